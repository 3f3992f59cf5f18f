//! The table with `u64` keys held as their own bits against the same table
//! with them boxed: run one after the other on the same operations, they
//! must answer exactly alike. Then concurrent inserters of the same keys:
//! one row per key, counts exact (both key kinds).

use std::hash::{BuildHasher, RandomState};

use proptest::prelude::*;

use super::keys::{self, Bits, Boxed};
use super::Undone;
use super::{Admitted, Ask, Cx, Spent, Table, Taken};
use crate::bucket::{Decision, Limits};
use crate::sync::epoch::{self, Guard};

/// A table of `u64` keys, held as their own bits or boxed, behind one set
/// of calls.
struct T {
    table: Table,
    boxed: bool,
}

impl T {
    fn new(min_cells: usize, boxed: bool) -> T {
        let kind = if boxed {
            keys::boxed::<u64>()
        } else {
            keys::inline()
        };
        T {
            table: Table::try_new(min_cells, kind, 1, crate::bucket::MAX_TIME, false).unwrap(),
            boxed,
        }
    }

    /// `n` tokens of key `k` at `now`; `hash_of` hashes keys (`k`'s too).
    fn reserve(
        &self,
        limits: &Limits,
        hash_of: &dyn Fn(u64) -> u64,
        k: u64,
        n: u64,
        now: u64,
        g: &Guard,
    ) -> Result<Admitted, Decision> {
        let (hash, ask) = (hash_of(k), Ask { limits, n, now });
        if self.boxed {
            let p = Boxed::<u64, u64>::new(&k, hash, g);
            self.table
                .reserve::<_, crate::table::TakeDebit, _>(crate::table::Reserve {
                    ask,
                    hash,
                    key: &p,
                    reread: &|| now,
                    hash_of,
                    guard: g,
                    spot: (),
                })
        } else {
            self.table
                .reserve::<_, crate::table::TakeDebit, _>(crate::table::Reserve {
                    ask,
                    hash,
                    key: &Bits(k),
                    reread: &|| now,
                    hash_of,
                    guard: g,
                    spot: (),
                })
        }
    }

    /// Refunds `spent` to key `k` at `now`.
    fn refund(
        &self,
        limits: &Limits,
        hash_of: &dyn Fn(u64) -> u64,
        k: u64,
        spent: Spent,
        now: u64,
        g: &Guard,
    ) -> Undone {
        let (hash, cx) = (hash_of(k), &Cx::new(hash_of, now));
        if self.boxed {
            let p = Boxed::<u64, u64>::new(&k, hash, g);
            self.table.refund(limits, hash, &p, spent, cx, g)
        } else {
            self.table.refund(limits, hash, &Bits(k), spent, cx, g)
        }
    }

    fn peek(&self, hash: u64, k: u64, g: &Guard) -> Option<u64> {
        if self.boxed {
            self.table
                .peek(hash, &Boxed::<u64, u64>::new(&k, hash, g), None, g)
                .map(|s| s.tat)
        } else {
            self.table.peek(hash, &Bits(k), None, g).map(|s| s.tat)
        }
    }

    fn live_keys(&self, g: &Guard) -> Vec<u64> {
        let mut k = self.table.live_keys(&|b| b, g);
        k.sort_unstable();
        k
    }
}

