//! What a [`Limit`](crate::Limit) reserves from: a local `pace::Pace`, or
//! a limit shared across replicas that answers asynchronously.

use std::error::Error;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use pace::{Clock, DenyReason, Pace, Quota, Rate};

/// A wait for a turn in flight (see [`AsyncLimit::acquire`]). Dropping it
/// before the turn gives the turn up.
pub type Acquire<D> = Pin<Box<dyn Future<Output = Result<D, Refusal>> + Send + 'static>>;

/// Why a limit refused a reservation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Refusal {
    /// Not enough tokens now: wait this long.
    Exhausted {
        /// The exact wait.
        retry_after: Duration,
    },
    /// Waiting does not help (a cost above the capacity, or a clock past the
    /// limiter's time space).
    Permanent(DenyReason),
    /// The limit gave no decision (a shared store that is down and set to
    /// fail closed). The layer answers `503` with `Retry-After`.
    Unavailable {
        /// Why.
        error: Box<dyn Error + Send + Sync>,
        /// When the limit tries its store again, if it knows (a
        /// `RedisPace`: the rest of its circuit's backoff); the layer's
        /// `Retry-After` is it in whole seconds, rounded up, at least 1 (1
        /// when `None`).
        retry_after: Option<Duration>,
    },
}

impl Refusal {
    /// [`Refusal::Unavailable`] for `error`, without a known wait.
    pub fn unavailable(error: impl Into<Box<dyn Error + Send + Sync>>) -> Refusal {
        Refusal::Unavailable {
            error: error.into(),
            retry_after: None,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Exhausted { retry_after } => {
                write!(f, "exhausted; retry after {retry_after:?}")
            }
            Refusal::Permanent(r) => write!(f, "denied for good ({r:?})"),
            Refusal::Unavailable { error, .. } => write!(f, "no decision: {error}"),
        }
    }
}

impl From<pace::Denied> for Refusal {
    fn from(d: pace::Denied) -> Refusal {
        if d.is_permanent() {
            Refusal::Permanent(d.reason())
        } else {
            Refusal::Exhausted {
                retry_after: d.retry_after(),
            }
        }
    }
}

