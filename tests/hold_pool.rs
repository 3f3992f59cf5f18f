//! A steady stream of holds allocates (almost) nothing: a held record that
//! the epoch frees goes to the freeing thread's pool, and the next hold of
//! that thread takes it from there (`src/table/held.rs`, `pool`).
//!
//! Counted with a global allocator. This file holds one test so that
//! nothing else allocates concurrently in this binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use pace::{Pace, Rate};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counter is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (via `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const CYCLES: u64 = 20_000;

#[test]
fn held_records_come_from_the_threads_pool() {
    // A limit that never refuses here: every hold is admitted, and each
    // makes its row held (a record), each keep or refund makes it plain
    // again (the record retired).
    let p: Pace<u64> = Pace::builder(Rate::per_second(1_000_000).unwrap())
        .capacity(1 << 40)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..8).collect();
    let cycle = |i: u64| {
        let h = p.hold(&keys[(i % 8) as usize]).expect("admitted");
        if i.is_multiple_of(2) {
            h.keep();
        } else {
            h.refund();
        }
    };
    // Warm up: the rows exist and the epoch has freed records into the pool.
    for i in 0..CYCLES {
        cycle(i);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for i in 0..CYCLES {
        cycle(i);
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    // Without the pool every hold allocates its record (CYCLES allocations).
    // With it, what allocates is the collector's own: one bag for every 64
    // deferred frees (crossbeam-epoch's `MAX_OBJECTS`), so CYCLES / 64, and
    // a pool that ran dry now and then would add to that.
    assert!(
        allocs <= CYCLES / 64 + CYCLES / 100,
        "{allocs} allocations in {CYCLES} hold cycles"
    );
}
