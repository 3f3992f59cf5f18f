//! Leases (DESIGN.md §11): a hot key's tokens granted to this replica by
//! the script's lease call (`pace.lua`, "Leases"), spent locally with one
//! CAS on a counter word until a deadline on the local clock.
//!
//! The counter's protocol is in `lease_counter.rs`.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::Value;

#[cfg(pace_mutant = "redis_lease_wait_ignored")]
use crate::conn::Replicated;
use crate::conn::Waited;
use crate::lease_counter::{Counter, Word, MAX_LEASED};
use crate::stats::bump;
use crate::{BackendError, RedisPace, Refunded, Reservation, Source, MAX_TAU_NS};

/// [`Builder::leases`](crate::Builder::leases)'s settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The lease time `L`: a grant is good for this long on the server's
    /// clock from the call that made it. Default 100 ms.
    pub lease: Duration,
    /// The grace `γ` after a lease's expiry before the server settles it as
    /// kept (from `expiry + γ`). Default 10 ms.
    pub grace: Duration,
    /// `ε_max`, parts per million: the local clock's rate is within it of
    /// the server's. The replica uses a grant for `(1 − ε_max)` of its
    /// remaining time. Default 1 000 (0.1%).
    pub eps_ppm: u32,
    /// Tokens asked for in one call; the server grants at most a share
    /// (half the capacity alone, `capacity / (2 (others + 1))` beside
    /// others holding tokens). Default a quarter of the capacity, at
    /// least 1.
    pub want: Option<u64>,
    /// A key is hot, and leased, after this many server decisions within
    /// one lease time. Default 8. The decisions are counted in
    /// `4 × max_keys` cells (at most 65,536) by the key's hash, without a
    /// lock: a key whose cell another key took starts its count again.
    /// A count stops at 65,535: a larger value acts as 65,535.
    pub hot_after: u32,
    /// Replicas (standbys) that must hold an admission's writes before it
    /// is used, as [`Builder::wait_replicas`](crate::Builder::wait_replicas)
    /// (which it sets, with `wait_timeout`): a `WAIT n` ends each granting
    /// call's pipeline, and a grant WAIT reports fewer acknowledgements
    /// for is not used (its tokens stay held on the server until a later
    /// call's grant is acknowledged, or expire); the server's own
    /// admissions wait the same way.
    /// 0 (default): no standby.
    pub wait_replicas: u32,
    /// How long a `WAIT` may block (it holds the shared connection: every
    /// call behind it waits too). A grant not acknowledged within it is
    /// not used, and the key asks for no lease for one lease time.
    /// Default 10 ms; at most the limiter's timeout.
    pub wait_timeout: Duration,
    /// Keys leased at once at most; beyond, keys keep one round trip per
    /// decision. Default 1 024.
    pub max_keys: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            lease: Duration::from_millis(100),
            grace: Duration::from_millis(10),
            eps_ppm: 1_000,
            want: None,
            hot_after: 8,
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(10),
            max_keys: 1_024,
        }
    }
}

/// What only the renewing task touches (one at a time: `renewing`).
#[derive(Default)]
struct Books {
    /// This replica's lease number on the key: a new one after a strand.
    number: u32,
    first: bool,
    born: Option<u64>,
    granted: u64,
    kept: u64,
    released: u64,
}

pub(crate) struct Slot {
    pub(crate) counter: Counter,
    renewing: AtomicBool,
    /// Local ns before which no renewal starts (after a grant no standby
    /// acknowledged).
    quiet_until: AtomicU64,
    /// Released for quiet: no renewal until the key is hot again (the slot
    /// stays, with its lease number and generations).
    cold: AtomicBool,
    books: Mutex<Books>,
}

