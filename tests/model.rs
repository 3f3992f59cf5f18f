//! `Pace` against an exact sequential model over random sequences of reserve,
//! reserve_n, reserve_n_with (quotas per call), set_quota, turns (`acquire`'s
//! reservation of a future slot), refund, holds kept or refunded, advance,
//! set-backwards, sweep and peek: every decision,
//! every `retry_after`, every `len()` and every peek must agree. The model is
//! `pace_models::debt` (shared with the fuzz targets).

use pace_models::debt::{self as debt_model, check, Op, Params};
use proptest::prelude::*;

fn op(keys: u16, capacity: u64, tau: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..keys).prop_map(|key| Op::Reserve { key, n: 1 }),
        2 => (0..keys, 0..=capacity + 1).prop_map(|(key, n)| Op::Reserve { key, n }),
        2 => (0..keys, 0..=capacity + 1).prop_map(|(key, n)| Op::Check { key, n }),
        3 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        3 => (0..=tau * 2).prop_map(|ns| Op::Advance { ns }),
        1 => (0..=tau).prop_map(|ns| Op::SetBack { ns }),
        1 => Just(Op::Sweep),
        2 => (0..keys).prop_map(|key| Op::Peek { key }),
        2 => (0..keys, 0..=capacity * 2 + 1, any::<u8>())
            .prop_map(|(key, n, quota)| Op::ReserveWith { key, n, quota }),
        1 => any::<u8>().prop_map(|quota| Op::SetQuota { quota }),
        2 => (0..keys, 0..=capacity + 1, 0..=tau * 2)
            .prop_map(|(key, n, wait)| Op::Turn { key, n, wait }),
        3 => (0..keys, 0..=capacity + 1).prop_map(|(key, n)| Op::Hold { key, n }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, keep)| Op::Resolve { pick, keep }),
    ]
}

fn case() -> impl Strategy<Value = (Params, Vec<Op>)> {
    (
        1_000u64..2_000_000,
        1u64..=6,
        prop_oneof![Just(4usize), Just(64)],
        prop_oneof![Just(3u16), Just(12), Just(300)],
    )
        .prop_flat_map(|(interval, capacity, min_slots, keys)| {
            let params = Params {
                interval,
                capacity,
                min_slots,
                keys,
            };
            (
                Just(params),
                proptest::collection::vec(op(keys, capacity, interval * capacity), 1..400),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pace_agrees_with_the_debt_model((params, ops) in case()) {
        if let Err(e) = check(params, &ops) {
            prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn the_fuzz_decoder_yields_runnable_cases() {
    let bytes: Vec<u8> = (0..=255u8).cycle().take(4_006).collect();
    for big in [false, true] {
        let (params, ops) = debt_model::decode(&bytes, big).unwrap();
        assert_eq!(ops.len(), 1_000);
        check(params, &ops).unwrap();
    }
}

/// The `table_model` fuzz target's cases (capacity 1, up to 2,000 keys),
/// drawn so that runs of new keys grow the table over several calls of a
/// migration and a pass comes due while it runs: a share of ops are
/// reserves (a random fraction per case) and a few are short advances.
/// Every decision, sweep count and `len()` must agree with the model.
/// Under `pass_waits_for_migration` (a pass due during a migration left to
/// later calls) the table keeps rows the model swept.
#[test]
fn growing_tables_agree_with_the_debt_model() {
    let cases: u64 = if cfg!(debug_assertions) { 1_000 } else { 3_000 };
    for case in 0..cases {
        let mut x = (case.wrapping_mul(0xD1B54A32D192ED03) ^ 0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let len = 6 + (next() % 4_000) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let reserves = next() % 100;
        for i in (6..len).step_by(4) {
            if next() % 100 < reserves {
                data[i] = (next() % 6) as u8; // reserve 1
            }
            if next() % 100 < 5 && i + 2 < len {
                // A short advance: up to 40/256 of 2 tau.
                data[i] = 11;
                data[i + 1] = (next() % 40) as u8;
                data[i + 2] = 0;
            }
        }
        let (params, ops) = debt_model::decode(&data, true).unwrap();
        if let Err(e) = check(params, &ops) {
            panic!("the table disagrees with the debt model: case {case} {params:?}: {e}");
        }
    }
}
