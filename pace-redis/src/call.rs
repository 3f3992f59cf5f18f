//! A call as the script takes it: its quota and wait, its key, and what is
//! answered without a round trip (bad keys, `n == 0` or above the capacity,
//! cached denials); the local fallback's answers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pace::{DenyReason, Quota, Rate};
use redis::Cmd;

use crate::stats::bump;
use crate::{
    BackendError, ConfigError, Denied, Error, KeyError, OnUnavailable, RedisPace, Reservation,
    Source, MAX_TAU_NS,
};

/// A quota as the script takes it: `interval` ns per token, `capacity`
/// tokens, `capacity x interval <= MAX_TAU_NS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) interval: u64,
    pub(crate) capacity: u64,
}

impl Limits {
    /// A call's quota, checked against [`MAX_TAU_NS`].
    pub(crate) fn of(quota: Quota) -> Result<Limits, Error> {
        let interval = u64::try_from(quota.interval().as_nanos()).unwrap_or(u64::MAX);
        let capacity = quota.capacity();
        let tau = interval.saturating_mul(capacity);
        if tau > MAX_TAU_NS {
            return Err(Error::InvalidQuota(ConfigError::TauTooLarge {
                tau_ns: tau,
                max_ns: MAX_TAU_NS,
            }));
        }
        Ok(Limits { interval, capacity })
    }

    /// `capacity x interval` (at most [`MAX_TAU_NS`]).
    pub(crate) fn tau(&self) -> u64 {
        self.capacity * self.interval
    }

    /// Whole tokens of a bucket `debt` ns from full (the core's rule).
    pub(crate) fn tokens_at_debt(&self, debt: u64) -> u64 {
        let tau = self.tau();
        if debt >= tau {
            0
        } else {
            (tau - debt) / self.interval
        }
    }
}

/// One request: `n` tokens under `limits`, admitted when its debit fits
/// the bucket within `wait` ns (0 but for turns). `quota` is the call's own
/// quota (`None`: the configuration's); `own` sends the quota and the wait
/// as arguments (every call with a quota, and every turn).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub(crate) n: u64,
    pub(crate) limits: Limits,
    pub(crate) quota: Option<Quota>,
    pub(crate) wait: u64,
    pub(crate) own: bool,
}

/// What a denial told about a key: its `tat` is at least `tat` (by the
/// local clock).
#[derive(Clone, Copy)]
pub(crate) struct CacheEntry {
    tat: Instant,
}

/// A request as sent to the script, or answered without it.
pub(crate) enum Prepared {
    Done(Result<Reservation, Error>),
    Send { key: String, call: Call },
}

impl RedisPace {
    /// A request of `n` tokens under the configuration's quota.
    pub(crate) fn default_call(&self, n: u64) -> Call {
        Call {
            n,
            limits: self.inner.limits(),
            quota: None,
            wait: 0,
            own: false,
        }
    }

    /// A request under the call's own quota (`None`: the configuration's),
    /// a turn when `max_wait` is given. The wait is capped so that the debt
    /// a turn may leave stays within [`MAX_TAU_NS`].
    pub(crate) fn quota_call(
        &self,
        n: u64,
        quota: Option<Quota>,
        max_wait: Option<Duration>,
    ) -> Result<Call, Error> {
        let limits = match quota {
            None => self.inner.limits(),
            Some(q) => Limits::of(q)?,
        };
        let wait = max_wait.map_or(0, |w| {
            u64::try_from(w.as_nanos())
                .unwrap_or(u64::MAX)
                .min(MAX_TAU_NS - limits.tau())
        });
        Ok(Call {
            n,
            limits,
            quota,
            wait,
            own: true,
        })
    }

    /// The local fallback's share of a call's quota: its rate divided by
    /// `replicas`, its capacity too (at least 1), as the configuration's.
    pub(crate) fn local_quota(&self, quota: Quota) -> Option<Quota> {
        let OnUnavailable::LocalFallback { replicas } = self.inner.policy else {
            return None;
        };
        let rate = quota.rate();
        let per = rate.per().checked_mul(replicas)?;
        let local = Rate::new(rate.count(), per).ok()?;
        Quota::new(local, (quota.capacity() / u64::from(replicas)).max(1)).ok()
    }

    /// Answers what needs no round trip: bad keys, `n == 0`, `n` above the
    /// capacity, cached denials.
    pub(crate) fn prepare(&self, key: &str, call: Call, now: Instant) -> Prepared {
        let inner = &*self.inner;
        let full = match self.checked_key(key) {
            Ok(full) => full,
            Err(e) => return Prepared::Done(Err(e)),
        };
        let n = call.n;
        if n == 0 {
            return Prepared::Done(Ok(Reservation {
                key: full,
                n: 0,
                prev: 0,
                tat: 0,
                server_now_ns: None,
                source: Source::Request,
                local: None,
                remaining: None,
                wait: 0,
                held: 0,
                lease: None,
            }));
        }
        if n > call.limits.capacity {
            return Prepared::Done(Err(Error::Denied(Denied {
                reason: DenyReason::ExceedsCapacity,
                wait_ns: u64::MAX,
                server_now_ns: None,
                source: Source::Request,
                remaining: None,
                reset_ns: None,
            })));
        }
        if let Some(cache) = inner
            .cache
            .as_ref()
            .filter(|_| inner.cached.load(Ordering::Relaxed) > 0)
        {
            let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = map.get(&full).copied() {
                // The request fits when the key's tat is at most `now +
                // fits`: its bucket then holds n tokens within the wait.
                let fits = call.limits.tau() - n * call.limits.interval + call.wait;
                // Known-wrong for mutation tests: the cache decides every
                // call with the configuration's quota.
                #[cfg(pace_mutant = "redis_cache_one_quota")]
                let fits = inner
                    .limits()
                    .tau()
                    .saturating_sub(n * inner.interval)
                    .min(fits);
                let ahead = u64::try_from(e.tat.saturating_duration_since(now).as_nanos())
                    .unwrap_or(u64::MAX);
                // Known-wrong for mutation tests: a cached denial never ends.
                let live = ahead > fits || cfg!(pace_mutant = "redis_cache_forever");
                if live {
                    bump(&inner.counters.shard().cache_denials, 1);
                    return Prepared::Done(Err(Error::Denied(Denied {
                        reason: DenyReason::Exhausted,
                        wait_ns: ahead.saturating_sub(fits - call.wait),
                        server_now_ns: None,
                        source: Source::Cache,
                        remaining: None,
                        reset_ns: None,
                    })));
                }
                if ahead == 0 {
                    // The bucket may be full: the entry denies nothing more.
                    map.remove(&full);
                    inner.cached.store(map.len(), Ordering::Relaxed);
                }
            }
        }
        Prepared::Send { key: full, call }
    }

