#!/usr/bin/env bash
# AddressSanitizer (with LeakSanitizer at exit, which scans memory
# conservatively and so also sees crossbeam-epoch's integer-typed pointers)
# over the threaded stress test and the rule tests, optimised.
# ThreadSanitizer is not run: it needs -Zbuild-std and does not understand
# the standalone fences crossbeam-epoch relies on (false positives).
set -euo pipefail
# Nightly only when missing (installing an installed channel updates it).
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan \
    cargo +nightly test --target x86_64-unknown-linux-gnu --release --test stress --test rules
