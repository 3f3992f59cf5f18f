#!/usr/bin/env bash
# The tests against the known-wrong variants outside loom. First, built once
# with the three mutants on, each regression test must fail with its own message
# and the random-history search must find an excess.
#   fresh_row_from_zero: a fresh row forgets the debt of the rows removed
#                        before it (stale reserve after a sweep or unlink)
#   refund_undrained:    a refund subtracts its undrained part from whatever
#                        the bucket holds (out-of-order and stale refunds)
#   claimed_left_on_panic: a key `Eq` that panics in the check after linking
#                        leaves the claimed row linked (and counted)
#
# Usage: 15-mutants.sh [all|debug|release]. `all` (the default) runs every
# variant below; .ci/run runs the two parts as jobs of its pool: `debug`
# (the variants built without --release, in the target directory of the
# README's tests, after them) and `release` (those built --release, which
# share nothing with the tests' debug build: in target/mutants-release, side
# by side with the checks).
set -euo pipefail
part="${1:-all}"
case "$part" in
all | debug | release) ;;
*) echo "usage: $0 [all|debug|release]" >&2; exit 2 ;;
esac
[ "$part" != release ] || export CARGO_TARGET_DIR=target/mutants-release
# The variants of this part shown caught, for the summary at the end.
declare -A caught=()
# Random histories (proptest) start from one fixed seed here, so that a
# variant is caught or not the same way in every run; the test step of
# .ci/run draws a new seed each time.
export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261205}"
# The variants built --release rebuild incrementally, as the debug ones do
# by default: a variant then recompiles only what its cfg changes (about half
# the CPU of a full release rebuild of pace and the test). Only this script
# builds --release in this target directory.
export CARGO_PROFILE_RELEASE_INCREMENTAL=true
# (.ci/run turns incremental compilation off for its other builds.)
unset CARGO_INCREMENTAL

# The registry (src/mutants.rs) lists every known-wrong variant of the core
# once; build.rs declares exactly its names as the values of
# `cfg(pace_mutant)` (clippy denies any other). Each name must still be in
# the sources and run by a suite (here or .ci/suites/10-loom.sh), outside
# comments.
names=$(grep -oE '^ +\("[a-z_0-9]+"' src/mutants.rs | grep -oE '[a-z_0-9]+')
[ "$(wc -w <<<"$names")" -gt 30 ] || { echo "registry not read: $names"; exit 1; }
suites=$(grep -hvE '^\s*#' .ci/suites/10-loom.sh .ci/suites/15-mutants.sh)
for m in $names; do
    if ! grep -rqF "pace_mutant = \"$m\"" src pace-redis/src/lease_counter.rs; then
        echo "the registry lists $m, which no source file has"
        exit 1
    fi
    if ! grep -qw "$m" <<<"$suites"; then
        echo "the registry's $m is run by no suite"
        exit 1
    fi
done
echo "registry: $(wc -w <<<"$names") variants, each in src and run below or by 10-loom.sh"
# Mutants are chosen with PACE_MUTANT (build.rs): only pace and the test
# rebuild, in the same target directory as the README's tests.
if [ "$part" != release ]; then
over_admission_tests=(
    a_stale_reserve_does_not_recreate_a_swept_row
    a_stale_reserve_does_not_recreate_a_row_swept_by_another_call
    a_far_future_sweep_forgets_no_debt_and_denies_nothing_forever
    out_of_order_refunds_mint_nothing
    a_stale_refund_mints_nothing
    panicking_eq_while_inserting_leaves_no_claimed_row
    random_histories_never_exceed_the_bound
)
status=0
# Only the tests that must fail run (`--exact` names): a variant is shown
# caught by them, and the file's other tests would only add time.
out=$(PACE_MUTANT=fresh_row_from_zero,refund_undrained,claimed_left_on_panic \
    cargo test --test over_admission -- --test-threads=1 --exact "${over_admission_tests[@]}" 2>&1) ||
    status=$?
if [ "$status" -eq 0 ]; then
    echo "$out" | tail -20
    echo "the mutants SURVIVED tests/over_admission.rs"
    exit 1
fi
for t in "${over_admission_tests[@]}"; do
    if ! grep -qE "^test $t \.\.\. FAILED" <<<"$out"; then
        echo "$out" | tail -40
        echo "mutant not caught by $t"
        exit 1
    fi
    echo "caught by $t"
done
grep -E "exceeds the bound by" <<<"$out" | head -1
caught[fresh_row_from_zero]=1 caught[refund_undrained]=1 caught[claimed_left_on_panic]=1
fi