/// A limit a [`Limit`](crate::Limit) reserves from, keyed by `K`: a local
/// [`Pace`] (which answers at once), or a limit shared across replicas
/// (which answers after a round trip; feature `redis` implements it for
/// `pace_redis::RedisPace`).
///
/// The layer reserves its limits in order and starts a limit's
/// reservation only once every limit before it admitted; when one refuses,
/// the ones before it are refunded (newest first). A request whose
/// response future is dropped while a reservation is in flight keeps what
/// was admitted. A limit the layer may refund that [`holds`](Self::holds)
/// is reserved with [`hold`](Self::hold) (or its variants) and, when not
/// refunded, settled with [`keep`](Self::keep); a limit without holds is
/// reserved plainly whatever the layer does with it.
pub trait AsyncLimit<K>: Send + Sync + 'static {
    /// What an admission holds until the response, to refund it.
    type Debit: Send + 'static;
    /// A reservation in flight.
    type Reserve: Future<Output = Result<Self::Debit, Refusal>> + Send + Unpin + 'static;

    /// Starts reserving `n` tokens of `key`.
    fn reserve(&self, key: &K, n: u64) -> Self::Reserve;

    /// The decision on `n` tokens of `key` now, for a limit that decides
    /// without waiting (a local one); `None` (the default) for one that
    /// needs a round trip: the layer then calls [`reserve`](Self::reserve).
    /// A request whose limits all decide now is decided inside the
    /// service's `call`.
    #[inline]
    fn reserve_now(&self, key: &K, n: u64) -> Option<Result<Self::Debit, Refusal>> {
        let _ = (key, n);
        None
    }

    /// [`reserve_now`](Self::reserve_now) for a debit the layer keeps at
    /// once (a limit it never refunds, without fields to write): only the
    /// decision. By default, `reserve_now`'s with its debit dropped; a
    /// `pace::Pace` takes [`check_key_n`](pace::Pace::check_key_n), which
    /// carries no debit back.
    #[inline]
    fn admit_now(&self, key: &K, n: u64) -> Option<Result<(), Refusal>> {
        self.reserve_now(key, n).map(|r| r.map(drop))
    }

    /// Whether [`reserve_now`](Self::reserve_now) always decides (a local
    /// limit): the layer then reserves it without keeping a state per
    /// request. False by default.
    #[inline]
    fn decides_at_once(&self) -> bool {
        false
    }

    /// Whether the limit decides with a quota given per call
    /// ([`reserve_with`](Self::reserve_with)). False by default: the layer
    /// then ignores a request's quota ([`Limit::quota`](crate::Limit::quota))
    /// and the limit's own applies, in the decision and in the fields.
    #[inline]
    fn takes_quota(&self) -> bool {
        false
    }

    /// Starts reserving `n` tokens of `key` under `quota` instead of the
    /// limit's own. By default (a limit that cannot take a quota), the plain
    /// [`reserve`](Self::reserve).
    #[inline]
    fn reserve_with(&self, key: &K, n: u64, quota: Quota) -> Self::Reserve {
        let _ = quota;
        self.reserve(key, n)
    }

    /// [`reserve_now`](Self::reserve_now) under `quota`. By default, the
    /// plain [`reserve_now`](Self::reserve_now).
    #[inline]
    fn reserve_now_with(
        &self,
        key: &K,
        n: u64,
        quota: Quota,
    ) -> Option<Result<Self::Debit, Refusal>> {
        let _ = quota;
        self.reserve_now(key, n)
    }

    /// [`remaining`](Self::remaining) under `quota`. By default, the plain
    /// [`remaining`](Self::remaining).
    #[inline]
    fn remaining_with(&self, key: &K, debit: Option<&Self::Debit>, quota: Quota) -> Option<u64> {
        let _ = quota;
        self.remaining(key, debit)
    }

    /// Waits for `key`'s turn for `n` tokens (under `quota`, or the limit's
    /// own for `None`) up to `max_wait` instead of refusing: the future
    /// resolves when the turn comes, or at once with a refusal when it lies
    /// more than `max_wait` ahead or never comes. `None` (the default) for
    /// a limit that cannot wait: the layer then reserves as usual.
    fn acquire(
        self: Arc<Self>,
        key: &K,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Option<Acquire<Self::Debit>> {
        let _ = (key, n, quota, max_wait);
        None
    }

    /// Whether the limit has holds: [`hold`](Self::hold) (and its variants)
    /// and [`keep`](Self::keep) implemented, refunds of held debits exact.
    /// False by default: the layer then reserves the limit plainly and
    /// never calls `keep`.
    #[inline]
    fn holds(&self) -> bool {
        false
    }

    /// Starts *holding* `n` tokens of `key`: admitted or refused as
    /// [`reserve`](Self::reserve) decides, but a debit whose
    /// [`refund`](Self::refund) returns its tokens exactly in any order,
    /// whatever else happened on the key, and which the layer settles with
    /// [`keep`](Self::keep) when it is not refunded. The layer holds the
    /// limits whose reservation it may refund (see
    /// [`PaceLayerBuilder::limit`](crate::PaceLayerBuilder::limit)). By
    /// default (a limit without holds), the plain
    /// [`reserve`](Self::reserve).
    #[inline]
    fn hold(&self, key: &K, n: u64) -> Self::Reserve {
        self.reserve(key, n)
    }

    /// [`hold`](Self::hold) under `quota`. By default, the plain
    /// [`reserve_with`](Self::reserve_with).
    #[inline]
    fn hold_with(&self, key: &K, n: u64, quota: Quota) -> Self::Reserve {
        self.reserve_with(key, n, quota)
    }

    /// [`hold`](Self::hold) decided now (see
    /// [`reserve_now`](Self::reserve_now)). By default, the plain
    /// [`reserve_now`](Self::reserve_now).
    #[inline]
    fn hold_now(&self, key: &K, n: u64) -> Option<Result<Self::Debit, Refusal>> {
        self.reserve_now(key, n)
    }

    /// [`hold_now`](Self::hold_now) under `quota`. By default, the plain
    /// [`reserve_now_with`](Self::reserve_now_with).
    #[inline]
    fn hold_now_with(&self, key: &K, n: u64, quota: Quota) -> Option<Result<Self::Debit, Refusal>> {
        self.reserve_now_with(key, n, quota)
    }

    /// [`hold_now`](Self::hold_now) while `decide` runs, then
    /// [`keep`](Self::keep) if it returns `Ok` or [`refund`](Self::refund)
    /// if it returns `Err`: how the layer holds a limit that decides at
    /// once while the limits after it decide. `decide` gets the debit to
    /// look at. `None` when the limit does not decide at once. The default
    /// does exactly that; a `pace::Pace` does it in one pin of the epoch,
    /// its resolution without a clock reading ([`pace::Pace::hold_while`]).
    #[inline]
    fn hold_while<T, E>(
        &self,
        key: &K,
        n: u64,
        decide: impl FnOnce(&Self::Debit) -> Result<T, E>,
    ) -> Option<Result<Result<T, E>, Refusal>>
    where
        Self: Sized,
    {
        let debit = match self.hold_now(key, n)? {
            Ok(d) => d,
            Err(refusal) => return Some(Err(refusal)),
        };
        let out = decide(&debit);
        match out {
            Ok(_) => self.keep(key, debit),
            Err(_) => self.refund(key, debit),
        }
        Some(Ok(out))
    }

    /// Keeps `debit`: settles a held debit ([`hold`](Self::hold)) as spent.
    /// The layer calls it (on a limit that [`holds`](Self::holds)) for
    /// every debit of a held limit it does not refund (the response passed, the inner service failed, the response
    /// future was dropped after admission). By default it drops the debit,
    /// which keeps a plain reservation.
    #[inline]
    fn keep(&self, key: &K, debit: Self::Debit) {
        let _ = (key, debit);
    }

    /// Returns `debit` (by the limit's refund rule; a held debit exactly).
    /// A shared limit may finish it in the background.
    fn refund(&self, key: &K, debit: Self::Debit);

    /// Whole tokens `key` holds now, for the `RateLimit` field; `debit` is
    /// the request's admission (`None` once refunded). `None` when not
    /// known: the field then has no item for this limit.
    fn remaining(&self, key: &K, debit: Option<&Self::Debit>) -> Option<u64>;

    /// Tokens a full bucket holds.
    fn capacity(&self) -> u64;

    /// The limit's own quota (capacity and rate) in one reading, when it
    /// has one; `None` (the default): the layer reads
    /// [`capacity`](Self::capacity) and [`rate`](Self::rate).
    #[inline]
    fn own_quota(&self) -> Option<Quota> {
        None
    }

    /// The declared rate.
    fn rate(&self) -> Rate;

    /// Rows held, for the `pace_rows` gauge (`None`: not reported).
    fn rows(&self) -> Option<usize> {
        None
    }

    /// A shared limit's lease counts since it was built, for the
    /// `pace_lease_*` counters (`None`, the default: the limit has no
    /// leases, and the layer registers no such counter for it).
    fn leases(&self) -> Option<LeaseCounts> {
        None
    }
}

