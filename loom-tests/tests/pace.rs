//! loom models of `Pace`: every interleaving (up to the preemption bound) of
//! the real table, bucket and epoch code, with `now` passed explicitly.
//!
//! Run: RUSTFLAGS="--cfg loom --cfg crossbeam_loom" \
//!      LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release
//!
//! Keys carry a `loom::sync::Arc`, so a key box that is never freed shows up as
//! a leak at the end of each model and one freed twice as a refcount error;
//! every model drops its limiter (and with it the collector) at the end.
//!
//! Mutants: built with `--cfg pace_mutant="…"`, the crate swaps in a
//! known-wrong variant; `.ci/suites/10-loom.sh` runs the `mutant_*` test for
//! it and asserts that the model fails with its invariant's message.
#![cfg(loom)]

use loom::thread;
use pace::internals::{PaceInternals, ReservationInternals};

mod support;

use support::*;

/// 1. Two threads race for the last tokens of one bucket: exactly the
///    tokens left are admitted, and the word ends exactly where the
///    sequential execution puts it.
fn exact_admission<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(3);
        let k = K::of(1);
        drop(p.reserve_n_at(&k, 1, 0).unwrap()); // 2 tokens left
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (p, k) = (p.clone(), k.clone());
                thread::spawn(move || (0..2).filter(|_| p.reserve_n_at(&k, 1, 0).is_ok()).count())
            })
            .collect();
        let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 2, "exactly the tokens left are admitted");
        assert_eq!(
            p.row_tat(&k),
            Some(3 * T),
            "state equals the sequential one"
        );
        assert_eq!(ids(&p), vec![1]);
    });
}

/// 2. A reserve races the sweep that unlinks its full row: the debit lands
///    on a live row (the old one before it dies, or a fresh one), never on a
///    dead one.
fn reserve_vs_unlink<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let k = K::of(1);
        drop(p.reserve_n_at(&k, 1, 0).unwrap()); // full again at T
        let sweeper = {
            let p = p.clone();
            thread::spawn(move || p.sweep_at(T))
        };
        let end = p.reserve_n_at(&k, 1, T).unwrap().debit_end_ns();
        let removed = sweeper.join().unwrap();
        assert_eq!(end, 2 * T);
        assert_eq!(
            p.row_tat(&k),
            Some(2 * T),
            "the debit is held by a live row"
        );
        assert_eq!(p.len(), 1);
        // The old row, and possibly the reserver's fresh row (a fresh row is
        // full until its creator's debit lands; the creator then retries).
        assert!(removed <= 2);
    });
}

/// 3a. A late refund (its debit drained) races a sweep: nothing is minted.
fn late_refund_vs_sweep<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let k = K::of(1);
        let early = p.reserve_n_at(&k, 1, 0).unwrap(); // ends at T
        drop(p.reserve_n_at(&k, 1, T).unwrap()); // from full at T: ends at 2T
        let sweeper = {
            let p = p.clone();
            thread::spawn(move || p.sweep_at(T))
        };
        early.refund_at(T);
        assert_eq!(sweeper.join().unwrap(), 0);
        assert_eq!(p.row_tat(&k), Some(2 * T), "a late refund returns nothing");
    });
}

/// 3b. A refund races the sweep of its (full) row, and an undrained refund
///     races a sweep: no row is resurrected, and a refund that fills the
///     bucket leaves no row.
fn refund_vs_sweep<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let (a, b) = (K::of(1), K::of(2));
        let swept = p.reserve_n_at(&a, 1, 0).unwrap(); // full at T
        let held = p.reserve_n_at(&b, 2, 0).unwrap(); // full at 2T
        let sweeper = {
            let p = p.clone();
            thread::spawn(move || p.sweep_at(T))
        };
        swept.refund_at(T);
        held.refund_at(T); // returns the undrained T: full, row removed
        sweeper.join().unwrap();
        assert_eq!(p.row_tat(&a), None, "no resurrection");
        assert_eq!(
            p.row_tat(&b),
            None,
            "a refund that fills the bucket removes the row"
        );
        assert_eq!(p.len(), 0);
    });
}

/// 4. Two threads create the same key's row at once: one row, both debits.
fn create_same_key<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let other = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&K::of(7), 1, 0).is_ok())
        };
        let mine = p.reserve_n_at(&K::of(7), 1, 0).is_ok();
        assert!(other.join().unwrap() && mine);
        assert_eq!(ids(&p), vec![7], "one live row");
        assert_eq!(p.row_tat(&K::of(7)), Some(2 * T), "both debits counted");
        assert_eq!(p.len(), 1);
    });
}

