#!/usr/bin/env bash
# MSRV: pace and pace-redis on 1.89, pace-tower on 1.95 (rust-version in each
# Cargo.toml). A job of .ci/run's pool: its own toolchains and target
# directory, so it runs beside the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup toolchain install 1.89 --profile minimal >/dev/null 2>&1 || true
rustup toolchain install 1.95 --profile minimal >/dev/null 2>&1 || true
CARGO_TARGET_DIR=target/msrv cargo +1.89 check -p pace -p pace-redis --all-features
CARGO_TARGET_DIR=target/msrv cargo +1.95 check -p pace-tower --all-features
