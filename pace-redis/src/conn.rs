//! How the limiter reaches Redis: the connector, the connection, the
//! circuit, reconnects, and the calls themselves (one script call, one
//! pipeline).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ErrorKind, RedisError, Value};

use crate::stats::bump;
use crate::{BackendError, EvictionCheck, Inner, OnUnavailable, RedisPace};

/// How the limiter reaches Redis.
pub(crate) enum Connector {
    /// Connections are made from this client (at start, in the background,
    /// after `READONLY`/`MASTERDOWN`).
    Client {
        client: Box<redis::Client>,
        config: ConnectionManagerConfig,
    },
    /// The caller's connection manager, never replaced.
    Given,
    /// A Redis Cluster client (a new connection re-reads the topology).
    #[cfg(feature = "cluster")]
    Cluster(Box<redis::cluster::ClusterClient>),
    /// The primary Sentinel reports, asked again for every new connection.
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinel: Box<tokio::sync::Mutex<redis::sentinel::SentinelClient>>,
        config: ConnectionManagerConfig,
        /// The address of the primary of the last connection made.
        primary: Mutex<Option<redis::ConnectionAddr>>,
    },
}

impl Connector {
    /// A new connection (no timeout of its own).
    pub(crate) async fn open(&self) -> Result<Conn, RedisError> {
        match self {
            Connector::Client { client, config } => {
                ConnectionManager::new_with_config((**client).clone(), config.clone())
                    .await
                    .map(Conn::Single)
            }
            Connector::Given => Err(RedisError::from((
                ErrorKind::ClientError,
                "a given connection is not replaced",
            ))),
            #[cfg(feature = "cluster")]
            Connector::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
            #[cfg(feature = "sentinel")]
            Connector::Sentinel {
                sentinel,
                config,
                primary,
            } => {
                let client = sentinel.lock().await.async_get_client().await?;
                let addr = client.get_connection_info().addr.clone();
                let conn = ConnectionManager::new_with_config(client, config.clone()).await?;
                *primary.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
                Ok(Conn::Single(conn))
            }
        }
    }
    fn replaceable(&self) -> bool {
        !matches!(self, Connector::Given)
    }
    /// Whether a lost connection should be made again from a new address
    /// (the old primary may be gone for good).
    fn asks_for_address(&self) -> bool {
        #[cfg(feature = "sentinel")]
        if matches!(self, Connector::Sentinel { .. }) {
            return true;
        }
        false
    }
}

/// A connection in use.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            Conn::Single(_) => false,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => true,
        }
    }
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The current connection and how to make a new one.
pub(crate) struct Link {
    pub(crate) how: Connector,
    /// `None` until the first connection is made.
    pub(crate) conn: RwLock<Option<Conn>>,
    /// A background connect is under way.
    pub(crate) connecting: AtomicBool,
    /// ns since the limiter's origin of the background connect's next
    /// attempt (while it waits between attempts).
    pub(crate) next_attempt: AtomicU64,
    /// The `maxmemory-policy` the last connection's server reported.
    pub(crate) policy: Mutex<Option<String>>,
    pub(crate) eviction: EvictionCheck,
    /// The server's circuit (a cluster's, for the slots of no known node).
    pub(crate) circuit: Circuit,
    /// A cluster's slots and one circuit per node.
    #[cfg(feature = "cluster")]
    pub(crate) topology: Option<Box<Topology>>,
}

/// A circuit: after a failed call, its server is not tried again until
/// `until`. It also marks an outage, so that its start and its end are
/// logged once each.
#[derive(Default)]
pub(crate) struct Circuit {
    /// ns since the limiter's origin before which the server is not tried
    /// (0: never opened).
    until: AtomicU64,
    /// An outage is under way: its start was logged, its end will be.
    outage: AtomicBool,
    /// ns since the limiter's origin before which a server decision is
    /// answered `NotReplicated` without being sent (0: never): its
    /// standbys missed a `WAIT` less than `backoff` ago
    /// ([`Builder::wait_replicas`](crate::Builder::wait_replicas)).
    unreplicated_until: AtomicU64,
}

impl Circuit {
    fn is_open(&self, now: u64) -> bool {
        let until = self.until.load(Ordering::Relaxed);
        until != 0 && now < until
    }
    /// ns until the circuit closes (0: closed).
    fn remaining(&self, now: u64) -> u64 {
        self.until.load(Ordering::Relaxed).saturating_sub(now)
    }
    /// Marks the start of an outage: true if it was not under way.
    pub(crate) fn begin_outage(&self) -> bool {
        let first = !self.outage.swap(true, Ordering::Relaxed);
        // Known-wrong for mutation tests: every failed call starts one.
        #[cfg(pace_mutant = "redis_warn_every_trip")]
        let first = true;
        first
    }
    /// Whether a server decision is answered `NotReplicated` unsent.
    fn unreplicated(&self, now: u64) -> bool {
        let until = self.unreplicated_until.load(Ordering::Relaxed);
        until != 0 && now < until
    }
    /// Marks an answer: true if it ends an outage.
    fn answered(&self) -> bool {
        self.outage.load(Ordering::Relaxed) && self.outage.swap(false, Ordering::Relaxed)
    }
}