    /// The Redis key of a valid `key`.
    pub(crate) fn checked_key(&self, key: &str) -> Result<String, Error> {
        let inner = &*self.inner;
        if key.is_empty() {
            return Err(Error::InvalidKey(KeyError::Empty));
        }
        let bytes = inner.prefix.len().saturating_add(key.len());
        if bytes > inner.max_key_bytes {
            return Err(Error::InvalidKey(KeyError::TooLong {
                bytes,
                max: inner.max_key_bytes,
            }));
        }
        Ok(self.redis_key(key))
    }

    /// `EVALSHA <sha> 1 <key>`: the start of every call, with room for the
    /// longest call's arguments (a hold's six and an injected time: at most
    /// 32 + 5 x 20 + 1 bytes), so that adding them allocates nothing.
    pub(crate) fn script_cmd(&self, key: &str) -> Cmd {
        let mut cmd = Cmd::with_capacity(11, 48 + key.len() + 133);
        cmd.arg("EVALSHA")
            .arg(self.inner.script.get_hash())
            .arg("1")
            .arg(key);
        cmd
    }

    /// The local fallback's answer to a call the server did not decide
    /// (`e`): `decide` debits the fallback's `pace::Pace` (a reservation or
    /// a hold) under the call's local quota. [`Error::Unavailable`] without a
    /// fallback, or when the call's quota has no local share.
    pub(crate) fn local_decision(
        &self,
        key: String,
        call: Call,
        e: BackendError,
        decide: impl FnOnce(
            &pace::Pace<String>,
            &str,
            Option<Quota>,
        ) -> Result<pace::Debit, pace::Denied>,
    ) -> Result<Reservation, Error> {
        let inner = &*self.inner;
        bump(&inner.counters.shard().unavailable, 1);
        let Some(local) = &inner.fallback else {
            return Err(Error::Unavailable(e));
        };
        bump(&inner.counters.shard().local_decisions, 1);
        let quota = match call.quota {
            None => None,
            Some(q) => match self.local_quota(q) {
                Some(q) => Some(q),
                None => return Err(Error::Unavailable(e)),
            },
        };
        let local_key = key.strip_prefix(inner.prefix.as_str()).unwrap_or(&key);
        let decided = decide(local, local_key, quota);
        self.local_answer(key, call.n, decided)
    }

    /// A decision of the local fallback as this crate answers it.
    pub(crate) fn local_answer(
        &self,
        key: String,
        n: u64,
        decided: Result<pace::Debit, pace::Denied>,
    ) -> Result<Reservation, Error> {
        let inner = &*self.inner;
        let Some(local) = &inner.fallback else {
            return Err(Error::Unavailable(BackendError::NotConnected));
        };
        let local_key = key.strip_prefix(inner.prefix.as_str()).unwrap_or(&key);
        let remaining = Some(local.peek(local_key));
        match decided {
            Ok(debit) => Ok(Reservation {
                key,
                n,
                prev: 0,
                tat: 0,
                server_now_ns: None,
                source: Source::Local,
                local: Some(debit),
                remaining,
                wait: 0,
                held: 0,
                lease: None,
            }),
            Err(d) => Err(Error::Denied(Denied {
                reason: d.reason(),
                wait_ns: u64::try_from(d.retry_after().as_nanos()).unwrap_or(u64::MAX),
                server_now_ns: None,
                source: Source::Local,
                remaining,
                reset_ns: None,
            })),
        }
    }

    /// Remembers that `key`'s `tat` lay `debt` ns after the server's
    /// decision, which came no earlier than `sent_at`: by the local clock
    /// the key's `tat` is at least `sent_at + debt` (unless a refund lowers
    /// it). Any later request that would not fit under that `tat`, whatever
    /// its quota or wait, is denied locally.
    pub(crate) fn remember_denial(&self, key: &str, sent_at: Instant, debt: u64) {
        let inner = &*self.inner;
        let Some(cache) = &inner.cache else { return };
        let Some(tat) = sent_at.checked_add(Duration::from_nanos(debt)) else {
            return;
        };
        let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= inner.cache_entries && !map.contains_key(key) {
            let now = Instant::now();
            map.retain(|_, e| e.tat > now);
            inner.cached.store(map.len(), Ordering::Relaxed);
            if map.len() >= inner.cache_entries {
                return; // full of live denials: this one is simply not cached
            }
        }
        let entry = map.entry(key.to_string()).or_insert(CacheEntry { tat });
        // Keep the latest known tat: it denies the most requests.
        if tat > entry.tat {
            entry.tat = tat;
        }
        inner.cached.store(map.len(), Ordering::Relaxed);
    }
}
