//! Reserves, turns, refunds and peeks.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pace::{DenyReason, Quota};
use redis::{Cmd, Value};

use crate::call::{Call, Limits, Prepared};
use crate::conn::{again, key_slot, Replicated, Waited};
use crate::reply::{parse_peek, parse_refund, parse_reserve, ReserveReply};
use crate::stats::bump;
use crate::{
    BackendError, Denied, Error, Peek, RedisPace, Refunded, Reservation, Source, MAX_AHEAD_NS,
};
#[cfg(doc)]
use crate::{Builder, OnUnavailable, MAX_TAU_NS};

/// A turn being waited for ([`RedisPace::acquire`]): refunded, in a task
/// of its own, if dropped before the turn comes.
struct Turn {
    limiter: RedisPace,
    reservation: Option<Reservation>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            self.limiter.refund_in_background(r);
        }
    }
}

/// One pipeline of `reserve_many`: its slot (0 off a cluster), the commands,
/// and (request index, Redis key, call) of each.
type Group = (u16, redis::Pipeline, Vec<(usize, String, Call)>);

impl RedisPace {
    /// Debits one token from `key`'s bucket.
    ///
    /// # Errors
    /// See [`reserve_n`](RedisPace::reserve_n).
    #[doc(alias = "Allow", alias = "allow")]
    pub async fn reserve(&self, key: &str) -> Result<Reservation, Error> {
        self.reserve_n(key, 1).await
    }

    /// Debits `n` tokens at once, or none, on the server's clock. `n == 0` is
    /// admitted and touches nothing; `n` above the capacity is denied
    /// permanently; neither makes a round trip.
    ///
    /// # Errors
    /// [`Error::Denied`], [`Error::InvalidKey`], or, under
    /// [`OnUnavailable::FailClosed`], [`Error::Unavailable`].
    #[doc(alias = "AllowN", alias = "allow_n")]
    pub async fn reserve_n(&self, key: &str, n: u64) -> Result<Reservation, Error> {
        self.reserve_inner(key, self.default_call(n), None).await
    }

    /// [`reserve`](RedisPace::reserve) under the call's own `quota` (a
    /// key's plan, a tenant's limit). A key stores only its `tat`, so it
    /// keeps its debt across quotas: the kept admissions of a key in any
    /// window `[t1, t2]` cost at most `(t2 - t1) +` the largest horizon among
    /// their quotas, each token costing its quota's interval (the core's
    /// contract, `pace::Pace::reserve_with`).
    ///
    /// # Errors
    /// As [`reserve_n_with`](RedisPace::reserve_n_with).
    pub async fn reserve_with(&self, key: &str, quota: Quota) -> Result<Reservation, Error> {
        self.reserve_n_with(key, 1, quota).await
    }

    /// [`reserve_n`](RedisPace::reserve_n) under the call's own `quota` (see
    /// [`reserve_with`](RedisPace::reserve_with)): `n > quota.capacity()`
    /// is denied permanently without a round trip; under
    /// [`OnUnavailable::LocalFallback`] the local fallback decides with the
    /// quota divided as the configuration's is (rate / replicas, capacity /
    /// replicas, at least 1).
    ///
    /// # Errors
    /// As [`reserve_n`](RedisPace::reserve_n), and [`Error::InvalidQuota`]
    /// when `quota.horizon()` exceeds [`MAX_TAU_NS`].
    pub async fn reserve_n_with(
        &self,
        key: &str,
        n: u64,
        quota: Quota,
    ) -> Result<Reservation, Error> {
        let call = self.quota_call(n, Some(quota), None)?;
        self.reserve_inner(key, call, None).await
    }

    /// [`reserve_n`](RedisPace::reserve_n) at `now_ns` instead of the server's
    /// clock (tests; needs [`Builder::time_injection`]).
    ///
    /// # Errors
    /// As `reserve_n`, and [`Error::TimeInjectionDisabled`].
    pub async fn reserve_n_at(&self, key: &str, n: u64, now_ns: u64) -> Result<Reservation, Error> {
        if !self.inner.time_injection {
            return Err(Error::TimeInjectionDisabled);
        }
        self.reserve_inner(key, self.default_call(n), Some(now_ns))
            .await
    }

