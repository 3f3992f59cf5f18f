//! Churn without migrations: a flood of new keys at a steady number of live
//! rows reuses the tombstones that removed rows leave, so the table keeps its
//! size and starts no migration. Known-wrong variants, each caught here:
//! `no_tombstone_reuse` (every new row takes a vacant slot) by the
//! `entries::` tests, `cells_no_clean` (tombstones only reused, never
//! cleaned) by the `cells::` tests, `cells_no_churn_resize` (a churning
//! cell array never resized after a pass) by
//! `a_churning_cell_array_is_resized_for_churn`; `mark_kept_after_pass`
//! (the doubling that starts a pass counts from the rows at the last pass's
//! start) and `shrink_to_half` (a shrink leaves no room for the rows to
//! double) by `a_flood_under_a_long_horizon_keeps_few_rows`;
//! `shrink_below_sweep_floor` (a shrink sized for the few rows a pass left)
//! by `new_keys_refilled_between_requests_stop_migrating`; `no_quiet_rows`
//! (passes put the quiet full rows of returning clients to sleep) by
//! `a_working_set_refilled_between_requests_stops_migrating`;
//! `quiet_rows_in_floods` (a flood beside returning clients keeps its rows)
//! by `a_flood_beside_returning_clients_keeps_few_of_its_rows`.

use std::collections::hash_map::RandomState;
use std::time::Duration;

#[macro_use]
mod tables;

use pace::internals::PaceInternals;
use pace::{ManualClock, Pace};
use tables::{limiter, Rows};

const T: u64 = 1_000;

both_tables!(
    refunded_keys_reuse_tombstones,
    swept_keys_reuse_tombstones,
    a_flood_under_a_long_horizon_keeps_few_rows,
    a_working_set_refilled_between_requests_stops_migrating,
    a_flood_beside_returning_clients_keeps_few_of_its_rows,
    returning_clients_that_leave_leave_nothing,
    new_keys_refilled_between_requests_stop_migrating,
);

/// Cells per live row a churning array may have: its target gives rows at
/// most an eighth of it (`target_size`), rounded up to a power of two.
fn churn_room(_rows: Rows) -> usize {
    16
}

/// Create a row, hand the debit back (the bucket is full again: the row
/// goes), next key: 1,000 live rows at every step. After a warm-up of 10,000
/// keys (where the table may grow once to make room for churn), 190,000 more
/// keys neither migrate nor resize the table.
fn refunded_keys_reuse_tombstones(rows: Rows) {
    const LIVE: u64 = 1_000;
    let p = limiter(1, Duration::from_nanos(T), rows);
    let now = 10 * T;
    let mut held = std::collections::VecDeque::new();
    let churn = |ids: std::ops::Range<u64>, held: &mut std::collections::VecDeque<_>| {
        for id in ids {
            if held.len() == LIVE as usize {
                let (old, debit) = held.pop_front().unwrap();
                p.refund_at(&old, debit, now);
            }
            held.push_back((id, p.reserve_n_at(&id, 1, now).unwrap().detach()));
            assert_eq!(p.len(), held.len(), "one row per held key");
        }
    };
    churn(0..11 * LIVE, &mut held);
    let slots = p.table_slots();
    let migrations = p.migrations();
    let most = churn_room(rows) * LIVE as usize;
    assert!(slots <= most, "{slots} slots for {LIVE} rows");
    churn(11 * LIVE..200 * LIVE, &mut held);
    assert_eq!(p.migrations(), migrations, "no migration under churn");
    assert_eq!(p.table_slots(), slots, "the table keeps its size");
    let mut keys = p.row_keys();
    keys.sort_unstable();
    let want: Vec<u64> = held.iter().map(|(id, _)| *id).collect();
    assert_eq!(keys, want, "exactly the held keys have rows");
}