# expect_caught MUTANT FILE MESSAGE CARGO_FLAGS TEST...: `cargo test
# CARGO_FLAGS --test FILE` (`--lib` when FILE is lib) built with MUTANT, run
# on the TESTs only (`--exact`), must fail, each TEST must be reported
# FAILED, and the output must contain MESSAGE. The part `debug` skips the
# calls with CARGO_FLAGS --release, the part `release` all others.
expect_caught() {
    local mutant=$1 file=$2 message=$3 flags=$4 t status=0 out target
    shift 4
    case "$part:$flags" in
    debug:--release) return 0 ;;
    release:--release | debug:* | all:*) ;;
    release:*) return 0 ;;
    esac
    target=(--test "$file")
    [ "$file" = lib ] && target=(--lib)
    # shellcheck disable=SC2086 # `flags`: empty, one word, or `-p PACKAGE`
    out=$(PACE_MUTANT=$mutant cargo test $flags "${target[@]}" -- --test-threads=1 --exact "$@" 2>&1) ||
        status=$?
    for t in "$@"; do
        if [ "$status" -eq 0 ] || ! grep -qE "^test $t \.\.\. FAILED" <<<"$out" ||
            ! grep -q -- "$message" <<<"$out"; then
            echo "$out" | tail -40
            echo "$mutant not caught by $t (tests/$file.rs)"
            exit 1
        fi
        echo "$mutant caught by $t"
    done
    caught[$mutant]=1
}

# Holds (tests/holds.rs): each known-wrong variant fails the random
# histories (an exact model decides every call; the bound over every window)
# and its own regression test. The calls that share a variant follow each
# other here and below: a change of PACE_MUTANT rebuilds the core and
# everything above it, a second test file of the same variant only itself.
expect_caught decision_ignores_held holds "" "" \
    held_tokens_count_at_every_decision random_hold_histories_follow_the_rule_exactly \
    random_expiring_hold_histories_never_exceed_the_bound
# ... and the real-clock test, whose hot keys are a quarter holds.
expect_caught decision_ignores_held exactness "exceed the bound by" "" \
    kept_admissions_fit_the_bucket_on_a_real_clock
expect_caught refund_rewinds_tat holds "" "" \
    a_refund_leaves_the_settled_debt random_hold_histories_follow_the_rule_exactly \
    random_expiring_hold_histories_never_exceed_the_bound
expect_caught settle_unclamped holds "" "" \
    keeping_settles_from_the_holds_reading random_hold_histories_follow_the_rule_exactly \
    random_expiring_hold_histories_never_exceed_the_bound
expect_caught sweep_removes_held holds "" "" \
    a_leaked_hold_expires_as_kept random_hold_histories_follow_the_rule_exactly
expect_caught holds_never_expire holds "" "" a_leaked_hold_expires_as_kept
expect_caught copy_removes_held holds "the held token stays held" "" migrations_copy_held_rows

# A `Debit` is refunded only by the limiter that made it, to a key of its
# hash (tests/refund_origin.rs), against `refund_ignores_origin`: a debit
# refunded to another limiter or another key restores that bucket.
expect_caught refund_ignores_origin refund_origin "minted tokens" "" \
    misdirected_to_another_limiter_cells misdirected_to_another_limiter_entries \
    misdirected_to_another_key_cells misdirected_to_another_key_entries

# Quotas per call keep the contract (tests/quotas.rs), against
# `quota_cost_of_default`: a call's quota gives the horizon but its tokens
# cost the default quota's interval. The exact model (tests/model.rs,
# pace_models::debt) catches it too.
expect_caught quota_cost_of_default quotas "exceed the bound by" "" \
    random_mixed_quota_histories_never_exceed_the_bound
expect_caught quota_cost_of_default model "Test failed: step" "" \
    pace_agrees_with_the_debt_model
# `check_key_n` decides as `reserve_n` does (the exact model's `Check`), against
# `check_costs_one`: a check debits one token, however many it asked for.
expect_caught check_costs_one model "Test failed: step" "" \
    pace_agrees_with_the_debt_model
# A reserve finds a row deep in a long cluster by probing to its end
# (tests/over_admission.rs), against `deep_probe_any_row`: past the eighth
# cell any live row is taken for the key's.
expect_caught deep_probe_any_row over_admission "key 11, reserve 0" "" \
    rows_deep_in_one_cluster_are_debited_exactly
# A large slot array asks for transparent huge pages (tests/huge_pages.rs),
# against `huge_pages_ignored`: none asks. The test sees pace's huge pages
# only where the kernel's THP setting is `madvise` (elsewhere it passes
# with nothing to check).
if grep -qF '[madvise]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
    expect_caught huge_pages_ignored huge_pages "its array asked for none" "" \
        a_large_array_asks_for_huge_pages
else
    echo "huge_pages_ignored: THP is not \`madvise\` here, nothing to catch it with"
fi
# ... and against `turn_before_its_slot`: a turn (`acquire`) is let through
# when it is decided, up to its whole wait before its debit fits; caught
# also by the real-clock test of quotas and turns (tests/exactness.rs) and
# the exact model.
expect_caught turn_before_its_slot quotas "exceed the bound by" "" \
    random_mixed_quota_histories_never_exceed_the_bound
expect_caught turn_before_its_slot exactness "through early" "" \
    kept_admissions_fit_under_quota_changes_and_turns_on_a_real_clock
expect_caught turn_before_its_slot model "Test failed: step" "" \
    pace_agrees_with_the_debt_model
