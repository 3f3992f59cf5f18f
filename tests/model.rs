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
