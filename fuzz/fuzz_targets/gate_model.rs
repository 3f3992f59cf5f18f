//! The gate against its sequential model, on fuzzer-chosen configurations
//! and operation sequences (zero and huge sizes, u64::MAX, shrinking past
//! the share, over-long bodies). The model and the checker are
//! `pace_models::gate`, the same code the proptest `tests/gate_model.rs`
//! drives, so the two cannot drift apart.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run gate_model`
#![no_main]

use libfuzzer_sys::fuzz_target;
use pace_models::gate::{check, Config, Op};

#[derive(arbitrary::Arbitrary, Debug)]
struct Input {
    config: Config,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    // Bound the work per input; long sequences add little over many short ones.
    let ops = &input.ops[..input.ops.len().min(256)];
    if let Err(divergence) = check(input.config, ops) {
        panic!("gate diverged from its model: {divergence}");
    }
});