# Turns beside holds (tests/holds.rs, tests/seams.rs, the exact model):
#   turn_slot_ignores_held:    a turn's slot comes from the settled tat,
#                              ahead of the held tokens its decision counted
#   turn_beside_too_many_held: a turn is placed after held tokens that leave
#                              it no room in the bucket
expect_caught turn_slot_ignores_held holds "turn of" "" \
    random_hold_histories_follow_the_rule_exactly
expect_caught turn_slot_ignores_held seams "the turn came before its slot" "" \
    a_turn_waits_behind_held_tokens
expect_caught turn_slot_ignores_held model "Test failed: step" "" \
    pace_agrees_with_the_debt_model
expect_caught turn_slot_ignores_held quotas "exceed the bound by" "" \
    random_mixed_quota_histories_never_exceed_the_bound
expect_caught turn_beside_too_many_held holds "turn of" "" \
    random_hold_histories_follow_the_rule_exactly
expect_caught turn_beside_too_many_held seams "panicked" "" \
    a_turn_beside_a_full_hold_is_denied_as_held
expect_caught turn_beside_too_many_held model "Test failed: step" "" \
    pace_agrees_with_the_debt_model
expect_caught turn_beside_too_many_held quotas "exceed the bound by" "" \
    random_mixed_quota_histories_never_exceed_the_bound
# A stale hold opens no lot in the past (tests/holds.rs), against
# `stale_lot_opens_in_the_past`: such a lot settles the previous one early.
expect_caught stale_lot_opens_in_the_past holds "resolved at" "" \
    holds_resolved_within_the_limit_are_exact_in_any_reading_order
expect_caught stale_lot_opens_in_the_past holds "Expired" "" \
    a_stale_hold_settles_no_lot_early
# Held rows inline (src/table/held.rs, `Form`), against
# `inline_offset_wraps`: a lot too far from its row's settled `tat` is
# written with a wrapped offset and comes back as another epoch's lot. The
# codec's own test finds the state it should have put in a record; the
# histories find the lot gone (a refund answers `Expired`) and the bound
# broken (a hold resolved on a lot it never joined).
expect_caught inline_offset_wraps lib "outside the form" "" \
    table::held::tests::inline_states_round_trip
expect_caught inline_offset_wraps holds "exceeds the bound by" "" \
    random_expiring_hold_histories_never_exceed_the_bound
expect_caught inline_offset_wraps holds "resolved at" "" \
    holds_resolved_within_the_limit_are_exact_in_any_reading_order
# A ticket names its lot by its epoch (tests/holds.rs), against
# `resolve_ignores_row`: handed to another key's row with a lot of that
# epoch, the resolution takes that key's held token.
expect_caught resolve_ignores_row holds "key 1's row has no hold of key 0" "" \
    a_ticket_resolves_only_on_its_own_row
# A hold resolved in its own pin (`Pace::hold_while`) CASes its row's cell
# from the value the hold wrote (tests/holds.rs, whose histories debit the
# key inside the hold), against `spot_written_blind`: the resolution is
# stored over the cell, and the debit made meanwhile is lost.
expect_caught spot_written_blind holds "tokens at" "" \
    random_hold_histories_follow_the_rule_exactly
# Drops while unwinding (tests/seams.rs), against
# `drop_panics_while_unwinding`: a key's panic escapes a Drop during
# unwinding, which aborts the test process (so no FAILED line: the abort's
# own message is the evidence).
if [ "$part" != release ]; then
    status=0
    out=$(PACE_MUTANT=drop_panics_while_unwinding cargo test --test seams -- --test-threads=1 \
        --exact an_all_reservation_dropped_while_unwinding_keeps_every_pair 2>&1) || status=$?
    if [ "$status" -eq 0 ] || ! grep -qE "panic in a destructor during cleanup|non-unwinding panic" <<<"$out"; then
        echo "$out" | tail -30
        echo "drop_panics_while_unwinding not caught by an_all_reservation_dropped_while_unwinding_keeps_every_pair"
        exit 1
    fi
    echo "drop_panics_while_unwinding caught by an_all_reservation_dropped_while_unwinding_keeps_every_pair (the process aborts)"
    caught[drop_panics_while_unwinding]=1
fi
# Rows of a short quota are swept soon (tests/quotas.rs), against
# `sweep_at_default_cadence`: passes keep the default quota's cadence.
expect_caught sweep_at_default_cadence quotas "still held 20 ms on" "" \
    rows_of_a_short_quota_are_swept_after_its_own_horizon

# All-or-nothing reservations (tests/all.rs) against three variants:
#   all_first_only:          denials after the first pair are ignored
#   all_no_refund:           a denial keeps the debits of the pairs before it
#   all_refund_oldest_first: they are refunded oldest first, so a plain pair
#                            named twice keeps a debit
expect_caught all_first_only all "panicked" "" \
    threaded_no_limit_over_admits \
    a_later_denial_refunds_the_earlier_pairs_and_leaves_later_ones_untouched
expect_caught all_no_refund all "panicked" "" \
    threaded_a_denial_leaves_no_debit_behind \
    a_later_denial_refunds_the_earlier_pairs_and_leaves_later_ones_untouched