/// A shared limit's lease counts since it was built
/// ([`AsyncLimit::leases`]; `pace_redis::Stats` for a `RedisPace` with
/// leases), exported by the layer as counters labelled with the limit's
/// name: `pace_lease_decisions_total`, `pace_lease_granted_tokens_total`,
/// `pace_lease_released_tokens_total`, `pace_lease_expiries_total`,
/// `pace_lease_stranded_tokens_total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    /// Decisions a lease made locally (no round trip).
    pub decisions: u64,
    /// Tokens granted to the limit's leases.
    pub granted: u64,
    /// Tokens the leases gave back to the server unused.
    pub released: u64,
    /// Leases found settled at their expiry.
    pub expiries: u64,
    /// Tokens such leases held unspent (unavailable until their expiry
    /// plus the grace; never excess).
    pub stranded: u64,
}

impl<K, S, C> AsyncLimit<K> for Pace<K, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
{
    type Debit = pace::Debit;
    type Reserve = Ready<Result<pace::Debit, Refusal>>;

    #[inline]
    fn reserve(&self, key: &K, n: u64) -> Self::Reserve {
        ready(
            self.reserve_n(key, n)
                .map(pace::Reservation::detach)
                .map_err(Refusal::from),
        )
    }

    #[inline]
    fn reserve_now(&self, key: &K, n: u64) -> Option<Result<pace::Debit, Refusal>> {
        Some(
            self.reserve_n(key, n)
                .map(pace::Reservation::detach)
                .map_err(Refusal::from),
        )
    }

