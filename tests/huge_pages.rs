//! With `Builder::huge_pages(true)` a large slot array asks Linux for
//! transparent huge pages; by default it asks for none. Known-wrong
//! variant, caught here: `huge_pages_ignored` (no array asks).
//!
//! Checked where the kernel's THP setting (`enabled`) is `madvise`, the
//! kernel's default, under which only the memory a process advises gets
//! huge pages: the process's `AnonHugePages` (`/proc/self/smaps_rollup`)
//! then counts the table's huge pages and nothing else. With `always` or
//! `never` there is nothing of pace's to see, and the test says so and
//! passes. This file holds one test, so nothing else of the process
//! allocates while it reads.

use std::time::Duration;

use pace::{Pace, Rate};

/// Keys enough for an array of 2^19 cells (8 MiB, four whole 2 MiB pages
/// or more wherever the allocator puts it).
const KEYS: u64 = 300_000;

fn anon_huge_kib() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("an AnonHugePages line")
}

/// The `AnonHugePages` a filled table of `KEYS` rows adds to the process,
/// each of its keys admitted once: with `huge_pages(on)`, or the default.
fn huge_kib_of(huge: Option<bool>) -> u64 {
    let rate = Rate::new(1, Duration::from_secs(1)).expect("rate");
    let before = anon_huge_kib();
    let b = Pace::builder(rate).capacity(10);
    let b = match huge {
        Some(on) => b.huge_pages(on),
        None => b,
    };
    let p: Pace<u64> = b.build().expect("limiter");
    for k in 0..KEYS {
        assert!(p.reserve(&k).is_ok(), "key {k} admitted");
    }
    let added = anon_huge_kib().saturating_sub(before);
    drop(p);
    added
}

#[test]
fn a_large_array_asks_for_huge_pages() {
    let setting =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !setting.contains("[madvise]") {
        eprintln!(
            "THP `enabled` is not `madvise` ({}): nothing to check",
            setting.trim()
        );
        return;
    }
    let on = huge_kib_of(Some(true));
    assert!(
        on >= 2048,
        "a table of {KEYS} rows added {on} KiB of AnonHugePages: its array asked for none"
    );
    for huge in [None, Some(false)] {
        let off = huge_kib_of(huge);
        assert_eq!(
            off, 0,
            "huge_pages {huge:?}: a table of {KEYS} rows added {off} KiB of AnonHugePages"
        );
    }
}
