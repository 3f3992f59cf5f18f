//! What a decision answers: a [`Reservation`], a [`Denied`], a [`Peek`],
//! and where each came from ([`Source`]).

use std::time::Duration;

use pace::DenyReason;

#[cfg(doc)]
use crate::{Hold, RedisPace};

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The script, on the server.
    Server,
    /// The local cache of denials (no round trip).
    Cache,
    /// The local fallback limiter (Redis unavailable).
    Local,
    /// The request itself (`n == 0`, or `n` above the capacity): no round trip.
    Request,
    /// A lease's tokens, spent locally (no round trip;
    /// [`Builder::leases`](crate::Builder::leases)).
    Lease,
}

/// A denied request. Nothing was debited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    pub(crate) reason: DenyReason,
    pub(crate) wait_ns: u64,
    pub(crate) server_now_ns: Option<u64>,
    pub(crate) source: Source,
    pub(crate) remaining: Option<u64>,
    pub(crate) reset_ns: Option<u64>,
}

impl Denied {
    /// The wait until this request would be admitted if nothing else touched
    /// the key; [`Duration::MAX`] when it never will be. A server's answer
    /// counts what the key holds in [`Hold`]s as spent, and a hold that
    /// expires before that time settles as kept from its expiry, which can
    /// push the time further: the wait counts that too, so a retry after it
    /// passes unless another call touched the key. A denial of the local
    /// cache ([`Source::Cache`]) gives the wait by the debt the server last
    /// reported, without the expiries.
    #[doc(alias = "RetryAfter")]
    pub fn retry_after(&self) -> Duration {
        match self.reason {
            DenyReason::Exhausted | DenyReason::Held => Duration::from_nanos(self.wait_ns),
            _ => Duration::MAX,
        }
    }
    /// Why.
    pub fn reason(&self) -> DenyReason {
        self.reason
    }
    /// True when waiting will not help (`n` above the capacity).
    pub fn is_permanent(&self) -> bool {
        !matches!(self.reason, DenyReason::Exhausted | DenyReason::Held)
    }
    /// The server's time of the decision (ns since the Unix epoch), when the
    /// server decided.
    pub fn server_now_ns(&self) -> Option<u64> {
        self.server_now_ns
    }
    /// Where the answer came from.
    pub fn source(&self) -> Source {
        self.source
    }
    /// Whole tokens in the bucket at the decision (fewer than requested),
    /// when the server decided on an existing bucket, or the local fallback
    /// decided.
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }
    /// The time until the bucket is full again if nothing else touches it
    /// (`tat - now` on the server's clock, plus what the key holds in
    /// [`Hold`]s, counted as kept), when the server decided.
    pub fn reset_after(&self) -> Option<Duration> {
        self.reset_ns.map(Duration::from_nanos)
    }
}

/// A key's bucket as read by [`RedisPace::peek`], without a debit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peek {
    pub(crate) remaining: u64,
    pub(crate) reset_ns: Option<u64>,
    pub(crate) server_now_ns: Option<u64>,
    pub(crate) source: Source,
}

impl Peek {
    /// Whole tokens the key could reserve now.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }
    /// The time until the bucket is full (zero when it is; what the key
    /// holds in [`Hold`]s counts as kept), when the server answered.
    pub fn reset_after(&self) -> Option<Duration> {
        self.reset_ns.map(Duration::from_nanos)
    }
    /// The server's time of the reading (ns since the Unix epoch).
    pub fn server_now_ns(&self) -> Option<u64> {
        self.server_now_ns
    }
    /// [`Source::Server`], or [`Source::Local`] (the fallback's bucket).
    pub fn source(&self) -> Source {
        self.source
    }
}

/// An admitted debit. Dropping it keeps the debit; pass it to
/// [`RedisPace::refund`] when the exchange did not happen.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "dropping a Reservation keeps the debit; refund it if the exchange did not happen"]
pub struct Reservation {
    pub(crate) key: String,
    pub(crate) n: u64,
    pub(crate) prev: u64,
    pub(crate) tat: u64,
    pub(crate) server_now_ns: Option<u64>,
    pub(crate) source: Source,
    /// The local fallback's debit, for a decision of the fallback.
    pub(crate) local: Option<pace::Debit>,
    pub(crate) remaining: Option<u64>,
    /// A turn's wait after the decision (ns; 0 for a reserve).
    pub(crate) wait: u64,
    /// What the key held in holds at the decision (ns of tokens), counted
    /// as debt.
    pub(crate) held: u64,
    /// A leased reservation: the counter's generation that took it and the
    /// local instant of the decision.
    pub(crate) lease: Option<(u64, std::time::Instant)>,
}

impl Reservation {
    /// Tokens debited.
    pub fn tokens(&self) -> u64 {
        self.n
    }
    /// The key's `tat` before this debit (0: the bucket was full).
    pub fn prev_ns(&self) -> u64 {
        self.prev
    }
    /// The key's `tat` after this debit.
    pub fn tat_ns(&self) -> u64 {
        self.tat
    }
    /// The server's time of the decision (ns since the Unix epoch).
    pub fn server_now_ns(&self) -> Option<u64> {
        self.server_now_ns
    }
    /// Where the admission came from.
    pub fn source(&self) -> Source {
        self.source
    }
    /// Whole tokens left in the bucket after this debit (server and local
    /// fallback decisions; `None` for `n == 0`).
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }
    /// For a turn of [`RedisPace::acquire`] decided by the server: how long
    /// after the decision ([`server_now_ns`](Reservation::server_now_ns))
    /// its slot came, on the server's clock (`tat - now - capacity x
    /// interval`, zero when the debit fit at once). Zero for a reserve.
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait)
    }
    /// For a reservation of a lease ([`Source::Lease`]): the local
    /// instant of the decision, the reading its lease's deadline was
    /// checked against.
    pub fn leased_at(&self) -> Option<std::time::Instant> {
        self.lease.map(|(_, at)| at)
    }
    /// The time until the bucket is full again if nothing else touches it
    /// (`tat - now` on the server's clock, plus what the key holds in
    /// [`Hold`]s, counted as kept), when the server decided.
    pub fn reset_after(&self) -> Option<Duration> {
        match (self.source, self.server_now_ns) {
            (Source::Server, Some(now)) => Some(Duration::from_nanos(
                self.tat.saturating_sub(now).saturating_add(self.held),
            )),
            _ => None,
        }
    }
}
