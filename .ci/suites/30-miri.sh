#!/usr/bin/env bash
# Miri over the unsafe core: the bucket and table unit tests, the rule tests
# and the threaded stress tests, sized down under cfg(miri).
set -euo pipefail
# Install nightly with Miri only when it is missing: `rustup toolchain install`
# on an installed channel updates it, and a failed update must not fail CI.
if ! cargo +nightly miri --version >/dev/null 2>&1 ||
    ! rustup +nightly component list --installed 2>/dev/null | grep -q '^rust-src'; then
    rustup toolchain install nightly --profile minimal --component miri,rust-src >/dev/null
fi
cargo +nightly miri setup >/dev/null 2>&1
# crossbeam-epoch stores tags in pointer bits (int-to-ptr casts) and trips
# Stacked Borrows inside its own Local; Tree Borrows is the model it supports.
# Its global collector keeps retired garbage behind integer-typed pointers,
# which Miri cannot trace at exit and reports as leaks: leaks are checked by
# tests/memory.rs (allocated bytes return to the baseline) and by loom
# (loom Arcs inside keys) instead.
# Isolation stays on: threads read Miri's virtual clock and the schedule
# follows a fixed seed (the default, or one named below), so a run is
# repeatable. On the real clock
# (-Zmiri-disable-isolation) every run of the stress tests takes another
# schedule, and some report a data race between a load of a row's word and
# the free of that row by another thread's collection (DESIGN.md, section 9).
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-ignore-leaks}"
miri_test() { cargo +nightly miri test -p pace --no-default-features "$@"; }
# Miri interprets on one core, so the tests run as five processes, each a
# job of the pool in .ci/run (beside the fuzz targets and the rest), or two
# at a time when this script runs alone: the two halves of the long stress
# test (other seeds) each in a process of its own, and the rest split by test
# file. Every part skips the two halves, as the one process for the rest did.
a=effective_exchanges_never_exceed_capacity_plus_rate_times_elapsed
b=effective_exchanges_fit_the_bound_with_other_seeds
part="${1:-all}"
case "$part" in
all)
    source "$(dirname "$0")/../pool.sh"
    for p in a b holds lib rules; do
        pool_add "miri $p" "bash $0 $p"
    done
    pool_run 2
    exit
    ;;
# Each half runs on three Miri schedule seeds that change from run to run
# (drawn from the date and the commit, printed with each result), with
# crossbeam-epoch's pin as Miri builds it but for one ordering: the relaxed
# store of the local epoch made `Release` (.ci/miri-x86-pin.sh's `release`
# mode, on a patched copy of the crossbeam-epoch Cargo.lock names, in
# target/miri-pin). With the stock pin a schedule can draw a data-race
# report between a thread's access to memory reached under a guard and the
# deferred free of that memory, from the pin alone: crossbeam-epoch with no
# code of ours draws it (.ci/miri-pin-litmus.rs, `miri-x86-pin.sh litmus`),
# and the same seed with the store made `Release` does not. DESIGN.md §9
# gives the runs, stock against patched. Any report here fails CI: with the
# pin's store made `Release`, a report is the table's.
a | b)
    seed=$(printf '%s %s %s' "$(date -u +%F)" "$(git rev-parse HEAD 2>/dev/null || echo none)" "$part" |
        cksum | cut -d' ' -f1)
    seed=$((seed % 1000000))
    echo "miri $part: seeds $seed..$((seed + 3)) (the pin's store made Release)"
    MIRI_PIN_SOURCE=worktree MIRI_X86_PIN_DIR="$PWD/target/miri-pin" \
        exec bash "$(dirname "$0")/../miri-x86-pin.sh" "$part" "$seed..$((seed + 3))" release
    ;;
lib) args=(--lib -- --skip "$a" --skip "$b") ;;
holds) args=(--test holds -- --skip "$a" --skip "$b") ;;
rules) args=(--test rules --test stress -- --skip "$a" --skip "$b") ;;
*) echo "usage: $0 [all|a|b|lib|holds|rules]" >&2; exit 2 ;;
esac
log=$(mktemp)
status=0
miri_test "${args[@]}" >"$log" 2>&1 || status=$?
grep -hE "^test |test result|Running" "$log" || true
if [ "$status" -ne 0 ]; then
    tail -40 "$log"
    echo "miri $part failed (exit $status)"
    exit "$status"
fi
# Each part must have run tests (a renamed test would filter to zero): at
# least one per file (miri-x86-pin.sh checks the halves' own).
if grep -q "test result: ok. 0 passed" "$log"; then
    echo "miri $part ran no test (renamed?)"
    exit 1
fi
rm -f "$log"
