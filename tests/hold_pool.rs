//! A steady stream of holds (`hold`, then `hold_while`) allocates nothing
//! and retires nothing: a held
//! row of a few tokens keeps its state in its own word (`src/table/held.rs`,
//! `Form`), so a hold and its resolution are each one CAS of the row's
//! cell, with no record to allocate or hand to the epoch.
//!
//! Counted with a global allocator. This file holds one test so that
//! nothing else allocates concurrently in this binary. Built with
//! `PACE_HOLD_RECORD=1` (every held row in a record), the records come from
//! the thread's pool instead, and the epoch's garbage bags are what
//! allocates: one for every 64 deferred frees.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use pace::{Pace, Rate};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counter is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (via `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const CYCLES: u64 = 20_000;

#[test]
fn a_steady_stream_of_holds_allocates_nothing() {
    // A limit that never refuses here: every hold is admitted, and each
    // makes its row held, each keep or refund makes it plain again.
    let p: Pace<u64> = Pace::builder(Rate::per_second(1_000_000).unwrap())
        .capacity(1 << 40)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..8).collect();
    // A `Hold` kept or refunded.
    let hold = |i: u64| {
        let key = &keys[(i % 8) as usize];
        if i.is_multiple_of(2) {
            assert!(p.hold(key).expect("admitted").keep());
        } else {
            let refunded = p.hold(key).expect("admitted").refund();
            assert_eq!(refunded, pace::Refunded::Restored);
        }
    };
    // `hold_while` kept or refunded.
    let hold_while = |i: u64| {
        let key = &keys[(i % 8) as usize];
        let decided = p.hold_while(
            key,
            1,
            |_| if i.is_multiple_of(2) { Ok(()) } else { Err(()) },
        );
        assert_eq!(decided.expect("admitted").is_ok(), i.is_multiple_of(2));
    };
    // With records: a garbage bag per 64 retired records, and records the
    // pool lacks while freed ones wait for the epoch. A `hold_while` cycle
    // pins once where a `Hold` pins twice, and crossbeam-epoch collects
    // every 128 pins of a thread, so its freed records wait twice as many
    // cycles to come back to the pool.
    type Cycle<'a> = (&'a str, &'a dyn Fn(u64), u64);
    let cycles: [Cycle<'_>; 2] = [
        ("hold", &hold, CYCLES / 100),
        ("hold_while", &hold_while, CYCLES / 50),
    ];
    for (what, cycle, pool_misses) in cycles {
        // Warm up: the rows exist (and, with records, the pool is stocked).
        for i in 0..CYCLES {
            cycle(i);
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        let bytes_before = BYTES.load(Ordering::Relaxed);
        for i in 0..CYCLES {
            cycle(i);
        }
        let allocs = ALLOCS.load(Ordering::Relaxed) - before;
        let bytes = BYTES.load(Ordering::Relaxed) - bytes_before;
        eprintln!("{allocs} allocations, {bytes} bytes in {CYCLES} {what} cycles");
        let allowed = if cfg!(pace_hold_record) {
            CYCLES / 64 + pool_misses
        } else {
            0
        };
        assert!(
            allocs <= allowed,
            "{allocs} allocations in {CYCLES} {what} cycles (allowed {allowed})"
        );
    }
}