/// A limiter's leases.
pub(crate) struct Leases {
    pub(crate) lease_ns: u64,
    pub(crate) grace_ns: u64,
    pub(crate) eps_ppm: u64,
    pub(crate) want: u64,
    pub(crate) hot_after: u32,
    pub(crate) max_keys: usize,
    /// This replica's id (random per limiter), 16 hexadecimal digits.
    pub(crate) replica: String,
    /// The leased keys' slots, read without a lock (`ArcSwap::load`): a
    /// reserve on a leased key is the lookup and one CAS. A new key's slot
    /// goes into a copy of the map, stored whole under `adding` (at most
    /// `max_keys` copies in a limiter's life: a slot is never removed).
    pub(crate) slots: ArcSwap<HashMap<String, Arc<Slot>>>,
    adding: Mutex<()>,
    /// Server decisions per key in the current lease time, in cells chosen
    /// by the key's hash (`Heat`): no lock and no copy of the key's name on
    /// a cold key's decision.
    heat: Box<[AtomicU64]>,
    heat_hasher: RandomState,
}

impl Leases {
    /// The settings of `config` for a bucket of `capacity` tokens, checked.
    pub(crate) fn new(config: LeaseConfig, capacity: u64, timeout: Duration) -> Option<Leases> {
        let lease_ns = u64::try_from(config.lease.as_nanos()).ok()?;
        let grace_ns = u64::try_from(config.grace.as_nanos()).ok()?;
        if lease_ns == 0
            || lease_ns.checked_add(grace_ns)? > MAX_TAU_NS
            || config.eps_ppm >= 1_000_000
            || config.hot_after == 0
            || config.max_keys == 0
            || (config.wait_replicas > 0
                && (config.wait_timeout.is_zero() || config.wait_timeout > timeout))
        {
            return None;
        }
        let want = config
            .want
            .unwrap_or(capacity / 4)
            .clamp(1, capacity.min(MAX_LEASED));
        let mut h = RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.write_u32(std::process::id());
        Some(Leases {
            lease_ns,
            grace_ns,
            eps_ppm: u64::from(config.eps_ppm),
            want,
            hot_after: config.hot_after,
            max_keys: config.max_keys,
            replica: format!("{:016x}", h.finish()),
            slots: ArcSwap::from_pointee(HashMap::new()),
            adding: Mutex::new(()),
            heat: (0..heat_cells(config.max_keys))
                .map(|_| AtomicU64::new(0))
                .collect(),
            heat_hasher: RandomState::new(),
        })
    }

    /// The cell counting `key`'s server decisions and the tag that tells
    /// its count from another key's.
    fn heat_cell(&self, key: &str) -> (&AtomicU64, u64) {
        let h = self.heat_hasher.hash_one(key);
        // A power of two cells: the low bits pick the cell, the high ones
        // are the tag.
        let cell = &self.heat[(h as usize) & (self.heat.len() - 1)];
        (cell, h >> 48)
    }

    /// The local time a grant with `remaining` ns left may be used for.
    fn usable_for(&self, remaining: u64) -> u64 {
        let r = u128::from(remaining);
        let used = r * u128::from(1_000_000 - self.eps_ppm) / 1_000_000;
        u64::try_from(used).unwrap_or(u64::MAX)
    }
}

/// Cells of the heat count: four per leasable key, a power of two, at most
/// 65,536.
fn heat_cells(max_keys: usize) -> usize {
    max_keys
        .saturating_mul(4)
        .clamp(1, 1 << 16)
        .next_power_of_two()
}

/// A heat cell's word: the tag of the key counted (16 bits), the start of
/// its count (local ns in units of 2^16 ns, 32 bits, wrapping), and the
/// count (16 bits, saturating). A key whose cell holds another tag starts
/// a count of its own in it (the other key's count starts again when it
/// comes back: a lease later); two keys of one cell and one tag count
/// together (a lease sooner). Either moves only when a lease is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Heat {
    tag: u64,
    start: u64,
    count: u64,
}

impl Heat {
    const UNIT_BITS: u32 = 16;
    const START_MASK: u64 = (1 << 32) - 1;

    fn unpack(w: u64) -> Heat {
        Heat {
            tag: w >> 48,
            start: (w >> 16) & Self::START_MASK,
            count: w & 0xffff,
        }
    }

