//! pace's reserve/refund rule in Redis or Valkey: one limit shared by every
//! replica of a service.
//!
//! Each key is one bucket of `capacity` tokens refilled one per `interval` ns,
//! stored as one string, its *theoretical arrival time* `tat` (ns since the
//! Unix epoch). A Lua script reads the server's `TIME`, decides and debits in
//! one round trip; a full bucket is no key (the key expires when its bucket is
//! full). The rule is the core crate's (`pace::Pace`), and a property test
//! compares the two decision by decision.
//!
//! Connecting: [`Builder::connect`] (a URL), [`Builder::connect_client`] (a
//! `redis::Client`), [`Builder::connect_with`] (a `ConnectionManager` the
//! application already uses). Features:
//!
//! - `tls`: `rediss://` URLs (rustls with `ring`), `Builder::tls_root_ca`,
//!   `Builder::tls_client_cert`;
//! - `cluster`: `Builder::connect_cluster`, a Redis Cluster client;
//! - `sentinel`: `Builder::connect_sentinel`, the primary as Sentinel reports
//!   it, followed across failovers.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use pace::Rate;
//! use pace_redis::{Error, OnUnavailable, RedisPace};
//!
//! let limiter = RedisPace::builder(Rate::per_second(100)?)
//!     .capacity(20)
//!     .on_unavailable(OnUnavailable::LocalFallback { replicas: 3 })
//!     .connect("redis://127.0.0.1:6379/")
//!     .await?;
//! match limiter.reserve("client-7").await {
//!     Ok(reservation) => {
//!         // serve; if the exchange did not happen after all:
//!         limiter.refund(reservation).await?;
//!     }
//!     Err(Error::Denied(d)) => println!("retry after {:?}", d.retry_after()),
//!     Err(e) => println!("limiter unavailable: {e}"),
//! }
//! # Ok(()) }
//! ```
//!
//! A reserve's refund returns nothing once another debit landed on the key
//! after it, so overlapping reserve → check → refund cycles lose tokens
//! until the bucket refills. A [`Hold`] ([`RedisPace::hold`]) is exact: its
//! tokens stay apart from the key's settled debt until it is kept or
//! refunded (a second script call), and a hold left unresolved for the hold
//! limit ([`Builder::hold_limit`], 10 s) settles as kept:
//!
//! ```no_run
//! # async fn demo(limiter: pace_redis::RedisPace, served: bool) -> Result<(), pace_redis::Error> {
//! let hold = limiter.hold("client-7").await?;
//! if served {
//!     hold.keep().await?;
//! } else {
//!     hold.refund().await?; // exact, whatever else happened to the key
//! }
//! # Ok(()) }
//! ```
//!
//! A quota per call ([`RedisPace::reserve_with`]: a key's plan) and waiting
//! for a turn instead of a denial ([`RedisPace::acquire`]: one script call
//! takes a slot up to `max_wait` ahead on the server's clock, then one
//! sleep):
//!
//! ```no_run
//! # async fn demo(limiter: pace_redis::RedisPace, paid: bool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! use pace::{Quota, Rate};
//! use pace_redis::Error;
//!
//! let quota = if paid {
//!     Quota::new(Rate::per_second(1000)?, 200)?
//! } else {
//!     Quota::per_second(10)?
//! };
//! match limiter.reserve_with("client-7", quota).await {
//!     Ok(_kept) => {}
//!     Err(Error::Denied(d)) => println!("retry after {:?}", d.retry_after()),
//!     Err(e) => println!("{e}"),
//! }
//! // A background job: through as soon as its turn comes, at most 2 s away.
//! let turn = limiter.acquire("export", Duration::from_secs(2)).await?;
//! println!("waited {:?} by the server's clock", turn.wait());
//! # Ok(()) }
//! ```
// docs.rs (`--cfg docsrs`): each feature's items marked with the feature
// (`doc_cfg` marks every `#[cfg(feature = ...)]` item by itself).
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The README's snippets, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeSnippets;

mod builder;
mod call;
mod conn;
mod error;
mod hold;
mod lease;
mod lease_counter;
mod reply;
mod reservation;
mod reserve;
mod stats;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pace::{Pace, Rate};
use redis::Script;

pub use builder::{Builder, EvictionCheck, OnUnavailable};
pub use error::{BackendError, ConfigError, ConnectError, Error, KeyError};
pub use hold::Hold;
pub use lease::{LeaseAnswer, LeaseConfig};
pub use reservation::{Denied, Peek, Reservation, Source};
pub use stats::Stats;

use call::{CacheEntry, Limits};
use conn::{key_slot, Link};
use stats::Counters;

/// The largest `capacity x interval` (time for an empty bucket to refill):
/// 2^50 ns, about 13 days. It keeps every number the script computes below
/// 2^53, where Lua's doubles stop being exact (README: "Precision").
pub const MAX_TAU_NS: u64 = 1 << 50;

