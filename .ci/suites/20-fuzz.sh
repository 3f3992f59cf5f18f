#!/usr/bin/env bash
# cargo-fuzz smoke runs: each target for a bounded time from the committed
# seed corpus; any crash (a disagreement with a model panics) fails CI.
set -euo pipefail
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
# Nightly only when missing (installing an installed channel updates it).
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cd fuzz
# Usage: 20-fuzz.sh [TARGET...]: the targets named, or every target. .ci/run
# runs each target as a job of its own in its pool: a fuzz run uses one
# core, so two targets (or a target and a Miri part) run side by side, each
# still for the full time.
targets=("$@")
[ "${#targets[@]}" -ne 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
known=$(cargo +nightly fuzz list)
for target in "${targets[@]}"; do
    grep -qxF "$target" <<<"$known" || { echo "no fuzz target $target"; exit 1; }
done
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    work=$(mktemp -d)
    cp -r "corpus/$target"/. "$work"/
    log=$(mktemp)
    echo "fuzz $target for ${SECONDS_PER_TARGET}s"
    status=0
    cargo +nightly fuzz run "$target" "$work" -- \
        -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb|ERROR|panicked|SUMMARY" "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -50 "$log"
        echo "fuzz target $target failed (exit $status); crash input under fuzz/artifacts/$target/"
        exit "$status"
    fi
    rm -rf "$work" "$log"
done