    #[inline]
    fn admit_now(&self, key: &K, n: u64) -> Option<Result<(), Refusal>> {
        Some(self.check_key_n(key, n).map_err(Refusal::from))
    }

    #[inline]
    fn decides_at_once(&self) -> bool {
        true
    }

    #[inline]
    fn takes_quota(&self) -> bool {
        true
    }

    #[inline]
    fn reserve_with(&self, key: &K, n: u64, quota: Quota) -> Self::Reserve {
        ready(
            self.reserve_n_with(key, n, quota)
                .map(pace::Reservation::detach)
                .map_err(Refusal::from),
        )
    }

    #[inline]
    fn reserve_now_with(
        &self,
        key: &K,
        n: u64,
        quota: Quota,
    ) -> Option<Result<pace::Debit, Refusal>> {
        Some(
            self.reserve_n_with(key, n, quota)
                .map(pace::Reservation::detach)
                .map_err(Refusal::from),
        )
    }

    #[inline]
    fn remaining_with(&self, key: &K, _: Option<&pace::Debit>, quota: Quota) -> Option<u64> {
        Some(self.peek_with(key, quota))
    }

    /// `Pace::acquire_n` (or `acquire_n_with`): one CAS for a slot up to
    /// `max_wait` ahead, then one sleep on `futures-timer` until the slot,
    /// in the order of the debits (first come, first served). Dropped before
    /// its turn, the reservation is refunded by the refund rule.
    fn acquire(
        self: Arc<Self>,
        key: &K,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Option<Acquire<pace::Debit>> {
        let key = key.clone();
        Some(Box::pin(async move {
            let turn = match quota {
                Some(q) => self.acquire_n_with(&key, n, q, max_wait).await,
                None => self.acquire_n(&key, n, max_wait).await,
            };
            turn.map(pace::Reservation::detach).map_err(Refusal::from)
        }))
    }

    #[inline]
    fn holds(&self) -> bool {
        true
    }

    /// `Pace::hold_n`, detached: refunded exactly in any order
    /// (`Pace::refund`), kept with `Pace::keep` (a second CAS on the row).
    #[inline]
    fn hold(&self, key: &K, n: u64) -> Self::Reserve {
        ready(
            self.hold_n(key, n)
                .map(pace::Hold::detach)
                .map_err(Refusal::from),
        )
    }

    #[inline]
    fn hold_with(&self, key: &K, n: u64, quota: Quota) -> Self::Reserve {
        ready(
            self.hold_n_with(key, n, quota)
                .map(pace::Hold::detach)
                .map_err(Refusal::from),
        )
    }

    #[inline]
    fn hold_now(&self, key: &K, n: u64) -> Option<Result<pace::Debit, Refusal>> {
        Some(
            self.hold_n(key, n)
                .map(pace::Hold::detach)
                .map_err(Refusal::from),
        )
    }

    #[inline]
    fn hold_now_with(&self, key: &K, n: u64, quota: Quota) -> Option<Result<pace::Debit, Refusal>> {
        Some(
            self.hold_n_with(key, n, quota)
                .map(pace::Hold::detach)
                .map_err(Refusal::from),
        )
    }

    /// `Pace::hold_while`: the hold, `decide` and the resolution in one pin
    /// of the epoch.
    #[inline]
    fn hold_while<T, E>(
        &self,
        key: &K,
        n: u64,
        decide: impl FnOnce(&pace::Debit) -> Result<T, E>,
    ) -> Option<Result<Result<T, E>, Refusal>> {
        Some(Pace::hold_while(self, key, n, decide).map_err(Refusal::from))
    }

    /// `Pace::keep`: a held debit is settled as spent (a plain one is kept
    /// already, and this does nothing).
    #[inline]
    fn keep(&self, key: &K, debit: pace::Debit) {
        Pace::keep(self, key, debit);
    }

    #[inline]
    fn refund(&self, key: &K, debit: pace::Debit) {
        Pace::refund(self, key, debit);
    }

    #[inline]
    fn remaining(&self, key: &K, _: Option<&pace::Debit>) -> Option<u64> {
        Some(self.peek(key))
    }

    fn capacity(&self) -> u64 {
        Pace::capacity(self)
    }

    #[inline]
    fn own_quota(&self) -> Option<Quota> {
        Some(Pace::quota(self))
    }

    fn rate(&self) -> Rate {
        Pace::rate(self)
    }

    #[inline]
    fn rows(&self) -> Option<usize> {
        Some(self.len())
    }
}

#[cfg(feature = "redis")]
pub use redis_impl::RedisDebit;

#[cfg(feature = "redis")]
mod redis_impl {
    use std::pin::Pin;

