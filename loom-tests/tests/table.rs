//! loom models of the table's migration protocol with boxed keys (keys that
//! hold a loom `Arc`, so a box freed twice or never is reported): a
//! migration copies 2 cells per chunk under loom, so a 4-cell array migrates
//! over several calls and every operation below can meet a half-copied
//! array.
//!
//! Run: RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom \
//!      LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release --test table
//!
//! The harness (keys holding a loom `Arc`, the id hasher, `model`) is
//! `support/mod.rs`, shared with `pace.rs`. Known-wrong variants of the crate,
//! built with `PACE_MUTANT=…` (or `--cfg pace_mutant="…"`), that a model here
//! must catch are run by the `mutant_*` tests (DESIGN.md §9 lists which);
//! `.ci/suites/10-loom.sh` runs them and checks the failure message.
#![cfg(loom)]

use loom::thread;
use pace::internals::{PaceInternals, ReservationInternals};

mod support;

use support::*;

/// Keys 0, 1, 2 in a 4-slot array: claims are at the limit (3 of 4), so the
/// next new key starts a migration to 8 slots (2 chunks of 2 slots).
fn three_rows(p: &P) {
    for id in [0, 1, 2] {
        drop(p.reserve_n_at(&key(id), 1, 0).unwrap());
    }
    assert_eq!(p.table_slots(), 4);
}

/// 1. Reserve racing a chunk copy: two threads create the same new key while
///    one of them starts a migration and copies the first chunk. The key's
///    sequence in the old array ends at a slot of the uncopied chunk: the
///    thread that goes on to the target must seal it, or the other thread's
///    insert, claimed before the migration, links a second row there.
fn reserve_vs_copy() {
    model(|| {
        let p = pace(4);
        for id in [0, 1] {
            drop(p.reserve_n_at(&key(id), 1, 0).unwrap());
        }
        // Key 6 starts at slot 2 of 4 (chunk 1); key 7 at slot 3.
        let other = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&key(6), 1, 0).is_ok())
        };
        // The third claim of 3 allowed: whichever of the two comes second
        // starts the migration.
        let mine = p.reserve_n_at(&key(6), 1, 0).is_ok() && p.reserve_n_at(&key(7), 1, 0).is_ok();
        assert!(other.join().unwrap() && mine);
        assert_eq!(ids(&p), vec![0, 1, 6, 7], "one live row per key");
        assert_eq!(p.row_tat(&key(6)), Some(2 * T), "both debits counted");
        assert_eq!(p.len(), 4, "len counts the rows");
    });
}

/// 2. Refund racing a chunk copy: a refund that fills its bucket removes the
///    row while a migration moves it. Whoever made it DEAD or the copier
///    unlinks it, wherever it is: no row is left, none resurrected, and the
///    row count is exact.
fn refund_vs_copy() {
    model(|| {
        let p = pace(4);
        let k0 = key(0);
        let held = p.reserve_n_at(&k0, 2, 0).unwrap();
        for id in [1, 2] {
            drop(p.reserve_n_at(&key(id), 1, 0).unwrap());
        }
        let grower = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&key(5), 1, 0).is_ok())
        };
        held.refund_at(0); // back to full: the row goes
        assert!(grower.join().unwrap());
        assert_eq!(
            p.row_tat(&key(0)),
            None,
            "a refund that fills the bucket removes the row"
        );
        assert_eq!(ids(&p), vec![1, 2, 5], "no row lost");
        assert_eq!(p.len(), 3, "len counts the rows");
    });
}

/// 3. Sweep racing a copy: one horizon later, two threads reserve new keys;
///    one of them runs the time-driven sweep pass (a reserve runs it before
///    its debit), the other starts a migration and copies. Rows killed while
///    being moved are unlinked exactly once wherever the copy took them, so
///    the row count stays exact; a pass that meets the migration stops and
///    starts again on the target once the copy ends, and the new rows live.
fn sweep_vs_copy() {
    model(|| {
        let p = pace(4);
        three_rows(&p); // all full long before `H`
        const H: u64 = 2_000_000; // past the first sweep due time (1 ms)
        let other = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&key(11), 1, H).is_ok())
        };
        let mine = p.reserve_n_at(&key(5), 1, H).is_ok();
        assert!(other.join().unwrap() && mine);
        let rows = ids(&p);
        assert!(
            rows.contains(&5) && rows.contains(&11),
            "new rows live: {rows:?}"
        );
        assert!(rows.iter().all(|id| [0, 1, 2, 5, 11].contains(id)));
        assert_eq!(p.len(), rows.len(), "len counts the rows");
        assert_eq!(p.row_tat(&key(5)), Some(H + T));
    });
}

