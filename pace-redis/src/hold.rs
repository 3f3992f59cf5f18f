//! Holds: exact reservations, kept apart from a key's settled debt until
//! kept or refunded.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pace::{DenyReason, Quota};
use redis::{Cmd, Value};

use crate::call::{Call, Prepared};
use crate::conn::{Replicated, Waited};
use crate::reply::{parse_hold, parse_resolve, HoldReply};
use crate::stats::bump;
#[cfg(doc)]
use crate::Builder;
use crate::{BackendError, Denied, Error, RedisPace, Refunded, Reservation, Source};

/// An exact reservation ([`RedisPace::hold`], the core's [`pace::Hold`] on
/// the server): its tokens are held apart from the key's settled debt until
/// [`keep`](Hold::keep) settles them or [`refund`](Hold::refund) returns
/// them, exactly, in any order. Each costs one more script call. Dropping
/// an unresolved hold keeps it, in a task spawned on the current runtime;
/// without a runtime (or if that call fails) the hold expires after the
/// hold limit and is settled as kept then. A hold of the local fallback
/// ([`Source::Local`]) is a hold of the local `pace::Pace`, resolved there.
#[must_use = "dropping a Hold keeps it (one more script call); keep or refund it"]
pub struct Hold {
    /// `None` once resolved.
    limiter: Option<RedisPace>,
    key: String,
    id: u64,
    n: u64,
    server_now_ns: Option<u64>,
    expires_ns: Option<u64>,
    source: Source,
    local: Option<pace::Debit>,
    remaining: Option<u64>,
    reset_ns: Option<u64>,
    /// A lease's hold: the local instant of its decision.
    leased_at: Option<Instant>,
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("key", &self.key)
            .field("id", &format_args!("{:x}", self.id))
            .field("n", &self.n)
            .field("server_now_ns", &self.server_now_ns)
            .field("expires_ns", &self.expires_ns)
            .field("source", &self.source)
            .field("remaining", &self.remaining)
            .finish()
    }
}

impl Hold {
    /// For a hold of a lease ([`Source::Lease`]): the local instant of the
    /// decision, the reading its lease's deadline was checked against.
    pub fn leased_at(&self) -> Option<Instant> {
        self.leased_at
    }