    use pace_redis::{Error as RedisError, Hold, RedisPace, Reservation, Source};

    use super::*;

    /// The refusal of `key` by `limiter` for `e`; no decision carries the
    /// wait until the limiter tries Redis again.
    fn refusal(e: RedisError, limiter: &RedisPace, key: &str) -> Refusal {
        match e {
            RedisError::Denied(d) if d.is_permanent() => Refusal::Permanent(d.reason()),
            RedisError::Denied(d) => Refusal::Exhausted {
                retry_after: d.retry_after(),
            },
            other => Refusal::Unavailable {
                error: Box::new(other),
                retry_after: Some(limiter.unavailable_for(key)),
            },
        }
    }

    /// What a request's admission by a `RedisPace` limit holds until its
    /// response: a plain reservation (a limit the layer never refunds, or
    /// a turn of [`Limit::wait_up_to`](crate::Limit::wait_up_to)), or a
    /// hold (a limit the layer may refund: exact refunds in any order).
    #[derive(Debug)]
    pub enum RedisDebit {
        /// `RedisPace::reserve_n` (or `acquire_n`, or their `_with` forms).
        Reserved(Reservation),
        /// `RedisPace::hold_n` (or `hold_n_with`).
        Held(Hold),
    }

    impl RedisDebit {
        /// Whole tokens left after the admission, when the server decided
        /// (the admission's own answer: no round trip).
        fn remaining(&self) -> Option<u64> {
            match self {
                RedisDebit::Reserved(r) if r.source() == Source::Server => r.remaining(),
                RedisDebit::Held(h) if h.source() == Source::Server => h.remaining(),
                _ => None,
            }
        }
    }