    fn pack(self) -> u64 {
        ((self.tag & 0xffff) << 48)
            | ((self.start & Self::START_MASK) << 16)
            | (self.count & 0xffff)
    }

    /// One more server decision of the key tagged `tag` at local `now_ns`,
    /// counted afresh when the cell holds another key or a count older
    /// than `lease_ns`.
    fn bump(w: u64, tag: u64, now_ns: u64, lease_ns: u64) -> Heat {
        let now = (now_ns >> Self::UNIT_BITS) & Self::START_MASK;
        let lease = (lease_ns >> Self::UNIT_BITS).max(1);
        let cur = Heat::unpack(w);
        let age = now.wrapping_sub(cur.start) & Self::START_MASK;
        if w == 0 || cur.tag != tag || age > lease {
            Heat {
                tag,
                start: now,
                count: 1,
            }
        } else {
            Heat {
                count: (cur.count + 1).min(0xffff),
                ..cur
            }
        }
    }
}

/// A lease call's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// The lease lives.
    Granted {
        /// Tokens granted to the lease so far, this call's included.
        granted: u64,
        /// Its expiry less the call's reading, ns.
        remaining: u64,
        /// The server's reading when the lease's record was created, ns.
        born: u64,
        /// The call's reading, ns.
        now: u64,
    },
    /// No record of the lease and the call was not its first.
    Unknown,
    /// The stored `tat` lies too far ahead of the server's clock.
    ClockBack,
}

