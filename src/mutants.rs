// The crate's known-wrong variants ("mutants"), one line each: the name
// that builds it (`PACE_MUTANT=name`, see build.rs), where its pair of
// functions lives, and what the wrong one does. Each is a pair of functions
// of one signature, the right one under `cfg(not(pace_mutant = "name"))`
// and the wrong one beside it under `cfg(pace_mutant = "name")`; in
// src/rule.rs a rule's wrong variants stand at the top of its function
// (`wrong!(pace_mutant = "name" => …)`, a `cfg!` constant the compiler
// folds away). No protocol function branches on a mutant at run time.
//
// This list is the registry: build.rs includes this file and declares
// exactly these names as the values of `cfg(pace_mutant)`, so a variant
// not listed here is an unexpected cfg (a warning, an error under CI's
// clippy), and `.ci/suites/15-mutants.sh` fails when a name here is not
// in the sources or is run by no suite. The suites (`10-loom.sh`,
// `15-mutants.sh`) build each one and check that its test or model fails
// with its own message.
//
// The `lease_*` variants live in pace-redis's lease counter
// (`pace-redis/src/lease_counter.rs`), which loom-tests includes and builds
// with this crate's build script.
//
// (A plain file, not a module: build.rs includes it with `include!`.)

/// `(name, where, what the wrong variant does)`.
pub const MUTANTS: &[(&str, &str, &str)] = &[
    ("all_first_only", "all.rs", "only the first pair's denial counts"),
    ("all_no_refund", "all.rs", "pairs held before a denial keep their debits"),
    ("all_refund_oldest_first", "all.rs", "pairs held before a denial are refunded oldest first"),
    ("arrays_wait_for_a_full_bag", "table/array.rs", "a retired array waits for its thread's garbage bag to fill"),
    ("check_costs_one", "pace/mod.rs", "check_key_n debits one token, however many it asked for"),
    ("check_then_debit", "table/insert.rs", "a debit is stored after a load, not by a CAS from it"),
    ("claimed_left_on_panic", "table/insert.rs", "a claim whose key check panicked stays claimed"),
    ("clean_without_fence", "table/clean.rs", "a tombstone is emptied on a read of the next cell, without a fence"),
    ("copy_drops_without_floor", "table/migrate.rs", "a copier removes a full row without raising its floor"),
    ("copy_removes_held", "table/migrate.rs", "a copier judges a held row by its settled tat alone"),
    ("copy_unfrozen", "table/migrate.rs", "a live row is copied without freezing its cell"),
    ("decision_ignores_held", "rule.rs", "a decision counts no held token"),
    ("deep_probe_any_row", "table/mod.rs", "a reserve past its key's eighth cell takes any live row for the key's"),
    ("drop_panics_while_unwinding", "pace/mod.rs", "a key's panic in a Drop escapes it while the thread unwinds"),
    ("fresh_row_from_zero", "table/floor.rs", "a fresh row starts from zero, not its key's floor"),
    ("gate_async_drop_keeps_turn", "gate/admit_async.rs", "a dropped first waiter wakes nobody"),
    ("gate_cancel_no_notify", "gate/queue.rs", "a cancel sets its flag and wakes nobody"),
    ("gate_no_fence", "gate/state.rs", "no fence between a release and a new waiter"),
    ("gate_no_wake_on_rollback", "gate/state.rs", "a slot rolled back for lack of bytes wakes nobody"),
    ("gate_shrink_keeps_excess", "gate/permit.rs", "a shrunk permit's excess bytes never return"),
    ("gate_unchecked_bytes", "gate/state.rs", "bytes are checked against a stale reading, then added blindly"),
    ("holds_never_expire", "table/held/mod.rs", "no held lot ever expires"),
    ("huge_pages_ignored", "table/cell.rs", "no slot array asks for huge pages, however large"),
    ("inline_any_hasher", "table/words.rs", "any hasher is trusted with keys held as their own bits"),
    ("inline_offset_wraps", "table/held/inline.rs", "an inline lot's epoch offset is written modulo 4, unchecked"),
    ("ip_prefix_untagged", "prefix.rs", "IPv6 prefixes' words lack the family bit"),
    ("journal_no_lock", "gate/journal.rs", "a journal takes no file lock"),
    ("journal_no_resync", "gate/journal.rs", "everything after the first bad bytes is taken as the tail"),
    ("journal_no_rollback", "gate/journal.rs", "a failed append's bytes stay in the file"),
    ("journal_open_truncates_damage", "gate/journal.rs", "opening a damaged journal cuts it at the first bad byte"),
    ("journal_truncates_foreign", "gate/journal.rs", "a file that never was a journal is truncated as a torn tail"),
    ("lease_clock_before_word", "../pace-redis/src/lease_counter.rs", "a leased reserve reads its clock before loading its lease's counter word"),
    ("lease_fresh_across_leases", "../pace-redis/src/lease_counter.rs", "a new lease's counter keeps the old lease's unreported kept tokens"),
    ("lease_refund_reported", "../pace-redis/src/lease_counter.rs", "a leased refund returns its tokens to the pool after a report counted them kept"),
    ("mark_kept_after_pass", "pace/mod.rs", "a pass's end leaves the doubling mark at the rows of its start"),
    ("no_churn_resize", "table/sweep.rs", "a churning array is never resized for churn"),
    ("no_clean", "table/clean.rs, table/migrate.rs", "tombstones are never cleaned, and no target is sized for churn"),
    ("no_dormancy", "table/sweep.rs", "passes remove every full row instead of making it dormant"),
    ("no_quiet_rows", "table/mod.rs", "passes put every full row to sleep, however lately it filled"),
    ("no_room_for_new_rows", "table/migrate.rs", "a target is sized from its rows alone"),
    ("pass_waits_for_migration", "table/sweep.rs", "a pass due on a small migrating array is left to later calls"),
    ("passes_die_with_their_array", "table/migrate.rs", "a sweep pass is not carried to the new array"),
    ("quiet_rows_in_floods", "table/mod.rs", "while passes keep quiet rows, new keys never end the returning mode"),
    ("quota_cost_of_default", "pace/mod.rs", "a call's quota gives the horizon, the default's interval the cost"),
    ("quota_read_twice", "pace/mod.rs", "the default quota is read twice, mixing two quotas"),
    ("refund_gives_up_on_frozen", "table/refund.rs", "a refund that finds its row frozen by a copier gives up"),
    ("refund_ignores_origin", "pace/refund.rs", "a debit is refunded to any limiter and key"),
    ("refund_keeps_floor", "table/floor.rs", "a refund that fills a row removes it without raising its floor"),
    ("refund_rewinds_tat", "rule.rs", "a hold's refund also takes its cost off the settled tat"),
    ("refund_undrained", "rule.rs", "a refund subtracts its undrained part from whatever the bucket holds"),
    ("resolve_ignores_row", "table/held/mod.rs", "a hold's resolution acts on another key's row with a lot of its epoch"),
    ("revive_from_now", "table/held.rs", "a revival starts from the reviver's reading, not the tat its cell kept"),
    ("revive_unsealed", "table/mod.rs", "a revival does not check for a migration that drops dormant cells"),
    ("settle_unclamped", "rule.rs", "a kept hold settles without the clamp at its own reading"),
    ("shrink_below_sweep_floor", "table/mod.rs", "a shrink is sized for the rows a pass left, not the rows before the next"),
    ("shrink_to_half", "table/migrate.rs", "a shrink's target gives rows half of it, not a quarter"),
    ("spot_written_blind", "table/refund.rs", "a resolution in its hold's pin is stored over the cell, not CASed from the hold's value"),
    ("stale_lot_opens_in_the_past", "table/held/lot.rs", "a fresh lot opened by a stale reading starts in the past and settles the previous lot early"),
    ("std_hash_for_bits", "pace/mod.rs", "copies and sweeps hash a cell's key with std's hasher, callers with SipHash under the limiter's key"),
    ("sweep_at_default_cadence", "pace/mod.rs", "passes keep the default quota's cadence"),
    ("sweep_cursor_stuck", "table/sweep.rs", "a pass restarts only from exactly SWEEP_IDLE"),
    ("sweep_floor_by_hash", "table/sweep.rs", "a sweep raises the floor of a word key's hash, not its bits' stripe"),
    ("sweep_keeps_floor", "table/sweep.rs", "a swept row's floor is not raised"),
    ("sweep_removes_held", "table/sweep.rs", "a held row is judged by its settled tat alone"),
    ("turn_before_its_slot", "rule.rs", "a turn is let through when decided, before its slot"),
    ("turn_beside_too_many_held", "rule.rs", "a turn is placed after held tokens that leave it no room in the bucket"),
    ("turn_slot_ignores_held", "rule.rs", "a turn's slot comes from the settled tat, ahead of the held tokens"),
    ("verify_off", "table/insert.rs", "every claim is kept unchecked"),
];
