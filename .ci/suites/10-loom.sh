#!/usr/bin/env bash
# loom: every model in loom-tests/ under a preemption bound, then each
# known-wrong variant of the crate, asserting that a model catches it.
set -euo pipefail
export RUSTFLAGS="--cfg loom --cfg crossbeam_loom"
export CARGO_TARGET_DIR=target/loom
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"

echo "models (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
time cargo test -p loom-tests --release -- --test-threads=1

for mutant in check_then_debit unlink_without_dead refund_full_interval; do
    echo "mutant $mutant: a model must fail"
    RUSTFLAGS="$RUSTFLAGS --cfg pace_mutant=\"$mutant\"" \
        CARGO_TARGET_DIR=target/loom-mutant \
        cargo test -p loom-tests --release --test pace -- mutant_ --test-threads=1
done