/// Redis Cluster's slot count.
#[cfg(feature = "cluster")]
const SLOTS: usize = 16_384;

/// The most cluster nodes with a circuit of their own; the slots of the
/// nodes beyond share the cluster's circuit.
#[cfg(feature = "cluster")]
const MAX_NODES: usize = 1_024;

/// Which node serves each slot (as `CLUSTER SLOTS` last said), and one
/// circuit per node: a node that fails opens its own circuit, not the
/// others'.
#[cfg(feature = "cluster")]
pub(crate) struct Topology {
    /// Each slot's node: its index in `addrs` plus one (0: not known).
    owner: Box<[std::sync::atomic::AtomicU16]>,
    /// The nodes seen, by address, in the order first seen.
    addrs: Mutex<Vec<String>>,
    /// The circuit of each node of `addrs`.
    nodes: Box<[Circuit]>,
    /// A `CLUSTER SLOTS` read is under way.
    refreshing: AtomicBool,
}

#[cfg(feature = "cluster")]
impl Topology {
    pub(crate) fn new() -> Topology {
        Topology {
            owner: (0..SLOTS)
                .map(|_| std::sync::atomic::AtomicU16::new(0))
                .collect(),
            addrs: Mutex::new(Vec::new()),
            nodes: (0..MAX_NODES).map(|_| Circuit::default()).collect(),
            refreshing: AtomicBool::new(false),
        }
    }

    /// The circuit of the node that serves `slot`, when known.
    fn circuit(&self, slot: u16) -> Option<&Circuit> {
        let owner = self.owner[usize::from(slot)].load(Ordering::Relaxed);
        self.nodes.get(usize::from(owner).checked_sub(1)?)
    }

    /// The address of the node whose circuit is `c`.
    fn address(&self, c: &Circuit) -> Option<String> {
        let i = self.nodes.iter().position(|n| std::ptr::eq(n, c))?;
        self.addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(i)
            .cloned()
    }

    /// Takes a `CLUSTER SLOTS` reply: each range's primary, by address.
    fn update(&self, reply: &Value) {
        let Value::Array(ranges) = reply else { return };
        let mut addrs = self.addrs.lock().unwrap_or_else(|p| p.into_inner());
        for range in ranges {
            let Value::Array(fields) = range else {
                continue;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            let host = match node.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => continue,
            };
            let Some(Value::Int(port)) = node.get(1) else {
                continue;
            };
            let addr = format!("{host}:{port}");
            let index = match addrs.iter().position(|a| *a == addr) {
                Some(i) => i,
                None if addrs.len() < MAX_NODES => {
                    addrs.push(addr);
                    addrs.len() - 1
                }
                None => continue,
            };
            let (Ok(start), Ok(end)) = (usize::try_from(*start), usize::try_from(*end)) else {
                continue;
            };
            // The index fits: MAX_NODES < u16::MAX.
            let owner = (index + 1) as u16;
            for slot in self.owner.iter().take(end.saturating_add(1)).skip(start) {
                slot.store(owner, Ordering::Relaxed);
            }
        }
    }
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of the key, or of its
/// hash tag (the text between the first `{` and the next `}`, when not
/// empty), modulo 16,384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// `READONLY` (a replica) or `MASTERDOWN` (a replica without its primary).
fn is_not_primary(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN"))
}

/// A pipeline's reply that says the connection reached no primary.
fn not_primary_reply(v: &Value) -> Option<RedisError> {
    match v {
        Value::ServerError(e) if matches!(e.code(), "READONLY" | "MASTERDOWN") => {
            v.clone().extract_error().err()
        }
        _ => None,
    }
}

/// [`Builder::wait_replicas`](crate::Builder::wait_replicas): the
/// standbys an admission needs and `WAIT`'s timeout (ms, at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) ms: u64,
}

/// Whether an admitting call's write reached the standbys it needs: `Err`
/// holds what an admission answers instead.
pub(crate) type Replicated = Result<(), BackendError>;