expect_caught all_refund_oldest_first all "a plain refund in the wrong order kept tokens" "" \
    plain_pairs_named_twice_are_refunded_newest_first

# The intent journal (feature `journal`; tests/gate_journal.rs and
# tests/gate_journal_faults.rs) against five variants: no file lock, no
# resync after damage, no rollback of a failed append, an open that cuts a
# damaged file, a foreign file truncated as a torn tail.
expect_caught journal_no_lock gate_journal "panicked" "--features journal" \
    second_open_is_refused_while_the_first_journal_lives \
    journal_of_a_live_worker_process_cannot_be_opened
expect_caught journal_no_resync gate_journal "panicked" "--features journal" \
    flipped_bit_in_a_middle_record_is_never_a_silent_truncation
expect_caught journal_open_truncates_damage gate_journal "panicked" "--features journal" \
    flipped_bit_in_a_middle_record_is_never_a_silent_truncation
expect_caught journal_truncates_foreign gate_journal_faults "panicked" "--features journal" \
    a_file_that_is_not_a_journal_is_refused_untouched
expect_caught journal_no_rollback gate_journal_faults "panicked" "--features journal" \
    failed_record_at_every_byte_leaves_the_journal_as_it_was \
    failed_record_that_cannot_be_undone_poisons_the_handle

# Churn without migrations (tests/churn.rs), with keys held either way:
# against `no_clean` no tombstone is ever cleaned, so the churn tests must
# see migrations.
expect_caught no_clean churn "no migration under churn" --release \
    cells::refunded_keys_reuse_tombstones cells::swept_keys_reuse_tombstones \
    entries::refunded_keys_reuse_tombstones entries::swept_keys_reuse_tombstones
# Against `inline_any_hasher` a limiter whose hasher is the caller's own
# holds word-sized keys as their own bits, so a hasher that panics on a live
# key while a migration copies it leaves the chunk frozen and the flood hangs.
expect_caught inline_any_hasher hashers "the flood finished" --release \
    a_hasher_that_panics_on_a_live_key_leaves_counts_exact own_bits_only_with_hashers_that_cannot_panic
# Against `std_hash_for_bits` a copier hashes the keys it moves with std's
# `RandomState` while callers hash with SipHash under the limiter's own key
# (src/hasher.rs), so keys moved by a migration are not found again.
expect_caught std_hash_for_bits hashers "is found after the migrations" --release \
    a_random_state_limiter_finds_every_key_it_moved
# Against `no_churn_resize` a sweep pass that leaves tombstones in a
# quarter of the cells does not resize the array for churn, so a flood of
# new keys runs in the array that grew for its first horizon's rows.
expect_caught no_churn_resize churn "slots for 4000 rows a horizon" --release \
    a_churning_cell_array_is_resized_for_churn

# A flood of new keys under a long horizon (tests/churn.rs): the passes that
# start when the rows double keep them at a few milliseconds of keys, and a
# slowdown shrinks the table once, against two variants:
#   mark_kept_after_pass: the next doubling counts from the rows at the last
#     pass's start, so the rows reach many milliseconds of keys
#   shrink_to_half: a shrink's target leaves no room for the rows to double
#     before the next pass, so the table grows again
expect_caught mark_kept_after_pass churn "rows at 4,000 keys a millisecond" --release \
    cells::a_flood_under_a_long_horizon_keeps_few_rows \
    entries::a_flood_under_a_long_horizon_keeps_few_rows
expect_caught shrink_to_half churn "the table shrank once" --release \
    cells::a_flood_under_a_long_horizon_keeps_few_rows \
    entries::a_flood_under_a_long_horizon_keeps_few_rows
# New keys whose buckets refill before the next pass: each pass removes
# nearly every row, and a shrink sized for the few it left grows back before
# the next pass (a migration every few dozen calls).
expect_caught shrink_below_sweep_floor churn "the table migrated under a steady flow of new keys" --release \
    cells::new_keys_refilled_between_requests_stop_migrating \
    entries::new_keys_refilled_between_requests_stop_migrating

# Dormant cells (tests/dormant.rs, DESIGN.md §4): a revival decides from
# the `tat` its cell kept (and the floor), never from the reviver's reading
# (`revive_from_now`: a stale reading mints a token); a revival checks for
# a migration that drops dormant cells (`revive_unsealed`: its row is copied
# into a target with no room for it); passes put the full rows of returning
# clients to sleep (`no_dormancy`: a String key's box is made again at each
# visit); passes leave the rows of a returning working set that filled
# lately live (`no_quiet_rows`: the working set lives in dormant cells), but
# not while new keys outnumber the returns (`quiet_rows_in_floods`: a flood's
# rows stay rows for the quiet time).
expect_caught revive_from_now dormant "unwrap_err" --release \
    a_stale_reading_cannot_revive_below_the_kept_tat
expect_caught revive_unsealed dormant "a target has room for every copy" --release \
    revivals_during_a_shrink_go_to_the_target
