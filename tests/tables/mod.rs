//! Running a test file's tests on both ways the table holds `u64` keys: as
//! their own bits in the cells (the default for word-sized keys) and boxed
//! with their hash, as every other key type is (`Builder::boxed_keys`).

use std::collections::hash_map::RandomState;
use std::time::Duration;

use pace::{ManualClock, Pace, Rate};

/// How a test's limiter holds its `u64` keys.
#[derive(Clone, Copy)]
pub enum Rows {
    /// The keys' own bits in the cells (the default for word-sized keys).
    Cells,
    /// Boxed with their hash (`Builder::boxed_keys`).
    Entries,
}

/// A `u64` limiter of one token per `interval` on a manual clock, its keys
/// held as `rows` says.
pub fn limiter(
    capacity: u64,
    interval: Duration,
    rows: Rows,
) -> Pace<u64, RandomState, ManualClock> {
    let b = Pace::builder(Rate::new(1, interval).unwrap())
        .capacity(capacity)
        .clock(ManualClock::new());
    match rows {
        Rows::Cells => b.build().unwrap(),
        Rows::Entries => b.boxed_keys().build().unwrap(),
    }
}

/// Each test, once per way of holding keys: `cells::name` (own bits) and
/// `entries::name` (boxed).
macro_rules! both_tables {
    ($($name:ident),* $(,)?) => {
        mod cells {
            $(#[test]
            fn $name() {
                super::$name(super::tables::Rows::Cells)
            })*
        }
        mod entries {
            $(#[test]
            fn $name() {
                super::$name(super::tables::Rows::Entries)
            })*
        }
    };
}