/// What a pipeline waits for
/// ([`Builder::wait_replicas`](crate::Builder::wait_replicas)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// No `WAIT` (a refund, a keep, a peek, or no standbys configured).
    No,
    /// A lease's grant, or a hold's release: `WAIT` ends the pipeline.
    Always,
    /// A server decision: `WAIT` ends the pipeline, and for `backoff` after
    /// a `WAIT` of the node counted too few standbys the pipeline is
    /// answered `NotReplicated` unsent (its admissions could not be used:
    /// sending them would hold the shared connection in `WAIT` for each,
    /// and a caller that gives up before the answer leaves its debit).
    Decision,
}

impl Wait {
    fn cmd(self) -> Cmd {
        let mut c = redis::cmd("WAIT");
        c.arg(self.replicas).arg(self.ms);
        c
    }

    /// `WAIT`'s answer `v`, checked: enough standbys, or why not.
    fn check(self, v: &Value) -> Replicated {
        match v {
            Value::Int(acked) if *acked >= i64::from(self.replicas) => Ok(()),
            Value::Int(acked) => Err(BackendError::NotReplicated {
                acked: u64::try_from(*acked).unwrap_or(0),
                wanted: self.replicas,
            }),
            other => Err(BackendError::BadReply(format!("WAIT answered {other:?}"))),
        }
    }
}

/// `replicated` once more, for another admission of the same pipeline.
pub(crate) fn again(replicated: &Replicated) -> Replicated {
    match replicated {
        Ok(()) => Ok(()),
        Err(BackendError::NotReplicated { acked, wanted }) => Err(BackendError::NotReplicated {
            acked: *acked,
            wanted: *wanted,
        }),
        Err(e) => Err(BackendError::BadReply(e.to_string())),
    }
}

fn is_noscript(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => e.code() == "NOSCRIPT",
        _ => false,
    }
}

impl RedisPace {
    /// Whether an admission whose standbys answered `replicated` may be
    /// used (`Ok`), counted in [`Stats::unreplicated`](crate::Stats) when
    /// not: every admission the server makes (a reserve, a hold, a turn, a
    /// grant) passes here before it is used.
    pub(crate) fn usable(&self, replicated: Replicated) -> Replicated {
        // Known-wrong for mutation tests: an admission used whatever WAIT
        // answered.
        #[cfg(pace_mutant = "redis_wait_ignored")]
        let replicated: Replicated = {
            let _ = replicated;
            Ok(())
        };
        if replicated.is_err() {
            bump(&self.inner.counters.shard().unreplicated, 1);
        }
        replicated
    }

    /// ns since the limiter's origin.
    fn now_ns(&self) -> u64 {
        self.inner.origin.elapsed().as_nanos() as u64
    }

    /// The circuit of a call (`EVALSHA <sha> 1 <key> ...`): in a cluster,
    /// that of the node serving its key's slot (when known); else the
    /// server's.
    fn circuit(&self, cmd: &Cmd) -> &Circuit {
        #[cfg(feature = "cluster")]
        if let (Some(t), Some(redis::Arg::Simple(key))) =
            (&self.inner.link.topology, cmd.args_iter().nth(3))
        {
            if let Some(c) = t.circuit(key_slot(key)) {
                // Known-wrong for mutation tests: one circuit for the cluster.
                #[cfg(not(pace_mutant = "redis_cluster_one_circuit"))]
                return c;
            }
        }
        let _ = cmd;
        &self.inner.link.circuit
    }

    /// The circuit of `slot`'s node (the server's outside a cluster).
    fn slot_circuit(&self, slot: u16) -> &Circuit {
        #[cfg(feature = "cluster")]
        if let Some(c) = self
            .inner
            .link
            .topology
            .as_ref()
            .and_then(|t| t.circuit(slot))
        {
            #[cfg(not(pace_mutant = "redis_cluster_one_circuit"))]
            return c;
        }
        let _ = slot;
        &self.inner.link.circuit
    }

    /// How long until a call on `key` tries Redis again: the rest of the
    /// backoff of the circuit a failed call opened (in a cluster, that of
    /// the node serving the key's slot), or, while the limiter connects in
    /// the background, the wait until its next attempt. Zero when a call
    /// would try Redis now. A caller that answers "unavailable" can tell
    /// its own client when to try again (pace-tower's `Retry-After`).
    pub fn unavailable_for(&self, key: &str) -> Duration {
        let now = self.now_ns();
        let slot = key_slot(self.redis_key(key).as_bytes());
        let mut wait = self.slot_circuit(slot).remaining(now);
        let link = &self.inner.link;
        if link.connecting.load(Ordering::Acquire) && self.conn().is_none() {
            let next = link
                .next_attempt
                .load(Ordering::Relaxed)
                .saturating_sub(now);
            wait = wait.max(next);
        }
        Duration::from_nanos(wait)
    }