expect_caught no_quiet_rows churn "every key of the working set keeps its row, live" --release \
    cells::a_working_set_refilled_between_requests_stops_migrating \
    entries::a_working_set_refilled_between_requests_stops_migrating
expect_caught quiet_rows_in_floods churn "rows beside a flood" --release \
    cells::a_flood_beside_returning_clients_keeps_few_of_its_rows \
    entries::a_flood_beside_returning_clients_keeps_few_of_its_rows
expect_caught no_dormancy dormant "round 0" --release \
    returning_string_keys_allocate_nothing

# A migration removes the rows already full instead of copying them, raising
# each key's floor first, against `copy_drops_without_floor`: a stale reserve
# then admits one more (src/table/tests.rs).
expect_caught copy_drops_without_floor lib "from the floor the copier raised" --release \
    table::tests::a_migration_removes_full_rows_and_raises_their_floor

# A sweep raises each removed row's floor in the stripe its key's creators
# read (a word key's from its bits, without hashing it), against
# `sweep_floor_by_hash`: a stale reserve then admits one more
# (src/table/tests.rs).
expect_caught sweep_floor_by_hash lib "starts from the floor the sweep raised" --release \
    table::tests::a_sweep_raises_the_floor_its_keys_creators_read

# A pass that comes due while a small array migrates copies the migration's
# rest and sweeps the target at once, against `pass_waits_for_migration`,
# which leaves it to later calls (src/table/tests.rs; tests/model.rs's
# growing tables then keep rows the debt model swept).
expect_caught pass_waits_for_migration lib "the pass copied the migration's rest" --release \
    table::tests::a_pass_due_during_a_migration_sweeps_at_once
expect_caught pass_waits_for_migration model "the table disagrees with the debt model" --release \
    growing_tables_agree_with_the_debt_model

# IPv6 prefixes' words carry the family bit (src/prefix.rs), against
# `ip_prefix_untagged`: a long IPv6 prefix of zeros then shares an IPv4
# network's word, and a limiter keyed by `IpPrefix` would share their row.
expect_caught ip_prefix_untagged lib "share a word" "" \
    prefix::tests::every_length_of_every_family_has_its_own_word

# A refund that fills a row raises its key's floor before it removes the row
# (src/table/tests.rs), against `refund_keeps_floor`: a stale reserve then
# starts a fresh row from the older floor and admits one more.
expect_caught refund_keeps_floor lib "from the floor the refund raised" --release \
    table::tests::a_refund_to_full_raises_the_floor

# Every migration is spread over many calls (tests/growth.rs), against a
# variant whose target fills before its copy ends, so that the insert that
# meets it copies every chunk left:
#   no_room_for_new_rows:   a shrink's target is sized from its rows alone
share="some call copied more than one call.s share"
expect_caught no_room_for_new_rows growth "$share" "" \
    entries::a_shrink_while_new_keys_arrive_is_spread_over_its_chunks

# Retired arrays are freed soon without a forced collection (tests/memory.rs)
# against `arrays_wait_for_a_full_bag`: no flush after retiring an array, so
# a growing table holds its old arrays until its thread's garbage bag fills.
expect_caught arrays_wait_for_a_full_bag memory "retired arrays are not freed" "" \
    memory_is_bounded_by_recent_exchanges

# A sweep pass is not lost, against two variants that lose one for a whole
# horizon:
#   passes_die_with_their_array: a pass that meets a migration is not started
#     again on the new array (tests/growth.rs)
#   sweep_cursor_stuck: a chunk claimed after its pass ended leaves a cursor
#     from which no later pass starts (src/pace/tests.rs, a unit test)
expect_caught passes_die_with_their_array growth "did not run on the new array" --release \
    cells::a_pass_due_during_a_migration_runs_on_the_new_array \
    entries::a_pass_due_during_a_migration_runs_on_the_new_array
expect_caught sweep_cursor_stuck lib "no pass ran after a late claim" --release \
    pace::tests::sweep_cursor::a_late_chunk_claim_does_not_stop_later_passes