/// Every call names a new key; each row refills in 1 ms and the
/// time-driven sweep removes full rows each 1 ms horizon, so the table holds
/// one to two horizons of keys: after the first horizons it neither grows,
/// shrinks nor migrates.
fn swept_keys_reuse_tombstones(rows: Rows) {
    let p = limiter(1, Duration::from_millis(1), rows);
    let mut flood = SweptFlood::new(&p);
    flood.run(30);
    let slots = p.table_slots();
    let migrations = p.migrations();
    flood.run(100);
    assert_eq!(p.migrations(), migrations, "no migration under churn");
    assert_eq!(p.table_slots(), slots, "the table keeps its size");
    assert!(
        (p.len() as u64) <= 3 * SweptFlood::PER_HORIZON,
        "rows are the last horizons' keys: {}",
        p.len()
    );
}

/// A flood of new keys into a cell table whose arrays grew for rows alone
/// (the first horizon's keys, before any was swept): at the end of a sweep
/// pass that leaves tombstones in a quarter of the cells, the table moves
/// to an array sized for churn, where a horizon's rows (4,000) take at most
/// 1/8 of the cells, and stays there. (The slot table resizes for churn
/// only when its tombstones fill the array.) Known-wrong variant, caught
/// here: `cells_no_churn_resize` (the cells stay at 16,384 until their
/// tombstones fill the array, 20 horizons later).
#[test]
fn a_churning_cell_array_is_resized_for_churn() {
    let p = limiter(1, Duration::from_millis(1), Rows::Cells);
    assert!(p.inline_keys(), "u64 rows are in cells");
    let mut flood = SweptFlood::new(&p);
    flood.run(12);
    let slots = p.table_slots();
    let per_horizon = SweptFlood::PER_HORIZON;
    assert!(
        slots >= 8 * per_horizon as usize,
        "{slots} slots for {per_horizon} rows a horizon"
    );
    let migrations = p.migrations();
    flood.run(20);
    assert_eq!(p.migrations(), migrations, "resized once");
    assert_eq!(p.table_slots(), slots, "the table keeps its size");
}

/// New keys, one each 250 ns, into a limiter of 1 ms horizon: 4,000 keys a
/// horizon, each row full again 1 ms after its reserve.
struct SweptFlood<'a> {
    p: &'a Pace<u64, RandomState, ManualClock>,
    id: u64,
    now: u64,
}

impl<'a> SweptFlood<'a> {
    const STEP: u64 = 250;
    const PER_HORIZON: u64 = 1_000_000 / Self::STEP;