    /// Runs `f` on the current tokio runtime, if there is one.
    fn spawn<F: Future<Output = ()> + Send + 'static>(f: F) -> bool {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(f);
                true
            }
            Err(_) => false,
        }
    }

    /// A limit shared by every replica through Redis or Valkey, keyed by
    /// the key's `Display` form. It has holds: a limit the layer may refund
    /// (a [`refund_if`](crate::Limit::refund_if), or a limit after it) is
    /// held (`RedisPace::hold_n`), and its refund returns the request's
    /// tokens exactly, in any order, whatever other replicas did on the
    /// key; one the layer does not refund is kept (`Hold::keep`). A limit
    /// never refunded is reserved plainly (`RedisPace::reserve_n`, one
    /// script call). It takes a quota per request
    /// ([`Limit::quota`](crate::Limit::quota): `reserve_n_with`,
    /// `hold_n_with`), and waits for turns on the server's clock
    /// ([`Limit::wait_up_to`](crate::Limit::wait_up_to): `acquire_n`). A
    /// refund or a keep is a script call in a task spawned on the current
    /// tokio runtime (without one, a reservation's debit stays and a hold
    /// settles as kept after the hold limit). The `RateLimit` item comes
    /// from the admission's own answer (the server's clock and the key's
    /// new state, holds counted as spent), without another round trip;
    /// after a refund, or from the local fallback, it is left out.
    impl<K> AsyncLimit<K> for RedisPace
    where
        K: fmt::Display + Send + Sync + 'static,
    {
        type Debit = RedisDebit;
        type Reserve = Pin<Box<dyn Future<Output = Result<RedisDebit, Refusal>> + Send>>;

        fn reserve(&self, key: &K, n: u64) -> Self::Reserve {
            let this = self.clone();
            let key = key.to_string();
            Box::pin(async move {
                this.reserve_n(&key, n)
                    .await
                    .map(RedisDebit::Reserved)
                    .map_err(|e| refusal(e, &this, &key))
            })
        }

        #[inline]
        fn takes_quota(&self) -> bool {
            true
        }

        fn reserve_with(&self, key: &K, n: u64, quota: Quota) -> Self::Reserve {
            let this = self.clone();
            let key = key.to_string();
            Box::pin(async move {
                this.reserve_n_with(&key, n, quota)
                    .await
                    .map(RedisDebit::Reserved)
                    .map_err(|e| refusal(e, &this, &key))
            })
        }

        fn remaining_with(&self, _: &K, debit: Option<&RedisDebit>, _: Quota) -> Option<u64> {
            debit?.remaining()
        }

        /// `RedisPace::acquire_n` (or `acquire_n_with`): one script call
        /// takes a slot up to `max_wait` ahead on the server's clock, then
        /// one sleep until it; the requests of a key go through in the
        /// order the server debited them, whichever replica they came to.
        fn acquire(
            self: Arc<Self>,
            key: &K,
            n: u64,
            quota: Option<Quota>,
            max_wait: Duration,
        ) -> Option<Acquire<RedisDebit>> {
            // Known-wrong variant for mutation tests: a shared limit cannot
            // wait, and a queueing request is answered at once.
            if cfg!(pace_mutant = "tower_redis_no_turn") {
                return None;
            }
            let key = key.to_string();
            Some(Box::pin(async move {
                match quota {
                    Some(q) => self.acquire_n_with(&key, n, q, max_wait).await,
                    None => self.acquire_n(&key, n, max_wait).await,
                }
                .map(RedisDebit::Reserved)
                .map_err(|e| refusal(e, &self, &key))
            }))
        }

        #[inline]
        fn holds(&self) -> bool {
            // Known-wrong variant for mutation tests: the layer reserves a
            // shared limit plainly, and refunds it by the plain rule.
            !cfg!(pace_mutant = "tower_redis_plain")
        }

        fn hold(&self, key: &K, n: u64) -> Self::Reserve {
            let this = self.clone();
            let key = key.to_string();
            Box::pin(async move {
                this.hold_n(&key, n)
                    .await
                    .map(RedisDebit::Held)
                    .map_err(|e| refusal(e, &this, &key))
            })
        }

        fn hold_with(&self, key: &K, n: u64, quota: Quota) -> Self::Reserve {
            let this = self.clone();
            let key = key.to_string();
            Box::pin(async move {
                this.hold_n_with(&key, n, quota)
                    .await
                    .map(RedisDebit::Held)
                    .map_err(|e| refusal(e, &this, &key))
            })
        }

        /// `Hold::keep` in a spawned task (dropping a hold does the same);
        /// a lease's hold is kept at once, without a round trip
        /// (`Hold::try_keep_now`); a reservation is kept already.
        fn keep(&self, _: &K, debit: RedisDebit) {
            if let RedisDebit::Held(mut h) = debit {
                if h.try_keep_now().is_some() {
                    return;
                }
                spawn(async move {
                    if let Err(e) = h.keep().await {
                        tracing::warn!(target: "pace_tower", error = %e, "shared keep failed; the hold settles as kept after the hold limit");
                    }
                });
            }
        }

        /// A lease's hold goes back to its pool at once, without a round
        /// trip (`Hold::try_refund_now`); any other refund is a script call
        /// in a spawned task.
        fn refund(&self, _: &K, debit: RedisDebit) {
            let debit = match debit {
                RedisDebit::Held(mut h) => {
                    if h.try_refund_now().is_some() {
                        return;
                    }
                    RedisDebit::Held(h)
                }
                other => other,
            };
            let this = self.clone();
            spawn(async move {
                let out = match debit {
                    RedisDebit::Reserved(r) => this.refund(r).await.map(drop),
                    RedisDebit::Held(h) => h.refund().await.map(drop),
                };
                if let Err(e) = out {
                    tracing::warn!(target: "pace_tower", error = %e, "shared refund failed; the debit stays");
                }
            });
        }

        fn remaining(&self, _: &K, debit: Option<&RedisDebit>) -> Option<u64> {
            debit?.remaining()
        }

        fn capacity(&self) -> u64 {
            RedisPace::capacity(self)
        }

        fn rate(&self) -> Rate {
            RedisPace::rate(self)
        }

        fn leases(&self) -> Option<LeaseCounts> {
            if !self.has_leases() {
                return None;
            }
            let s = self.stats();
            Some(LeaseCounts {
                decisions: s.leased_decisions,
                granted: s.lease_grants,
                released: s.lease_releases,
                expiries: s.lease_expiries,
                stranded: s.lease_stranded,
            })
        }
    }
}