    /// Tokens held.
    pub fn tokens(&self) -> u64 {
        self.n
    }
    /// The server's time of the decision (ns since the Unix epoch): a keep
    /// settles the hold from this reading.
    pub fn server_now_ns(&self) -> Option<u64> {
        self.server_now_ns
    }
    /// When the hold expires on the server's clock (decision + hold limit),
    /// for a hold of the server.
    pub fn expires_at_ns(&self) -> Option<u64> {
        self.expires_ns
    }
    /// Where the admission came from.
    pub fn source(&self) -> Source {
        self.source
    }
    /// Whole tokens left in the bucket after this hold (counting every
    /// hold as spent).
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }
    /// The time until the bucket is full again if every hold is kept and
    /// nothing else touches it, when the server decided.
    pub fn reset_after(&self) -> Option<Duration> {
        self.reset_ns.map(Duration::from_nanos)
    }

    /// Keeps the hold: its tokens become a debit from the decision's own
    /// reading (what dropping it does). False when there was nothing to
    /// settle: the hold had expired (settled as kept from its expiry
    /// already), the key was lost, or the hold is of zero tokens.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when Redis gives no answer; the hold then
    /// expires after the hold limit and settles as kept.
    pub async fn keep(self) -> Result<bool, Error> {
        Ok(self.resolve(true, None).await? == Refunded::Restored)
    }

    /// Refunds the hold: its tokens come back exactly, whatever happened to
    /// the key since ([`Refunded::Restored`]); a hold that expired, or whose
    /// key was lost, returns nothing ([`Refunded::Expired`]); a hold of zero
    /// tokens answers [`Refunded::Nothing`]. A hold of the local fallback
    /// answers as the core's [`pace::Hold::refund`].
    ///
    /// # Errors
    /// [`Error::Unavailable`] when Redis gives no answer; the hold then
    /// expires after the hold limit and settles as kept (fewer admissions,
    /// never more).
    pub async fn refund(self) -> Result<Refunded, Error> {
        self.resolve(false, None).await
    }

    /// [`keep`](Hold::keep) at `now_ns` (tests; needs
    /// [`Builder::time_injection`]).
    ///
    /// # Errors
    /// As `keep`, and [`Error::TimeInjectionDisabled`].
    pub async fn keep_at(self, now_ns: u64) -> Result<bool, Error> {
        Ok(self.resolve(true, Some(now_ns)).await? == Refunded::Restored)
    }

    /// [`refund`](Hold::refund) at `now_ns` (tests; needs
    /// [`Builder::time_injection`]).
    ///
    /// # Errors
    /// As `refund`, and [`Error::TimeInjectionDisabled`].
    pub async fn refund_at(self, now_ns: u64) -> Result<Refunded, Error> {
        self.resolve(false, Some(now_ns)).await
    }

    /// Keeps (`keep`) or refunds the hold: `Restored` when it was resolved
    /// now, `Expired` when there was nothing to resolve, `Nothing` for zero
    /// tokens; a local refund answers the core's outcome.
    async fn resolve(mut self, keep: bool, now: Option<u64>) -> Result<Refunded, Error> {
        if now.is_some()
            && !self
                .limiter
                .as_ref()
                .is_some_and(|l| l.inner.time_injection)
        {
            return Err(Error::TimeInjectionDisabled);
        }
        if let Some(done) = self.resolve_now(keep) {
            return Ok(done);
        }
        let Some(limiter) = self.limiter.take() else {
            return Ok(Refunded::Nothing);
        };
        let key = std::mem::take(&mut self.key);
        let found = limiter.resolve_hold(&key, self.id, keep, now).await?;
        Ok(if found {
            Refunded::Restored
        } else {
            Refunded::Expired
        })
    }

    /// Keeps the hold at once when that needs no round trip, as
    /// [`keep`](Hold::keep) answers: a lease's hold ([`Source::Lease`],
    /// kept as taken) or the local fallback's. `None` for a hold of the
    /// server, left as it was (for [`keep`](Hold::keep)); once answered,
    /// the hold is resolved and dropping it does nothing.
    pub fn try_keep_now(&mut self) -> Option<bool> {
        self.resolve_now(true).map(|r| r == Refunded::Restored)
    }

    /// Refunds the hold at once when that needs no round trip, as
    /// [`refund`](Hold::refund) answers: a lease's hold (back to the
    /// lease's pool while no report counted it; else it stays kept,
    /// [`Refunded::Superseded`]) or the local fallback's. `None` for a hold
    /// of the server, left as it was (for [`refund`](Hold::refund)); once
    /// answered, the hold is resolved and dropping it does nothing.
    pub fn try_refund_now(&mut self) -> Option<Refunded> {
        self.resolve_now(false)
    }

    /// Resolves a hold that needs no round trip; `None` for a hold of the
    /// server, left as it was.
    fn resolve_now(&mut self, keep: bool) -> Option<Refunded> {
        if self.source == Source::Server && self.limiter.is_some() {
            return None;
        }
        let Some(limiter) = self.limiter.take() else {
            return Some(Refunded::Nothing);
        };
        let key = std::mem::take(&mut self.key);
        Some(match self.source {
            Source::Local => limiter.resolve_local(&key, self.local.take(), keep),
            // A lease's hold (`id`: the counter's generation that took
            // it): kept as taken, or back to the pool while unreported.
            Source::Lease if keep => Refunded::Restored,
            Source::Lease => limiter.lease_give_back(&key, self.id, self.n),
            _ => Refunded::Nothing,
        })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let Some(limiter) = self.limiter.take() else {
            return;
        };
        match self.source {
            Source::Server => {}
            Source::Local => {
                // The local fallback's hold: kept there, at once.
                limiter.resolve_local(&self.key, self.local.take(), true);
                return;
            }
            _ => return,
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // it expires after the hold limit and settles as kept
        };
        let key = std::mem::take(&mut self.key);
        let id = self.id;
        runtime.spawn(async move {
            let _ = limiter.resolve_hold(&key, id, true, None).await;
        });
    }
}

