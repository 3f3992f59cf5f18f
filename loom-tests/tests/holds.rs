//! loom models of holds (`Pace::hold`, DESIGN.md §3 "Holds") on the table
//! with keys held as their own bits: a held row's state (in its word, or in
//! a record when it outgrows the word) replaced by racing holds, debits,
//! refunds, keeps, copies and sweeps, each change one CAS. CI runs them
//! also built with `PACE_HOLD_RECORD=1`, where every held state is a record.
//!
//! Run: RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom \
//!      LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release --test holds
//!
//! Known-wrong variants: `refund_rewinds_tat` (a refund also takes its cost
//! off the settled `tat`) must fail `overlapping_refunds_are_exact`;
//! `decision_ignores_held` must fail `held_tokens_count_at_every_decision`;
//! `spot_written_blind` (a resolution in its hold's pin stored over the
//! cell) must fail `hold_while_vs_debit`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use pace::internals::CellsModel;

mod support;

use support::model;

/// One token per 10 ns.
const T: u64 = 10;

/// Two overlapping holds of key 0, refunded in either order, while the
/// key is debited between them: only the kept debit remains, nothing held.
#[test]
fn overlapping_refunds_are_exact() {
    model(|| {
        let t = Arc::new(CellsModel::new(4, T, 3));
        let mine = t.hold(0, 0).expect("3 tokens");
        let other = {
            let t = t.clone();
            thread::spawn(move || {
                let h = t.hold(0, 0).expect("3 tokens: 2 held, 1 kept");
                assert!(t.resolve(0, h, false, 0), "the refund found its lot");
            })
        };
        assert!(t.reserve(0, 0).is_some());
        assert!(t.resolve(0, mine, false, 0), "the refund found its lot");
        other.join().unwrap();
        assert_eq!(t.held(0), Some((T, 0)), "only the kept debit remains");
    });
}

/// Capacity 1: a hold (then kept) races a debit; exactly one is admitted,
/// and the settled `tat` counts it once.
#[test]
fn held_tokens_count_at_every_decision() {
    model(|| {
        let t = Arc::new(CellsModel::new(4, T, 1));
        let holder = {
            let t = t.clone();
            thread::spawn(move || match t.hold(0, 0) {
                Some(h) => {
                    assert!(t.resolve(0, h, true, 0));
                    1
                }
                None => 0,
            })
        };
        let debited = u64::from(t.reserve(0, 0).is_some());
        let admitted = debited + holder.join().unwrap();
        assert!(admitted <= 1, "at most the capacity is admitted");
        assert_eq!(admitted, 1, "a full bucket of 1 admits 1");
        assert_eq!(t.held(0), Some((T, 0)));
    });
}

/// A hold and its refund racing a chunk copy: keys 0, 1, 2 fill the limit
/// of 4 cells, a new key starts a migration that copies key 0's chunk while
/// another thread holds key 0 and refunds it. The refund finds the hold
/// wherever the row moved; the replaced records are freed once (loom's
/// epoch collector of the model frees them).
#[test]
fn hold_vs_copy() {
    model(|| {
        let t = Arc::new(CellsModel::new(4, T, 4));
        for k in [0, 1, 2] {
            assert_eq!(t.reserve(k, 0), Some(T));
        }
        let holder = {
            let t = t.clone();
            thread::spawn(move || {
                let h = t.hold(0, 0).expect("3 tokens left");
                assert!(t.resolve(0, h, false, 0), "the refund found its lot");
            })
        };
        assert_eq!(t.reserve(5, 0), Some(T));
        holder.join().unwrap();
        assert_eq!(t.sweep(0), 0);
        assert_eq!(t.held(0), Some((T, 0)), "the hold left nothing behind");
        assert_eq!(t.live_keys(), vec![0, 1, 2, 5]);
        assert_eq!(t.len(), 4);
    });
}

/// A refund racing the sweep that expires its lot (hold limit 5 ns, the
/// sweep at 10 ns): either the refund returns the token (and removes the
/// full row), or the sweep settles it as kept and the refund finds nothing;
/// never both, never neither.
#[test]
fn refund_vs_expiring_sweep() {
    model(|| {
        let t = Arc::new(CellsModel::with_hold_limit(4, T, 2, 5));
        let h = t.hold(0, 0).expect("a full bucket");
        let sweeper = {
            let t = t.clone();
            thread::spawn(move || t.sweep(10))
        };
        let refunded = t.resolve(0, h, false, 4);
        assert_eq!(sweeper.join().unwrap(), 0, "a held row is not full");
        // Refunded: the bucket is full again and the row gone; settled: the
        // token is kept at the last instant of its lot (epoch 0 of 5 ns,
        // expired at 10 ns): 9 ns.
        let expect = if refunded { None } else { Some((9 + T, 0)) };
        assert_eq!(t.held(0), expect, "refunded or settled, once");
    });
}