    /// [`reserve_n_with`](RedisPace::reserve_n_with) at `now_ns` (tests;
    /// needs [`Builder::time_injection`]).
    ///
    /// # Errors
    /// As `reserve_n_with`, and [`Error::TimeInjectionDisabled`].
    pub async fn reserve_n_with_at(
        &self,
        key: &str,
        n: u64,
        quota: Quota,
        now_ns: u64,
    ) -> Result<Reservation, Error> {
        if !self.inner.time_injection {
            return Err(Error::TimeInjectionDisabled);
        }
        let call = self.quota_call(n, Some(quota), None)?;
        self.reserve_inner(key, call, Some(now_ns)).await
    }

    /// The reservation of a turn ([`acquire_n_with`](RedisPace::acquire_n_with),
    /// `quota` `None` for the configuration's) decided at `now_ns`, without
    /// the wait: the caller's turn is `now_ns +`
    /// [`Reservation::wait`]. Tests; needs [`Builder::time_injection`].
    ///
    /// # Errors
    /// As `acquire_n_with`, and [`Error::TimeInjectionDisabled`].
    pub async fn reserve_turn_at(
        &self,
        key: &str,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
        now_ns: u64,
    ) -> Result<Reservation, Error> {
        if !self.inner.time_injection {
            return Err(Error::TimeInjectionDisabled);
        }
        let call = self.quota_call(n, quota, Some(max_wait))?;
        self.reserve_inner(key, call, Some(now_ns)).await
    }

    /// Waits for a turn instead of being refused: one script call reserves
    /// a token of `key` in a slot that may lie up to `max_wait` ahead on the
    /// server's clock (the script decides with the server's `TIME`, debits,
    /// and answers the wait), then the task sleeps exactly that wait (on
    /// `futures-timer`, as the core's `acquire`: nanosecond deadlines, never
    /// early). Callers of one key go through in the
    /// order of their debits, each at its own slot, with no retries.
    ///
    /// Dropping the future before its turn refunds the reservation by the
    /// refund rule, in a task spawned on the current runtime: the slot comes
    /// back when nothing was debited from the key since, and is otherwise
    /// lost (later callers keep their slots: fewer admissions, never more);
    /// with Redis away the debit stays.
    ///
    /// Under [`OnUnavailable::LocalFallback`] a call that finds Redis away
    /// waits for its turn on the local fallback (`pace::Pace::acquire_n_with`).
    ///
    /// # Errors
    /// At once, having written nothing: [`Error::Denied`] when the turn lies
    /// more than `max_wait` ahead (its [`retry_after`](Denied::retry_after)
    /// is the whole wait the request would need now) or can never come
    /// ([`Denied::is_permanent`]: `n` above the capacity); otherwise as
    /// [`reserve_n`](RedisPace::reserve_n). A `max_wait` beyond
    /// `MAX_TAU_NS - capacity x interval` (about 13 days) counts as that.
    #[doc(alias = "until_key_ready")]
    pub async fn acquire(&self, key: &str, max_wait: Duration) -> Result<Reservation, Error> {
        self.acquire_n(key, 1, max_wait).await
    }

    /// [`acquire`](RedisPace::acquire) of `n` tokens at once.
    ///
    /// # Errors
    /// As [`acquire`](RedisPace::acquire).
    pub async fn acquire_n(
        &self,
        key: &str,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let call = self.quota_call(n, None, Some(max_wait))?;
        self.acquire_inner(key, call).await
    }

    /// [`acquire_n`](RedisPace::acquire_n) under the call's own `quota`
    /// (see [`reserve_with`](RedisPace::reserve_with)).
    ///
    /// # Errors
    /// As [`acquire`](RedisPace::acquire), and [`Error::InvalidQuota`].
    pub async fn acquire_n_with(
        &self,
        key: &str,
        n: u64,
        quota: Quota,
        max_wait: Duration,
    ) -> Result<Reservation, Error> {
        let call = self.quota_call(n, Some(quota), Some(max_wait))?;
        self.acquire_inner(key, call).await
    }