/// A hold's id: 64 random bits (std's per-instance SipHash keys over a
/// process-wide counter). The script refuses an id already held on the key.
fn hold_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

impl RedisPace {
    /// Holds one token of `key` exactly (README: "Holds"): decided like
    /// [`reserve`](RedisPace::reserve), counting every hold already on the
    /// key as spent, but kept apart from the key's settled debt until
    /// [`Hold::keep`] or [`Hold::refund`] (a second script call), so that
    /// a refund returns exactly its tokens in any order. A hold left
    /// unresolved for the hold limit ([`Builder::hold_limit`], default 10 s)
    /// settles as kept.
    ///
    /// # Errors
    /// As [`reserve_n`](RedisPace::reserve_n).
    pub async fn hold(&self, key: &str) -> Result<Hold, Error> {
        self.hold_n(key, 1).await
    }

    /// [`hold`](RedisPace::hold) of `n` tokens at once. `n == 0` is
    /// admitted and touches nothing.
    ///
    /// # Errors
    /// As [`reserve_n`](RedisPace::reserve_n).
    pub async fn hold_n(&self, key: &str, n: u64) -> Result<Hold, Error> {
        let call = self.quota_call(n, None, None)?;
        self.hold_inner(key, call, None).await
    }

    /// [`hold`](RedisPace::hold) under the call's own `quota` (see
    /// [`reserve_with`](RedisPace::reserve_with)).
    ///
    /// # Errors
    /// As [`reserve_n_with`](RedisPace::reserve_n_with).
    pub async fn hold_with(&self, key: &str, quota: Quota) -> Result<Hold, Error> {
        self.hold_n_with(key, 1, quota).await
    }

    /// [`hold_n`](RedisPace::hold_n) under the call's own `quota`.
    ///
    /// # Errors
    /// As [`reserve_n_with`](RedisPace::reserve_n_with).
    pub async fn hold_n_with(&self, key: &str, n: u64, quota: Quota) -> Result<Hold, Error> {
        let call = self.quota_call(n, Some(quota), None)?;
        self.hold_inner(key, call, None).await
    }

    /// [`hold_n_with`](RedisPace::hold_n_with) at `now_ns` (`quota`
    /// `None`: the configuration's); tests, needs
    /// [`Builder::time_injection`].
    ///
    /// # Errors
    /// As `hold_n_with`, and [`Error::TimeInjectionDisabled`].
    pub async fn hold_n_at(
        &self,
        key: &str,
        n: u64,
        quota: Option<Quota>,
        now_ns: u64,
    ) -> Result<Hold, Error> {
        if !self.inner.time_injection {
            return Err(Error::TimeInjectionDisabled);
        }
        let call = self.quota_call(n, quota, None)?;
        self.hold_inner(key, call, Some(now_ns)).await
    }

    /// The hold limit, ns ([`Builder::hold_limit`]).
    pub fn hold_limit(&self) -> Duration {
        Duration::from_nanos(self.inner.hold_limit)
    }

