//! Every migration is spread over many calls: no call pays for the table,
//! whether the table grows or shrinks while new keys arrive. Known-wrong
//! variants, each caught here:
//! * `copies_keep_their_room`: the rows a chunk copies stay counted against
//!   the room the target kept for them, so the target reaches its limit
//!   before the copy ends and the insert that meets it copies every chunk
//!   left;
//! * `no_room_for_new_rows`: a shrinking table's target is sized from its
//!   rows alone, so new rows fill it long before the copy of the large old
//!   array ends, with the same effect;
//! * `passes_die_with_their_array`: a sweep pass that comes due while a
//!   migration runs stops on the migrating array and is not started again on
//!   the new one, so the rows it should remove stay a whole horizon longer.

use std::time::Duration;

#[macro_use]
mod tables;

use pace::internals::{PaceInternals, ReservationInternals, MIGRATION_CALL_CELLS, MIGRATION_CHUNK};
use pace::{ManualClock, Pace};
use tables::{limiter, Rows};

type P = Pace<u64, std::collections::hash_map::RandomState, ManualClock>;

const T: u64 = 1_000_000;

both_tables!(
    each_growth_migration_is_spread_over_its_chunks,
    a_shrink_while_new_keys_arrive_is_spread_over_its_chunks,
    a_pass_due_during_a_migration_runs_on_the_new_array,
);

/// Follows the migrations that `call` meets, one call at a time: no call
/// copies more than `MIGRATION_CALL_CELLS` slots of a migration (whole
/// chunks of `MIGRATION_CHUNK`; more than one only while they are sparse),
/// and, one thread calling, a migration from an array of `n` slots runs over
/// at least `n / MIGRATION_CALL_CELLS` calls. Records the migrations seen:
/// (slots copied from, calls).
#[derive(Default)]
struct Watch {
    running: Option<(usize, usize)>,
    seen: Vec<(usize, usize)>,
}

impl Watch {
    fn call(&mut self, p: &P, call: impl FnOnce()) {
        let before = p.slots();
        let started = p.migrations();
        let copied = p.copied_slots();
        call();
        let now_copied = p.copied_slots() - copied;
        assert!(
            now_copied <= MIGRATION_CALL_CELLS,
            "one call copied {now_copied} slots: some call copied more than one call's share"
        );
        assert_eq!(now_copied % MIGRATION_CHUNK, 0, "whole chunks");
        if let Some((_, calls)) = self.running.as_mut() {
            *calls += 1;
        } else if p.migrations() > started {
            self.running = Some((before, 1));
        }
        if !p.migrating() {
            if let Some((from, calls)) = self.running.take() {
                assert!(
                    calls >= from.div_ceil(MIGRATION_CALL_CELLS),
                    "the migration from {from} slots ended after {calls} calls: \
                     some call copied more than one call's share"
                );
                self.seen.push((from, calls));
            }
        }
    }
}

/// One thread, every call a new key that it keeps (nothing refills during
/// the test): in release, migrations up to one from 2^19 slots.
fn each_growth_migration_is_spread_over_its_chunks(rows: Rows) {
    const KEYS: u64 = if cfg!(debug_assertions) {
        100_000
    } else {
        600_000
    };
    let p = limiter(100, Duration::from_secs(100), rows);
    let now = 1_000_000_000;
    let mut w = Watch::default();
    for k in 0..KEYS {
        w.call(&p, || {
            let _kept = p.reserve_n_at(&k, 1, now).expect("a fresh key");
        });
    }
    assert_eq!(p.len(), KEYS as usize);
    // Dense arrays (growth at 3/4 full) copy one chunk per call.
    for &(from, calls) in &w.seen {
        assert!(
            calls >= from.div_ceil(MIGRATION_CHUNK),
            "growth from {from} slots took {calls} calls"
        );
    }
    let largest = w.seen.iter().map(|&(from, _)| from).max().unwrap_or(0);
    assert!(
        largest >= 1 << 16,
        "migrations checked: {:?}; expected one from at least 2^16 slots",
        w.seen
    );
}

