#!/usr/bin/env bash
# loom: every model in loom-tests/ under a preemption bound, then each
# known-wrong variant of the crate, asserting that its model catches it.
# Models run two at a time (each is single-threaded). A mutant is chosen with
# PACE_MUTANT (build.rs), so switching mutants rebuilds pace and loom-tests
# only, not loom and crossbeam.
#
# Usage: 10-loom.sh [all|long|models|mutants]. `all` (the default) runs the
# three parts one after the other; .ci/run runs them as three jobs of its
# pool, side by side:
#   long     the one long model, tombstone_reuse_vs_empty_claim (minutes on
#            one core), alone, so that it overlaps with the other jobs
#            instead of leaving the second core idle at the end of its file
#   models   every other model at the bound, and again at bound 3
#   mutants  each known-wrong variant against its model
set -euo pipefail
part="${1:-all}"
case "$part" in
all | long | models | mutants) ;;
*) echo "usage: $0 [all|long|models|mutants]" >&2; exit 2 ;;
esac
export RUSTFLAGS="--cfg loom --cfg crossbeam_loom"
export CARGO_TARGET_DIR=target/loom
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
long=tombstone_reuse_vs_empty_claim

# run_models CARGO_TEST_ARGS...: the models' summary lines, and a failure if
# cargo fails. (Not `cargo ... | grep ... || true; test "${PIPESTATUS[0]}"
# -eq 0`: under pipefail a failing cargo makes the pipeline fail, `|| true`
# runs and PIPESTATUS is then true's, so a failing model passed.)
run_models() {
    local log status=0
    log=$(mktemp)
    cargo test -p loom-tests --release "$@" >"$log" 2>&1 || status=$?
    grep -E "^test |loom:|test result|panicked|error" "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -40 "$log"
        echo "loom models failed (cargo test exit $status)"
        exit 1
    fi
    MODELS_LOG=$log
}

if [ "$part" = all ] || [ "$part" = long ]; then
    echo "the long model $long (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
    run_models --test cells -- --exact "$long" --nocapture
    # A renamed model would filter to zero tests and pass.
    grep -q "^test $long ... ok" "$MODELS_LOG" || { echo "the model $long did not run"; exit 1; }
fi

if [ "$part" = all ] || [ "$part" = models ]; then
    echo "models (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS), all but $long (run by itself)"
    run_models -- --test-threads=2 --nocapture --skip "$long"

    # The models that stay small also run with one more preemption (bound 3);
    # exact_admission would take far longer there.
    echo "models at LOOM_MAX_PREEMPTIONS=3 (all but exact_admission)"
    LOOM_MAX_PREEMPTIONS=3 run_models --test pace -- \
        --test-threads=2 --nocapture --skip exact_admission

    # The models of holds again with every held row in a record
    # (PACE_HOLD_RECORD=1, build.rs): both forms of a held row stay proven.
    echo "the models of holds with every held row in a record (PACE_HOLD_RECORD=1)"
    PACE_HOLD_RECORD=1 run_models --test holds -- --test-threads=2 --nocapture
    grep -q "^test holds_between_the_word_and_a_record ... ok" "$MODELS_LOG" ||
        { echo "the record-only models did not run"; exit 1; }
    PACE_HOLD_RECORD=1 run_models --test pace -- --test-threads=2 --nocapture turn_vs_hold_and_keep
    grep -q "^test model::turn_vs_hold_and_keep ... ok" "$MODELS_LOG" ||
        { echo "the record-only turn model did not run"; exit 1; }
fi

[ "$part" = all ] || [ "$part" = mutants ] || exit 0

# The mutants build in a target directory of their own: a mutant rebuild
# relinks the test binaries of loom-tests, which the parts above may be
# running at that moment (in .ci/run they run side by side). It starts as a
# copy of target/loom once that is built (the build waits for cargo's lock
# while another part builds there; when all is built it recompiles only
# loom-tests, whose build script, ../build.rs, names a rerun-if-changed file
# that does not exist from loom-tests/), so that loom, crossbeam and the rest
# are not built a second time.
if [ ! -d target/loom-mutants ]; then
    cargo test -p loom-tests --release --no-run >/dev/null 2>&1 ||
        cargo test -p loom-tests --release --no-run
    rm -rf target/loom-mutants.tmp
    cp -a target/loom target/loom-mutants.tmp
    mv target/loom-mutants.tmp target/loom-mutants
