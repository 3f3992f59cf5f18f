//! The [`Builder`]: the configuration, its checks, the first connection,
//! and the server's eviction policy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use pace::{Pace, Rate};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, Script};

use crate::conn::{
    check_server, refusal_kind, Circuit, Conn, Connector, Link, Refusal, Refused, Wait,
};
use crate::lease::{LeaseConfig, Leases};
use crate::stats::Counters;
use crate::{
    script_source, ConfigError, ConnectError, Inner, RedisPace, DEFAULT_HOLD_LIMIT, MAX_TAU_NS,
};
#[cfg(doc)]
use crate::{BackendError, Error, Hold, Refunded, Source};

/// What happens when Redis cannot answer in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnUnavailable {
    /// Return [`Error::Unavailable`]: nothing is admitted without Redis.
    FailClosed,
    /// Decide on a local [`pace::Pace`] at `rate / replicas` (capacity
    /// `capacity / replicas`, at least 1), so that `replicas` processes
    /// together stay near the shared limit while Redis is away.
    LocalFallback {
        /// How many replicas share the limit (at least 1).
        replicas: u32,
    },
}

/// What [`Builder::connect`] does when the server's `maxmemory-policy` can
/// evict the limiter's keys (`allkeys-*`, or `volatile-*`: every key the
/// limiter writes has an expiry). A lost key is a full bucket: at most one
/// capacity of extra admissions per key (README: "Lost keys").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionCheck {
    /// Log a warning (target `pace_redis`) and use the server (default).
    Warn,
    /// Refuse the server: `connect` fails with
    /// [`ConfigError::EvictingPolicy`]; a connection made in the background
    /// is dropped (and tried again after `backoff`).
    Refuse,
    /// Do not read the policy.
    Ignore,
}

/// Builds a [`RedisPace`].
#[must_use = "a builder does nothing until connect() is called"]
pub struct Builder {
    rate: Rate,
    capacity: Option<u64>,
    prefix: String,
    timeout: Duration,
    backoff: Duration,
    policy: OnUnavailable,
    deny_cache: bool,
    deny_cache_entries: usize,
    max_key_bytes: usize,
    time_injection: bool,
    eviction: EvictionCheck,
    hold_limit: Duration,
    leases: Option<LeaseConfig>,
    wait: Option<(u32, Duration)>,
    #[cfg(feature = "tls")]
    tls: Tls,
}

