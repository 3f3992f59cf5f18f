//! Dormant cells (DESIGN.md §4): a pass puts a full row to sleep, keeping its
//! key and `tat` in its cell (no row: not counted, not peeked, refunds find
//! nothing); the key's next call revives it with one CAS, deciding as a row
//! made anew would, without making a row or a key box. Known-wrong variants,
//! each caught here: `revive_from_now` (a revival starts from the reviver's
//! reading) by `a_stale_reading_cannot_revive_below_the_kept_tat`,
//! `revive_unsealed` (a revival in an array whose migration drops dormant
//! cells) by `revivals_during_a_shrink_go_to_the_target`, `no_dormancy`
//! (passes remove every full row) by `a_returning_key_revives_its_cell` and
//! `returning_string_keys_allocate_nothing`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::time::Duration;

use pace::internals::{PaceInternals, ReservationInternals};
use pace::{ManualClock, Pace, Rate, Refunded};

/// Counts this thread's allocations (tests run on threads of their own).
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|a| a.get())
}

const SEC: u64 = 1_000_000_000;

/// 1 token a second, capacity 2 (a 2 s horizon), on a manual clock, its
/// passes putting every full row to sleep.
fn limiter<K: std::hash::Hash + Eq + Clone + 'static>() -> Pace<K, RandomState, ManualClock> {
    let p = Pace::builder(Rate::per_second(1).unwrap())
        .capacity(2)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    p.force_dormancy();
    p
}

#[test]
fn a_returning_key_revives_its_cell() {
    let p = limiter::<u64>();
    let t = 10 * SEC;
    let r = p.reserve_n_at(&7, 2, t).unwrap();
    assert_eq!(r.debit_end_ns(), t + 2 * SEC);
    assert_eq!(p.len(), 1);
    // Full at t + 2 s: the pass puts it to sleep. No row any more.
    p.pass_at(t + 2 * SEC);
    assert_eq!((p.len(), p.dormant_cells()), (0, 1));
    assert!(p.is_empty());
    assert_eq!(p.row_keys(), Vec::<u64>::new());
    assert_eq!(p.row_tat(&7), None, "a dormant cell is no row");
    // A refund of the debit that filled it finds no row.
    assert_eq!(r.refund_at(t + 2 * SEC), Refunded::Refilled);
    // The key comes back: its cell is a row again, decided as a row made
    // anew at its floor (the kept `tat`) would be.
    let back = p.reserve_n_at(&7, 2, t + 3 * SEC).unwrap();
    assert_eq!(back.debit_prev_ns(), t + 2 * SEC);
    assert_eq!(back.debit_end_ns(), t + 5 * SEC);
    assert_eq!((p.len(), p.dormant_cells()), (1, 0));
    assert_eq!(p.row_keys(), vec![7]);
    // The bucket holds nothing more until a token refills.
    assert!(p.reserve_n_at(&7, 1, t + 3 * SEC).is_err());
    // An explicit sweep drops dormant cells and removes full rows alike.
    p.pass_at(t + 6 * SEC);
    assert_eq!((p.len(), p.dormant_cells()), (0, 1));
    assert_eq!(p.sweep_at(t + 6 * SEC), 0, "a dormant cell is no row");
    assert_eq!((p.len(), p.dormant_cells()), (0, 0));
}

/// A thread that read the clock before the pass that put the row to sleep
/// (its reading earlier than the kept `tat`) revives the row from that
/// `tat`, not from its reading: the bucket it fills was already full of
/// debt at that reading.
#[test]
fn a_stale_reading_cannot_revive_below_the_kept_tat() {
    let p = limiter::<u64>();
    let t = 10 * SEC;
    drop(p.reserve_n_at(&7, 2, t).unwrap()); // full again at t + 2 s
    p.pass_at(t + 2 * SEC);
    assert_eq!(p.dormant_cells(), 1);
    // The stale reading t: the bucket is empty at t, so the debit waits.
    let denied = p.reserve_n_at(&7, 1, t).unwrap_err();
    assert_eq!(denied.retry_after(), Duration::from_secs(1));
    assert_eq!(
        (p.len(), p.dormant_cells()),
        (0, 1),
        "a denial writes nothing"
    );
    // At t + 1 s one token is back: exactly one.
    assert!(p.reserve_n_at(&7, 1, t + SEC).is_ok());
    assert!(p.reserve_n_at(&7, 1, t + SEC).is_err());
}