fn parse_lease(v: &Value) -> Result<LeaseAnswer, BackendError> {
    let bad = || BackendError::BadReply(format!("{v:?}"));
    if let Value::ServerError(_) = v {
        return Err(match v.clone().extract_error() {
            Err(e) => BackendError::Redis(e),
            Ok(_) => bad(),
        });
    }
    let Value::BulkString(text) = v else {
        return Err(bad());
    };
    let text = std::str::from_utf8(text).map_err(|_| bad())?;
    let f: Vec<u64> = text
        .split(' ')
        .map(|p| p.parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let time = |s: u64, ns: u64| {
        (ns < 1_000_000_000)
            .then(|| s.checked_mul(1_000_000_000)?.checked_add(ns))
            .flatten()
            .ok_or_else(bad)
    };
    match f.as_slice() {
        [8, granted, remaining, born, s, ns] => Ok(LeaseAnswer::Granted {
            granted: *granted,
            remaining: *remaining,
            born: *born,
            now: time(*s, *ns)?,
        }),
        [7, 0, s, ns] => time(*s, *ns).map(|_| LeaseAnswer::Unknown),
        [3, 0, s, ns] => time(*s, *ns).map(|_| LeaseAnswer::ClockBack),
        _ => Err(bad()),
    }
}

impl RedisPace {
    /// The lease's local clock: ns since the limiter's origin.
    fn lease_clock(&self) -> u64 {
        u64::try_from(self.inner.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether any key has a lease slot: else a call looks for none (a cold
    /// key's decision builds no Redis key for the lookup).
    pub(crate) fn any_leased(&self) -> bool {
        self.inner
            .leases
            .as_ref()
            .is_some_and(|l| !l.slots.load().is_empty())
    }

    /// A reserve of `n` tokens of `key` (its Redis key) from its lease, if
    /// it has one that can decide it.
    pub(crate) fn leased(&self, key: String, n: u64) -> Result<Reservation, String> {
        let Some(leases) = self.inner.leases.as_ref() else {
            return Err(key);
        };
        let (decided, low) = {
            let slots = leases.slots.load();
            let Some(slot) = slots.get(&key) else {
                drop(slots);
                return Err(key);
            };
            let decided = slot.counter.take(n, || self.lease_clock());
            let low = match decided {
                Some((_, at)) => {
                    let w = Word::unpack(slot.counter.word.load(Ordering::Relaxed));
                    w.pool < leases.want.div_ceil(2)
                        || slot.counter.deadline.load(Ordering::Relaxed)
                            < at.saturating_add(leases.lease_ns / 4)
                }
                None => true,
            };
            (decided, low)
        };
        if low {
            self.spawn_renewal(&key);
        }
        let Some((generation, at)) = decided else {
            return Err(key);
        };
        bump(&self.inner.counters.shard().leased_decisions, 1);
        Ok(Reservation {
            key,
            n,
            prev: 0,
            tat: 0,
            server_now_ns: None,
            source: Source::Lease,
            local: None,
            remaining: None,
            wait: 0,
            held: 0,
            lease: Some((generation, self.inner.origin + Duration::from_nanos(at))),
        })
    }

    /// A leased reservation's refund: back to the pool while unreported.
    pub(crate) fn lease_refund(&self, r: &Reservation) -> Refunded {
        match r.lease {
            Some((generation, _)) => self.lease_give_back(&r.key, generation, r.n),
            None => Refunded::Nothing,
        }
    }

    /// `n` leased tokens of `key` taken in `generation` back to the pool
    /// (`Restored`) while no report counted them; else they stay kept
    /// (`Superseded`).
    pub(crate) fn lease_give_back(&self, key: &str, generation: u64, n: u64) -> Refunded {
        let Some(leases) = &self.inner.leases else {
            return Refunded::Nothing;
        };
        match leases.slots.load().get(key) {
            Some(slot) if slot.counter.give_back(generation, n) => Refunded::Restored,
            _ => Refunded::Superseded,
        }
    }

    /// Counts a server decision of the configuration's quota on `key`;
    /// a key with `hot_after` of them within a lease time gets a lease.
    pub(crate) fn heat(&self, key: &str) {
        let Some(leases) = self.inner.leases.as_ref() else {
            return;
        };
        let now = self.lease_clock();
        let (cell, tag) = leases.heat_cell(key);
        let mut count = 0;
        let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            let next = Heat::bump(w, tag, now, leases.lease_ns);
            count = next.count;
            Some(next.pack())
        });
        if count < u64::from(leases.hot_after).min(0xffff) {
            return;
        }
        {
            let _adding = leases.adding.lock().unwrap_or_else(|p| p.into_inner());
            let slots = leases.slots.load();
            if let Some(slot) = slots.get(key) {
                slot.cold.store(false, Ordering::Release);
            } else {
                if slots.len() >= leases.max_keys {
                    return;
                }
                let mut slots = HashMap::clone(&slots);
                slots.insert(
                    key.to_owned(),
                    Arc::new(Slot {
                        counter: Counter::default(),
                        renewing: AtomicBool::new(false),
                        quiet_until: AtomicU64::new(0),
                        cold: AtomicBool::new(false),
                        books: Mutex::new(Books {
                            first: true,
                            ..Books::default()
                        }),
                    }),
                );
                leases.slots.store(Arc::new(slots));
            }
        }
        self.spawn_renewal(key);
    }

    fn spawn_renewal(&self, key: &str) {
        let Some(leases) = self.inner.leases.as_ref() else {
            return;
        };
        let slot = match leases.slots.load().get(key) {
            Some(s) => Arc::clone(s),
            None => return,
        };
        if slot.cold.load(Ordering::Acquire)
            || slot.quiet_until.load(Ordering::Relaxed) > self.lease_clock()
            || slot.renewing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            slot.renewing.store(false, Ordering::Release);
            return;
        };
        let limiter = self.clone();
        let key = key.to_owned();
        runtime.spawn(async move {
            limiter.renew(&key, &slot, false).await;
            slot.renewing.store(false, Ordering::Release);
            limiter.watch(&key, &slot).await;
        });
    }

    /// After a renewal: every half lease time, a pool nobody touched since
    /// the last look is released (reported, with nothing more asked for)
    /// and the key is cold (a lease again once hot again);
    /// a change of generation (another renewal, which watches in turn) or
    /// an empty pool ends the watch.
    async fn watch(&self, key: &str, slot: &Slot) {
        let Some(leases) = self.inner.leases.as_ref() else {
            return;
        };
        let mut seen = slot.counter.word.load(Ordering::Acquire);
        loop {
            tokio::time::sleep(Duration::from_nanos(leases.lease_ns / 2)).await;
            let now = slot.counter.word.load(Ordering::Acquire);
            let w = Word::unpack(now);
            if w.pool == 0 || w.generation != Word::unpack(seen).generation {
                return;
            }
            if now != seen {
                seen = now;
                continue;
            }
            if slot.renewing.swap(true, Ordering::AcqRel) {
                return;
            }
            self.renew(key, slot, true).await;
            // Cold again: a lease once hot again.
            slot.cold.store(true, Ordering::Release);
            leases.heat_cell(key).0.store(0, Ordering::Relaxed);
            slot.renewing.store(false, Ordering::Release);
            return;
        }
    }

    /// One take/renew call for `slot` (the caller holds `renewing`).
    /// With `release`, the pool is given back and nothing more asked for.
    async fn renew(&self, key: &str, slot: &Slot, release: bool) {
        let Some(leases) = self.inner.leases.as_ref() else {
            return;
        };
        let counters = &self.inner.counters;
        let (fresh, unused) = if release {
            slot.counter.drain()
        } else {
            (slot.counter.report(), 0)
        };
        bump(&counters.shard().lease_releases, unused);
        let want = if release { 0 } else { leases.want };
        let (lid, first, kept, released) = {
            let mut b = slot.books.lock().unwrap_or_else(|p| p.into_inner());
            b.kept += fresh;
            b.released += unused;
            (
                format!("{}{:08x}", leases.replica, b.number),
                b.first,
                b.kept,
                b.released,
            )
        };
        let sent = self.lease_clock();
        let mut cmd = self.script_cmd(key);
        cmd.arg("l")
            .arg(&lid)
            .arg(if first { "1" } else { "0" })
            .arg(kept)
            .arg(released)
            .arg(want)
            .arg(leases.lease_ns)
            .arg(leases.grace_ns);
        let answer = self
            .eval_admitting(&cmd, Waited::Always)
            .await
            .and_then(|(v, replicated)| parse_lease(&v).map(|a| (a, replicated)));
        match answer {
            Ok((
                LeaseAnswer::Granted {
                    granted,
                    remaining,
                    born,
                    ..
                },
                replicated,
            )) => {
                {
                    let b = slot.books.lock().unwrap_or_else(|p| p.into_inner());
                    if b.born.is_some_and(|was| was != born) {
                        drop(b);
                        self.strand(slot);
                        return;
                    }
                }
                // Known-wrong: a grant used whatever WAIT answered.
                #[cfg(pace_mutant = "redis_lease_wait_ignored")]
                let replicated: Replicated = {
                    let _ = replicated;
                    Ok(())
                };
                if self.usable(replicated).is_err() {
                    // Not on the standbys: not used, and no lease asked for
                    // during one lease time.
                    slot.quiet_until.store(
                        self.lease_clock().saturating_add(leases.lease_ns),
                        Ordering::Relaxed,
                    );
                    return;
                }
                let new = {
                    let mut b = slot.books.lock().unwrap_or_else(|p| p.into_inner());
                    b.born = Some(born);
                    b.first = false;
                    let new = granted.saturating_sub(b.granted);
                    b.granted = b.granted.max(granted);
                    new
                };
                let deadline = sent.saturating_add(leases.usable_for(remaining));
                slot.counter.grant(new, deadline);
                bump(&counters.shard().lease_grants, new);
            }
            Ok((LeaseAnswer::Unknown, _)) => self.strand(slot),
            Ok((LeaseAnswer::ClockBack, _)) | Err(_) => {}
        }
    }

    /// The lease was settled at its expiry: what the pool had is stranded;
    /// the next call starts a new lease.
    fn strand(&self, slot: &Slot) {
        let stranded = slot.counter.strand();
        let mut b = slot.books.lock().unwrap_or_else(|p| p.into_inner());
        *b = Books {
            number: b.number.wrapping_add(1),
            first: true,
            ..Books::default()
        };
        let shard = self.inner.counters.shard();
        bump(&shard.lease_expiries, 1);
        bump(&shard.lease_stranded, stranded);
    }

    /// One lease call as the limiter makes it, at `now_ns` (tests; needs
    /// [`Builder::time_injection`](crate::Builder::time_injection)): lease
    /// `lid` (24 hexadecimal digits), the replica's cumulative `kept` and
    /// `released` tokens, `want` more, for `lease_ns` plus `grace_ns`.
    ///
    /// # Errors
    /// [`crate::Error::TimeInjectionDisabled`], [`crate::Error::InvalidKey`],
    /// [`crate::Error::Unavailable`].
    #[allow(clippy::too_many_arguments)]
    pub async fn lease_call_at(
        &self,
        key: &str,
        lid: &str,
        first: bool,
        kept: u64,
        released: u64,
        want: u64,
        lease_ns: u64,
        grace_ns: u64,
        now_ns: u64,
    ) -> Result<LeaseAnswer, crate::Error> {
        if !self.inner.time_injection {
            return Err(crate::Error::TimeInjectionDisabled);
        }
        let full = self.checked_key(key)?;
        let mut cmd = self.script_cmd(&full);
        cmd.arg("l")
            .arg(lid)
            .arg(if first { "1" } else { "0" })
            .arg(kept)
            .arg(released)
            .arg(want)
            .arg(lease_ns)
            .arg(grace_ns)
            .arg(now_ns);
        self.eval(&cmd)
            .await
            .and_then(|v| parse_lease(&v))
            .map_err(crate::Error::Unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::{heat_cells, Heat};

    const UNIT: u64 = 1 << 16;

    /// `n` decisions of the key tagged `tag`, at the local times `at`.
    fn count(mut w: u64, tag: u64, at: &[u64], lease: u64) -> (u64, Vec<u64>) {
        let mut counts = Vec::new();
        for &t in at {
            let h = Heat::bump(w, tag, t, lease);
            counts.push(h.count);
            w = h.pack();
        }
        (w, counts)
    }

    #[test]
    fn a_key_counts_its_decisions_within_a_lease_time_and_no_others() {
        let lease = 100 * UNIT;
        // Within one lease time (in the cell's units), one count.
        let (w, c) = count(0, 7, &[0, UNIT, 50 * UNIT, 100 * UNIT], lease);
        assert_eq!(c, [1, 2, 3, 4]);
        // Past it, a new count from that decision.
        let (w, c) = count(w, 7, &[101 * UNIT, 102 * UNIT], lease);
        assert_eq!(c, [1, 2]);
        // Another key in the cell starts its own; the first starts again.
        let (w, c) = count(w, 8, &[103 * UNIT], lease);
        assert_eq!(c, [1]);
        let (_, c) = count(w, 7, &[104 * UNIT, 105 * UNIT], lease);
        assert_eq!(c, [1, 2]);
    }

    #[test]
    fn a_count_saturates_and_its_start_wraps() {
        let lease = 100 * UNIT;
        let full = Heat {
            tag: 3,
            start: 5,
            count: 0xffff,
        };
        assert_eq!(Heat::bump(full.pack(), 3, 5 * UNIT, lease).count, 0xffff);
        // A start just below the wrap of its 32 bits, a decision after it.
        let late = Heat {
            tag: 3,
            start: (1 << 32) - 10,
            count: 4,
        };
        let after = ((1u64 << 32) + 20) * UNIT;
        assert_eq!(Heat::bump(late.pack(), 3, after, lease).count, 5);
        assert_eq!(
            Heat::bump(late.pack(), 3, after + 100 * UNIT, lease).count,
            1
        );
        for h in [full, late] {
            assert_eq!(Heat::unpack(h.pack()), h);
        }
    }

    #[test]
    fn heat_cells_are_a_bounded_power_of_two() {
        assert_eq!(heat_cells(1), 4);
        assert_eq!(heat_cells(1_000), 4_096);
        assert_eq!(heat_cells(1_024), 4_096);
        assert_eq!(heat_cells(usize::MAX), 1 << 16);
    }
}