/// 4. A migration starting while the previous one finishes: the target of a
///    running migration fills up to its limit (it keeps room for the rows
///    still to be copied: 3 new rows beside the 3 copies, in 8 slots) while
///    one thread holds a chunk it has claimed and not yet copied; the target
///    may start its own migration only once it is current, so no copied row
///    is lost.
fn migration_while_finishing() {
    model(|| {
        let p = pace(4);
        three_rows(&p);
        let other = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&key(3), 1, 0).is_ok())
        };
        let mine = [5, 9, 13, 17]
            .iter()
            .all(|&id| p.reserve_n_at(&key(id), 1, 0).is_ok());
        assert!(other.join().unwrap() && mine);
        assert_eq!(
            ids(&p),
            vec![0, 1, 2, 3, 5, 9, 13, 17],
            "no row lost, none duplicated"
        );
        assert_eq!(p.len(), 8, "len counts the rows");
        for id in [0, 1, 2, 3, 5, 9, 13, 17] {
            assert_eq!(p.row_tat(&key(id)), Some(T), "every debit kept");
        }
    });
}

/// 5. Tombstone reuse racing a late refund: key 0's row sits in slot 0;
///    one thread creates key 4 (same start), which passes slot 0 while key 0
///    lives there, while the other hands back key 0's debit late, which
///    fills its bucket: the row goes, slot 0 becomes a tombstone, and the
///    cleaner vacates it if slot 1 is vacant. Then key 4 is reserved again,
///    which may reuse slot 0. Every lookup finds key 4's row, and exactly
///    one row of it lives, holding both debits: a row linked into slot 1
///    must not end up behind a vacated slot 0 (the cleaner fences slot 1;
///    the inserter checks that its row is on its key's sequence).
fn reuse_vs_late_refund() {
    model(|| {
        let p = pace(4);
        let k0 = key(0);
        let held = p.reserve_n_at(&k0, 2, 0).unwrap();
        let other = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&key(4), 1, 0).is_ok())
        };
        held.refund_at(0); // back to full: the row goes
        assert!(other.join().unwrap());
        assert_eq!(p.row_tat(&key(4)), Some(T), "every lookup finds the row");
        assert!(p.reserve_n_at(&key(4), 1, 0).is_ok());
        assert_eq!(ids(&p), vec![4], "one live row per key");
        assert_eq!(p.row_tat(&key(4)), Some(2 * T), "both debits counted");
        assert_eq!(p.len(), 1, "len counts the rows");
    });
}

/// 6. Two inserters of one key while a tombstone appears before the first
///    vacant slot: one thread creates key 4 (it passes slot 0 while key 0
///    lives there and links into slot 1), the other hands back key 0's debit
///    (slot 0 becomes a tombstone) and creates key 4 too, reusing slot 0.
///    Each inserter checks the sequence after linking its claimed row, so
///    exactly one row of key 4 lives, holding both debits.
fn reuse_vs_insert() {
    model(|| {
        let p = pace(4);
        let k0 = key(0);
        let held = p.reserve_n_at(&k0, 2, 0).unwrap();
        let other = {
            let p = p.clone();
            thread::spawn(move || p.reserve_n_at(&key(4), 1, 0).is_ok())
        };
        held.refund_at(0); // back to full: the row goes
        let mine = p.reserve_n_at(&key(4), 1, 0).is_ok();
        assert!(other.join().unwrap() && mine);
        assert_eq!(ids(&p), vec![4], "one live row per key");
        assert_eq!(p.row_tat(&key(4)), Some(2 * T), "both debits counted");
        assert_eq!(p.len(), 1, "len counts the rows");
    });
}

macro_rules! models {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(not(pace_mutant))]
        #[test]
        fn $name() {
            super::$name();
        }
    )*};
}

mod model {
    models!(
        reserve_vs_copy,
        refund_vs_copy,
        sweep_vs_copy,
        migration_while_finishing,
        reuse_vs_late_refund,
        reuse_vs_insert
    );
}

// Mutants: each runs the model that must catch it (see pace.rs for why these
// are not `#[should_panic]`).

#[cfg(pace_mutant = "verify_off")]
#[test]
fn mutant_verify_off() {
    reuse_vs_insert();
}

#[cfg(pace_mutant = "copy_unfrozen")]
#[test]
fn mutant_copy_unfrozen() {
    reserve_vs_copy();
}

#[cfg(pace_mutant = "refund_gives_up_on_frozen")]
#[test]
fn mutant_refund_gives_up_on_frozen() {
    refund_vs_copy();
}