/// [`Builder::hold_limit`]'s default: 10 s.
pub const DEFAULT_HOLD_LIMIT: Duration = Duration::from_secs(10);

/// The furthest a stored `tat` may lie ahead of the server's clock (the
/// script's `MAX_AHEAD_S`, 2 x 10^6 s).
pub(crate) const MAX_AHEAD_NS: u64 = 2_000_000 * 1_000_000_000;

/// The script's source for one configuration: the constants, then the
/// rule (`src/pace.lua`, as the build script copied it: with a known-wrong
/// variant's patch applied under `PACE_MUTANT`, build.rs).
pub(crate) fn script_source(interval: u64, capacity: u64) -> String {
    format!(
        "local INTERVAL, CAP = {interval}, {capacity}\n{}",
        include_str!(concat!(env!("OUT_DIR"), "/pace.lua"))
    )
}

/// What a refund did: the core's [`pace::Refunded`], one outcome type for
/// every limiter. A server reservation refunds by the same rule as the core:
/// `Restored`, `Removed` (the state before the debit is a full bucket: the
/// key was deleted), `Superseded` (someone debited the key since),
/// `Refilled` (the key is gone: it expired full), `Nothing` (`n == 0`). A
/// reservation of the local fallback ([`Reservation::source`] is
/// `Source::Local`) refunds there, and the answer is the core's.
pub use pace::Refunded;

/// A rate limit shared through one Redis or Valkey server. Cheap to clone;
/// clones share the connection, the denial cache and the counters.
#[derive(Clone)]
#[doc(alias = "Limiter", alias = "redis_rate")]
pub struct RedisPace {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) link: Link,
    pub(crate) script: Script,
    pub(crate) rate: Rate,
    pub(crate) interval: u64,
    pub(crate) capacity: u64,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) backoff: Duration,
    pub(crate) policy: OnUnavailable,
    pub(crate) fallback: Option<Pace<String>>,
    pub(crate) cache: Option<Mutex<HashMap<String, CacheEntry>>>,
    /// Entries in `cache` (written under its lock): an empty cache costs a
    /// load, not a lock.
    pub(crate) cached: AtomicUsize,
    pub(crate) cache_entries: usize,
    pub(crate) max_key_bytes: usize,
    pub(crate) time_injection: bool,
    /// [`Builder::hold_limit`], ns.
    pub(crate) hold_limit: u64,
    pub(crate) origin: Instant,
    /// [`Builder::leases`]: `None` without.
    pub(crate) leases: Option<lease::Leases>,
    /// [`Builder::wait_replicas`]: `None` without.
    pub(crate) wait: Option<conn::Wait>,
    pub(crate) counters: Counters,
}

impl Inner {
    /// The configuration's quota.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            interval: self.interval,
            capacity: self.capacity,
        }
    }
}

impl RedisPace {
    /// The declared rate.
    pub fn rate(&self) -> Rate {
        self.inner.rate
    }

    /// Bucket capacity in tokens.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// The policy when Redis gives no decision.
    pub fn policy(&self) -> OnUnavailable {
        self.inner.policy
    }

    /// Nanoseconds per token.
    pub fn interval_ns(&self) -> u64 {
        self.inner.interval
    }

    /// The Redis key of `key`.
    pub fn redis_key(&self, key: &str) -> String {
        let prefix = &self.inner.prefix;
        let mut full = String::with_capacity(prefix.len() + key.len());
        full.push_str(prefix);
        full.push_str(key);
        full
    }

    /// The Redis Cluster slot of `key` (of its Redis key, prefix included).
    pub fn slot(&self, key: &str) -> u16 {
        key_slot(self.redis_key(key).as_bytes())
    }

    /// The server's `maxmemory-policy` as read on the last new connection
    /// (`None` before one, when not read, or with [`EvictionCheck::Ignore`]).
    pub fn maxmemory_policy(&self) -> Option<String> {
        self.inner
            .link
            .policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the limiter was built with leases
    /// ([`Builder::leases`](crate::Builder::leases)).
    pub fn has_leases(&self) -> bool {
        self.inner.leases.is_some()
    }

    /// Counters since the limiter was built.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            round_trips: c.sum(|s| &s.round_trips),
            script_loads: c.sum(|s| &s.script_loads),
            server_decisions: c.sum(|s| &s.server_decisions),
            cache_denials: c.sum(|s| &s.cache_denials),
            local_decisions: c.sum(|s| &s.local_decisions),
            unavailable: c.sum(|s| &s.unavailable),
            connects: c.sum(|s| &s.connects),
            outages: c.sum(|s| &s.outages),
            leased_decisions: c.sum(|s| &s.leased_decisions),
            lease_grants: c.sum(|s| &s.lease_grants),
            lease_releases: c.sum(|s| &s.lease_releases),
            lease_expiries: c.sum(|s| &s.lease_expiries),
            lease_stranded: c.sum(|s| &s.lease_stranded),
            unreplicated: c.sum(|s| &s.unreplicated),
        }
    }
}
