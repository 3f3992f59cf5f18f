#!/usr/bin/env bash
# AddressSanitizer (with LeakSanitizer at exit, which scans memory
# conservatively and so also sees crossbeam-epoch's integer-typed pointers)
# over the threaded stress test and the rule tests, optimised.
# ThreadSanitizer is not run: it needs -Zbuild-std and does not understand
# the standalone fences crossbeam-epoch relies on (false positives).
set -euo pipefail
# Nightly only when missing (installing an installed channel updates it).
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
# allocator_may_return_null: a request the allocator cannot serve returns
# null, as malloc does, instead of stopping the run (tests/rules.rs asks for
# a 4 EiB slot array and expects the typed error).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1"
RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan \
    cargo +nightly test --target x86_64-unknown-linux-gnu --release --test stress --test rules --test holds
