#!/usr/bin/env bash
# MSRV: pace and pace-redis on 1.89, pace-tower on 1.95 (rust-version in each
# Cargo.toml).
#
# Usage: msrv.sh [all|1.89|1.95]. `all` (the default) checks both in a target
# directory of their own, target/msrv. .ci/run runs the two parts apart:
#   1.89  a job of its pool, in target/msrv, beside the rest
#   1.95  a step of .ci/checks.sh, after the docs, in the checks' target
#         directory (the caller's CARGO_TARGET_DIR, else target): when the
#         stable toolchain of the checks is 1.95 itself (the same `rustc -vV`),
#         cargo finds most dependencies already checked by clippy and
#         rustdoc and checks the rest (those that pace-tower's features
#         alone unify differently) and the workspace crates; on another
#         stable it checks everything with 1.95, beside the checks' build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each toolchain is installed only when missing (installing an installed
# channel updates it, which needs the network; .ci/run installs both before
# its pool, so that no two jobs install at once).
part="${1:-all}"
case "$part" in
all | 1.89) export CARGO_TARGET_DIR=target/msrv ;;
1.95) ;;
*) echo "usage: $0 [all|1.89|1.95]" >&2; exit 2 ;;
esac
if [ "$part" != 1.95 ]; then
    rustc +1.89 --version >/dev/null 2>&1 || rustup toolchain install 1.89 --profile minimal >/dev/null
    cargo +1.89 check -p pace -p pace-redis --all-features
fi
if [ "$part" != 1.89 ]; then
    rustc +1.95 --version >/dev/null 2>&1 || rustup toolchain install 1.95 --profile minimal >/dev/null
    echo "1.95: $(rustc +1.95 --version); the checks' stable: $(rustc --version)"
    cargo +1.95 check -p pace-tower --all-features
fi