/// A table of 100,000 rows refills (capacity 1, interval T); 50 fresh keys
/// stay live; the sweep pass that ordinary calls run removes the rest and
/// ends by starting a shrink migration of the large array, which keeps its
/// 50 rows. Meanwhile every call presents a new key: refunded (no row) during
/// the pass, kept after it. The shrink, too, copies at most one call's share
/// per call.
fn a_shrink_while_new_keys_arrive_is_spread_over_its_chunks(rows: Rows) {
    const KEYS: u64 = 100_000;
    let p = limiter(1, Duration::from_nanos(T), rows);
    for k in 0..KEYS {
        let _kept = p.reserve_n_at(&k, 1, 0).expect("a fresh key");
    }
    // Finish the last growth (denied calls copy too), so that the pass below
    // runs over the grown array (a pass that meets a migration starts again
    // on the new array once the copy ends).
    while p.migrating() {
        assert!(p.reserve_n_at(&0, 1, 0).is_err(), "key 0 is empty at 0");
    }
    let grown = p.slots();
    let now = 10 * T; // every row above refilled at T
    for k in KEYS..KEYS + 50 {
        let _kept = p.reserve_n_at(&k, 1, now).expect("a fresh key");
    }
    let mut w = Watch::default();
    let mut k = 2 * KEYS;
    let grew = p.migrations();
    // The pass: one chunk per call, until the shrink starts.
    while p.migrations() == grew {
        k += 1;
        w.call(&p, || {
            p.reserve_n_at(&k, 1, now)
                .expect("a fresh key")
                .refund_at(now);
        });
        assert!(k < 3 * KEYS, "the pass ended without a shrink");
    }
    // The shrink, with a new row each call.
    while w.running.is_some() {
        k += 1;
        w.call(&p, || {
            let _kept = p.reserve_n_at(&k, 1, now).expect("a fresh key");
        });
    }
    let (from, calls) = *w.seen.last().unwrap();
    assert_eq!(from, grown, "the shrink copied the grown array");
    assert!(p.slots() < grown, "the table shrank");
    assert_eq!(p.len(), 50 + calls - 1, "the 50 live rows and the new ones");
}

/// A time-driven sweep pass that comes due while a growth migration runs is
/// carried to the new array: once the migration ends, the next
/// `slots / sweep_chunk(slots)` calls remove every row that refilled, with no
/// second horizon to wait for. Every call below presents a new key and
/// refunds it, so no row is kept and no pass starts for any other reason.
fn a_pass_due_during_a_migration_runs_on_the_new_array(rows: Rows) {
    let p = limiter(1, Duration::from_nanos(T), rows);
    let horizon = u64::try_from(p.horizon().as_nanos()).unwrap();
    // Rows taken at 0 (each full again at T), until a growth migration from
    // an array too large to sweep at once is running.
    let mut k = 0;
    while !(k >= 20_000 && p.migrating()) {
        let _kept = p.reserve_n_at(&k, 1, 0).expect("a fresh key");
        k += 1;
    }
    let rows = p.len();
    assert_eq!(rows, usize::try_from(k).unwrap());
    let now = 10 * T.max(horizon); // the pass is due, every row refilled
    let mut calls = 0;
    while p.migrating() {
        k += 1;
        calls += 1;
        p.reserve_n_at(&k, 1, now)
            .expect("a fresh key")
            .refund_at(now);
        assert!(calls < 10 * rows, "the migration does not end");
    }
    assert!(calls > 1, "the pass came due while the array migrated");
    let slots = p.slots();
    let chunk = pace::internals::sweep_chunk(slots);
    for _ in 0..slots.div_ceil(chunk) {
        k += 1;
        p.reserve_n_at(&k, 1, now)
            .expect("a fresh key")
            .refund_at(now);
    }
    assert_eq!(
        p.len(),
        0,
        "{rows} refilled rows, {slots} slots: the pass that came due during \
         the migration did not run on the new array"
    );
}