    /// What a failed call does to its circuit: a lost connection, a
    /// timeout, or a server that is no longer the primary opens it for
    /// `backoff` (and, at an outage's start, logs one warning).
    fn trip(&self, e: &BackendError, circuit: &Circuit) {
        let opens = match e {
            BackendError::Timeout(_) => {
                if self.inner.link.how.asks_for_address() {
                    self.reconnect();
                }
                true
            }
            BackendError::Redis(r) if is_not_primary(r) => {
                // A failover left this connection on a replica (READONLY) or
                // on a replica cut from its primary (MASTERDOWN): a new
                // connection, made in the background, may reach the primary.
                self.reconnect();
                true
            }
            BackendError::Redis(r) => {
                let lost = r.is_io_error()
                    || r.is_connection_dropped()
                    || r.is_connection_refusal()
                    || r.is_timeout()
                    || r.is_unrecoverable_error();
                if lost && self.inner.link.how.asks_for_address() {
                    self.reconnect();
                }
                lost
            }
            _ => false,
        };
        if !opens {
            return;
        }
        let until = self.now_ns() + self.inner.backoff.as_nanos() as u64;
        circuit.until.fetch_max(until, Ordering::Relaxed);
        if circuit.begin_outage() {
            bump(&self.inner.counters.shard().outages, 1);
            self.log_outage(e, circuit);
        }
        #[cfg(feature = "cluster")]
        self.refresh_topology_soon();
    }

    /// The warning at an outage's start (one per outage, not per call).
    fn log_outage(&self, e: &BackendError, circuit: &Circuit) {
        #[cfg(feature = "cluster")]
        let node = self
            .inner
            .link
            .topology
            .as_ref()
            .and_then(|t| t.address(circuit));
        #[cfg(not(feature = "cluster"))]
        let node: Option<String> = {
            let _ = circuit;
            None
        };
        let server = node.map_or_else(|| "redis".to_string(), |n| format!("redis node {n}"));
        let policy = match self.inner.policy {
            OnUnavailable::FailClosed => "calls fail (FailClosed)",
            OnUnavailable::LocalFallback { .. } => "calls decide on the local fallback",
        };
        log::warn!(
            target: "pace_redis",
            "{server} gives no decision ({e}): {policy}; it is tried again every {:?} \
             (logged once per outage)",
            self.inner.backoff
        );
    }

    /// A call's answer came: ends its circuit's outage, if any (logged).
    fn answered(&self, circuit: &Circuit) {
        if circuit.answered() {
            log::info!(target: "pace_redis", "redis answers again: the outage ended");
        }
    }

    /// Reads the cluster's slots again (`CLUSTER SLOTS`) in the
    /// background, unless a read is under way.
    #[cfg(feature = "cluster")]
    fn refresh_topology_soon(&self) {
        let Some(t) = &self.inner.link.topology else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if t.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        runtime.spawn(async move {
            this.refresh_topology().await;
            if let Some(t) = &this.inner.link.topology {
                t.refreshing.store(false, Ordering::Release);
            }
        });
    }

    /// Reads the cluster's slots (`CLUSTER SLOTS`, within the timeout).
    #[cfg(feature = "cluster")]
    pub(crate) async fn refresh_topology(&self) {
        let (Some(t), Some(mut conn)) = (&self.inner.link.topology, self.conn()) else {
            return;
        };
        let read = tokio::time::timeout(
            self.inner.timeout,
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<Value>(&mut conn),
        )
        .await;
        if let Ok(Ok(reply)) = read {
            t.update(&reply);
        }
    }

