//! How the limiter reaches Redis: the connector, the connection, the
//! circuit, reconnects, and the calls themselves (one script call, one
//! pipeline).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ErrorKind, RedisError, Value};

use crate::builder::check_eviction;
use crate::stats::bump;
use crate::{BackendError, EvictionCheck, Inner, RedisPace};

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
            Connector::Sentinel { sentinel, config } => {
                let client = sentinel.lock().await.async_get_client().await?;
                ConnectionManager::new_with_config(client, config.clone())
                    .await
                    .map(Conn::Single)
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
    /// The `maxmemory-policy` the last connection's server reported.
    pub(crate) policy: Mutex<Option<String>>,
    pub(crate) eviction: EvictionCheck,
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

fn is_noscript(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => e.code() == "NOSCRIPT",
        _ => false,
    }
}

impl RedisPace {
    fn circuit_open(&self) -> bool {
        let until = self.inner.down_until.load(Ordering::Relaxed);
        // 0: never opened (no clock read).
        until != 0 && (self.inner.origin.elapsed().as_nanos() as u64) < until
    }

    fn trip(&self, e: &BackendError) {
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
        if opens {
            let until = self.inner.origin.elapsed() + self.inner.backoff;
            self.inner
                .down_until
                .fetch_max(until.as_nanos() as u64, Ordering::Relaxed);
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
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let pause = inner.backoff.max(Duration::from_millis(10));
                let made = tokio::time::timeout(inner.timeout, inner.link.how.open()).await;
                if let Ok(Ok(mut conn)) = made {
                    let policy =
                        check_eviction(&mut conn, inner.link.eviction, inner.timeout).await;
                    let Ok(policy) = policy else {
                        // Refused: keep the fallback, try again later.
                        drop(inner);
                        tokio::time::sleep(pause).await;
                        continue;
                    };
                    *inner.link.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
                    bump(&inner.counters.shard().connects, 1);
                    // The circuit, if open, stays open for its backoff: a
                    // connection that lands on a replica again is replaced
                    // at most once per backoff.
                    *inner.link.conn.write().unwrap_or_else(|p| p.into_inner()) = Some(conn);
                    inner.link.connecting.store(false, Ordering::Release);
                    return;
                }
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
        if self.circuit_open() {
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
        if let Err(e) = &result {
            self.trip(e);
        }
        result
    }

    async fn load(&self, conn: &mut Conn) -> Result<(), RedisError> {
        bump(&self.inner.counters.shard().round_trips, 1);
        bump(&self.inner.counters.shard().script_loads, 1);
        self.inner.script.load_async(conn).await.map(|_| ())
    }

    /// A pipeline of `count` EVALSHAs; those answered NOSCRIPT are sent again
    /// after a load (the others ran and must not run twice).
    pub(crate) async fn pipeline(
        &self,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, BackendError> {
        if self.circuit_open() {
            return Err(BackendError::CircuitOpen);
        }
        let inner = &*self.inner;
        let Some(mut conn) = self.conn() else {
            return Err(BackendError::NotConnected);
        };
        let work = async {
            bump(&inner.counters.shard().round_trips, 1);
            let mut values = conn.req_packed_commands(pipe, 0, count).await?;
            let missing: Vec<usize> = values
                .iter()
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
                bump(&inner.counters.shard().round_trips, 1);
                let redone = conn.req_packed_commands(&again, 0, missing.len()).await?;
                for (i, v) in missing.into_iter().zip(redone) {
                    values[i] = v;
                }
            }
            Ok::<_, RedisError>(values)
        };
        let result = match tokio::time::timeout(inner.timeout, work).await {
            Ok(Ok(v)) if v.len() == count => Ok(v),
            Ok(Ok(v)) => Err(BackendError::BadReply(format!(
                "{} replies to {count} commands",
                v.len()
            ))),
            Ok(Err(e)) if e.is_timeout() => Err(BackendError::Timeout(inner.timeout)),
            Ok(Err(e)) => Err(BackendError::Redis(e)),
            Err(_) => Err(BackendError::Timeout(inner.timeout)),
        };
        match &result {
            Err(e) => self.trip(e),
            Ok(values) => {
                if let Some(e) = values.iter().find_map(not_primary_reply) {
                    self.trip(&BackendError::Redis(e));
                }
            }
        }
        result
    }
}
