//! The limiter's counters: [`Stats`], summed over per-thread shards.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(doc)]
use crate::RedisPace;

/// Counters since the limiter was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests written to the server (a pipeline of k decisions counts 1;
    /// a script load counts 1).
    pub round_trips: u64,
    /// `SCRIPT LOAD`s after a NOSCRIPT answer.
    pub script_loads: u64,
    /// Decisions (reserve or refund) the server made.
    pub server_decisions: u64,
    /// Denials answered from the local cache.
    pub cache_denials: u64,
    /// Decisions of the local fallback.
    pub local_decisions: u64,
    /// Calls that found Redis unavailable (timeout, error, open circuit).
    pub unavailable: u64,
    /// Connections made in the background (after starting with the server
    /// away, after `READONLY`/`MASTERDOWN`, or at a Sentinel's
    /// `+switch-master`).
    pub connects: u64,
    /// Outages begun: a failed call that opened a closed circuit (in a
    /// cluster, a node's), or a start with the server unreachable. Each is
    /// one warning in the log (target `pace_redis`), whatever the calls it
    /// refused.
    pub outages: u64,
    /// Reserves decided from a lease's local counter (no round trip;
    /// [`Builder::leases`](crate::Builder::leases)).
    pub leased_decisions: u64,
    /// Tokens granted to this limiter's leases (used once granted and,
    /// with standbys, acknowledged by them).
    pub lease_grants: u64,
    /// Tokens this limiter's leases released back to the server unused.
    pub lease_releases: u64,
    /// Leases found settled at their expiry (answered `Unknown` by the
    /// server, or re-created under their id): each starts a new lease.
    pub lease_expiries: u64,
    /// Tokens such leases held unspent locally: unavailable to every
    /// replica until their expiry plus the grace (never excess).
    pub lease_stranded: u64,
    /// Admissions the server made but fewer standbys than
    /// [`Builder::wait_replicas`](crate::Builder::wait_replicas)
    /// acknowledged in time: not used (answered as
    /// [`BackendError::NotReplicated`](crate::BackendError::NotReplicated),
    /// then the policy's), grants included.
    pub unreplicated: u64,
}

/// The counters of [`Stats`], in one shard per thread (up to
/// [`SHARDS`], then shared): a call bumps its own thread's counters, not a
/// cache line every thread writes; [`RedisPace::stats`] adds the shards.
#[derive(Default)]
pub(crate) struct Counters {
    shards: [Shard; SHARDS],
}

const SHARDS: usize = 8;

/// One thread's counters, on cache lines of their own.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Shard {
    pub(crate) round_trips: AtomicU64,
    pub(crate) script_loads: AtomicU64,
    pub(crate) server_decisions: AtomicU64,
    pub(crate) cache_denials: AtomicU64,
    pub(crate) local_decisions: AtomicU64,
    pub(crate) unavailable: AtomicU64,
    pub(crate) connects: AtomicU64,
    pub(crate) outages: AtomicU64,
    pub(crate) leased_decisions: AtomicU64,
    pub(crate) lease_grants: AtomicU64,
    pub(crate) lease_releases: AtomicU64,
    pub(crate) lease_expiries: AtomicU64,
    pub(crate) lease_stranded: AtomicU64,
    pub(crate) unreplicated: AtomicU64,
}

impl Counters {
    /// The calling thread's shard.
    pub(crate) fn shard(&self) -> &Shard {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
        }
        &self.shards[INDEX.with(|i| *i)]
    }

    /// The sum of one counter over the shards.
    pub(crate) fn sum(&self, field: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .map(|s| field(s).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

pub(crate) fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}