impl std::ops::Deref for T {
    type Target = Table;
    fn deref(&self) -> &Table {
        &self.table
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Reserve `n` tokens of key `k`, after the clock moved `dt`.
    Reserve { k: u64, n: u64, dt: u64 },
    /// Refund the `i`-th admitted reservation still held (modulo).
    Refund { i: usize, dt: u64 },
    /// Sweep, after the clock moved `dt`.
    Sweep { dt: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..6, 1u64..4, 0u64..400).prop_map(|(k, n, dt)| Op::Reserve { k, n, dt }),
        2 => (any::<usize>(), 0u64..400).prop_map(|(i, dt)| Op::Refund { i, dt }),
        1 => (0u64..3_000).prop_map(|dt| Op::Sweep { dt }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    #[cfg_attr(miri, ignore)] // proptest reads the working directory
    fn boxed_keys_answer_as_inline_keys_do(
        interval in 1u64..200,
        capacity in 1u64..4,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let limits = Limits::new(interval, capacity).unwrap();
        let hasher = RandomState::new();
        let hash = |k: u64| hasher.hash_one(k);
        // 4 cells: six keys make it migrate, sweeps make it shrink.
        let entries = T::new(4, true);
        let cells = T::new(4, false);
        let mut now = 1_000u64;
        // Admitted reservations not yet refunded: (key, n, tat, prev in
        // entries, prev in cells).
        let mut held: Vec<(u64, u64, u64, u64, u64)> = Vec::new();
        for op in ops {
            let guard = epoch::pin();
            match op {
                Op::Reserve { k, n, dt } => {
                    now += dt;
                    let e = entries.reserve(&limits, &hash, k, n, now, &guard);
                    let c = cells.reserve(&limits, &hash, k, n, now, &guard);
                    // A fresh row's `prev` is its stripe's floor, and the
                    // kinds stripe keys apart (a boxed key by its hash, a
                    // key in cells by its bits): every floor here is a
                    // removed `tat` no later than `now` (asserted), so each
                    // starts the row at `now`, which is what must agree.
                    for a in [&e, &c].into_iter().flatten() {
                        let prev = a.prev();
                        prop_assert!(!a.created || prev <= now, "floor {} after {}", prev, now);
                    }
                    let start = |r: &Result<Admitted, Decision>| {
                        r.map(|a| {
                            let prev = if a.created { a.prev().max(now) } else { a.prev() };
                            (a.tat(), prev, a.created, a.beside)
                        })
                    };
                    prop_assert_eq!(start(&e), start(&c), "reserve {} x{} at {}", k, n, now);
                    if let (Ok(e), Ok(c)) = (e, c) {
                        held.push((k, n, c.tat(), e.prev(), c.prev()));
                    }
                }
                Op::Refund { i, dt } => {
                    if held.is_empty() {
                        continue;
                    }
                    now += dt;
                    let (k, n, tat, pe, pc) = held.swap_remove(i % held.len());
                    let e = entries.refund(&limits, &hash, k, Spent { n, tat, prev: pe }, now, &guard);
                    let c = cells.refund(&limits, &hash, k, Spent { n, tat, prev: pc }, now, &guard);
                    prop_assert_eq!(e, c, "refund {} at {}", k, now);
                }
                Op::Sweep { dt } => {
                    now += dt;
                    let e = entries.sweep(now, &hash, &guard);
                    let c = cells.sweep(now, &hash, &guard);
                    prop_assert_eq!(e, c, "sweep at {}", now);
                }
            }
            for k in 0..6u64 {
                prop_assert_eq!(
                    entries.peek(hash(k), k, &guard),
                    cells.peek(hash(k), k, &guard),
                    "peek {} at {}", k, now
                );
            }
            prop_assert_eq!(entries.len(), cells.len());
            prop_assert_eq!(entries.live_keys(&guard), cells.live_keys(&guard));
        }
    }
}

/// Keys 0 and u64::MAX are rows like any other (key bits are not states).
#[test]
fn extreme_keys_are_rows() {
    for boxed in [false, true] {
        let limits = Limits::new(10, 2).unwrap();
        let cells = T::new(16, boxed);
        let g = epoch::pin();
        let id = |k: u64| k;
        for k in [0, 1, u64::MAX] {
            let a = cells.reserve(&limits, &id, k, 1, 0, &g).unwrap();
            assert!(a.created);
            assert_eq!(cells.peek(k, k, &g), Some(a.tat()));
            let b = cells.reserve(&limits, &id, k, 1, 0, &g).unwrap();
            assert!(!b.created);
            assert_eq!(
                cells.reserve(&limits, &id, k, 1, 0, &g),
                Err(Decision::Wait(10))
            );
        }
        assert_eq!(cells.live_keys(&g), vec![0, 1, u64::MAX]);
        assert_eq!(cells.len(), 3);
    }
}

/// A full array migrates: 3/4 of 8 cells take 6 rows, the 7th starts a
/// migration whose copies go on over later calls; every row stays found.
#[test]
fn a_full_array_migrates() {
    for boxed in [false, true] {
        let limits = Limits::new(10, 1).unwrap();
        let cells = T::new(8, boxed);
        let g = epoch::pin();
        let id = |k: u64| k;
        for k in 0..200u64 {
            assert!(cells.reserve(&limits, &id, k, 1, 0, &g).is_ok());
            // Every row found after each insert (a sample of them under Miri).
            let step = if cfg!(miri) { 16 } else { 1 };
            for j in (0..=k).step_by(step).chain([k]) {
                assert_eq!(cells.peek(j, j, &g), Some(10), "key {j} after {k}");
            }
        }
        assert_eq!(cells.len(), 200);
        assert!(cells.cells(&g) >= 256);
        assert_eq!(cells.sweep(100, &id, &g), 200);
        assert_eq!(cells.len(), 0);
        // Empty now: the sweep shrank it to the table's minimum.
        assert_eq!(cells.cells(&g), 8);
        assert_eq!(
            cells.reserve(&limits, &id, 7, 1, 100, &g).unwrap().tat(),
            110
        );
    }
}

/// Two threads insert and debit the same keys at one instant, with every
/// key hashed to one home so that their sequences overlap: each key ends
/// with one row, and the admissions of each key are exactly its capacity.
#[test]
fn concurrent_inserters_make_one_row_per_key() {
    for round in 0..if cfg!(miri) { 4 } else { 2_000 } {
        let boxed = round % 2 == 1;
        let capacity = 3;
        let limits = Limits::new(1_000, capacity).unwrap();
        // 8 cells, 8 keys on one home: the table migrates under the race.
        let cells = T::new(8, boxed);
        let keys: Vec<u64> = (0..8).map(|k| k * 7 + round).collect();
        let start = std::sync::Barrier::new(2);
        let admitted: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let (cells, keys, limits, start) = (&cells, &keys, &limits, &start);
                    s.spawn(move || {
                        let mut got = vec![0u64; keys.len()];
                        start.wait();
                        for _ in 0..4 {
                            for (i, &k) in keys.iter().enumerate() {
                                let i = if t == 0 { i } else { keys.len() - 1 - i };
                                let k = if t == 0 { k } else { keys[i] };
                                // One home for every key: the worst overlap.
                                let g = epoch::pin();
                                if cells.reserve(limits, &|_| 5, k, 1, 0, &g).is_ok() {
                                    got[i] += 1;
                                }
                            }
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for i in 0..keys.len() {
            assert_eq!(admitted[0][i] + admitted[1][i], capacity, "key {}", keys[i]);
        }
        let live = cells.live_keys(&epoch::pin());
        let mut want = keys.clone();
        want.sort_unstable();
        assert_eq!(live, want, "one row per key");
        assert_eq!(cells.len(), keys.len());
    }
}

/// Two threads reserve 32 keys on a 4-cell table (so it migrates again and
/// again) while a clock shared by both advances by one ns per call, and one
/// thread sweeps now and then (rows leave, floors rise). No key's admissions
/// exceed its capacity plus what refilled over the run.
#[test]
#[cfg_attr(miri, ignore)] // 800k reserves
fn concurrent_admissions_stay_within_the_bound() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (interval, capacity) = (64u64, 3u64);
    for round in 0..20u64 {
        let limits = Limits::new(interval, capacity).unwrap();
        let cells = T::new(4, round % 2 == 1);
        let clock = AtomicU64::new(1_000);
        let hasher = RandomState::new();
        let hash = |k: u64| hasher.hash_one(k);
        let keys = 32u64;
        let start = std::sync::Barrier::new(2);
        let admitted: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2u64)
                .map(|t| {
                    let (cells, clock, limits, hash, start) =
                        (&cells, &clock, &limits, &hash, &start);
                    s.spawn(move || {
                        let mut got = vec![0u64; keys as usize];
                        start.wait();
                        let mut x = round * 2 + t + 1;
                        for i in 0..20_000u64 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let k = x % keys;
                            let now = clock.fetch_add(1, Ordering::Relaxed);
                            let g = epoch::pin();
                            if t == 0 && i % 2_000 == 0 {
                                cells.sweep(now, hash, &g);
                            }
                            if cells.reserve(limits, hash, k, 1, now, &g).is_ok() {
                                got[k as usize] += 1;
                            }
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let elapsed = clock.load(Ordering::Relaxed) - 1_000;
        // Readings lie in 1_000..1_000 + elapsed.
        let bound = capacity + (elapsed - 1) / interval;
        for (k, (a, b)) in admitted[0].iter().zip(&admitted[1]).enumerate() {
            let total = a + b;
            assert!(total <= bound, "key {k}: {total} admitted, bound {bound}");
        }
    }
}

/// A flood of new keys at a steady number of live rows (each refunded to
/// full after the next key arrives) keeps a 64-cell table at its size:
/// tombstones are reused or cleaned, never migrated away. Known-wrong
/// variant `no_clean` (tombstones only reused) migrates.
#[test]
#[cfg_attr(miri, ignore)] // 100k keys
fn churn_keeps_the_table_at_its_size() {
    for boxed in [false, true] {
        let limits = Limits::new(1_000, 1).unwrap();
        let cells = T::new(64, boxed);
        let g = epoch::pin();
        let hasher = RandomState::new();
        let hash = |k: u64| hasher.hash_one(k);
        let mut held: Option<(u64, Admitted)> = None;
        for k in 0..100_000u64 {
            let a = cells
                .reserve(&limits, &hash, k, 1, 0, &g)
                .expect("a new key admits");
            if let Some((old, b)) = held.replace((k, a)) {
                let r = cells.refund(
                    &limits,
                    &hash,
                    old,
                    Spent {
                        n: 1,
                        tat: b.tat(),
                        prev: b.prev(),
                    },
                    0,
                    &g,
                );
                assert_eq!(r, Undone::Removed);
            }
            assert!(cells.len() <= 2);
        }
        assert_eq!(cells.migrations(), 0);
        assert_eq!(cells.cells(&g), 64);
    }
}

/// A pass over a table of more than `SWEEP_AT_ONCE` cells runs a chunk per
/// call: the call that starts it removes one chunk's full rows, and the
/// pass ends after `cells / chunk` calls having removed every full row.
#[test]
#[cfg_attr(miri, ignore)] // 10k rows
fn a_large_table_is_swept_a_chunk_per_call() {
    let limits = Limits::new(10, 1).unwrap();
    let cells = T::new(16_384, false);
    let g = epoch::pin();
    let hasher = RandomState::new();
    let hash = |k: u64| hasher.hash_one(k);
    for k in 0..10_000u64 {
        cells.reserve(&limits, &hash, k, 1, 0, &g).unwrap();
    }
    assert_eq!(cells.cells(&g), 16_384);
    let chunk = super::sweep_chunk(16_384);
    cells.start_sweep(100, &hash, &g);
    let mut calls = 1;
    let mut seen = vec![10_000 - cells.len()];
    while cells.sweep_running(&g) {
        let _ = cells.sweep_step(100, &hash, &g);
        calls += 1;
        seen.push(10_000 - cells.len());
    }
    assert_eq!(calls, 16_384 / chunk);
    assert_eq!(cells.len(), 0);
    // No call removed more than its chunk held.
    assert!(seen.windows(2).all(|w| w[1] - w[0] <= chunk));
    assert!(seen[0] <= chunk);
}

/// A key whose `Eq` panics when asked to: the panic in an inserter's check
/// (`verify`) withdraws its claim and frees its box, so the table counts
/// exactly its rows and a later insert of the key succeeds. Known-wrong
/// variant `claimed_left_on_panic` leaves the claim: `len` counts it for
/// good.
#[test]
fn a_panicking_eq_in_the_check_leaves_counts_exact() {
    use std::cell::Cell as StdCell;
    thread_local!(static PANIC_ON_EQ: StdCell<bool> = const { StdCell::new(false) });
    #[derive(Clone, Debug)]
    struct K(u64);
    impl PartialEq for K {
        fn eq(&self, other: &K) -> bool {
            if PANIC_ON_EQ.with(|p| p.get()) {
                panic!("a key's Eq panicked");
            }
            self.0 == other.0
        }
    }
    impl Eq for K {}
    let limits = Limits::new(10, 2).unwrap();
    let table = Table::try_new(4, keys::boxed::<K>(), 1, crate::bucket::MAX_TIME, false).unwrap();
    let g = epoch::pin();
    // Every key on one home: an insert's check meets the other rows' keys
    // with the same tag, so it calls `Eq` on them.
    let reserve = |k: u64| {
        let key = K(k);
        let ask = Ask {
            limits: &limits,
            n: 1,
            now: 0,
        };
        let p = Boxed::<K, K>::new(&key, 0, &g);
        table.reserve::<_, crate::table::TakeDebit, _>(crate::table::Reserve {
            ask,
            hash: 0,
            key: &p,
            reread: &|| 0,
            hash_of: &|_| 0,
            guard: &g,
            spot: (),
        })
    };
    assert!(reserve(1).is_ok());
    PANIC_ON_EQ.with(|p| p.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reserve(2)));
    PANIC_ON_EQ.with(|p| p.set(false));
    assert!(r.is_err(), "the check compared the keys");
    assert_eq!(table.len(), 1, "the panicked claim is not counted");
    assert!(reserve(2).is_ok());
    assert_eq!(table.len(), 2);
    let mut live: Vec<u64> = table
        .live_keys(&|_| unreachable!(), &g)
        .into_iter()
        .map(|k: K| k.0)
        .collect();
    live.sort_unstable();
    assert_eq!(live, vec![1, 2]);
}

/// A refund that fills its row's bucket raises the key's floor to the
/// state before its reservation, then removes the row: a stale reserve (a
/// reading taken before the refund) starts the next row from that floor.
/// Known-wrong variant `refund_keeps_floor` removes the row without raising
/// the floor, so the stale reserve admits a token the bucket never had.
#[test]
fn a_refund_to_full_raises_the_floor() {
    for boxed in [false, true] {
        let limits = Limits::new(10, 1).unwrap();
        let t = T::new(4, boxed);
        let g = epoch::pin();
        let id = |k: u64| k;
        // Key 3 debited at 0 (tat 10), then at 10 (prev 10, tat 20).
        let a = t.reserve(&limits, &id, 3, 1, 0, &g).unwrap();
        assert_eq!((a.prev(), a.tat()), (0, 10));
        let b = t.reserve(&limits, &id, 3, 1, 10, &g).unwrap();
        assert_eq!((b.prev(), b.tat()), (10, 20));
        // The second refunded at 15: back to 10, full at 15: removed.
        let r = t.refund(
            &limits,
            &id,
            3,
            Spent {
                n: 1,
                tat: b.tat(),
                prev: b.prev(),
            },
            15,
            &g,
        );
        assert_eq!(r, Undone::Removed);
        assert_eq!(t.len(), 0);
        // A reserve that read the clock at 5 (before the refund): the first
        // debit still holds the only token until 10.
        assert_eq!(
            t.reserve(&limits, &id, 3, 1, 5, &g),
            Err(Decision::Wait(5)),
            "a fresh row starts from the floor the refund raised"
        );
    }
}

/// A sweep raises the floor of each row it removes, in the stripe the key's
/// creators read (for keys in cells, from the key's bits; boxed, from the
/// hash the box keeps): a reserve that read the clock before the sweep
/// starts the key's next row from that floor. Known-wrong variants
/// `sweep_keeps_floor` (no raise) and `sweep_floor_by_hash` (a word key's
/// hash stripe, not its bits') let the stale reserve admit a token the
/// bucket never had. Eight keys: under the second, each escapes only if
/// another key's raise lands in its stripe.
#[test]
fn a_sweep_raises_the_floor_its_keys_creators_read() {
    for boxed in [false, true] {
        let limits = Limits::new(10, 1).unwrap();
        let t = T::new(64, boxed);
        let g = epoch::pin();
        let hasher = RandomState::new();
        let hash = |k: u64| hasher.hash_one(k);
        let keys = [3u64, 17, 1 << 40, 99, 12_345, 7 << 50, 61, 1_000_003];
        for &k in &keys {
            // Debited at 0: tat 10, the bucket empty until 10.
            assert_eq!(t.reserve(&limits, &hash, k, 1, 0, &g).unwrap().tat(), 10);
        }
        assert_eq!(t.sweep(20, &hash, &g), keys.len(), "every row full at 20");
        assert_eq!(t.len(), 0);
        for &k in &keys {
            // A reserve that read the clock at 5, before the sweep: the
            // first debit still holds the only token until 10.
            assert_eq!(
                t.reserve(&limits, &hash, k, 1, 5, &g),
                Err(Decision::Wait(5)),
                "key {k} (boxed: {boxed}) starts from the floor the sweep raised"
            );
        }
    }
}

/// A migration removes the rows full at its copier's reading instead of
/// copying them, raising each key's floor to the row's own `tat` first, as a
/// sweep does: a stale reserve of such a key (a reading taken before) starts
/// from that floor. Known-wrong variant `copy_drops_without_floor` removes
/// them without raising the floor, so the stale reserve admits a token the
/// bucket never had.
#[test]
fn a_migration_removes_full_rows_and_raises_their_floor() {
    for boxed in [false, true] {
        let limits = Limits::new(10, 1).unwrap();
        // 128 cells, two chunks of 64; key k's hash is k, so keys 0..64 lie
        // in chunk 0 and 64..104 in chunk 1: 104 claims, the array's limit.
        let t = T::new(128, boxed);
        let g = epoch::pin();
        let id = |k: u64| k;
        for k in 0..104u64 {
            t.reserve(&limits, &id, k, 1, 0, &g).unwrap();
        }
        // Key 100's second debit, at 10: its row ends at 20.
        assert_eq!(t.reserve(&limits, &id, 100, 1, 10, &g).unwrap().tat(), 20);
        assert_eq!(t.migrations(), 0);
        // Key 200 at 25 finds no room and starts a migration; the chunk its
        // call copies (chunk 0), before its own row, keeps every row.
        t.reserve(&limits, &id, 200, 1, 25, &g).unwrap();
        assert_eq!(t.migrations(), 1);
        // Key 201 at 25: after its own row, its call copies chunk 1, whose
        // rows are all full at 25: removed, not copied.
        t.reserve(&limits, &id, 201, 1, 25, &g).unwrap();
        let mut want: Vec<u64> = (0..64).collect();
        want.extend([200, 201]);
        assert_eq!(t.live_keys(&g), want, "chunk 1's full rows were not copied");
        assert_eq!(t.len(), 66);
        // A reserve of key 100 that read the clock at 15: the row's debit at
        // 10 holds the only token until 20.
        assert_eq!(
            t.reserve(&limits, &id, 100, 1, 15, &g),
            Err(Decision::Wait(5)),
            "a fresh row starts from the floor the copier raised"
        );
    }
}

/// A pass that comes due while a small array migrates does not wait for
/// the migration: its call copies the chunks left (removing the rows full
/// at its reading) and sweeps the target at once, so a lone caller's pass
/// removes every row full at its reading, as the sequential models expect.
/// Known-wrong variant `pass_waits_for_migration` leaves the pass to later
/// calls, chunk by chunk in the target.
#[test]
fn a_pass_due_during_a_migration_sweeps_at_once() {
    for boxed in [false, true] {
        let limits = Limits::new(10, 1).unwrap();
        // As above: 104 rows, full from 10, fill 128 cells.
        let t = T::new(128, boxed);
        let g = epoch::pin();
        let id = |k: u64| k;
        for k in 0..104u64 {
            t.reserve(&limits, &id, k, 1, 0, &g).unwrap();
        }
        // Key 200 at 25 starts a migration and copies chunk 0 (keeping
        // every row, before its own); chunk 1 is left.
        t.reserve(&limits, &id, 200, 1, 25, &g).unwrap();
        assert_eq!(t.migrations(), 1);
        let migrating = |g: &Guard| {
            super::is_migrating(t.array(g).next.load(crate::sync::Ordering::Acquire, g))
        };
        assert!(migrating(&g));
        // A pass at 30: every row but key 200's (full at 35) is full.
        t.start_sweep(30, &id, &g);
        assert!(!migrating(&g), "the pass copied the migration's rest");
        assert_eq!(t.live_keys(&g), vec![200], "the pass swept the target");
        assert_eq!(t.len(), 1);
    }
}

impl Admitted {
    /// A debit's settled `tat` after it.
    fn tat(&self) -> u64 {
        match self.taken {
            Taken::Debit { tat, .. } => tat,
            Taken::Hold(_) => panic!("a debit, not a hold"),
        }
    }

    /// A debit's settled `tat` before it.
    fn prev(&self) -> u64 {
        match self.taken {
            Taken::Debit { prev, .. } => prev,
            Taken::Hold(_) => panic!("a debit, not a hold"),
        }
    }
}