    async fn hold_inner(&self, key: &str, call: Call, now: Option<u64>) -> Result<Hold, Error> {
        if self.any_leased()
            && now.is_none()
            && call.quota.is_none()
            && call.wait == 0
            && call.n >= 1
        {
            // A lease's tokens hold locally, as a leased reserve: kept as
            // taken, refunded to the pool while unreported.
            let full = self.checked_key(key)?;
            if call.n <= call.limits.capacity {
                if let Ok(r) = self.leased(full, call.n) {
                    let Some((generation, at)) = r.lease else {
                        return Err(Error::Unavailable(BackendError::NotConnected));
                    };
                    return Ok(Hold {
                        limiter: Some(self.clone()),
                        key: r.key.clone(),
                        id: generation,
                        n: r.n,
                        server_now_ns: None,
                        expires_ns: None,
                        source: Source::Lease,
                        local: None,
                        remaining: None,
                        reset_ns: None,
                        leased_at: Some(at),
                    });
                }
            }
        }
        let sent_at = Instant::now();
        let (key, call) = match self.prepare(key, call, sent_at) {
            Prepared::Done(r) => return r.map(|r| self.hold_of(r)),
            Prepared::Send { key, call } => (key, call),
        };
        let id = hold_id();
        let cmd = self.hold_cmd(&key, id, call, now);
        let reply = self.eval_admitting(&cmd, Waited::Decision).await;
        // Known-wrong variant for mutation tests: a key only held never
        // gets hot, and no lease decides its holds.
        #[cfg(not(pace_mutant = "redis_hold_not_leased"))]
        if self.inner.leases.is_some() && now.is_none() && call.quota.is_none() && call.wait == 0 {
            // A key only held gets hot, and leased, as a reserved one.
            self.heat(&key);
        }
        self.finish_hold(key, id, call, sent_at, reply)
    }

    /// A hold: `h id n interval capacity hold_limit` (and `now`).
    #[inline]
    fn hold_cmd(&self, key: &str, id: u64, call: Call, now: Option<u64>) -> Cmd {
        let mut cmd = self.script_cmd(key);
        cmd.arg("h")
            .arg(format!("{id:x}"))
            .arg(call.n)
            .arg(call.limits.interval)
            .arg(call.limits.capacity)
            .arg(self.inner.hold_limit);
        if let Some(now) = now {
            cmd.arg(now);
        }
        cmd
    }

    /// The hold `id` as the server decided it, or else as the local
    /// fallback (if any) decides it.
    #[inline]
    fn finish_hold(
        &self,
        key: String,
        id: u64,
        call: Call,
        sent_at: Instant,
        reply: Result<(Value, Replicated), BackendError>,
    ) -> Result<Hold, Error> {
        match reply.and_then(|(v, replicated)| parse_hold(&v).map(|d| (d, replicated))) {
            Ok((decided @ HoldReply::Admitted { .. }, replicated)) => {
                match self.usable(replicated) {
                    Ok(()) => self.server_hold(key, id, call, sent_at, decided),
                    Err(e) => {
                        bump(&self.inner.counters.shard().server_decisions, 1);
                        // Not used: the hold is released (exact), or it
                        // would settle as kept at its expiry (the
                        // known-wrong variant `redis_unused_kept`).
                        #[cfg(not(pace_mutant = "redis_unused_kept"))]
                        self.release_in_background(key.clone(), id);
                        self.local_hold(key, call, e)
                    }
                }
            }
            Ok((decided, _)) => self.server_hold(key, id, call, sent_at, decided),
            Err(e) => self.local_hold(key, call, e),
        }
    }

    /// The server's decision on the hold `id`.
    #[inline]
    fn server_hold(
        &self,
        key: String,
        id: u64,
        call: Call,
        sent_at: Instant,
        decided: HoldReply,
    ) -> Result<Hold, Error> {
        let inner = &*self.inner;
        let limits = call.limits;
        bump(&inner.counters.shard().server_decisions, 1);
        match decided {
            HoldReply::Admitted { debt, held, now } => {
                let debt = debt.saturating_add(held);
                Ok(Hold {
                    limiter: Some(self.clone()),
                    key,
                    id,
                    n: call.n,
                    server_now_ns: Some(now),
                    expires_ns: Some(now.saturating_add(inner.hold_limit)),
                    source: Source::Server,
                    local: None,
                    remaining: Some(limits.tokens_at_debt(debt)),
                    reset_ns: Some(debt),
                    leased_at: None,
                })
            }
            HoldReply::Denied { wait, debt, now } => {
                let (settled, held) = debt.unwrap_or_else(|| {
                    let debt = wait
                        .saturating_add(limits.tau())
                        .saturating_sub(call.n.saturating_mul(limits.interval));
                    (debt, 0)
                });
                let debt = settled.saturating_add(held);
                // Only the settled debt is remembered (see reserve.rs).
                self.remember_denial(&key, sent_at, settled);
                Err(Error::Denied(Denied {
                    reason: if held > 0 {
                        DenyReason::Held
                    } else {
                        DenyReason::Exhausted
                    },
                    wait_ns: wait,
                    server_now_ns: Some(now),
                    source: Source::Server,
                    remaining: Some(limits.tokens_at_debt(debt)),
                    reset_ns: Some(debt),
                }))
            }
            HoldReply::Never { now } => Err(Error::Denied(Denied {
                reason: DenyReason::ExceedsCapacity,
                wait_ns: u64::MAX,
                server_now_ns: Some(now),
                source: Source::Server,
                remaining: None,
                reset_ns: None,
            })),
        }
    }