    /// Makes a new connection in the background, unless one is under way
    /// (or the connection was given, or there is no tokio runtime): one
    /// attempt per `backoff` (at least 10 ms), each within the timeout, until
    /// one succeeds or the limiter is dropped. The current connection, if
    /// any, serves until the new one replaces it.
    pub(crate) fn reconnect(&self) {
        let link = &self.inner.link;
        if !link.how.replaceable() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if link.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            // A refused login or TLS handshake is logged once per reconnect.
            let mut refusal_logged = false;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let pause = inner.backoff.max(Duration::from_millis(10));
                let made = tokio::time::timeout(inner.timeout, inner.link.how.open()).await;
                let refused = match made {
                    Ok(Ok(mut conn)) => {
                        match check_server(&mut conn, inner.link.eviction, inner.timeout).await {
                            Ok(policy) => {
                                *inner.link.policy.lock().unwrap_or_else(|p| p.into_inner()) =
                                    policy;
                                bump(&inner.counters.shard().connects, 1);
                                // The circuit, if open, stays open for its
                                // backoff: a connection that lands on a replica
                                // again is replaced at most once per backoff.
                                *inner.link.conn.write().unwrap_or_else(|p| p.into_inner()) =
                                    Some(conn);
                                inner.link.connecting.store(false, Ordering::Release);
                                #[cfg(feature = "cluster")]
                                RedisPace {
                                    inner: inner.clone(),
                                }
                                .refresh_topology()
                                .await;
                                return;
                            }
                            // Kept on the fallback; tried again later.
                            Err(Refused::Policy(_)) => None,
                            Err(Refused::Login(e)) => Some(e.to_string()),
                        }
                    }
                    Ok(Err(e)) if refusal_kind(&e).is_some() => Some(e.to_string()),
                    _ => None,
                };
                if let Some(why) = refused {
                    if !refusal_logged {
                        refusal_logged = true;
                        log::error!(
                            target: "pace_redis",
                            "redis refused the limiter's connection ({why}); \
                             it is tried again every {pause:?}"
                        );
                    }
                }
                let next = inner.origin.elapsed() + pause;
                inner
                    .link
                    .next_attempt
                    .store(next.as_nanos() as u64, Ordering::Relaxed);
                drop(inner);
                tokio::time::sleep(pause).await;
            }
        });
    }

    /// The connection in use; `None` before the first one is made.
    pub(crate) fn conn(&self) -> Option<Conn> {
        self.inner
            .link
            .conn
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// One EVALSHA within the timeout; after NOSCRIPT, loads the script and
    /// sends it again.
    pub(crate) async fn eval(&self, cmd: &Cmd) -> Result<Value, BackendError> {
        let circuit = self.circuit(cmd);
        if circuit.is_open(self.now_ns()) {
            return Err(BackendError::CircuitOpen);
        }
        let inner = &*self.inner;
        let Some(mut conn) = self.conn() else {
            return Err(BackendError::NotConnected);
        };
        // The connection's boxed future, awaited directly: a small state
        // for the call's future (moved at every level of the call); the
        // reload after NOSCRIPT, rare, is boxed apart.
        let work = async {
            bump(&inner.counters.shard().round_trips, 1);
            let first = conn.req_packed_command(cmd).await;
            match first.and_then(Value::extract_error) {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    Box::pin(async {
                        self.load(&mut conn).await?;
                        bump(&inner.counters.shard().round_trips, 1);
                        conn.req_packed_command(cmd)
                            .await
                            .and_then(Value::extract_error)
                    })
                    .await
                }
                other => other,
            }
        };
        let result = match tokio::time::timeout(inner.timeout, work).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_timeout() => Err(BackendError::Timeout(inner.timeout)),
            Ok(Err(e)) => Err(BackendError::Redis(e)),
            Err(_) => Err(BackendError::Timeout(inner.timeout)),
        };
        match &result {
            Err(e) => self.trip(e, circuit),
            Ok(_) => self.answered(circuit),
        }
        result
    }

    async fn load(&self, conn: &mut Conn) -> Result<(), RedisError> {
        bump(&self.inner.counters.shard().round_trips, 1);
        bump(&self.inner.counters.shard().script_loads, 1);
        self.inner.script.load_async(conn).await.map(|_| ())
    }

    /// One EVALSHA that can admit (a reserve, a hold, a turn, a grant):
    /// without [`Builder::wait_replicas`](crate::Builder::wait_replicas),
    /// [`eval`](RedisPace::eval); with it, one pipeline of the call and
    /// `WAIT`. The second value is `Ok` when the standbys acknowledged the
    /// call's write (or none are required), else the error an admission
    /// answers instead: the one place an admission waits for standbys.
    pub(crate) async fn eval_admitting(
        &self,
        cmd: &Cmd,
        waited: Waited,
    ) -> Result<(Value, Replicated), BackendError> {
        if self.inner.wait.is_none() {
            return self.eval(cmd).await.map(|v| (v, Ok(())));
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone());
        let (mut values, replicated) = self.pipeline(&pipe, 1, waited).await?;
        let value = values.pop().unwrap_or(Value::Nil);
        match value.extract_error() {
            Ok(v) => Ok((v, replicated)),
            Err(e) => {
                let e = BackendError::Redis(e);
                self.trip(&e, self.circuit(cmd));
                Err(e)
            }
        }
    }

    /// A hold's release (`cmd`): sent as [`eval`](RedisPace::eval), with
    /// `WAIT` when standbys are required. When it gets no answer, or its
    /// standbys do not acknowledge it, it is sent again in the background
    /// every `backoff` for `for_ns` at most, until an answer the standbys
    /// acknowledged: neither a failover nor a timeout then leaves the hold
    /// to settle as kept (a flood's holds spending its victim's tokens).
    /// Sent again, a release finds no hold and changes nothing. (A
    /// reserve's refund is not sent again: it would undo a later debit that
    /// ended at the same `tat`.)
    pub(crate) async fn eval_release(&self, cmd: &Cmd, for_ns: u64) -> Result<Value, BackendError> {
        let first = self.eval_admitting(cmd, Waited::Always).await;
        // Known-wrong for mutation tests: a release sent once.
        #[cfg(not(pace_mutant = "redis_release_once"))]
        if !matches!(first, Ok((_, Ok(())))) {
            self.release_later(cmd.clone(), for_ns);
        }
        first.map(|(v, _)| v)
    }

    /// Sends the release `cmd` again, every `backoff` (at least 10 ms) for
    /// `for_ns` at most, until an answer its standbys acknowledged; ends
    /// when the limiter is dropped.
    fn release_later(&self, cmd: Cmd, for_ns: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let start = self.now_ns();
        runtime.spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let pause = inner.backoff.max(Duration::from_millis(10));
                drop(inner);
                tokio::time::sleep(pause).await;
                let Some(inner) = weak.upgrade() else { return };
                let this = RedisPace { inner };
                if this.now_ns().saturating_sub(start) >= for_ns {
                    return;
                }
                if let Ok((_, Ok(()))) = this.eval_admitting(&cmd, Waited::Always).await {
                    return;
                }
            }
        });
    }

    /// A pipeline of `count` EVALSHAs; those answered NOSCRIPT are sent again
    /// after a load (the others ran and must not run twice). Unless `waited`
    /// is [`Waited::No`], with
    /// [`Builder::wait_replicas`](crate::Builder::wait_replicas) `WAIT`
    /// ends the pipeline (and the part sent again after a NOSCRIPT: a
    /// `WAIT` covers the writes before it), and its answer comes back as
    /// [`Replicated`] (always `Ok` otherwise).
    pub(crate) async fn pipeline(
        &self,
        pipe: &redis::Pipeline,
        count: usize,
        waited: Waited,
    ) -> Result<(Vec<Value>, Replicated), BackendError> {
        let wait = self.inner.wait.filter(|_| waited != Waited::No);
        // A pipeline holds the calls of one slot (one node) in a cluster.
        let circuit = match pipe.cmd_iter().next() {
            Some(first) => self.circuit(first),
            None => &self.inner.link.circuit,
        };
        if circuit.is_open(self.now_ns()) {
            return Err(BackendError::CircuitOpen);
        }
        if let Some(w) = wait {
            // Known-wrong for mutation tests: decisions sent (and each
            // holding the connection in WAIT) while the standbys are away.
            #[cfg(not(pace_mutant = "redis_unreplicated_sent"))]
            if waited == Waited::Decision && circuit.unreplicated(self.now_ns()) {
                return Err(BackendError::NotReplicated {
                    acked: 0,
                    wanted: w.replicas,
                });
            }
        }
        let inner = &*self.inner;
        let Some(mut conn) = self.conn() else {
            return Err(BackendError::NotConnected);
        };
        // The commands sent: the pipeline, then WAIT when waited.
        let extra = usize::from(wait.is_some());
        let waited_pipe;
        let sent = match wait {
            None => pipe,
            Some(w) => {
                let mut p = pipe.clone();
                p.add_command(w.cmd());
                waited_pipe = p;
                &waited_pipe
            }
        };
        let work = async {
            bump(&inner.counters.shard().round_trips, 1);
            let mut values = match conn.req_packed_commands(sent, 0, count + extra).await {
                // A cluster connection answers a pipeline with one error
                // when a reply is one. The pipeline's EVALSHAs share one
                // node (one slot), so a NOSCRIPT there is every EVALSHA's:
                // none ran, and the whole pipeline is sent again.
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    self.load(&mut conn).await?;
                    bump(&inner.counters.shard().round_trips, 1);
                    conn.req_packed_commands(sent, 0, count + extra).await?
                }
                other => other?,
            };
            let missing: Vec<usize> = values
                .iter()
                .take(count)
                .enumerate()
                .filter(|(_, v)| is_noscript(v))
                .map(|(i, _)| i)
                .collect();
            if !missing.is_empty() {
                self.load(&mut conn).await?;
                let mut again = redis::pipe();
                let cmds: Vec<&Cmd> = pipe.cmd_iter().collect();
                for &i in &missing {
                    again.add_command(cmds[i].clone());
                }
                if let Some(w) = wait {
                    again.add_command(w.cmd());
                }
                bump(&inner.counters.shard().round_trips, 1);
                let mut redone = conn
                    .req_packed_commands(&again, 0, missing.len() + extra)
                    .await?;
                if extra == 1 && redone.len() == missing.len() + 1 && values.len() == count + 1 {
                    // The new WAIT's answer replaces the first one's.
                    values[count] = redone.pop().unwrap_or(Value::Nil);
                }
                for (i, v) in missing.into_iter().zip(redone) {
                    values[i] = v;
                }
            }
            Ok::<_, RedisError>(values)
        };
        let result = match tokio::time::timeout(inner.timeout, work).await {
            Ok(Ok(mut v)) if v.len() == count + extra => {
                let replicated = match wait {
                    None => Ok(()),
                    Some(w) => w.check(&v.pop().unwrap_or(Value::Nil)),
                };
                // (The known-wrong variant `redis_wait_ignored` ignores
                // WAIT's answer here too.)
                #[cfg(not(pace_mutant = "redis_wait_ignored"))]
                if let Err(BackendError::NotReplicated { .. }) = replicated {
                    // The node's standbys are away: its decisions are
                    // answered unsent for a backoff.
                    let until = self
                        .now_ns()
                        .saturating_add(inner.backoff.as_nanos() as u64);
                    circuit
                        .unreplicated_until
                        .store(until.max(1), Ordering::Relaxed);
                }
                Ok((v, replicated))
            }
            Ok(Ok(v)) => Err(BackendError::BadReply(format!(
                "{} replies to {} commands",
                v.len(),
                count + extra
            ))),
            Ok(Err(e)) if e.is_timeout() => Err(BackendError::Timeout(inner.timeout)),
            Ok(Err(e)) => Err(BackendError::Redis(e)),
            Err(_) => Err(BackendError::Timeout(inner.timeout)),
        };
        match &result {
            Err(e) => self.trip(e, circuit),
            Ok((values, _)) => match values.iter().find_map(not_primary_reply) {
                Some(e) => self.trip(&BackendError::Redis(e), circuit),
                None => self.answered(circuit),
            },
        }
        result
    }
}

