//! Running a test file's tests on both tables of `u64` rows: the cells (the
//! default for word-sized keys) and the slot table (`Builder::entry_rows`).

use std::collections::hash_map::RandomState;
use std::time::Duration;

use pace::{ManualClock, Pace, Rate};

/// Which table a test's limiter keeps its `u64` rows in.
#[derive(Clone, Copy)]
pub enum Rows {
    /// 16-byte cells in the array (the default for word-sized keys).
    Cells,
    /// A separately allocated entry per row (`Builder::entry_rows`).
    Entries,
}

/// A `u64` limiter of one token per `interval` on a manual clock, its rows
/// in `rows`.
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
        Rows::Entries => b.entry_rows().build().unwrap(),
    }
}

/// Each test, once per table: `cells::name` and `entries::name`.
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
