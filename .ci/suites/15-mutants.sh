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
set -euo pipefail
# Mutants are chosen with PACE_MUTANT (build.rs): only pace and the test
# rebuild, in the same target directory as the README's tests.
status=0
out=$(PACE_MUTANT=fresh_row_from_zero,refund_undrained,claimed_left_on_panic \
    cargo test --test over_admission -- --test-threads=1 2>&1) || status=$?
if [ "$status" -eq 0 ]; then
    echo "$out" | tail -20
    echo "the mutants SURVIVED tests/over_admission.rs"
    exit 1
fi
for t in a_stale_reserve_does_not_recreate_a_swept_row \
    a_stale_reserve_does_not_recreate_a_row_swept_by_another_call \
    a_far_future_sweep_forgets_no_debt_and_denies_nothing_forever \
    out_of_order_refunds_mint_nothing \
    a_stale_refund_mints_nothing \
    panicking_eq_while_inserting_leaves_no_claimed_row \
    random_histories_never_exceed_the_bound; do
    if ! grep -qE "^test $t \.\.\. FAILED" <<<"$out"; then
        echo "$out" | tail -40
        echo "mutant not caught by $t"
        exit 1
    fi
    echo "caught by $t"
done
grep -E "exceeds the bound by" <<<"$out" | head -1

# Churn without migrations (tests/churn.rs) against `no_tombstone_reuse`:
# every new row takes a vacant slot, so both churn tests must see migrations.
status=0
out=$(PACE_MUTANT=no_tombstone_reuse cargo test --release --test churn -- --test-threads=1 2>&1) || status=$?
for t in refunded_keys_reuse_tombstones swept_keys_reuse_tombstones; do
    if [ "$status" -eq 0 ] || ! grep -qE "^test $t \.\.\. FAILED" <<<"$out" ||
        ! grep -q "no migration under churn" <<<"$out"; then
        echo "$out" | tail -40
        echo "no_tombstone_reuse not caught by $t"
        exit 1
    fi
    echo "no_tombstone_reuse caught by $t"
done

# Every migration is spread over its chunks (tests/growth.rs), against two
# variants whose target fills before its copy ends, so that the insert that
# meets it copies every chunk left:
#   copies_keep_their_room: copies stay counted against the room kept for them
#   no_room_for_new_rows:   a shrink's target is sized from its rows alone
for entry in copies_keep_their_room=each_growth_migration_is_spread_over_its_chunks \
    no_room_for_new_rows=a_shrink_while_new_keys_arrive_is_spread_over_its_chunks; do
    mutant=${entry%%=*}
    t=${entry#*=}
    status=0
    out=$(PACE_MUTANT=$mutant cargo test --test growth 2>&1) || status=$?
    if [ "$status" -eq 0 ] || ! grep -qE "^test $t \.\.\. FAILED" <<<"$out" ||
        ! grep -q "some call copied more than one call.s share" <<<"$out"; then
        echo "$out" | tail -40
        echo "$mutant not caught by $t"
        exit 1
    fi
    echo "$mutant caught by $t"
done

# Retired arrays are freed soon without a forced collection (tests/memory.rs)
# against `arrays_wait_for_a_full_bag`: no flush after retiring an array, so
# a growing table holds its old arrays until its thread's garbage bag fills.
status=0
out=$(PACE_MUTANT=arrays_wait_for_a_full_bag cargo test --test memory 2>&1) || status=$?
if [ "$status" -eq 0 ] || ! grep -q "retired arrays are not freed" <<<"$out"; then
    echo "$out" | tail -40
    echo "arrays_wait_for_a_full_bag not caught by tests/memory.rs"
    exit 1
fi
echo "arrays_wait_for_a_full_bag caught by memory_is_bounded_by_recent_exchanges"