/// 5a. Growth (migration) races a debit of an existing row.
fn growth_vs_reserve<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        for id in [0, 4, 2] {
            drop(p.reserve_n_at(&K::of(id), 1, 0).unwrap()); // 3 of 4 slots: next insert migrates
        }
        let grower = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&K::of(3), 1, 0).is_ok())
        };
        let debited = p.reserve_n_at(&K::of(4), 1, 0).is_ok();
        assert!(grower.join().unwrap() && debited);
        assert_eq!(ids(&p), vec![0, 2, 3, 4], "no row lost, none duplicated");
        assert_eq!(
            p.row_tat(&K::of(4)),
            Some(2 * T),
            "no debit lost or doubled"
        );
        assert_eq!(p.row_tat(&K::of(3)), Some(T));
        assert_eq!(p.len(), 4);
        assert_eq!(p.table_slots(), 8);
    });
}

/// 5b. A sweep that shrinks the table (a migration to a smaller array) races
///     a reserve that creates a row.
fn shrink_vs_reserve<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let keys: Vec<K> = (0..4).map(K::of).collect();
        let held: Vec<_> = keys
            .iter()
            .map(|k| p.reserve_n_at(k, 1, 0).unwrap())
            .collect();
        assert_eq!(p.table_slots(), 8, "the 4th row grew the table");
        for r in held {
            r.refund_at(0); // each refund fills its bucket: the row goes
        }
        assert_eq!(p.len(), 0);
        let sweeper = {
            let p = p.clone();
            thread::spawn(move || p.sweep_at(T)) // sparse: shrinks to 4 slots
        };
        let end = p.reserve_n_at(&K::of(9), 1, T).unwrap().debit_end_ns();
        sweeper.join().unwrap();
        assert_eq!(end, 2 * T);
        assert_eq!(ids(&p), vec![9], "the new row survives the migration");
        assert_eq!(p.row_tat(&K::of(9)), Some(2 * T));
        assert_eq!(p.len(), 1);
        assert!([4, 8].contains(&p.table_slots()));
    });
}

/// 7. Stale and out-of-order `now` per thread: the state's time never moves
///    backwards, and each admission's debit ends after every earlier one.
fn stale_clocks<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let k = K::of(1);
        let late = {
            let (p, k) = (p.clone(), k.clone());
            // This thread's clock is 100 intervals behind.
            thread::spawn(move || {
                [0, 50 * T]
                    .iter()
                    .filter_map(|&now| p.reserve_n_at(&k, 1, now).ok())
                    .map(|r| r.debit_end_ns())
                    .collect::<Vec<_>>()
            })
        };
        let mine: Vec<u64> = [100 * T, 100 * T]
            .iter()
            .filter_map(|&now| p.reserve_n_at(&k, 1, now).ok())
            .map(|r| r.debit_end_ns())
            .collect();
        let theirs = late.join().unwrap();
        let mut all: Vec<u64> = mine.iter().chain(theirs.iter()).copied().collect();
        assert!(mine.windows(2).all(|w| w[0] < w[1]));
        assert!(theirs.windows(2).all(|w| w[0] < w[1]));
        all.sort_unstable();
        all.dedup();
        assert_eq!(
            all.len(),
            mine.len() + theirs.len(),
            "no two debits share an end"
        );
        assert_eq!(
            p.row_tat(&k),
            all.last().copied(),
            "the word holds the latest end"
        );
        // Never more than capacity + what 100 intervals refill.
        assert!(all.len() <= 4);
        assert_eq!(mine.len(), 2, "the up-to-date thread is never starved");
    });
}

/// The promise, checked exactly: kept admissions `(now, tokens)` of one key
/// fit `capacity + span / T` over every window of their decision times.
fn assert_fits(kept: &[(u64, u64)], capacity: u64) {
    for &(a, _) in kept {
        for &(b, _) in kept {
            if a > b {
                continue;
            }
            let tokens: u64 = kept
                .iter()
                .filter(|&&(t, _)| a <= t && t <= b)
                .map(|&(_, n)| n)
                .sum();
            assert!(
                tokens * T <= capacity * T + (b - a),
                "kept admissions exceed the bucket: {tokens} in [{a}, {b}] ({kept:?})"
            );
        }
    }
}

