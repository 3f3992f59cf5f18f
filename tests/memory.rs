//! Memory follows the keys that exchanged, not the keys anyone named.
//!
//! Measured with a counting global allocator. This file holds one test so
//! that nothing else allocates concurrently in this binary; it floods both
//! tables of `u64` rows (cells and entries) in turn.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::hash_map::RandomState;
use std::sync::atomic::{AtomicIsize, Ordering};

use pace::internals::PaceInternals;
use pace::{ManualClock, Pace, Rate};

struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counter is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (via `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            HELD.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn held() -> isize {
    pace::internals::collect_garbage();
    HELD.load(Ordering::Relaxed)
}

/// What an idle run of the collector may keep (thread-local garbage bags).
const SLACK: isize = 64 * 1024;
const FLOOD: u64 = if cfg!(debug_assertions) {
    200_000
} else {
    1_000_000
};

#[test]
fn memory_is_bounded_by_recent_exchanges() {
    let clock = ManualClock::new();
    let rate = Rate::per_second(10).unwrap();

    // 1. A flood of distinct claimed ids, each reserved and refunded (the
    //    presenter could not prove the id): no row survives, the table keeps
    //    its size.
    let ids: Pace<String, RandomState, ManualClock> =
        Pace::builder(rate).clock(clock.clone()).build().unwrap();
    let slots = ids.table_slots();
    let base = held();
    for i in 0..FLOOD {
        let claimed = format!("client-{i:012}");
        ids.reserve(claimed.as_str()).unwrap().refund();
    }
    assert_eq!(ids.len(), 0);
    assert_eq!(ids.table_slots(), slots);
    let after = held();
    assert!(after - base <= SLACK, "flood left {} bytes", after - base);

    // 1b. The same flood with holds, and overlapping holds of one id kept
    //    and refunded: every record a hold or a resolution made is freed.
    let base = held();
    for i in 0..FLOOD {
        let claimed = format!("client-{i:012}");
        ids.hold(claimed.as_str()).unwrap().refund();
    }
    for _ in 0..FLOOD / 4 {
        let a = ids.hold("victim").unwrap();
        let b = ids.hold("victim").unwrap();
        b.refund();
        a.refund();
    }
    assert_eq!(ids.len(), 0);
    let after = held();
    assert!(after - base <= SLACK, "holds left {} bytes", after - base);

    // 2. A flood of keys that each really exchanged once, in each table.
    let cells = flood("cells", rate, &clock);
    let entries = flood("entries", rate, &clock);

    // 3. The same with String keys (what a claimed id usually is).
    let base = held();
    let names: Pace<String, RandomState, ManualClock> =
        Pace::builder(rate).clock(clock.clone()).build().unwrap();
    let n = FLOOD / 4;
    for i in 0..n {
        let _kept = names.reserve(format!("client-{i:08}").as_str()).unwrap();
    }
    let peak = held();
    eprintln!(
        "{n} live String rows (15-byte keys): {:.1} bytes per row",
        (peak - base) as f64 / n as f64
    );
    clock.advance(names.horizon());
    assert_eq!(names.sweep(), n as usize);
    assert_eq!(names.table_slots(), slots);
    drop(names);
    drop(cells);
    drop(entries);
    drop(ids);
    let end = held();
    assert!(end - base <= SLACK, "{} bytes left after drop", end - base);
}

/// Part 2 of the test, for one table (`rows`: "cells" or "entries"): a
/// flood of keys that each really exchanged once. Rows live for one
/// horizon, then the first calls after it sweep them and the table shrinks
/// back to its minimum. Returns the limiter, to be dropped with the others.
fn flood(rows: &str, rate: Rate, clock: &ManualClock) -> Pace<u64, RandomState, ManualClock> {
    let keys: Pace<u64, RandomState, ManualClock> = match rows {
        "cells" => Pace::builder(rate).clock(clock.clone()).build().unwrap(),
        _ => Pace::builder(rate)
            .clock(clock.clone())
            .boxed_keys()
            .build()
            .unwrap(),
    };
    assert_eq!(keys.inline_keys(), rows == "cells");
    let slots = keys.table_slots();
    let base = held();
    for k in 0..FLOOD {
        let _kept = keys.reserve(&k).unwrap();
    }
    assert_eq!(keys.len(), FLOOD as usize);
    // Without forcing collection: ordinary calls finish the last migration
    // and, pinning, run the collector, which frees the arrays the flood's
    // migrations retired (large ones on a thread of their own: wait for it).
    // What is held is then the live array and the rows.
    while keys.migrating() {
        keys.reserve(&0).unwrap().refund();
    }
    for _ in 0..1024 {
        keys.reserve(&0).unwrap().refund();
    }
    while pace::internals::frees_in_flight() > 0 {
        std::thread::yield_now();
    }
    let uncollected = HELD.load(Ordering::Relaxed) - base;
    let live = (keys.table_bytes() + keys.memory().entry_bytes) as isize;
    assert!(
        uncollected <= live + SLACK,
        "{uncollected} bytes held without a forced collection, {live} live: \
         retired arrays are not freed"
    );
    let peak = held();
    eprintln!(
        "{FLOOD} live u64 rows in {rows}: {} bytes, {:.1} bytes per row ({} table slots)",
        peak - base,
        (peak - base) as f64 / FLOOD as f64,
        keys.table_slots()
    );
    // The flood's last migration may still be running: ordinary calls
    // finish it, one chunk each, so the pass below is counted alone. Its
    // source is smaller than its target, so the target's chunk count bounds
    // the calls.
    let chunks = keys
        .table_slots()
        .div_ceil(pace::internals::MIGRATION_CHUNK);
    let mut copies = 0;
    while keys.migrating() {
        keys.reserve(&0).unwrap().refund();
        copies += 1;
        assert!(copies <= chunks, "every call copies a chunk");
    }
    clock.advance(keys.horizon());
    // Past the horizon the next call starts a sweep pass; on a table this
    // large each call sweeps one chunk of `sweep_chunk(slots)` slots, so
    // callers finish it.
    let slots_now = keys.table_slots();
    let chunk = pace::internals::sweep_chunk(slots_now);
    let chunks = slots_now.div_ceil(chunk);
    let mut calls = 0;
    while !keys.is_empty() || calls == 0 {
        keys.reserve(&u64::MAX).unwrap().refund(); // a rejected presentation
        calls += 1;
        assert!(calls <= chunks, "the pass ends after one call per chunk");
    }
    assert_eq!(calls, chunks, "one call per chunk");
    assert_eq!(keys.len(), 0);
    assert_eq!(keys.table_slots(), slots);
    // The pass put the full rows to sleep (dormant cells: no rows) and,
    // nobody coming back to them, ended in a shrink, which drops them: each
    // call's share of it takes at least a chunk of 64 cells (4 of a sparse
    // array).
    let mut shares = 0;
    while keys.migrating() {
        keys.reserve(&u64::MAX).unwrap().refund();
        shares += 1;
        assert!(
            shares <= slots_now / pace::internals::MIGRATION_CHUNK,
            "every call copies a chunk"
        );
    }
    assert_eq!(keys.dormant_cells(), 0);
    while pace::internals::frees_in_flight() > 0 {
        std::thread::yield_now();
    }
    let after = held();
    assert!(
        after - base <= SLACK,
        "{} bytes left after the horizon",
        after - base
    );
    keys
}
