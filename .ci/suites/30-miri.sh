#!/usr/bin/env bash
# Miri over the unsafe core: the bucket and table unit tests, the rule tests
# and the threaded stress tests, sized down under cfg(miri).
set -euo pipefail
rustup toolchain install nightly --profile minimal --component miri,rust-src >/dev/null
cargo +nightly miri setup >/dev/null 2>&1
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
time cargo +nightly miri test --no-default-features --lib --test rules --test stress