/// 8a. Time as it really is: a reserve that read the clock at 10T, and is
///     pre-empted while a sweep reading 11T + 1 removes the (full by then)
///     row, must not create a fresh row from 10T. Capacity 1.
fn stale_reserve_vs_sweep<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(1);
        let k = K::of(1);
        drop(p.reserve_n_at(&k, 1, 10 * T).unwrap()); // kept at 10T
        let sweeper = {
            let p = p.clone();
            thread::spawn(move || p.sweep_at(11 * T + 1))
        };
        let stale = p.reserve_n_at(&k, 1, 10 * T).is_ok();
        sweeper.join().unwrap();
        let mut kept = vec![(10 * T, 1)];
        if stale {
            kept.push((10 * T, 1));
        }
        assert_fits(&kept, 1);
    });
}

/// 8b. The same against a refund that fills the row and unlinks it: a and b
///     kept at 10T and 11T, then b refunded at 11T (restores 11T: full, the
///     row goes) while a reserve that read 10T acts.
fn stale_reserve_vs_refund_unlink<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(1);
        let k = K::of(1);
        drop(p.reserve_n_at(&k, 1, 10 * T).unwrap()); // kept at 10T: full at 11T
        let b = p.reserve_n_at(&k, 1, 11 * T).unwrap(); // refunded below
        let stale = {
            let (p, k) = (p.clone(), k.clone());
            thread::spawn(move || p.reserve_n_at(&k, 1, 10 * T).is_ok())
        };
        b.refund_at(11 * T);
        let stale = stale.join().unwrap();
        let mut kept = vec![(10 * T, 1)];
        if stale {
            kept.push((10 * T, 1));
        }
        assert_fits(&kept, 1);
        assert!(p.len() <= 1);
    });
}

/// 9. A refund that read an earlier clock than a kept reservation that
///    followed: a at 10T; the other thread reserves twice at 11T while a is
///    refunded with a reading of 10T. Capacity 1: at most one kept at 11T.
fn stale_refund_vs_later_reserve<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(1);
        let k = K::of(1);
        let a = p.reserve_n_at(&k, 1, 10 * T).unwrap().detach();
        let refunder = {
            let (p, k) = (p.clone(), k.clone());
            thread::spawn(move || p.refund_at(&k, a, 10 * T))
        };
        let kept: Vec<(u64, u64)> = (0..2)
            .filter_map(|_| {
                p.reserve_n_at(&k, 1, 11 * T)
                    .ok()
                    .map(|r| (11 * T, r.tokens()))
            })
            .collect();
        refunder.join().unwrap();
        assert!(!kept.is_empty(), "the first reserve at 11T always fits");
        assert_fits(&kept, 1);
    });
}

/// 10. Refunds out of order, racing later reserves: capacity 2, a and b at
///     10T; one thread refunds a (at 10T) and reserves at 10.5T, the other
///     refunds b (at 10.9T) and reserves at 10.9T and 11T.
fn out_of_order_refunds<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let k = K::of(1);
        let a = p.reserve_n_at(&k, 1, 10 * T).unwrap().detach();
        let b = p.reserve_n_at(&k, 1, 10 * T).unwrap().detach();
        let other = {
            let (p, k) = (p.clone(), k.clone());
            thread::spawn(move || {
                p.refund_at(&k, a, 10 * T);
                p.reserve_n_at(&k, 1, 10 * T + T / 2)
                    .ok()
                    .map(|_| (10 * T + T / 2, 1))
                    .into_iter()
                    .collect::<Vec<_>>()
            })
        };
        p.refund_at(&k, b, 10 * T + 9 * T / 10);
        let mut kept: Vec<(u64, u64)> = [10 * T + 9 * T / 10, 11 * T]
            .iter()
            .filter_map(|&now| p.reserve_n_at(&k, 1, now).ok().map(|_| (now, 1)))
            .collect();
        kept.extend(other.join().unwrap());
        assert_fits(&kept, 2);
    });
}

/// 11. The default quota is replaced while a reserve decides: the reserve
///     decides with one whole quota, old or new. A: 5 per token, capacity 2
///     (horizon 10); B: 1 per token, capacity 3 (horizon 3). The key owes 5
///     at 0. Three tokens are more than A holds and do not fit B's horizon
///     (5 + 3 > 3); only a decision that took B's capacity and cost with A's
///     horizon (5 + 3 <= 10) would admit them.
fn quota_swap_vs_reserve<K: ModelKey>() {
    model(|| {
        let a = quota(5 * T, 2);
        let b = quota(T, 3);
        let p = pace_of::<K>(1);
        p.set_quota(a);
        let k = K::of(1);
        drop(p.reserve_n_at(&k, 1, 0).unwrap()); // owes 5T under A
        let swapper = {
            let p = p.clone();
            thread::spawn(move || p.set_quota(b))
        };
        let three = p.reserve_n_at(&k, 3, 0);
        swapper.join().unwrap();
        assert!(three.is_err(), "a decision mixed two quotas");
        assert_eq!(p.row_tat(&k), Some(5 * T), "a denial writes nothing");
        assert_eq!(p.quota(), b);
    });
}

