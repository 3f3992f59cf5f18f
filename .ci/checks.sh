#!/usr/bin/env bash
# The checks on the normal build, one after the other: formatting, lints,
# docs, the packaging check (.ci/package.sh), pace-tower's MSRV check (1.95,
# the part of .ci/msrv.sh that can use this build), the README's test
# command. .ci/run runs this as the first job
# of its pool (then .ci/suites/15-mutants.sh, which builds in the same target
# directory as the tests here), beside the single-core suites.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

step() { printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "cargo fmt --check"
cargo fmt --all --check

step "no two modules of a crate import each other (.ci/import_cycles.py, < 1 s)"
for src in src pace-redis/src pace-tower/src pace-models/src pace-soak/src pace-lab/src loom-tests/src; do
    python3 .ci/import_cycles.py "$src" | sed "s|^|$src: |"
done

step "cargo clippy"
# --all-targets: the benchmarks (run by hand: docs/bench/README.md) and the
# examples type-check here.
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "the core without the internals feature: no warnings, no hidden items"
cargo clippy -p pace --lib -- -D warnings
if grep -rnE 'doc\(hidden\)|__private' src; then
    echo "FAILED: the default public API has hidden items; test hooks go behind the feature __internals (src/internals.rs)" >&2
    exit 1
fi

step "cargo doc (no warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --all-features

step "packaging: cargo publish --dry-run -p pace -p pace-redis -p pace-tower (.ci/package.sh)"
bash .ci/package.sh

step "MSRV of pace-tower: cargo +1.95 check (.ci/msrv.sh 1.95, on this build)"
bash .ci/msrv.sh 1.95

step "redis-server (pace-redis's tests start their own on a loopback port)"
if ! command -v redis-server >/dev/null; then
    (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server) || {
        echo "FAILED: redis-server is missing and could not be installed from Debian's packages;" >&2
        echo "        pace-redis's tests need a real server (apt-get install -y redis-server)." >&2
        exit 1
    }
fi
redis-server --version

step "tests (README's test command)"
cargo test --workspace --all-features
step "checks done"
