//! `Pace` against the exact 128-bit sequential model, step by step: arbitrary
//! sequences of reserve / reserve_n / refund / advance / set-backwards /
//! sweep / peek over a small key space (decisions, retry_after, len()).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pace_models::debt as debt_model;

fuzz_target!(|data: &[u8]| {
    if let Some((params, ops)) = debt_model::decode(data, false) {
        if let Err(e) = debt_model::check(params, &ops) {
            panic!("pace disagrees with the model: {e}");
        }
    }
});