    /// A hold without the server's decision (`e`): held on the local
    /// fallback's `pace::Pace`, or [`Error::Unavailable`] without one.
    fn local_hold(&self, key: String, call: Call, e: BackendError) -> Result<Hold, Error> {
        let n = call.n;
        self.local_decision(key, call, e, |local, key, quota| {
            match quota {
                None => local.hold_n(key, n),
                Some(q) => local.hold_n_with(key, n, q),
            }
            .map(pace::Hold::detach)
        })
        .map(|r| self.hold_of(r))
    }

    /// A hold answered without the script (`n == 0`, the local fallback).
    fn hold_of(&self, r: Reservation) -> Hold {
        let Reservation {
            ref key,
            n,
            source,
            local,
            remaining,
            ..
        } = r;
        Hold {
            limiter: Some(self.clone()),
            key: key.clone(),
            id: 0,
            n,
            server_now_ns: None,
            expires_ns: None,
            source,
            local,
            remaining,
            reset_ns: None,
            leased_at: None,
        }
    }

    /// Refunds the server's hold `id` of `key` in a task spawned on the
    /// current runtime (a hold the standbys did not acknowledge); without
    /// a runtime it settles as kept at its expiry (fewer admissions).
    fn release_in_background(&self, key: String, id: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limiter = self.clone();
        runtime.spawn(async move {
            let _ = limiter.resolve_hold(&key, id, false, None).await;
        });
    }

    /// Keeps or refunds the server's hold `id` of `key`: true when the key
    /// had it, false when not (expired, lost).
    async fn resolve_hold(
        &self,
        key: &str,
        id: u64,
        keep: bool,
        now: Option<u64>,
    ) -> Result<bool, Error> {
        let inner = &*self.inner;
        let mut cmd = self.script_cmd(key);
        cmd.arg(if keep { "k" } else { "x" }).arg(format!("{id:x}"));
        if let Some(now) = now {
            cmd.arg(now);
        }
        let reply = if keep {
            // A keep lost with its primary leaves the hold to settle as
            // kept at its expiry: fewer admissions, never more.
            self.eval(&cmd).await
        } else {
            self.eval_release(&cmd, inner.hold_limit).await
        };
        match reply.and_then(|v| parse_resolve(&v)) {
            Ok(found) => {
                bump(&inner.counters.shard().server_decisions, 1);
                if found && !keep {
                    if let Some(cache) = &inner.cache {
                        let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
                        map.remove(key);
                        inner.cached.store(map.len(), Ordering::Relaxed);
                    }
                }
                Ok(found)
            }
            Err(e) => {
                bump(&inner.counters.shard().unavailable, 1);
                Err(Error::Unavailable(e))
            }
        }
    }

    /// Keeps or refunds a hold of the local fallback (`debit`, detached):
    /// as [`Hold::resolve`] answers.
    fn resolve_local(&self, key: &str, debit: Option<pace::Debit>, keep: bool) -> Refunded {
        let inner = &*self.inner;
        let (Some(debit), Some(local)) = (debit, &inner.fallback) else {
            return Refunded::Nothing;
        };
        let local_key = key.strip_prefix(inner.prefix.as_str()).unwrap_or(key);
        if !keep {
            return local.refund(local_key, debit);
        }
        if local.keep(local_key, debit) {
            Refunded::Restored
        } else {
            Refunded::Expired
        }
    }
}
