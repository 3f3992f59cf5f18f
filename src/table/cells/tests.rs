//! The cell table against the entry table (`Table<u64>`): run one after the
//! other on the same operations, they must answer exactly alike. Then
//! concurrent inserters of the same keys: one row per key, counts exact.

use std::hash::{BuildHasher, RandomState};

use proptest::prelude::*;

use super::{Admitted as CellAdmitted, CellTable};
use crate::bucket::{Decision, Limits};
use crate::sync::epoch;
use crate::table::Table;

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

/// What one reserve answered, in a form both tables share.
fn entry_answer(r: Result<crate::table::Admitted, Decision>) -> Result<CellAdmitted, Decision> {
    r.map(|a| CellAdmitted {
        tat: a.tat,
        prev: a.prev,
        created: a.created,
    })
}

fn cell_answer(r: Result<CellAdmitted, Decision>) -> Result<CellAdmitted, Decision> {
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    #[cfg_attr(miri, ignore)] // proptest reads the working directory
    fn cells_answer_as_entries_do(
        interval in 1u64..200,
        capacity in 1u64..4,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let limits = Limits::new(interval, capacity).unwrap();
        let hasher = RandomState::new();
        let hash = |k: u64| hasher.hash_one(k);
        let entries: Table<u64> = Table::new(4);
        // 4 cells: six keys make it migrate, sweeps make it shrink.
        let cells = CellTable::new(4);
        let mut now = 1_000u64;
        // Admitted reservations not yet refunded: (key, n, tat, prev).
        let mut held: Vec<(u64, u64, u64, u64)> = Vec::new();
        for op in ops {
            let guard = epoch::pin();
            match op {
                Op::Reserve { k, n, dt } => {
                    now += dt;
                    let e = entry_answer(entries.reserve(&limits, hash(k), &k, n, now, &|| now, &guard));
                    let c = cell_answer(cells.reserve(&limits, hash(k), k, n, now, &|| now, &hash, &guard));
                    prop_assert_eq!(e, c, "reserve {} x{} at {}", k, n, now);
                    if let Ok(a) = c {
                        held.push((k, n, a.tat, a.prev));
                    }
                }
                Op::Refund { i, dt } => {
                    if held.is_empty() {
                        continue;
                    }
                    now += dt;
                    let (k, n, tat, prev) = held.swap_remove(i % held.len());
                    entries.refund(&limits, hash(k), &k, n, tat, prev, now, &guard);
                    cells.refund(&limits, hash(k), k, n, tat, prev, now, &hash, &guard);
                }
                Op::Sweep { dt } => {
                    now += dt;
                    let e = entries.sweep(now, &guard);
                    let c = cells.sweep(now, &hash, &guard);
                    prop_assert_eq!(e, c, "sweep at {}", now);
                }
            }
            for k in 0..6u64 {
                prop_assert_eq!(
                    entries.peek(hash(k), &k, &guard),
                    cells.peek(hash(k), k, &guard),
                    "peek {} at {}", k, now
                );
            }
            prop_assert_eq!(entries.len(), cells.len());
        }
    }
}

/// Keys 0 and u64::MAX are rows like any other (key bits are not states).
#[test]
fn extreme_keys_are_rows() {
    let limits = Limits::new(10, 2).unwrap();
    let cells = CellTable::new(16);
    let g = epoch::pin();
    let id = |k: u64| k;
    for k in [0, 1, u64::MAX] {
        let a = cells.reserve(&limits, k, k, 1, 0, &|| 0, &id, &g).unwrap();
        assert!(a.created);
        assert_eq!(cells.peek(k, k, &g), Some(a.tat));
        let b = cells.reserve(&limits, k, k, 1, 0, &|| 0, &id, &g).unwrap();
        assert!(!b.created);
        assert_eq!(
            cells.reserve(&limits, k, k, 1, 0, &|| 0, &id, &g),
            Err(Decision::Wait(10))
        );
    }
    let mut keys = cells.live_keys(&g);
    keys.sort_unstable();
    assert_eq!(keys, vec![0, 1, u64::MAX]);
    assert_eq!(cells.len(), 3);
}