/// Certificates for `rediss://` beyond the system's roots.
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
struct Tls {
    root_ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Builder {
    /// Bucket capacity in tokens (default: one second of the rate, at least 1).
    pub fn capacity(mut self, tokens: u64) -> Self {
        self.capacity = Some(tokens);
        self
    }
    /// Prefix of every Redis key (default `"pace:"`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
    /// The longest a call waits for Redis, script reloads included
    /// (default 250 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// After a failed call, Redis (in a cluster, the node that serves the
    /// call's slot) is not tried again for this long: calls go straight to
    /// the policy (default 100 ms). [`RedisPace::unavailable_for`] tells
    /// what is left of it.
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }
    /// The policy when Redis gives no decision (default
    /// [`OnUnavailable::FailClosed`]).
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.policy = policy;
        self
    }
    /// Answer a key denied until `t` locally until `t` (default on).
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }
    /// Most keys the denial cache holds (default 65,536).
    pub fn deny_cache_entries(mut self, entries: usize) -> Self {
        self.deny_cache_entries = entries;
        self
    }
    /// Largest prefix + key in bytes (default 1,024).
    pub fn max_key_bytes(mut self, bytes: usize) -> Self {
        self.max_key_bytes = bytes;
        self
    }
    /// Enables [`RedisPace::reserve_n_at`] and [`RedisPace::refund_at`],
    /// which pass the time to the script instead of its reading `TIME`
    /// (tests only: keys then get no expiry).
    pub fn time_injection(mut self, on: bool) -> Self {
        self.time_injection = on;
        self
    }

    /// Leases on hot keys (DESIGN.md §11; off by default): a key with
    /// [`LeaseConfig::hot_after`] server decisions within a lease time gets
    /// a lease, a server-side hold of up to a share of its tokens for this
    /// limiter, renewed in the background; a [`RedisPace::reserve`],
    /// [`RedisPace::reserve_n`], [`RedisPace::hold`] or
    /// [`RedisPace::hold_n`] on it is then decided locally (one CAS,
    /// [`Source::Lease`]) while the lease has tokens and its deadline has
    /// not passed, and its refund too while no renewal has reported it (a
    /// leased hold is kept as taken). Every other call (a quota of its
    /// own, a turn, an injected time) goes to the server as without leases;
    /// the server counts the leased tokens as held. The bound holds over
    /// every window; the costs are tokens stranded by a replica that dies
    /// (until the lease's expiry plus its grace), a quiet key's tokens
    /// (about half a lease time, then released) and a share cap.
    pub fn leases(mut self, config: LeaseConfig) -> Self {
        self.leases = Some(config);
        self
    }

    /// Standbys that must hold an admission's write before it is used
    /// (off by default): each call that can admit (a reserve, a hold, a
    /// turn, a lease's grant; not a reserve's refund, a keep or a peek) goes out in
    /// one pipeline with `WAIT replicas timeout`, so it still costs one
    /// round trip. An admission fewer standbys acknowledged within
    /// `timeout` is not used: the call answers
    /// [`BackendError::NotReplicated`] through the policy
    /// ([`Error::Unavailable`], or the local fallback), and its tokens go
    /// back in the background (a hold released, a reserve or a turn
    /// refunded; a grant stays held until a later grant or its expiry).
    /// A failover to a standby that acknowledged
    /// then loses no used admission (DESIGN.md §11). A hold's release goes
    /// out with `WAIT` too and is sent again every `backoff` (for the hold
    /// limit at most) until the standbys acknowledge it; for `backoff`
    /// after a `WAIT` counted too few standbys, decisions are answered
    /// `NotReplicated` without being sent.
    ///
    /// `WAIT` blocks the shared connection until the standbys answer
    /// (every call behind it waits too), and a primary without `replicas`
    /// standbys admits nothing: set it only where the standbys exist. In a
    /// Cluster the `WAIT` goes to the primary of the call's key (the
    /// pipeline's slot). [`LeaseConfig::wait_replicas`] and
    /// [`LeaseConfig::wait_timeout`] set the same thing.
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = Some((replicas, timeout));
        self
    }

    /// How long a [`Hold`] may stay unresolved (default 10 s): after it, on
    /// the server's clock, the hold is settled as kept from its expiry by
    /// the next call on its key, and a late keep or refund answers
    /// [`Refunded::Expired`] (a keep, false). A replica that dies holding tokens locks them
    /// for at most this long; they then refill at the normal rate. At most
    /// [`MAX_TAU_NS`]; zero is rejected.
    pub fn hold_limit(mut self, limit: Duration) -> Self {
        self.hold_limit = limit;
        self
    }

    /// What to do when the server's `maxmemory-policy` (read with `INFO
    /// memory` on every new connection) can evict the limiter's keys
    /// (default [`EvictionCheck::Warn`]).
    pub fn eviction_check(mut self, check: EvictionCheck) -> Self {
        self.eviction = check;
        self
    }

    /// Trusts the certificates of this PEM bundle for `rediss://` URLs
    /// instead of the system's roots (a private CA). The server's
    /// certificate is verified against them, host name included.
    #[cfg(feature = "tls")]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_ca = Some(pem.into());
        self
    }
    /// Presents this client certificate chain and private key (both PEM) to
    /// a server that requires mutual TLS (`tls-auth-clients yes`).
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_chain_pem.into(), key_pem.into()));
        self
    }

    /// The client of `url`, with the TLS settings: a URL that does not
    /// parse is [`ConnectError::InvalidUrl`]; certificates that do not,
    /// [`ConnectError::Tls`].
    fn client(&self, url: &str) -> Result<redis::Client, ConnectError> {
        redis::IntoConnectionInfo::into_connection_info(url).map_err(ConnectError::InvalidUrl)?;
        self.client_of(url).map_err(ConnectError::Tls)
    }

    fn client_of(&self, url: &str) -> Result<redis::Client, RedisError> {
        #[cfg(feature = "tls")]
        {
            // rustls needs a process-wide crypto provider; this crate enables
            // only `ring`. An application that installed one keeps its own.
            let _ = rustls::crypto::ring::default_provider().install_default();
            if self.tls.root_ca.is_some() || self.tls.client.is_some() {
                let certs = redis::TlsCertificates {
                    client_tls: self.tls.client.as_ref().map(|(cert, key)| {
                        redis::ClientTlsConfig {
                            client_cert: cert.clone(),
                            client_key: key.clone(),
                        }
                    }),
                    root_cert: self.tls.root_ca.clone(),
                };
                return redis::Client::build_with_tls(url, certs);
            }
        }
        redis::Client::open(url)
    }

    /// Checks the configuration and connects to `url`
    /// (`redis://host:port/db`, or `rediss://host:port/db` with the `tls`
    /// feature).
    ///
    /// When the server cannot be reached (an I/O error or no answer within
    /// the timeout) and the policy is [`OnUnavailable::LocalFallback`], the
    /// limiter is returned anyway: it decides on the local fallback and
    /// connects in the background (one attempt per `backoff`, each within the
    /// timeout); decisions move to the server once it answers.
    ///
    /// A server that answers but refuses the client is not "unreachable":
    /// a refused login or TLS handshake fails `connect` under either
    /// policy.
    ///
    /// # Errors
    /// [`ConnectError::Config`] for a rejected configuration,
    /// [`ConnectError::InvalidUrl`] for a URL that does not parse,
    /// [`ConnectError::Auth`] for a refused login (a missing or wrong
    /// password), [`ConnectError::Tls`] for a failed TLS handshake (a
    /// certificate the client does not trust, or one the server refuses),
    /// and [`ConnectError::Redis`] for any other failure, which includes,
    /// under [`OnUnavailable::FailClosed`] only, a server that cannot be
    /// reached in time.
    pub async fn connect(self, url: &str) -> Result<RedisPace, ConnectError> {
        let client = self.client(url)?;
        self.connect_client(client).await
    }

    /// [`connect`](Builder::connect) with a client built by the caller (its
    /// own TLS settings, credentials, protocol). Connections are made from
    /// it: at start, in the background while the server is away, and again
    /// after a failover's `READONLY` or `MASTERDOWN` answer (re-resolving
    /// the host name).
    ///
    /// # Errors
    /// As [`connect`](Builder::connect).
    pub async fn connect_client(self, client: redis::Client) -> Result<RedisPace, ConnectError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            // One connection attempt per reconnect, no sleeping retries: the
            // limiter's own backoff paces the attempts (a call after the
            // backoff triggers the next one).
            .set_number_of_retries(0)
            .set_max_delay(10);
        let client = Box::new(client);
        self.start(Connector::Client { client, config }, None).await
    }

    /// Uses a connection manager made by the caller (shared with the rest of
    /// the application). It reconnects by itself after a lost connection;
    /// this crate never replaces it, so after a failover's `READONLY` the
    /// circuit opens for `backoff` at a time until the address answers as a
    /// primary again (prefer [`connect_client`](Builder::connect_client)
    /// when the address can move).
    ///
    /// # Errors
    /// [`ConnectError::Config`] for a rejected configuration.
    pub async fn connect_with(self, conn: ConnectionManager) -> Result<RedisPace, ConnectError> {
        self.start(Connector::Given, Some(Conn::Single(conn))).await
    }

    /// Connects to a Redis Cluster through any of its `nodes`
    /// (`redis://host:port`, or `rediss://` with the `tls` feature and the
    /// builder's TLS settings): each key goes to its slot's primary, MOVED
    /// and ASK are followed, and [`RedisPace::reserve_many`] sends one
    /// pipeline per slot, concurrently. The circuit is one per node (read
    /// from `CLUSTER SLOTS` at connect and after a node's circuit opens):
    /// a node that fails does not stop the calls of the others. Otherwise
    /// as [`connect`](Builder::connect).
    ///
    /// # Errors
    /// As [`connect`](Builder::connect).
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster(self, nodes: &[&str]) -> Result<RedisPace, ConnectError> {
        #[allow(unused_mut)]
        let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout);
        #[cfg(feature = "tls")]
        {
            let _ = rustls::crypto::ring::default_provider().install_default();
            if self.tls.root_ca.is_some() || self.tls.client.is_some() {
                builder = builder.certs(redis::TlsCertificates {
                    client_tls: self.tls.client.as_ref().map(|(cert, key)| {
                        redis::ClientTlsConfig {
                            client_cert: cert.clone(),
                            client_key: key.clone(),
                        }
                    }),
                    root_cert: self.tls.root_ca.clone(),
                });
            }
        }
        let client = builder.build().map_err(ConnectError::InvalidUrl)?;
        self.connect_cluster_client(client).await
    }

    /// [`connect_cluster`](Builder::connect_cluster) with a cluster client
    /// built by the caller.
    ///
    /// # Errors
    /// As [`connect`](Builder::connect).
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster_client(
        self,
        client: redis::cluster::ClusterClient,
    ) -> Result<RedisPace, ConnectError> {
        self.start(Connector::Cluster(Box::new(client)), None).await
    }

    /// Connects to the primary that the Sentinels at `sentinels`
    /// (`redis://host:port`) report for `service` (`sentinel monitor
    /// <service> ...`). Every new connection asks them again: after a
    /// `READONLY`, `MASTERDOWN` or a lost connection, the limiter follows a
    /// failover to the new primary. A task on the current tokio runtime
    /// also subscribes to the Sentinels' `+switch-master` channel and
    /// moves the limiter to the new primary at each switch, so that a
    /// graceful failover (the old primary still up) does not leave it
    /// deciding on the old one. Otherwise as [`connect`](Builder::connect).
    ///
    /// # Errors
    /// As [`connect`](Builder::connect).
    #[cfg(feature = "sentinel")]
    pub async fn connect_sentinel(
        self,
        sentinels: &[&str],
        service: &str,
    ) -> Result<RedisPace, ConnectError> {
        let client = redis::sentinel::SentinelClient::build(
            sentinels.to_vec(),
            service.to_string(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(ConnectError::InvalidUrl)?;
        self.connect_sentinel_client(client).await
    }

    /// [`connect_sentinel`](Builder::connect_sentinel) with a Sentinel
    /// client built by the caller (credentials, TLS to the servers), which
    /// must ask for the primary (`SentinelServerType::Master`).
    ///
    /// # Errors
    /// As [`connect`](Builder::connect).
    #[cfg(feature = "sentinel")]
    pub async fn connect_sentinel_client(
        self,
        client: redis::sentinel::SentinelClient,
    ) -> Result<RedisPace, ConnectError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            .set_number_of_retries(0)
            .set_max_delay(10);
        let sentinel = Box::new(tokio::sync::Mutex::new(client));
        let primary = Mutex::new(None);
        let limiter = self
            .start(
                Connector::Sentinel {
                    sentinel,
                    config,
                    primary,
                },
                None,
            )
            .await?;
        // Known-wrong for mutation tests: no follower (a limiter moves only
        // after an error from the old primary).
        #[cfg(not(pace_mutant = "redis_sentinel_unfollowed"))]
        limiter.follow_sentinels();
        Ok(limiter)
    }

    /// Validates the configuration, makes the first connection (unless given
    /// one) and builds the limiter.
    async fn start(self, how: Connector, given: Option<Conn>) -> Result<RedisPace, ConnectError> {
        let checked = self.check()?;
        let fallback = self.local_fallback(checked.capacity)?;
        let first = match given {
            Some(conn) => Some(conn),
            None => self.first_connection(&how, fallback.is_some()).await?,
        };
        let mut seen_policy = None;
        if let Some(conn) = &first {
            let mut conn = conn.clone();
            match check_server(&mut conn, self.eviction, self.timeout).await {
                Ok(policy) => seen_policy = policy,
                Err(Refused::Policy(policy)) => {
                    return Err(ConnectError::Config(ConfigError::EvictingPolicy { policy }))
                }
                Err(Refused::Login(e)) => return Err(ConnectError::Auth(e)),
            }
        }
        let connected = first.is_some();
        let limiter = self.limiter(checked, fallback, how, first, seen_policy);
        if connected {
            #[cfg(feature = "cluster")]
            limiter.refresh_topology().await;
        } else {
            if limiter.inner.link.circuit.begin_outage() {
                crate::stats::bump(&limiter.inner.counters.shard().outages, 1);
                log::warn!(
                    target: "pace_redis",
                    "redis cannot be reached at start: calls decide on the local fallback \
                     while the limiter connects in the background (logged once per outage)"
                );
            }
            limiter.reconnect();
        }
        Ok(limiter)
    }

    /// The configuration's capacity, interval and hold limit, once they
    /// pass the checks of [`ConfigError`].
    fn check(&self) -> Result<Checked, ConnectError> {
        let capacity = self.capacity.unwrap_or_else(|| self.rate.one_second());
        // The core crate's own checks (zero capacity, tau overflow).
        Pace::<String>::builder(self.rate)
            .capacity(capacity)
            .min_slots(1)
            .build()
            .map_err(|e| ConnectError::Config(ConfigError::Pace(e)))?;
        let interval = u64::try_from(self.rate.interval().as_nanos()).unwrap_or(u64::MAX);
        let tau = interval.saturating_mul(capacity);
        if tau > MAX_TAU_NS {
            return Err(ConnectError::Config(ConfigError::TauTooLarge {
                tau_ns: tau,
                max_ns: MAX_TAU_NS,
            }));
        }
        if self.timeout.is_zero() {
            return Err(ConnectError::Config(ConfigError::ZeroTimeout));
        }
        let hold_limit = u64::try_from(self.hold_limit.as_nanos()).unwrap_or(u64::MAX);
        if hold_limit == 0 || hold_limit > MAX_TAU_NS {
            return Err(ConnectError::Config(ConfigError::HoldLimit {
                ns: hold_limit,
            }));
        }
        if self.prefix.len() >= self.max_key_bytes {
            return Err(ConnectError::Config(ConfigError::PrefixTooLong));
        }
        let leases = match self.leases {
            None => None,
            Some(config) => Some(
                Leases::new(config, capacity, self.timeout)
                    .ok_or(ConnectError::Config(ConfigError::Leases))?,
            ),
        };
        let from_leases = self
            .leases
            .filter(|c| c.wait_replicas > 0)
            .map(|c| (c.wait_replicas, c.wait_timeout));
        let wait = match (self.wait, from_leases) {
            (Some(a), Some(b)) if a != b => {
                return Err(ConnectError::Config(ConfigError::WaitReplicas))
            }
            (Some(w), _) | (None, Some(w)) => Some(w),
            (None, None) => None,
        };
        let wait = match wait {
            None => None,
            Some((replicas, timeout))
                if replicas == 0 || timeout.is_zero() || timeout > self.timeout =>
            {
                return Err(ConnectError::Config(ConfigError::WaitReplicas))
            }
            Some((replicas, timeout)) => Some(Wait {
                replicas,
                ms: u64::try_from(timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            }),
        };
        Ok(Checked {
            capacity,
            interval,
            hold_limit,
            leases,
            wait,
        })
    }

    /// The local limiter of [`OnUnavailable::LocalFallback`] (a replica's
    /// share of the rate and of `capacity`), `None` under
    /// [`OnUnavailable::FailClosed`].
    fn local_fallback(&self, capacity: u64) -> Result<Option<Pace<String>>, ConnectError> {
        match self.policy {
            OnUnavailable::FailClosed => Ok(None),
            OnUnavailable::LocalFallback { replicas: 0 } => {
                Err(ConnectError::Config(ConfigError::ZeroReplicas))
            }
            OnUnavailable::LocalFallback { replicas } => {
                let per = self
                    .rate
                    .per()
                    .checked_mul(replicas)
                    .ok_or(ConnectError::Config(ConfigError::Pace(
                        pace::ConfigError::IntervalTooLong,
                    )))?;
                let rate = Rate::new(self.rate.count(), per)
                    .map_err(|e| ConnectError::Config(ConfigError::Pace(e)))?;
                let cap = (capacity / u64::from(replicas)).max(1);
                // Known-wrong for mutation tests: the fallback at the full rate.
                #[cfg(pace_mutant = "redis_fallback_full_rate")]
                let (rate, cap) = (self.rate, capacity);
                Ok(Some(
                    Pace::builder(rate)
                        .capacity(cap)
                        .hold_limit(self.hold_limit)
                        .build()
                        .map_err(|e| ConnectError::Config(ConfigError::Pace(e)))?,
                ))
            }
        }
    }

    /// The first connection through `how`, within the timeout; `None`
    /// when Redis is unreachable and the limiter starts on its local
    /// `fallback`.
    async fn first_connection(
        &self,
        how: &Connector,
        fallback: bool,
    ) -> Result<Option<Conn>, ConnectError> {
        match tokio::time::timeout(self.timeout, how.open()).await {
            Ok(Ok(conn)) => Ok(Some(conn)),
            // A server that answers and refuses: under either policy.
            Ok(Err(e)) => match refusal_kind(&e) {
                Some(Refusal::Auth) => Err(ConnectError::Auth(e)),
                Some(Refusal::Tls) => Err(ConnectError::Tls(e)),
                None if !(e.is_io_error() && fallback) => Err(ConnectError::Redis(e)),
                None => Ok(None),
            },
            Err(_) if !fallback => Err(ConnectError::Redis(RedisError::from((
                ErrorKind::IoError,
                "connect timed out",
            )))),
            // Unreachable under LocalFallback: start on the fallback.
            _ => Ok(None),
        }
    }

    /// The limiter of this configuration, on `first` (when connected).
    fn limiter(
        self,
        checked: Checked,
        fallback: Option<Pace<String>>,
        how: Connector,
        first: Option<Conn>,
        seen_policy: Option<String>,
    ) -> RedisPace {
        let Checked {
            capacity,
            interval,
            hold_limit,
            leases,
            wait,
        } = checked;
        #[cfg(feature = "cluster")]
        let cluster = matches!(how, Connector::Cluster(_));
        RedisPace {
            inner: Arc::new(Inner {
                link: Link {
                    how,
                    conn: RwLock::new(first),
                    connecting: AtomicBool::new(false),
                    next_attempt: AtomicU64::new(0),
                    policy: Mutex::new(seen_policy),
                    eviction: self.eviction,
                    circuit: Circuit::default(),
                    #[cfg(feature = "cluster")]
                    topology: cluster.then(|| Box::new(crate::conn::Topology::new())),
                },
                script: Script::new(&script_source(interval, capacity)),
                rate: self.rate,
                interval,
                capacity,
                prefix: self.prefix,
                timeout: self.timeout,
                backoff: self.backoff,
                policy: self.policy,
                fallback,
                cache: self.deny_cache.then(|| Mutex::new(HashMap::new())),
                cached: AtomicUsize::new(0),
                cache_entries: self.deny_cache_entries.max(1),
                max_key_bytes: self.max_key_bytes,
                time_injection: self.time_injection,
                hold_limit,
                origin: Instant::now(),
                leases,
                wait,
                counters: Counters::default(),
            }),
        }
    }
}

/// A [`Builder`]'s capacity (tokens), interval and hold limit (ns), checked.
struct Checked {
    capacity: u64,
    interval: u64,
    hold_limit: u64,
    leases: Option<Leases>,
    wait: Option<Wait>,
}

impl RedisPace {
    /// A builder at `rate`.
    pub fn builder(rate: Rate) -> Builder {
        Builder {
            rate,
            capacity: None,
            prefix: "pace:".to_string(),
            timeout: Duration::from_millis(250),
            backoff: Duration::from_millis(100),
            policy: OnUnavailable::FailClosed,
            deny_cache: true,
            deny_cache_entries: 65_536,
            max_key_bytes: 1_024,
            time_injection: false,
            eviction: EvictionCheck::Warn,
            hold_limit: DEFAULT_HOLD_LIMIT,
            leases: None,
            wait: None,
            #[cfg(feature = "tls")]
            tls: Tls::default(),
        }
    }
}