#[cfg(feature = "sentinel")]
impl RedisPace {
    /// Follows the Sentinels' `+switch-master` announcements in the
    /// background (one pub/sub connection to one Sentinel, made again when
    /// lost): at each, and at every new subscription (one may have come
    /// while none was open), the Sentinels are asked for the primary, and a
    /// new primary gets a new connection at once. Ends when the limiter is
    /// dropped (checked at least once a second).
    pub(crate) fn follow_sentinels(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            use futures_util::StreamExt;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                // Between attempts to subscribe (no Sentinel answers).
                let pause = inner.backoff.max(Duration::from_millis(500));
                let subscribed = tokio::time::timeout(inner.timeout, async {
                    let Connector::Sentinel { sentinel, .. } = &inner.link.how else {
                        return None;
                    };
                    let client = sentinel.lock().await.async_get_sentinel_client().await;
                    let mut pubsub = client.ok()?.get_async_pubsub().await.ok()?;
                    pubsub.subscribe("+switch-master").await.ok()?;
                    Some(pubsub)
                })
                .await;
                let Ok(Some(pubsub)) = subscribed else {
                    drop(inner);
                    tokio::time::sleep(pause).await;
                    continue;
                };
                let this = RedisPace { inner };
                this.follow_primary().await;
                drop(this);
                let mut messages = pubsub.into_on_message();
                loop {
                    match tokio::time::timeout(Duration::from_secs(1), messages.next()).await {
                        Ok(Some(_switch)) => {
                            let Some(inner) = weak.upgrade() else { return };
                            RedisPace { inner }.follow_primary().await;
                        }
                        // The subscription is lost: subscribe again.
                        Ok(None) => break,
                        Err(_) if weak.strong_count() == 0 => return,
                        Err(_) => {}
                    }
                }
            }
        });
    }

    /// Asks the Sentinels for the primary: when it is not the one of the
    /// current connection, connects to it and uses that connection from
    /// now on.
    async fn follow_primary(&self) {
        let inner = &*self.inner;
        let Connector::Sentinel {
            sentinel,
            config,
            primary,
        } = &inner.link.how
        else {
            return;
        };
        let asked = tokio::time::timeout(inner.timeout, async {
            sentinel.lock().await.async_get_client().await
        })
        .await;
        let Ok(Ok(client)) = asked else { return };
        let addr = client.get_connection_info().addr.clone();
        if primary.lock().unwrap_or_else(|p| p.into_inner()).as_ref() == Some(&addr) {
            return;
        }
        let made = tokio::time::timeout(
            inner.timeout,
            ConnectionManager::new_with_config(client, config.clone()),
        )
        .await;
        let Ok(Ok(conn)) = made else { return };
        let mut conn = Conn::Single(conn);
        let Ok(policy) = check_server(&mut conn, inner.link.eviction, inner.timeout).await else {
            return;
        };
        *inner.link.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
        *primary.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr.clone());
        *inner.link.conn.write().unwrap_or_else(|p| p.into_inner()) = Some(conn);
        bump(&inner.counters.shard().connects, 1);
        log::info!(
            target: "pace_redis",
            "the Sentinels name a new primary, {addr}: decisions move to it"
        );
    }
}