    fn new(p: &'a Pace<u64, RandomState, ManualClock>) -> SweptFlood<'a> {
        assert_eq!(p.horizon(), Duration::from_millis(1));
        SweptFlood {
            p,
            id: 0,
            now: 1_000_000_000,
        }
    }

    fn run(&mut self, horizons: u64) {
        for _ in 0..horizons * Self::PER_HORIZON {
            drop(self.p.reserve_n_at(&self.id, 1, self.now).unwrap());
            self.id += 1;
            self.now += Self::STEP;
        }
    }
}

/// New keys under the default capacity of 1000/s (a 1 s horizon), so each
/// row is full again 1 ms after its reserve but the time-driven pass comes
/// only once a second: the passes that start when the rows double remove
/// them. Each counts from the rows the last pass left, so the table holds a
/// few milliseconds of keys and, after a warm-up, neither grows nor
/// shrinks (4,000 keys a millisecond); when the keys slow to 1,000 a
/// millisecond it shrinks once, to an array where the rows can double
/// before the next pass, and stays there. Known-wrong variants, caught
/// here: `mark_kept_after_pass` (the next doubling counts from the rows at
/// the last pass's start: the rows reach 16 ms of keys and the table
/// grows), `shrink_to_half` (the shrink leaves no room for a doubling: it
/// grows again).
fn a_flood_under_a_long_horizon_keeps_few_rows(rows: Rows) {
    let p = limiter(1000, Duration::from_millis(1), rows);
    assert_eq!(p.horizon(), Duration::from_secs(1));
    let mut now = 1_000_000_000;
    let mut id = 0u64;
    // `ms` milliseconds of a new key each `step` ns: the most rows seen.
    let mut flood = |ms: u64, step: u64| {
        let mut most = 0;
        for _ in 0..ms * 1_000_000 / step {
            drop(p.reserve_n_at(&id, 1, now).unwrap());
            id += 1;
            now += step;
            most = most.max(p.len());
        }
        most
    };
    let (fast, slow) = (250, 1_000);
    flood(20, fast);
    let (slots, migrations) = (p.table_slots(), p.migrations());
    let most = flood(20, fast);
    assert!(
        most <= 4 * 1_000_000 / fast as usize,
        "{most} rows at 4,000 keys a millisecond"
    );
    assert_eq!(p.migrations(), migrations, "no migration under churn");
    assert_eq!(p.table_slots(), slots, "the table keeps its size");
    flood(30, slow);
    let shrunk = p.table_slots();
    assert!(shrunk < slots, "{shrunk} slots: no shrink");
    assert_eq!(p.migrations(), migrations + 1, "the table shrank once");
    let most = flood(30, slow);
    assert!(
        most <= 4 * 1_000_000 / slow as usize,
        "{most} rows at 1,000 keys a millisecond"
    );
    assert_eq!(p.migrations(), migrations + 1, "the table shrank once");
    assert_eq!(p.table_slots(), shrunk, "the table keeps its size");
}

/// 1,024 keys asked in turn, one each 400 ns, under 1,000,000 tokens a
/// second and a capacity of 2,000,000 (a 2 s horizon): a key comes back
/// every 410 µs, its bucket full again (a token refills in 1 µs). The first
/// passes (they start when the rows double, from 64, the sweep floor)
/// remove the full rows, the keys come back to make them again, and the
/// table sees its clients return: from then on its passes leave the rows
/// that filled within its `quiet` time (half the retention, 4 s here) as
/// they are. So after a warm-up every key keeps its row, live (a returning
/// call is one CAS on it), none is dormant, and the table neither shrinks
/// nor grows. Known-wrong variant, caught here: `no_quiet_rows` (passes
/// put every full row to sleep: the working set lives in dormant cells and
/// each visit revives one).
fn a_working_set_refilled_between_requests_stops_migrating(rows: Rows) {
    const KEYS: u64 = 1024;
    let p = limiter(2_000_000, Duration::from_micros(1), rows);
    assert_eq!(p.horizon(), Duration::from_secs(2));
    let mut now = 1_000_000_000;
    let mut ask = |calls: u64, from: u64| {
        for i in from..from + calls {
            drop(p.reserve_n_at(&(i % KEYS), 1, now).unwrap());
            now += 400;
        }
    };
    ask(20 * KEYS, 0);
    let (slots, migrations) = (p.table_slots(), p.migrations());
    assert_eq!(
        (p.len(), p.dormant_cells()),
        (KEYS as usize, 0),
        "every key of the working set keeps its row, live"
    );
    ask(100 * KEYS, 20 * KEYS);
    assert_eq!(
        (p.len(), p.dormant_cells()),
        (KEYS as usize, 0),
        "every key of the working set keeps its row, live"
    );
    assert_eq!(
        p.migrations(),
        migrations,
        "the table migrated under a steady working set"
    );
    assert_eq!(p.table_slots(), slots, "the table keeps its size");
}

/// The working set of `a_working_set_refilled_between_requests_stops_migrating`
/// (1,024 keys, one call each 400 ns, their rows live), warmed up; returns
/// the time after it.
fn warm_working_set(p: &Pace<u64, RandomState, ManualClock>, keys: u64) -> u64 {
    let mut now = 1_000_000_000;
    for i in 0..20 * keys {
        drop(p.reserve_n_at(&(i % keys), 1, now).unwrap());
        now += 400;
    }
    assert_eq!(
        (p.len(), p.dormant_cells()),
        (keys as usize, 0),
        "every key of the working set keeps its row, live"
    );
    now
}

/// The working set above, then a flood as fast as it: each call of a
/// working-set key is followed by one of a new key that never comes back.
/// The new keys' rows double the count and start passes; a pass keeps the
/// quiet rows only while the rows new keys made since the pass before it
/// are at most 8 times the returns seen (each key of the working set
/// returns at most once per removal, and the window holds at most two), or
/// at most an eighth of the rows kept. Otherwise it removes the full rows,
/// the flood's with them: the rows never reach 18 working sets (8.25 are
/// seen). Known-wrong variant, caught here:
/// `quiet_rows_in_floods` (while passes leave quiet rows live, the table
/// counts its clients as coming back whatever new keys come: the flood's
/// rows stay rows for the quiet time, 4 s here, and the rows grow with
/// them).
fn a_flood_beside_returning_clients_keeps_few_of_its_rows(rows: Rows) {
    const KEYS: u64 = 1024;
    let p = limiter(2_000_000, Duration::from_micros(1), rows);
    let mut now = warm_working_set(&p, KEYS);
    let (mut most, mut id) = (0, 1 << 32);
    for i in 0..200 * KEYS {
        drop(p.reserve_n_at(&(i % KEYS), 1, now).unwrap());
        drop(p.reserve_n_at(&id, 1, now + 200).unwrap());
        (id, now) = (id + 1, now + 400);
        most = most.max(p.len());
    }
    assert!(most <= 18 * KEYS as usize, "{most} rows beside a flood");
}

/// The working set above, then its clients leave; one other key goes on,
/// a call a millisecond, and its calls drive the passes. A pass puts a row
/// to sleep once it is quiet for half the retention (8 s here: four 2 s
/// horizons), passes come at least every four retentions, and a dormant
/// cell goes at the first pass past its retention: six retentions after
/// the clients left, neither their rows nor their dormant cells are left.
fn returning_clients_that_leave_leave_nothing(rows: Rows) {
    const KEYS: u64 = 1024;
    const RETAIN: u64 = 8_000_000_000;
    let p = limiter(2_000_000, Duration::from_micros(1), rows);
    let left = warm_working_set(&p, KEYS);
    let mut now = left;
    while now < left + 6 * RETAIN {
        now += 1_000_000;
        drop(p.reserve_n_at(&u64::MAX, 1, now).unwrap());
    }
    assert_eq!(
        (p.len(), p.dormant_cells()),
        (1, 0),
        "nothing is left of them"
    );
}

/// New keys, one each 400 ns, under 1,000,000 tokens a second and a capacity
/// of 2,000,000 (a 2 s horizon): each row is full 1 µs after its reserve and
/// its key never comes back. So the passes that start when the rows double
/// (from 64, the sweep floor) remove nearly every row, and each comes once
/// 128 rows are made again. After a warm-up, the table neither shrinks nor
/// grows: a pass that leaves a few rows does not shrink it below room for
/// the rows before the next pass. Known-wrong variant, caught here:
/// `shrink_below_sweep_floor` (each pass shrinks the table for the few rows
/// it left and the next 128 rows grow it back: a migration every few dozen
/// calls).
fn new_keys_refilled_between_requests_stop_migrating(rows: Rows) {
    let p = limiter(2_000_000, Duration::from_micros(1), rows);
    assert_eq!(p.horizon(), Duration::from_secs(2));
    let mut now = 1_000_000_000;
    let mut ask = |from: u64, calls: u64| {
        for id in from..from + calls {
            drop(p.reserve_n_at(&id, 1, now).unwrap());
            now += 400;
        }
    };
    ask(0, 20_000);
    let (slots, migrations) = (p.table_slots(), p.migrations());
    assert!(
        p.len() < 2 * 64 + 1,
        "{} rows: the passes did not run",
        p.len()
    );
    assert_eq!(p.dormant_cells(), 0, "nobody came back: no dormant cell");
    ask(20_000, 100_000);
    assert_eq!(
        p.migrations(),
        migrations,
        "the table migrated under a steady flow of new keys"
    );
    assert_eq!(p.table_slots(), slots, "the table keeps its size");
}