/// A full array migrates: 3/4 of 8 cells take 6 rows, the 7th starts a
/// migration whose copies go on over later calls; every row stays found.
#[test]
fn a_full_array_migrates() {
    let limits = Limits::new(10, 1).unwrap();
    let cells = CellTable::new(8);
    let g = epoch::pin();
    let id = |k: u64| k;
    for k in 0..200u64 {
        assert!(cells.reserve(&limits, k, k, 1, 0, &|| 0, &id, &g).is_ok());
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
        cells
            .reserve(&limits, 7, 7, 1, 100, &|| 100, &id, &g)
            .unwrap()
            .tat,
        110
    );
}

/// Two threads insert and debit the same keys at one instant, with every
/// key hashed to one home so that their sequences overlap: each key ends
/// with one row, and the admissions of each key are exactly its capacity.
#[test]
fn concurrent_inserters_make_one_row_per_key() {
    for round in 0..if cfg!(miri) { 4 } else { 2_000 } {
        let capacity = 3;
        let limits = Limits::new(1_000, capacity).unwrap();
        // 8 cells, 8 keys on one home: the table migrates under the race.
        let cells = CellTable::new(8);
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
                                if cells.reserve(limits, 5, k, 1, 0, &|| 0, &|_| 5, &g).is_ok() {
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
        let mut live = cells.live_keys(&epoch::pin());
        live.sort_unstable();
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
        let cells = CellTable::new(4);
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
                            if cells
                                .reserve(limits, hash(k), k, 1, now, &|| now, hash, &g)
                                .is_ok()
                            {
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
/// variant `cells_no_clean` (tombstones only reused) migrates.
#[test]
#[cfg_attr(miri, ignore)] // 100k keys
fn churn_keeps_the_table_at_its_size() {
    let limits = Limits::new(1_000, 1).unwrap();
    let cells = CellTable::new(64);
    let g = epoch::pin();
    let hasher = RandomState::new();
    let hash = |k: u64| hasher.hash_one(k);
    let mut held: Option<(u64, CellAdmitted)> = None;
    for k in 0..100_000u64 {
        let a = cells
            .reserve(&limits, hash(k), k, 1, 0, &|| 0, &hash, &g)
            .expect("a new key admits");
        if let Some((old, b)) = held.replace((k, a)) {
            cells.refund(&limits, hash(old), old, 1, b.tat, b.prev, 0, &hash, &g);
        }
        assert!(cells.len() <= 2);
    }
    assert_eq!(cells.migrations(), 0);
    assert_eq!(cells.cells(&g), 64);
}

/// A pass over a table of more than `SWEEP_AT_ONCE` cells runs a chunk per
/// call: the call that starts it removes one chunk's full rows, and the
/// pass ends after `cells / chunk` calls having removed every full row.
#[test]
#[cfg_attr(miri, ignore)] // 10k rows
fn a_large_table_is_swept_a_chunk_per_call() {
    let limits = Limits::new(10, 1).unwrap();
    let cells = CellTable::new(16_384);
    let g = epoch::pin();
    let hasher = RandomState::new();
    let hash = |k: u64| hasher.hash_one(k);
    for k in 0..10_000u64 {
        cells
            .reserve(&limits, hash(k), k, 1, 0, &|| 0, &hash, &g)
            .unwrap();
    }
    assert_eq!(cells.cells(&g), 16_384);
    let chunk = super::cell_sweep_chunk(16_384);
    cells.start_sweep(100, &hash, &g);
    let mut calls = 1;
    let mut seen = vec![10_000 - cells.len()];
    while cells.sweep_running(&g) {
        cells.sweep_step(100, &hash, &g);
        calls += 1;
        seen.push(10_000 - cells.len());
    }
    assert_eq!(calls, 16_384 / chunk);
    assert_eq!(cells.len(), 0);
    // No call removed more than its chunk held.
    assert!(seen.windows(2).all(|w| w[1] - w[0] <= chunk));
    assert!(seen[0] <= chunk);
}