// The checks of a server a connection reaches: its login, its TLS
// handshake, its eviction policy.

/// Whether `policy` can evict keys that have an expiry.
fn evicts_limiter_keys(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// Why a server that answered is not used.
pub(crate) enum Refused {
    /// Its `maxmemory-policy` can evict keys and the builder refuses it.
    Policy(String),
    /// It refused the login (`NOAUTH`, `WRONGPASS`).
    Login(RedisError),
}

/// What kind of refusal an error is, if any.
pub(crate) enum Refusal {
    /// The server refused the credentials (or their absence).
    Auth,
    /// The TLS handshake failed.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Tls,
}

/// Whether `e` says the server refused the client (its login or its TLS
/// handshake) rather than that it cannot be reached.
pub(crate) fn refusal_kind(e: &RedisError) -> Option<Refusal> {
    // Known-wrong for mutation tests: every refusal counts as an outage.
    #[cfg(pace_mutant = "redis_refusal_is_outage")]
    return None;
    #[allow(unreachable_code)]
    if e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
    {
        return Some(Refusal::Auth);
    }
    #[cfg(feature = "tls")]
    {
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
        while let Some(s) = source {
            if s.is::<rustls::Error>() {
                return Some(Refusal::Tls);
            }
            if let Some(inner) = s
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                if inner.is::<rustls::Error>() {
                    return Some(Refusal::Tls);
                }
            }
            source = s.source();
        }
    }
    None
}