    async fn acquire_inner(&self, key: &str, call: Call) -> Result<Reservation, Error> {
        let sent_at = Instant::now();
        let (key, call) = match self.prepare(key, call, sent_at) {
            Prepared::Done(r) => return r,
            Prepared::Send { key, call } => (key, call),
        };
        let cmd = self.reserve_cmd(&key, call, None);
        let reply = self.eval_admitting(&cmd, Waited::Decision).await;
        let (key, err) = match self.server_decision(key, call, sent_at, reply) {
            Ok(decided) => {
                let r = decided?;
                let wait = r.wait;
                if wait == 0 {
                    return Ok(r);
                }
                // Refunded (in the background) if dropped before its turn.
                let mut turn = Turn {
                    limiter: self.clone(),
                    reservation: Some(r),
                };
                // Known-wrong for mutation tests: the turn comes at half its
                // wait, before its slot.
                #[cfg(pace_mutant = "redis_turn_early")]
                let wait = wait / 2;
                futures_timer::Delay::new(Duration::from_nanos(wait)).await;
                return Ok(turn.reservation.take().expect("taken only here"));
            }
            Err(back) => back,
        };
        let inner = &*self.inner;
        bump(&inner.counters.shard().unavailable, 1);
        let Some(local) = &inner.fallback else {
            return Err(Error::Unavailable(err));
        };
        bump(&inner.counters.shard().local_decisions, 1);
        let local_key = key.strip_prefix(inner.prefix.as_str()).unwrap_or(&key);
        let max_wait = Duration::from_nanos(call.wait);
        let decided = match call.quota {
            None => local.acquire_n(local_key, call.n, max_wait).await,
            Some(q) => match self.local_quota(q) {
                Some(q) => local.acquire_n_with(local_key, call.n, q, max_wait).await,
                None => return Err(Error::Unavailable(err)),
            },
        }
        .map(|kept| kept.detach());
        self.local_answer(key, call.n, decided)
    }