/// 12. A turn is cancelled while a later turn queues behind it (capacity 1,
///     the key owes T at 0): whichever lands first, the later turn goes
///     through at its slot, and the kept admissions counted at their slots
///     fit the bucket; a cancelled turn that the later one stacked on is
///     lost (fewer admissions), never returned twice.
fn cancelled_turn_vs_later_turn<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(1);
        let k = K::of(1);
        drop(p.reserve_n_at(&k, 1, 0).unwrap()); // kept at 0, ends at T
        let first = {
            let (p, k) = (p.clone(), k.clone());
            thread::spawn(move || {
                let (r, _slot) = p.reserve_turn_at(&k, 1, None, 3 * T, 0).unwrap();
                r.refund_at(0) // cancelled before its turn
            })
        };
        let (later, slot) = p.reserve_turn_at(&k, 1, None, 3 * T, 0).unwrap();
        let end = later.debit_end_ns();
        drop(later); // let through at `slot`: kept
        let cancelled = first.join().unwrap();
        assert_fits(&[(0, 1), (slot, 1)], 1);
        match cancelled {
            // Refunded before the later turn: the later one is the 2nd slot.
            pace::Refunded::Restored => assert_eq!((slot, end), (T, 2 * T)),
            // Stacked on: lost, the later turn is the 3rd slot.
            pace::Refunded::Superseded => assert_eq!((slot, end), (2 * T, 3 * T)),
            other => panic!("unexpected refund {other:?}"),
        }
        assert_eq!(p.row_tat(&k), Some(end));
    });
}

/// 13. A turn under the default quota (T a token, horizon T) races a
///     reserve under a quota of its own (T/2 a token, horizon 2T); the key
///     owes T at 0. The quota's reserve fits only before the turn; the turn
///     goes through where its debit fits the default bucket; the kept
///     admissions, each counted at its reading (the turn at its slot) and
///     costed by its quota, fit the mixed bound.
fn turn_vs_reserve_with_quota<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(1);
        let k = K::of(1);
        let own = quota(T / 2, 4); // horizon 2T
        drop(p.reserve_n_at(&k, 1, 0).unwrap()); // owes T
        let other = {
            let (p, k) = (p.clone(), k.clone());
            thread::spawn(move || p.reserve_n_with_at(&k, 1, own, 0).is_ok())
        };
        let (turn, slot) = p.reserve_turn_at(&k, 1, None, 4 * T, 0).unwrap();
        let end = turn.debit_end_ns();
        drop(turn);
        let own_admitted = other.join().unwrap();
        assert_eq!(end - slot, T, "a turn goes through when its debit fits");
        let mut kept = vec![(0, T, T), (slot, T, T)];
        if own_admitted {
            assert_eq!((slot, end), (3 * T / 2, 5 * T / 2));
            kept.push((0, T / 2, 2 * T));
        } else {
            assert_eq!((slot, end), (T, 2 * T));
        }
        assert_fits_mixed(&kept);
        assert_eq!(p.row_tat(&k), Some(end));
    });
}

/// 14. A turn races a hold and its resolution (capacity 2; the key owes T
///     at 0): a hold of 1 at 0, kept at 0, on another thread. A turn
///     decided while the token is held goes through behind it (at T, the
///     slot its decision counted), not at 0 where the held token and the
///     reserve already are; decided after the keep, it is at T as well;
///     decided before the hold, it fits at 0 and the hold is denied. The
///     kept admissions, the turn at its slot, fit the bucket.
fn turn_vs_hold_and_keep<K: ModelKey>() {
    model(|| {
        let p = pace_of::<K>(2);
        let k = K::of(1);
        drop(p.reserve_n_at(&k, 1, 0).unwrap()); // kept at 0, owes T
        let holder = {
            let (p, k) = (p.clone(), k.clone());
            thread::spawn(move || match p.hold_n_at(&k, 1, None, 0) {
                Ok(h) => {
                    assert_eq!(PaceOf::<K>::resolve_at(h, true, 0), pace::Refunded::Nothing);
                    true
                }
                Err(_) => false,
            })
        };
        let (turn, slot) = p.reserve_turn_at(&k, 1, None, 3 * T, 0).unwrap();
        drop(turn); // let through at `slot`: kept
        let held = holder.join().unwrap();
        let mut kept = vec![(0, 1), (slot, 1)];
        if held {
            kept.push((0, 1));
            assert_eq!(slot, T, "the turn goes behind the held token");
        } else {
            assert_eq!(slot, 0, "a turn before the hold fits at once");
        }
        assert_fits(&kept, 2);
        let tokens = kept.len() as u64;
        assert_eq!(p.row_tat(&k), Some(tokens * T), "every kept token counted");
        assert_eq!(p.row_held(&k), Some(0), "nothing left held");
    });
}