fi
export CARGO_TARGET_DIR=target/loom-mutants
# Incremental release builds here only: each mutant then recompiles only
# what its cfg changes in pace and loom-tests (about a third of the CPU of a
# full rebuild of the two). The models above keep the normal release build.
export CARGO_PROFILE_RELEASE_INCREMENTAL=true
unset CARGO_INCREMENTAL # (.ci/run turns it off for its other builds)
# mutant = the invariant message its model must fail with (mutant:test =
# the same, checked by the test mutant_<test>)
mutants=(
    "check_then_debit=exactly the tokens left are admitted"
    "refund_undrained=kept admissions exceed the bucket"
    "fresh_row_from_zero=kept admissions exceed the bucket"
    "fresh_row_from_zero:fresh_row_from_zero_cells=kept admissions exceed the bucket"
    "quota_read_twice=a decision mixed two quotas"
    "turn_before_its_slot=kept admissions exceed the bucket"
    "turn_slot_ignores_held=the turn goes behind the held token"
)
# Each entry is "mutant=message": built with that mutant, the file's
# `mutant_<mutant>` test must fail, and with the model's own message.
expect_caught() {
    local file=$1 entry mutant expected status out
    shift
    for entry in "$@"; do
        mutant=${entry%%=*}
        expected=${entry#*=}
        # "mutant:test=message" runs the test `mutant_<test>` instead.
        test_name=mutant_${mutant#*:}
        mutant=${mutant%%:*}
        echo "$file mutant $mutant ($test_name): the model must fail with \"$expected\""
        status=0
        out=$(PACE_MUTANT="$mutant" cargo test -p loom-tests --release --test "$file" -- "$test_name" --exact --test-threads=1 2>&1) ||
            status=$?
        if [ "$status" -eq 0 ]; then
            echo "$out" | tail -20
            echo "mutant $mutant SURVIVED: no model caught it"
            exit 1
        fi
        if ! grep -qF "$expected" <<<"$out"; then
            echo "$out" | tail -40
            echo "mutant $mutant failed, but not with the expected invariant"
            exit 1
        fi
        echo "caught: $(grep -F "$expected" <<<"$out" | head -1)"
    done
}
expect_caught pace "${mutants[@]}"

# The gate's mutants (loom-tests/tests/gate.rs): each `mutant_*` test there is
# `#[should_panic]` on its model's failure message, so it must pass.
gate_mutants=(
    gate_unchecked_bytes
    gate_no_wake_on_rollback
    gate_no_fence
    gate_cancel_no_notify
    gate_shrink_keeps_excess
    gate_async_drop_keeps_turn
)
for mutant in "${gate_mutants[@]}"; do
    echo "gate mutant $mutant: its model must fail"
    status=0
    out=$(PACE_MUTANT="$mutant" cargo test -p loom-tests --release --test gate -- mutant_ --test-threads=1 2>&1) || status=$?
    # Exactly one `mutant_*` test is compiled in per mutant; zero would pass
    # without checking anything.
    if [ "$status" -ne 0 ] || ! grep -q "test result: ok. 1 passed" <<<"$out"; then
        echo "$out" | tail -40
        echo "gate mutant $mutant SURVIVED (or no mutant_ test ran for it)"
        exit 1
    fi
    echo "caught: $(grep -E "^test mutant_" <<<"$out")"
done

# The table's protocol with boxed keys (loom-tests/tests/table.rs, keys that
# hold a loom `Arc`) and with keys held as their own bits
# (loom-tests/tests/cells.rs): each known-wrong variant must make its model
# fail with the invariant message given here. A variant both files catch
# runs against both in a row: a change of PACE_MUTANT rebuilds pace and
# loom-tests, a second test file of the same variant only itself.
expect_caught table "verify_off=one live row per key"
expect_caught cells "verify_off=both debits, one row"
expect_caught table "copy_unfrozen=both debits counted"
expect_caught cells "copy_unfrozen=both debits of key 0"
expect_caught table "refund_gives_up_on_frozen=a refund that fills the bucket removes the row"
expect_caught cells "refund_gives_up_on_frozen=from the floor the refund raised"
expect_caught cells \
    "clean_without_fence=key 4's row is on its sequence" \
    "sweep_keeps_floor=from the floor the sweep raised" \
    "revive_from_now=from the kept tat"
# Holds (loom-tests/tests/holds.rs), likewise.
holds_mutants=(
    "refund_rewinds_tat=only the kept debit remains"
    "decision_ignores_held=at most the capacity is admitted"
    "spot_written_blind=the debit and what was kept remain"
)
expect_caught holds "${holds_mutants[@]}"
# A lease's local counter (pace-redis/src/lease_counter.rs, included by
# loom-tests/tests/lease_counter.rs; the models take well under a second).
lease_mutants=(
    "lease_clock_before_word=before its grant"
    "lease_fresh_across_leases=lease 2 reported a token of lease 1"
    "lease_refund_reported=the token is kept"
)
expect_caught lease_counter "${lease_mutants[@]}"