/// Many keys asleep in a large array; a pass's shrink begins (nobody came
/// back: it drops the dormant cells) and the keys come back while it runs.
/// Each revival first checks for the migration: a key whose cell is in the
/// migrating array drops it and makes its row in the target, which has room
/// for it. Under `revive_unsealed` the revived rows are copied into a
/// target sized without them, which has no room for them (its copy
/// panics).
#[test]
fn revivals_during_a_shrink_go_to_the_target() {
    const KEYS: u64 = 30_000;
    let p = limiter::<u64>();
    let t = 10 * SEC;
    for k in 0..KEYS {
        drop(p.reserve_n_at(&k, 1, t).unwrap());
    }
    let big = p.table_slots();
    assert!(big >= 32_768, "{big} slots");
    // Full at t + 1 s: asleep, and the pass's shrink starts at once.
    p.pass_at(t + SEC);
    assert_eq!(p.len(), 0);
    assert!(p.migrating(), "the pass ended in a shrink");
    // (Its first share of the copy dropped the dormant cells of a chunk.)
    assert!(
        p.dormant_cells() > KEYS as usize / 2,
        "{}",
        p.dormant_cells()
    );
    let now = t + 2 * SEC;
    for k in 0..KEYS {
        let r = p.reserve_n_at(&k, 1, now).unwrap();
        assert_eq!(r.debit_end_ns(), now + SEC, "key {k}");
    }
    // (Calls of one more key finish the copy.)
    drop(p.reserve_n_at(&KEYS, 1, now).unwrap());
    while p.migrating() {
        drop(p.reserve_n_at(&KEYS, 1, now));
    }
    assert_eq!((p.len(), p.dormant_cells()), (KEYS as usize + 1, 0));
    let mut keys = p.row_keys();
    keys.sort_unstable();
    assert_eq!(keys, (0..=KEYS).collect::<Vec<_>>());
    // Each key holds one token of debt: one more fits its bucket of 2.
    for k in 0..KEYS {
        assert!(p.reserve_n_at(&k, 1, now).is_ok(), "key {k}");
        assert!(p.reserve_n_at(&k, 1, now).is_err(), "key {k} debited once");
    }
}

/// A client that comes back to its dormant cell costs no allocation: the
/// key box stays in the cell.
#[test]
fn returning_string_keys_allocate_nothing() {
    const KEYS: usize = 500;
    let p = limiter::<String>();
    let names: Vec<String> = (0..KEYS).map(|i| format!("client-{i:012}")).collect();
    let mut now = 10 * SEC;
    for n in &names {
        drop(p.reserve_n_at(n.as_str(), 1, now).unwrap());
    }
    // The first pass ends in a shrink that drops the dormant cells (no
    // client came back yet); the clients' new rows are returns, so from
    // then on the passes' dormant cells stay for them.
    now += 2 * SEC;
    p.pass_at(now);
    for n in &names {
        drop(p.reserve_n_at(n.as_str(), 1, now).unwrap());
    }
    while p.migrating() {
        drop(p.reserve_n_at(names[0].as_str(), 1, now));
    }
    for round in 0..5 {
        now += 2 * SEC; // every bucket full again
        p.pass_at(now);
        assert_eq!((p.len(), p.dormant_cells()), (0, KEYS), "round {round}");
        let before = allocs();
        for n in &names {
            drop(p.reserve_n_at(n.as_str(), 1, now).unwrap());
        }
        assert_eq!(allocs() - before, 0, "round {round}: allocations");
        assert_eq!((p.len(), p.dormant_cells()), (KEYS, 0));
    }
}

/// A key whose dormant cell another key took over, or that a drop removed,
/// starts again from its floor, which holds the `tat` its cell kept.
#[test]
fn a_dropped_dormant_cell_leaves_its_tat_in_the_floor() {
    let p = limiter::<u64>();
    let t = 10 * SEC;
    drop(p.reserve_n_at(&7, 2, t).unwrap());
    p.pass_at(t + 2 * SEC);
    assert_eq!(p.sweep_at(t + 2 * SEC), 0);
    assert_eq!(p.dormant_cells(), 0, "the explicit sweep dropped it");
    // The stale reading t: the new row starts from the floor, t + 2 s.
    let denied = p.reserve_n_at(&7, 1, t).unwrap_err();
    assert_eq!(denied.retry_after(), Duration::from_secs(1));
}