/// Kept admissions `(reading, cost, horizon)`: over every window of
/// readings their cost is at most the span plus their largest horizon.
fn assert_fits_mixed(kept: &[(u64, u64, u64)]) {
    for &(a, _, _) in kept {
        for &(b, _, _) in kept {
            if a > b {
                continue;
            }
            let inside = kept.iter().filter(|&&(t, _, _)| a <= t && t <= b);
            let cost: u64 = inside.clone().map(|&(_, c, _)| c).sum();
            let horizon = inside.map(|&(_, _, h)| h).max().unwrap_or(0);
            assert!(
                cost <= (b - a) + horizon,
                "kept admissions exceed the bucket: cost {cost} in [{a}, {b}] ({kept:?})"
            );
        }
    }
}

fn quota(interval: u64, capacity: u64) -> pace::Quota {
    pace::Quota::new(
        pace::Rate::new(1, std::time::Duration::from_nanos(interval)).unwrap(),
        capacity,
    )
    .unwrap()
}

macro_rules! models {
    ($key:ty: $($name:ident),* $(,)?) => {$(
        #[cfg(not(pace_mutant))]
        #[test]
        fn $name() {
            super::$name::<$key>();
        }
    )*};
}

/// Every model with boxed keys (`Key`s: a leaked or doubly freed key box
/// shows) and with keys held as their own bits (`u64` keys).
macro_rules! both_tables {
    ($($name:ident),* $(,)?) => {
        mod model {
            models!(super::Key: $($name),*);
        }
        mod cells_model {
            models!(u64: $($name),*);
        }
    };
}

both_tables!(
    exact_admission,
    reserve_vs_unlink,
    late_refund_vs_sweep,
    refund_vs_sweep,
    create_same_key,
    growth_vs_reserve,
    shrink_vs_reserve,
    stale_clocks,
    stale_reserve_vs_sweep,
    stale_reserve_vs_refund_unlink,
    stale_refund_vs_later_reserve,
    out_of_order_refunds,
    quota_swap_vs_reserve,
    cancelled_turn_vs_later_turn,
    turn_vs_reserve_with_quota,
    turn_vs_hold_and_keep,
);

// Mutants: each runs the model that must catch it. loom aborts the process
// on a failed model (a panic while unwinding its scheduler), so these are not
// `#[should_panic]`: `.ci/suites/10-loom.sh` runs each and asserts that it
// fails with the model's assertion message.

#[cfg(pace_mutant = "check_then_debit")]
#[test]
fn mutant_check_then_debit() {
    exact_admission::<Key>();
}

#[cfg(pace_mutant = "refund_undrained")]
#[test]
fn mutant_refund_undrained() {
    stale_refund_vs_later_reserve::<Key>();
}

#[cfg(pace_mutant = "fresh_row_from_zero")]
#[test]
fn mutant_fresh_row_from_zero() {
    stale_reserve_vs_sweep::<Key>();
}

/// The floors are shared by both tables: a cell row must start from them
/// too.
#[cfg(pace_mutant = "fresh_row_from_zero")]
#[test]
fn mutant_fresh_row_from_zero_cells() {
    stale_reserve_vs_sweep::<u64>();
}

#[cfg(pace_mutant = "quota_read_twice")]
#[test]
fn mutant_quota_read_twice() {
    quota_swap_vs_reserve::<Key>();
}

#[cfg(pace_mutant = "turn_before_its_slot")]
#[test]
fn mutant_turn_before_its_slot() {
    cancelled_turn_vs_later_turn::<Key>();
}

#[cfg(pace_mutant = "turn_slot_ignores_held")]
#[test]
fn mutant_turn_slot_ignores_held() {
    turn_vs_hold_and_keep::<u64>();
}