# pace-redis (its tests start their own redis-server on loopback). The
# script's variants are patch files, pace-redis/mutants/NAME.patch, which
# pace-redis's build script applies to its copy of the script when
# PACE_MUTANT names them (the working tree is never changed; a patch that
# no longer applies fails the build). Each must be run below:
for p in pace-redis/mutants/*.patch; do
    m=$(basename "$p" .patch)
    if ! grep -qE "^(expect_caught|for m in).* $m( |\$|;)" "$0"; then
        echo "the script variant $m ($p) is run by no expect_caught here"
        exit 1
    fi
done
# The script's quota per call and turns (tests/equivalence.rs,
# tests/acquire.rs) against three variants:
#   redis_quota_ignored:    the script decides a call with its own quota by
#                           the configuration's interval and capacity
#   redis_turn_beyond_wait: the script admits a turn up to twice max_wait away
#   redis_turn_early:       acquire sleeps half the wait the script answered
#   redis_cache_one_quota:  the denial cache decides every call with the
#                           configuration's quota
expect_caught redis_quota_ignored equivalence "Test failed" "-p pace-redis" \
    script_pace_and_model_agree_on_every_decision
expect_caught redis_quota_ignored acquire "ExceedsCapacity" "-p pace-redis" \
    quotas_per_call_decide_with_their_own_capacity_and_interval
# The real-clock test of replicas with quotas and turns (tests/shared.rs)
# sees a turn's wait answered for another quota (the script's slot) or the
# first over-admit over a window, whichever comes first,
expect_caught redis_quota_ignored shared "the contract allows\\|the call's own quota" "-p pace-redis" \
    replicas_with_quotas_and_turns_keep_the_contract
expect_caught redis_turn_beyond_wait equivalence "Test failed" "-p pace-redis" \
    script_pace_and_model_agree_on_every_decision
expect_caught redis_turn_beyond_wait acquire "a turn beyond max_wait was admitted" "-p pace-redis" \
    a_turn_beyond_max_wait_or_capacity_is_refused_at_once_writing_nothing
expect_caught redis_cache_one_quota acquire "a denial cached under another quota" "-p pace-redis" \
    quotas_per_call_decide_with_their_own_capacity_and_interval
# ... and the third go through early.
expect_caught redis_turn_early shared "before its slot" "-p pace-redis" \
    replicas_with_quotas_and_turns_keep_the_contract
expect_caught redis_turn_early acquire "went through" "-p pace-redis" \
    capacity_three_passes_three_at_once_and_the_fourth_waits_one_interval \
    concurrent_waiters_go_through_one_per_interval_in_slot_order_none_early
# ... and the earlier ones: the script admits one token beyond the capacity,
# restores a refund superseded by a later debit; a cached denial outlives
# its retry time; the local fallback runs at the full rate.
expect_caught redis_admit_one_more equivalence "Test failed" "-p pace-redis" \
    script_pace_and_model_agree_on_every_decision
expect_caught redis_refund_unchecked equivalence "Test failed" "-p pace-redis" \
    script_pace_and_model_agree_on_every_decision
expect_caught redis_cache_forever requests "panicked" "-p pace-redis" \
    a_flood_of_denials_is_answered_locally_until_the_retry_time
expect_caught redis_fallback_full_rate faults "panicked" "-p pace-redis" \
    restart_local_fallback_admits_at_rate_over_replicas
# Holds (tests/holds.rs): exact refunds in any order and the over-admission
# bound, against four variants, each caught by the model (the first and
# third also by the bound alone over the script's answers):
#   redis_hold_ignored:    a decision does not count what is held
#   redis_release_rewinds: a hold's refund also rewinds the settled tat (when
#                          that still lies ahead of now)
#   redis_keep_unclamped:  a keep settles tat + cost without the clamp at
#                          its own reading (max(tat, decided) + cost)
#   redis_expiry_refunds:  an expired hold is dropped as if refunded, not
#                          settled as kept (also the hold-limit tests)
for m in redis_hold_ignored redis_keep_unclamped; do
    expect_caught "$m" holds "exceeds the bound by" "-p pace-redis" \
        holds_agree_with_the_integer_model random_hold_histories_never_exceed_the_bound
done
# A rewinding refund over-admits only when a settled debit follows the hold
# and precedes its refund within one horizon: the model catches it in every
# run, the bound over 300 random histories in some; its own test always.
expect_caught redis_release_rewinds holds "panicked" "-p pace-redis" \
    holds_agree_with_the_integer_model a_refund_leaves_the_settled_debt
# Leases (tests/lease_equivalence.rs): the script's lease call against the
# lease model's server (pace_models::leases::LeaseServer), ~10 s per build:
#   redis_lease_keep_from_grant: reported kept tokens settle from the lease's
#                                first grant's reading, not the call's
#   redis_lease_delta_reports:   a report applied as a delta (a retry twice)
for m in redis_lease_keep_from_grant redis_lease_delta_reports; do
    expect_caught "$m" lease_equivalence "assertion .left == right. failed" "-p pace-redis" \
        the_lease_call_agrees_with_the_model
done
# redis_lease_wait_ignored: a grant is used whatever WAIT answered (no
# standby acknowledged it); tests/leases.rs, a few seconds.
expect_caught redis_lease_wait_ignored leases "panicked" "-p pace-redis" \
    a_grant_no_standby_acknowledged_is_never_used
# redis_wait_ignored: an admission of the server's (a reserve, a call with a
# quota of its own, a hold, a turn, reserve_many) is used whatever WAIT
# answered; tests/failover.rs, a few seconds: 16 admissions used of a
# capacity of 10 across the failover.
expect_caught redis_wait_ignored failover "admissions used before the failover" "-p pace-redis" \
    a_failover_loses_no_admission_the_standby_acknowledged
# redis_unreplicated_sent: within the backoff after a WAIT counted too few
# standbys, decisions are still sent (each holds the connection in WAIT);
# tests/failover.rs, a few seconds.
expect_caught redis_unreplicated_sent failover "decisions sent within the backoff" "-p pace-redis" \
    decisions_wait_out_a_backoff_once_the_standbys_miss_a_wait
# redis_release_once: a hold's release is sent once, even when no standby
# acknowledged it; tests/failover.rs, about 10 s to fail (the wait for the
# tokens on the new primary).
expect_caught redis_release_once failover "the release never reached B" "-p pace-redis" \
    a_release_the_standby_missed_is_sent_again_after_a_failover
# redis_unused_kept: an admission no standby acknowledged stays debited
# (a hold settles as kept at its expiry); tests/failover.rs, about 10 s
# to fail (the wait for the tokens' return).
expect_caught redis_unused_kept failover "never given back" "-p pace-redis" \
    an_admission_not_used_goes_back
# redis_hold_not_leased: a key only held (pace-tower's layer holds a limit
# it may refund) never gets hot, so no lease decides its holds;
# tests/leases.rs, about 10 s to build and 8 s to fail.
expect_caught redis_hold_not_leased leases "panicked" "-p pace-redis" \
    a_held_key_is_leased_and_its_holds_resolve_at_once
# ... and by the failover of tests/leases_processes.rs (4 replica processes,
# the standby cut, the primary killed): the grants the primary made after
# the cut are used, and lost with it (about 45 s: the test's build beside
# the variant's library, built just above, and a 30 s run).
expect_caught redis_lease_wait_ignored leases_processes "grants the standby lacks were used" \
    "-p pace-redis" leases_across_processes_survive_kills_and_a_failover
# ... and by a Sentinel failover (tests/sentinel_leases.rs, feature
# sentinel: two limiters, the standby's link stalled until the primary holds
# 100 tokens of debits it lacks, the primary killed, the Sentinel promoting
# the standby): the grants made during the stall are used and lost with the
# primary (31-40 tokens over the bound, 3 of 3 runs). Its graceful
# failover (`SENTINEL FAILOVER`) is over by 3-6 tokens only: not
# registered. redis_wait_ignored (an admission used whatever WAIT
# answered) fails both (83-102 and 32-39 tokens over, 3 of 3 runs each).
# About 30-35 s in all (measured twice, load 2 and 6, 2-core VM): pace-redis and the
# test rebuilt incrementally twice with --all-features (the dependencies are
# the tests' own build), runs of 7 and 12 s.
expect_caught redis_lease_wait_ignored sentinel_leases "exceed the bound by" \
    "-p pace-redis --all-features" a_killed_primary_costs_no_excess_with_leases
# ... and by a Cluster primary killed (tests/cluster_leases.rs, feature
# cluster: 3 primaries with a replica each, two limiters, the hot key's
# replica stopped until its primary holds 300 tokens of debits the replica
# lacks, the primary killed, the replica promoted by the node timeout): the
# grants made while the replica was stopped are used and lost with the
# primary (85-101 tokens over the bound, 6 of 6 runs). About 25 s (load
# 4.5, 2-core VM): the test built with the variant's library (built just
# above; 15 s), a run of 10-11 s.
expect_caught redis_lease_wait_ignored cluster_leases "exceed the bound by" \
    "-p pace-redis --all-features" a_killed_cluster_primary_costs_no_excess_with_leases
expect_caught redis_wait_ignored sentinel_leases "exceed the bound by" \
    "-p pace-redis --all-features" a_killed_primary_costs_no_excess_with_leases \
    a_graceful_failover_costs_no_excess_with_leases
# ... and by the Cluster primary killed: the server's admissions made while
# the replica was stopped are used and lost with the primary (257-303
# tokens over, 5 of 5 runs). About 25 s, as above (runs of 8-10 s).
expect_caught redis_wait_ignored cluster_leases "exceed the bound by" \
    "-p pace-redis --all-features" a_killed_cluster_primary_costs_no_excess_with_leases
# An expiry is reached only by histories that wait out the hold limit: the
# model catches it in every run, the bound over random histories in some.
expect_caught redis_expiry_refunds holds "panicked" "-p pace-redis" \
    holds_agree_with_the_integer_model
expect_caught redis_expiry_refunds holds "an expired hold was returned" "-p pace-redis" \
    an_unresolved_hold_settles_as_kept_after_the_hold_limit \
    a_dead_clients_hold_expires_on_the_servers_clock
# Turns beside holds (tests/holds.rs, whose random histories mix turns with
# holds), against two variants:
#   redis_turn_beside_held:     a turn is admitted beside more held tokens
#                               than the capacity leaves it, stored as any
#                               debit, so after the holds' refund a reserve
#                               lands on the turn's own slot
#   redis_held_wait_ignores_held: a denial's wait while tokens are held
#                               leaves them out (not the wait if they are
#                               kept, `rule::held_wait`)
expect_caught redis_turn_beside_held holds "tokens at one instant" "-p pace-redis" \
    a_turn_is_admitted_only_where_it_fits_beside_held_tokens holds_agree_with_the_integer_model
expect_caught redis_turn_beside_held holds "exceeds the bound by" "-p pace-redis" \
    random_hold_histories_never_exceed_the_bound
expect_caught redis_held_wait_ignores_held holds "leaves the held tokens out" "-p pace-redis" \
    a_held_denials_retry_after_is_the_wait_if_the_holds_are_kept holds_agree_with_the_integer_model
# ... and by the comparison of the script with the core, whose histories
# hold, keep and refund (about 30 s: the test's build and 160 histories).
expect_caught redis_held_wait_ignores_held equivalence "Test failed" "-p pace-redis" \
    script_pace_and_model_agree_on_every_decision

# The lease protocol of a shared limit (pace-models/src/leases.rs, its
# tests/leases.rs: 300 random histories each, several replicas with
# drifting clocks, a network that delays, duplicates and loses calls,
# kills, failovers to a standby, and clocks within 20%), against six
# variants, each over the bound (about 5 s each; only pace-models rebuilds):
#   lease_keep_from_grant:     reported kept tokens settle from the lease's
#                              first grant's reading, before their use
#   lease_deadline_from_reply: the replica counts its deadline from the
#                              reply's arrival, not from the call's send
#   lease_delta_reports:       reports are deltas, so a duplicated call
#                              applies twice
#   lease_expiry_refunds:      an expired lease is dropped as if refunded
#   lease_reply_unreplicated:  a reply leaves before the standby has the
#                              call's writes (no WAIT 1)
#   lease_no_drift_margin:     the deadline counts the lease's whole
#                              remaining time on a clock that may run slow
for m in lease_keep_from_grant lease_deadline_from_reply lease_delta_reports lease_expiry_refunds; do
    expect_caught "$m" leases "exceeds the bound by" "-p pace-models" \
        lease_histories_never_exceed_the_bound failover_histories_never_exceed_the_bound
done
# ... and the server-side ones their own scenario at hand-picked readings:
expect_caught lease_keep_from_grant leases "settled from before the report" "-p pace-models" \
    a_reported_token_settles_from_the_reports_reading
expect_caught lease_expiry_refunds leases "dropped as refunded" "-p pace-models" \
    an_expired_lease_settles_as_kept_from_its_expiry
expect_caught lease_delta_reports leases "a duplicated release applied twice" "-p pace-models" \
    a_duplicated_report_applies_once
expect_caught lease_reply_unreplicated leases "exceeds the bound by" "-p pace-models" \
    failover_histories_never_exceed_the_bound
expect_caught lease_no_drift_margin leases "exceeds the bound by" "-p pace-models" \
    drifting_clock_histories_never_exceed_the_bound

# Operations (the features cluster, sentinel, tls; the tests start their
# own servers on loopback), against four variants, built once together
# (each changes what one test sees only, and fails it with its own message):
#   redis_warn_every_trip:     every failed call logs a warning (a log flood
#                              during an outage, not one line per outage)
#   redis_cluster_one_circuit: one circuit for the whole cluster (a dead
#                              primary's timeouts refuse the healthy ones)
#   redis_sentinel_unfollowed: no +switch-master follower (a limiter stays on
#                              the old primary after a graceful failover)
#   redis_refusal_is_outage:   a refused login or certificate counts as a
#                              server that cannot be reached
ops=redis_warn_every_trip,redis_cluster_one_circuit,redis_sentinel_unfollowed,redis_refusal_is_outage
expect_caught "$ops" outage "one warning per outage" "-p pace-redis --all-features" \
    each_refusal_says_when_to_retry_and_an_outage_is_logged_once
expect_caught "$ops" cluster "circuit opened with no failure of its own" "-p pace-redis --all-features" \
    one_primary_down_leaves_the_others_deciding
expect_caught "$ops" sentinel "over the bound" "-p pace-redis --all-features" \
    a_graceful_failover_does_not_split_the_limit
expect_caught "$ops" refusals "connected without the password" "-p pace-redis --all-features" \
    a_refused_login_fails_connect_under_either_policy
expect_caught "$ops" tls "expected a TLS failure" "-p pace-redis --all-features" \
    an_unknown_ca_is_refused

# pace-tower's known-wrong variants (PACE_MUTANT, read by pace-tower/build.rs):
# each must make its test file fail (tests, not the build).
[ "$part" = release ] || for entry in xff_leftmost=server v6_full_address=server retry_after_truncated=server \
    tower_plain_reserve=holds tower_no_keep=holds tower_nested_no_refund=holds tower_warn_every_outage_request=operable \
    tower_redis_plain=shared_holds tower_redis_no_turn=shared_holds; do
    m=${entry%%=*}
    f=${entry#*=}
    status=0
    out=$(PACE_MUTANT=$m cargo test -p pace-tower --all-features --test "$f" 2>&1) || status=$?
    if [ "$status" -eq 0 ] || ! grep -q "test result: FAILED" <<<"$out"; then
        echo "$out" | tail -30
        echo "pace-tower mutant $m SURVIVED pace-tower/tests/$f.rs"
        exit 1
    fi
    echo "pace-tower mutant $m caught by pace-tower/tests/$f.rs: $(grep -E '^test .* FAILED' <<<"$out" | head -3 | tr '\n' ' ')"
    caught[$m]=1
done
echo "mutants ($part): ${#caught[@]} variants caught here"
