//! The gate against its sequential model (`pace_models::gate`, shared with
//! the `gate_model` fuzz target): every outcome and every counter after
//! every step, and zero held once everything is dropped.

use pace_models::gate::{check, Config, Op};
use proptest::prelude::*;

/// Sizes around the interesting edges: zero, small, the cap, just past it,
/// the budget, and u64::MAX.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..=130u64,
        1 => Just(0u64),
        1 => Just(u64::MAX),
        1 => (u64::MAX - 2)..=u64::MAX,
    ]
}

fn config() -> impl Strategy<Value = Config> {
    prop_oneof![
        // Mostly valid, small gates that saturate often.
        8 => (1u8..6, 1u64..=128).prop_flat_map(|(slots, bytes)| {
            (Just(slots), Just(bytes), prop::option::of(1..=bytes)).prop_map(
                |(slots, bytes, body_cap)| Config { slots, bytes, body_cap },
            )
        }),
        // Anything, including zero and over-budget caps and u64::MAX.
        1 => (0u8..3, size(), prop::option::of(size()))
            .prop_map(|(slots, bytes, body_cap)| Config { slots, bytes, body_cap }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let idx = 0usize..16;
    prop_oneof![
        4 => prop::option::of(size()).prop_map(|declared| Op::TryAdmit { declared }),
        1 => prop::option::of(size()).prop_map(|declared| Op::Admit { declared }),
        2 => idx.clone().prop_map(|idx| Op::Split { idx }),
        2 => (idx.clone(), size()).prop_map(|(idx, to)| Op::Shrink { idx, to }),
        2 => (idx.clone(), 0u64..300).prop_map(|(idx, len)| Op::ReadBody { idx, len }),
        3 => idx.prop_map(|idx| Op::Drop { idx }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn gate_matches_sequential_model(config in config(), ops in prop::collection::vec(op(), 0..80)) {
        if let Err(e) = check(config, &ops) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// A fixed saturating run (a regression anchor beside the random ones), and
/// the model's own reading of the config rules.
///
/// That the checker can fail is shown with the mutants: building with
/// `RUSTFLAGS='--cfg pace_mutant="gate_shrink_keeps_excess"'` makes
/// `gate_matches_sequential_model` fail (DESIGN.md, section 10).
#[test]
fn a_saturating_run_and_a_body_cap_over_budget_follow_the_model() {
    use pace::gate::ConfigError;
    use pace_models::gate::expected_config;
    assert_eq!(
        expected_config(Config {
            slots: 1,
            bytes: 10,
            body_cap: Some(11)
        }),
        Err(ConfigError::BodyCapOverBudget {
            body_cap: 11,
            bytes: 10
        })
    );
    let ops: Vec<Op> = (0..40)
        .map(|i| match i % 4 {
            0 => Op::TryAdmit { declared: Some(3) },
            1 => Op::Split { idx: i },
            2 => Op::ReadBody {
                idx: i,
                len: i as u64,
            },
            _ => Op::Shrink { idx: i, to: 1 },
        })
        .collect();
    check(
        Config {
            slots: 3,
            bytes: 8,
            body_cap: None,
        },
        &ops,
    )
    .unwrap();
}