/// Checks a new connection's server: the login (a server with
/// `requirepass` accepts a connection without a password, then answers
/// every command `NOAUTH`), then the `maxmemory-policy` (`INFO memory`)
/// under `check`. `Ok(policy)` to use the server (`None` when the policy
/// was not read), `Err` to refuse it.
pub(crate) async fn check_server(
    conn: &mut Conn,
    check: EvictionCheck,
    timeout: Duration,
) -> Result<Option<String>, Refused> {
    let cmd = if check == EvictionCheck::Ignore {
        redis::cmd("PING")
    } else {
        let mut c = redis::cmd("INFO");
        c.arg("memory");
        c
    };
    let read = tokio::time::timeout(timeout, cmd.query_async::<Value>(conn)).await;
    let reply = match read {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) if refusal_kind(&e).is_some() => return Err(Refused::Login(e)),
        _ => None,
    };
    if check == EvictionCheck::Ignore {
        return Ok(None);
    }
    let Some(policy) = reply.as_ref().and_then(maxmemory_policy) else {
        log::warn!(
            target: "pace_redis",
            "could not read the server's maxmemory-policy (INFO memory); \
             if it can evict keys, a lost key hands out a full bucket"
        );
        return Ok(None);
    };
    if evicts_limiter_keys(&policy) {
        if check == EvictionCheck::Refuse {
            return Err(Refused::Policy(policy));
        }
        log::warn!(
            target: "pace_redis",
            "the server's maxmemory-policy is {policy}: under memory pressure it evicts \
             the limiter's keys, and each evicted key hands out a full bucket \
             (at most one capacity of extra admissions); noeviction avoids it"
        );
    }
    Ok(Some(policy))
}

/// `maxmemory_policy` of an `INFO` reply (one text, or one per node).
fn maxmemory_policy(v: &Value) -> Option<String> {
    let text = |v: &Value| -> Option<String> {
        match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            Value::VerbatimString { text, .. } => Some(text.clone()),
            _ => None,
        }
    };
    let find = |t: &str| {
        t.lines()
            .find_map(|l| l.strip_prefix("maxmemory_policy:"))
            .map(|p| p.trim().to_string())
    };
    match v {
        Value::Map(nodes) => {
            // Several nodes: the first that evicts, else the first read.
            let all: Vec<String> = nodes
                .iter()
                .filter_map(|(_, v)| text(v))
                .filter_map(|t| find(&t))
                .collect();
            all.iter()
                .find(|p| evicts_limiter_keys(p))
                .or(all.first())
                .cloned()
        }
        other => find(&text(other)?),
    }
}