    /// Decides several requests with one round trip (one pipeline) for all
    /// that need the server. Answers are in request order.
    pub async fn reserve_many(&self, requests: &[(&str, u64)]) -> Vec<Result<Reservation, Error>> {
        let sent_at = Instant::now();
        let mut out: Vec<Option<Result<Reservation, Error>>> = Vec::with_capacity(requests.len());
        // One pipeline, or one per slot on a cluster (a pipeline must stay
        // within one slot there).
        let by_slot = self.conn().is_some_and(|c| c.is_cluster());
        let mut groups: Vec<Group> = Vec::new();
        for (i, &(key, n)) in requests.iter().enumerate() {
            match self.prepare(key, self.default_call(n), sent_at) {
                Prepared::Done(r) => out.push(Some(r)),
                Prepared::Send { key, call } => {
                    let slot = if by_slot { key_slot(key.as_bytes()) } else { 0 };
                    let g = match groups.iter().position(|g| g.0 == slot) {
                        Some(g) => g,
                        None => {
                            groups.push((slot, redis::pipe(), Vec::new()));
                            groups.len() - 1
                        }
                    };
                    groups[g].1.add_command(self.reserve_cmd(&key, call, None));
                    groups[g].2.push((i, key, call));
                    out.push(None);
                }
            }
        }
        let replies = self.pipelines(&groups).await;
        for ((_, _, pending), reply) in groups.into_iter().zip(replies) {
            match reply {
                Ok((values, replicated)) => {
                    for ((i, key, call), v) in pending.into_iter().zip(values) {
                        let reply = Ok((v, again(&replicated)));
                        out[i] = Some(self.finish_reserve(key, call, sent_at, reply));
                    }
                }
                Err(e) => {
                    // Each request of the pipeline answers NotReplicated
                    // (its own copy); otherwise the first the error, the
                    // others an open circuit.
                    let unreplicated = match e {
                        BackendError::NotReplicated { acked, wanted } => Some((acked, wanted)),
                        _ => None,
                    };
                    let mut e = Some(e);
                    for (i, key, call) in pending {
                        let err = match unreplicated {
                            Some((acked, wanted)) => BackendError::NotReplicated { acked, wanted },
                            None => e.take().unwrap_or(BackendError::CircuitOpen),
                        };
                        out[i] = Some(self.finish_reserve(key, call, sent_at, Err(err)));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(Error::Unavailable(BackendError::CircuitOpen))))
            .collect()
    }

    /// Sends the pipelines, concurrently when there are several.
    async fn pipelines(
        &self,
        groups: &[Group],
    ) -> Vec<Result<(Vec<Value>, Replicated), BackendError>> {
        #[cfg(feature = "cluster")]
        if groups.len() > 1 {
            return futures_util::future::join_all(
                groups
                    .iter()
                    .map(|(_, pipe, p)| self.pipeline(pipe, p.len(), Waited::Decision)),
            )
            .await;
        }
        let mut out = Vec::with_capacity(groups.len());
        for (_, pipe, p) in groups {
            out.push(self.pipeline(pipe, p.len(), Waited::Decision).await);
        }
        out
    }

    /// Returns a reservation: if nothing was debited from its key since, the
    /// key goes back to its state before the debit (a full bucket: no key);
    /// otherwise nothing is returned. A refund therefore never makes a bucket
    /// fuller than it would be had the reservation not happened. A
    /// reservation of a lease ([`Source::Lease`]) goes back to the lease's
    /// pool (`Restored`, no round trip) while no renewal has reported it
    /// kept; after that it stays kept (`Superseded`).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when Redis gives no answer (whatever the policy:
    /// the debit then stays).
    pub async fn refund(&self, r: Reservation) -> Result<Refunded, Error> {
        self.refund_inner(r, None).await
    }

    /// [`refund`](RedisPace::refund) at `now_ns` (tests; needs
    /// [`Builder::time_injection`]).
    ///
    /// # Errors
    /// As `refund`, and [`Error::TimeInjectionDisabled`].
    pub async fn refund_at(&self, r: Reservation, now_ns: u64) -> Result<Refunded, Error> {
        if !self.inner.time_injection {
            return Err(Error::TimeInjectionDisabled);
        }
        self.refund_inner(r, Some(now_ns)).await
    }

    /// Reads `key`'s bucket on the server's clock: the whole tokens it holds
    /// and the time until it is full. Writes nothing. For observability:
    /// deciding on it and then reserving is a check-then-act race (another
    /// replica may debit in between); `reserve_n` decides atomically.
    ///
    /// # Errors
    /// [`Error::InvalidKey`], or, under [`OnUnavailable::FailClosed`],
    /// [`Error::Unavailable`] (under `LocalFallback` the fallback's bucket
    /// answers, [`Source::Local`]).
    pub async fn peek(&self, key: &str) -> Result<Peek, Error> {
        self.peek_inner(key, None, None).await
    }

    /// [`peek`](RedisPace::peek) under `quota`: the whole tokens `key`
    /// could reserve now with [`reserve_with`](RedisPace::reserve_with) and
    /// that quota (the same script call: a key's state does not depend on
    /// the quota).
    ///
    /// # Errors
    /// As `peek`, and [`Error::InvalidQuota`].
    pub async fn peek_with(&self, key: &str, quota: Quota) -> Result<Peek, Error> {
        self.peek_inner(key, Some(quota), None).await
    }

    /// [`peek`](RedisPace::peek) at `now_ns` (tests; needs
    /// [`Builder::time_injection`]).
    ///
    /// # Errors
    /// As `peek`, and [`Error::TimeInjectionDisabled`].
    pub async fn peek_at(&self, key: &str, now_ns: u64) -> Result<Peek, Error> {
        if !self.inner.time_injection {
            return Err(Error::TimeInjectionDisabled);
        }
        self.peek_inner(key, None, Some(now_ns)).await
    }

    /// [`peek_with`](RedisPace::peek_with) at `now_ns` (tests; needs
    /// [`Builder::time_injection`]).
    ///
    /// # Errors
    /// As `peek_with`, and [`Error::TimeInjectionDisabled`].
    pub async fn peek_with_at(&self, key: &str, quota: Quota, now_ns: u64) -> Result<Peek, Error> {
        if !self.inner.time_injection {
            return Err(Error::TimeInjectionDisabled);
        }
        self.peek_inner(key, Some(quota), Some(now_ns)).await
    }

    async fn peek_inner(
        &self,
        key: &str,
        quota: Option<Quota>,
        now: Option<u64>,
    ) -> Result<Peek, Error> {
        let inner = &*self.inner;
        let limits = match quota {
            None => inner.limits(),
            Some(q) => Limits::of(q)?,
        };
        let full = self.checked_key(key)?;
        let mut cmd = self.script_cmd(&full);
        cmd.arg("p");
        if let Some(now) = now {
            cmd.arg(now);
        }
        let err = match self.eval(&cmd).await.and_then(|v| parse_peek(&v)) {
            Ok((tat, now, held)) => {
                let debt = tat.saturating_sub(now);
                if debt > MAX_AHEAD_NS {
                    BackendError::ClockOutOfRange
                } else {
                    // What is held counts as debt (as if every hold is kept).
                    let debt = debt.saturating_add(held);
                    return Ok(Peek {
                        remaining: limits.tokens_at_debt(debt),
                        reset_ns: Some(debt),
                        server_now_ns: Some(now),
                        source: Source::Server,
                    });
                }
            }
            Err(e) => e,
        };
        bump(&inner.counters.shard().unavailable, 1);
        match &inner.fallback {
            None => Err(Error::Unavailable(err)),
            Some(local) => {
                let local_key = full.strip_prefix(inner.prefix.as_str()).unwrap_or(&full);
                let remaining = match quota {
                    None => local.peek(local_key),
                    Some(q) => match self.local_quota(q) {
                        Some(q) => local.peek_with(local_key, q),
                        None => return Err(Error::Unavailable(err)),
                    },
                };
                Ok(Peek {
                    remaining,
                    reset_ns: None,
                    server_now_ns: None,
                    source: Source::Local,
                })
            }
        }
    }

    async fn reserve_inner(
        &self,
        key: &str,
        call: Call,
        now: Option<u64>,
    ) -> Result<Reservation, Error> {
        if self.any_leased() && now.is_none() && !call.own && call.n >= 1 {
            // A lease decides the configuration's quota locally, or the
            // call goes on as without leases.
            let full = self.checked_key(key)?;
            if call.n <= call.limits.capacity {
                if let Ok(r) = self.leased(full, call.n) {
                    return Ok(r);
                }
            }
        }
        let sent_at = Instant::now();
        match self.prepare(key, call, sent_at) {
            Prepared::Done(r) => r,
            Prepared::Send { key, call } => {
                let cmd = self.reserve_cmd(&key, call, now);
                let reply = self.eval_admitting(&cmd, Waited::Decision).await;
                if self.inner.leases.is_some() && now.is_none() && !call.own {
                    self.heat(&key);
                }
                self.finish_reserve(key, call, sent_at, reply)
            }
        }
    }

    /// A reserve: no argument for one token, `n` for more, `n now` with an
    /// injected time; a call with its own quota or a turn: `q n interval
    /// capacity wait` (and `now`).
    fn reserve_cmd(&self, key: &str, call: Call, now: Option<u64>) -> Cmd {
        let mut cmd = self.script_cmd(key);
        if call.own {
            cmd.arg("q")
                .arg(call.n)
                .arg(call.limits.interval)
                .arg(call.limits.capacity)
                .arg(call.wait);
            if let Some(now) = now {
                cmd.arg(now);
            }
        } else if let Some(now) = now {
            cmd.arg(call.n).arg(now);
        } else if call.n != 1 {
            cmd.arg(call.n);
        }
        cmd
    }

    /// The server's decision, or why there is none (with the key back).
    fn server_decision(
        &self,
        key: String,
        call: Call,
        sent_at: Instant,
        reply: Result<(Value, Replicated), BackendError>,
    ) -> Result<Result<Reservation, Error>, (String, BackendError)> {
        let inner = &*self.inner;
        let Call { n, limits, .. } = call;
        let decided = reply.and_then(|(v, replicated)| {
            parse_reserve(&v, n, limits.interval).map(|d| (d, replicated))
        });
        let (decided, replicated) = match decided {
            Ok(decided) => decided,
            Err(e) => return Err((key, e)),
        };
        match decided {
            ReserveReply::Admitted {
                prev,
                tat,
                now,
                held,
                wait,
            } => {
                bump(&inner.counters.shard().server_decisions, 1);
                // The key's holds count as debt.
                let debt = tat.saturating_sub(now).saturating_add(held);
                let r = Reservation {
                    key,
                    n,
                    prev,
                    tat,
                    server_now_ns: Some(now),
                    source: Source::Server,
                    local: None,
                    remaining: Some(limits.tokens_at_debt(debt)),
                    wait,
                    held,
                    lease: None,
                };
                match self.usable(replicated) {
                    Ok(()) => Ok(Ok(r)),
                    Err(e) => {
                        // Not used: its tokens go back by the refund rule.
                        // (Known-wrong variant `redis_unused_kept`: they
                        // stay debited.)
                        let key = r.key.clone();
                        #[cfg(not(pace_mutant = "redis_unused_kept"))]
                        self.refund_in_background(r);
                        Err((key, e))
                    }
                }
            }
            ReserveReply::Denied { wait, debt, now } => {
                bump(&inner.counters.shard().server_decisions, 1);
                // The debt before this request, as the script saw it:
                // answered (settled, held), or else wait = debt + n x
                // interval - tau.
                let (settled, held) = debt.unwrap_or_else(|| {
                    let debt = wait
                        .saturating_add(limits.tau())
                        .saturating_sub(n.saturating_mul(limits.interval));
                    (debt, 0)
                });
                let debt = settled.saturating_add(held);
                // Only the settled debt is remembered: a hold may be
                // refunded at any moment.
                self.remember_denial(&key, sent_at, settled);
                Ok(Err(Error::Denied(Denied {
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
                })))
            }
            ReserveReply::Never { now } => {
                bump(&inner.counters.shard().server_decisions, 1);
                Ok(Err(Error::Denied(Denied {
                    reason: DenyReason::ExceedsCapacity,
                    wait_ns: u64::MAX,
                    server_now_ns: Some(now),
                    source: Source::Server,
                    remaining: None,
                    reset_ns: None,
                })))
            }
        }
    }

    fn finish_reserve(
        &self,
        key: String,
        call: Call,
        sent_at: Instant,
        reply: Result<(Value, Replicated), BackendError>,
    ) -> Result<Reservation, Error> {
        let (key, err) = match self.server_decision(key, call, sent_at, reply) {
            Ok(decided) => return decided,
            Err(back) => back,
        };
        let n = call.n;
        self.local_decision(key, call, err, |local, key, quota| {
            match quota {
                None => local.reserve_n(key, n),
                Some(q) => local.reserve_n_with(key, n, q),
            }
            .map(|kept| kept.detach())
        })
    }

    /// Refunds `r` in a task spawned on the current runtime (a turn
    /// dropped before its slot, an admission the standbys did not
    /// acknowledge); without a runtime the debit stays (fewer admissions).
    pub(crate) fn refund_in_background(&self, r: Reservation) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limiter = self.clone();
        runtime.spawn(async move {
            let _ = limiter.refund(r).await;
        });
    }

    async fn refund_inner(&self, r: Reservation, now: Option<u64>) -> Result<Refunded, Error> {
        let inner = &*self.inner;
        if r.source == Source::Lease {
            return Ok(self.lease_refund(&r));
        }
        if let (Some(debit), Some(local)) = (r.local, &inner.fallback) {
            let local_key = r.key.strip_prefix(inner.prefix.as_str()).unwrap_or(&r.key);
            return Ok(local.refund(local_key, debit));
        }
        if r.source != Source::Server {
            return Ok(Refunded::Nothing);
        }
        let mut cmd = self.script_cmd(&r.key);
        cmd.arg("f").arg(r.prev).arg(r.tat);
        if let Some(now) = now {
            cmd.arg(now);
        }
        let reply = self.eval(&cmd).await.and_then(|v| parse_refund(&v));
        match reply {
            Ok(out) => {
                bump(&inner.counters.shard().server_decisions, 1);
                if out.returned() {
                    if let Some(cache) = &inner.cache {
                        let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
                        map.remove(&r.key);
                        inner.cached.store(map.len(), Ordering::Relaxed);
                    }
                }
                Ok(out)
            }
            Err(e) => {
                bump(&inner.counters.shard().unavailable, 1);
                Err(Error::Unavailable(e))
            }
        }
    }
}
