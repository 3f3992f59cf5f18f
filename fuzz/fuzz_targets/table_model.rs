//! The table against a std `HashMap` model: capacity-1 buckets over up to
//! 2,000 keys and a 4-slot minimum, so reserves are inserts (absent) or
//! denied lookups (present), refunds unlink, sweeps unlink in bulk, and the
//! array grows, compacts and shrinks all the time. Rows, `len()` and every
//! answer must match the model's map.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pace_models::debt as debt_model;

fuzz_target!(|data: &[u8]| {
    if let Some((params, ops)) = debt_model::decode(data, true) {
        if let Err(e) = debt_model::check(params, &ops) {
            panic!("the table disagrees with the model: {e}");
        }
    }
});