/// Holds that outgrow the inline form (a lot of more than 3 tokens) race a
/// refund that brings the row back into it: the row goes from its word to
/// a record and back, each change one CAS, and every token is accounted
/// for. Capacity 6, three holds of 2 tokens in one lot.
#[test]
fn holds_between_the_word_and_a_record() {
    model(|| {
        let t = Arc::new(CellsModel::new(4, T, 6));
        let mine = t.hold_n(0, 2, 0).expect("6 tokens");
        let other = {
            let t = t.clone();
            thread::spawn(move || {
                let h = t.hold_n(0, 2, 0).expect("at most 4 held");
                assert!(t.resolve(0, h, false, 0), "the refund found its lot");
            })
        };
        let third = t.hold_n(0, 2, 0).expect("at most 4 held");
        other.join().unwrap();
        assert_eq!(t.held(0), Some((0, 4 * T)), "two holds left");
        assert!(t.resolve(0, third, true, 0), "the keep found its lot");
        assert_eq!(t.held(0), Some((2 * T, 2 * T)), "kept from its reading");
        assert!(t.resolve(0, mine, false, 0), "the refund found its lot");
        assert_eq!(t.held(0), Some((2 * T, 0)), "nothing held");
    });
}

/// Key 4's row lies in its second cell, behind key 0's (hash = key, 4
/// cells), so its holds and their resolutions find it past the first cell
/// (`reserve_near`, `near`) while a sweep turns key 0's full row into the
/// tombstone they pass over. Both holds fit beside key 4's debt (1 token
/// owed at `T` of 3); the refund returns exactly, the keep settles after
/// the debt, and key 4 ends with nothing held.
#[test]
fn holds_past_the_first_cell_vs_sweep() {
    model(|| {
        let t = Arc::new(CellsModel::new(4, T, 3));
        assert_eq!(t.reserve(0, 0), Some(T), "key 0 in its first cell");
        assert_eq!(t.reserve(4, 0), Some(T), "key 4 in the next cell");
        assert_eq!(t.reserve(4, 0), Some(2 * T));
        let sweeper = {
            let t = t.clone();
            thread::spawn(move || t.sweep(T))
        };
        let kept = t.hold(4, T).expect("1 token owed, 2 free");
        let refunded = t.hold(4, T).expect("1 token owed, 1 held, 1 free");
        assert!(t.resolve(4, refunded, false, T), "the refund found its lot");
        assert!(t.resolve(4, kept, true, T), "the keep found its lot");
        assert_eq!(sweeper.join().unwrap(), 1, "key 0's row, full at T");
        assert_eq!(t.live_keys(), vec![4]);
        assert_eq!(t.held(4), Some((3 * T, 0)), "kept after the debt");
    });
}

/// `Pace::hold_while`: a hold resolved in the pin it was made in, at the
/// cell it left its row in, while another thread debits the key. A refund
/// CASes from the value the hold wrote: a debit between them makes it look
/// the row up again and refund exactly, so only the debit remains; a keep
/// settles both. Capacity 3, key 0's row made first (a hold on a new row
/// is resolved by a lookup).
#[test]
fn hold_while_vs_debit() {
    for keep in [false, true] {
        model(move || {
            let t = Arc::new(CellsModel::new(4, T, 3));
            assert_eq!(t.reserve(0, 0), Some(T));
            let debtor = {
                let t = t.clone();
                thread::spawn(move || {
                    assert!(t.reserve(0, 0).is_some(), "3 tokens: 1 owed, 1 held")
                })
            };
            let r = t.hold_while(0, 1, 0, keep, || thread::yield_now());
            assert_eq!(r, Some(true), "the resolution found its lot");
            debtor.join().unwrap();
            let expect = if keep { 3 * T } else { 2 * T };
            assert_eq!(
                t.held(0),
                Some((expect, 0)),
                "the debit and what was kept remain"
            );
        });
    }
}

/// `Pace::hold_while` racing a chunk copy: keys 0, 1, 2 fill the limit of
/// 4 cells, a new key starts a migration that copies key 0's chunk between
/// the hold and its refund. The refund at the hold's cell is refused once
/// the array migrates (or its cell is frozen) and finds the row where it
/// moved; nothing stays held.
#[test]
fn hold_while_vs_copy() {
    model(|| {
        let t = Arc::new(CellsModel::new(4, T, 4));
        for k in [0, 1, 2] {
            assert_eq!(t.reserve(k, 0), Some(T));
        }
        let holder = {
            let t = t.clone();
            thread::spawn(move || {
                let r = t.hold_while(0, 1, 0, false, || thread::yield_now());
                assert_eq!(r, Some(true), "the refund found its lot");
            })
        };
        assert_eq!(t.reserve(5, 0), Some(T));
        holder.join().unwrap();
        assert_eq!(t.sweep(0), 0);
        assert_eq!(t.held(0), Some((T, 0)), "the hold left nothing behind");
        assert_eq!(t.live_keys(), vec![0, 1, 2, 5]);
    });
}

#[cfg(pace_mutant = "spot_written_blind")]
#[test]
fn mutant_spot_written_blind() {
    hold_while_vs_debit();
}

#[cfg(pace_mutant = "refund_rewinds_tat")]
#[test]
fn mutant_refund_rewinds_tat() {
    overlapping_refunds_are_exact();
}

#[cfg(pace_mutant = "decision_ignores_held")]
#[test]
fn mutant_decision_ignores_held() {
    held_tokens_count_at_every_decision();
}
