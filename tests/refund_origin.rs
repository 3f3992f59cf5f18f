//! What a refund returns, exactly, and that a `Debit` refunded where it did
//! not come from (another limiter, another key) returns nothing, in both
//! tables (u64 keys live in cells, `String` keys in entries).
//!
//! The known-wrong variant `refund_ignores_origin` (a debit is refunded to
//! whatever limiter and key it is handed to) fails the `misdirected` tests
//! (`.ci/suites/15-mutants.sh`).

use std::collections::hash_map::RandomState;
use std::hash::Hash;
use std::time::Duration;

use pace::{ManualClock, Pace, Rate, Refunded};

type P<K> = Pace<K, RandomState, ManualClock>;

fn pace<K>(clock: &ManualClock, interval: Duration, capacity: u64) -> P<K> {
    Pace::builder(Rate::new(1, interval).unwrap())
        .capacity(capacity)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A 1-token debit of a 100 ms limiter ends where a 100-token debit of a
/// 1 ms limiter does: refunded to the second limiter it must not give those
/// 100 tokens back.
fn debit_of_another_limiter_returns_nothing<K: Hash + Eq + Clone>(key: K) {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let slow: P<K> = pace(&clock, ms(100), 10);
    let fast: P<K> = pace(&clock, ms(1), 1000);
    let _kept = fast.reserve_n(&key, 100).unwrap();
    assert_eq!(fast.peek(&key), 900);
    let foreign = slow.reserve(&key).unwrap().detach();
    let outcome = fast.refund(&key, foreign);
    assert_eq!(fast.peek(&key), 900, "a foreign debit minted tokens");
    assert_eq!(outcome, Refunded::Misdirected);
    assert_eq!(slow.peek(&key), 9);
}

/// Two fresh keys debited at one reading hold equal debits: refunded to the
/// other key, one must not give that key its token back.
fn debit_of_another_key_returns_nothing<K: Hash + Eq + Clone>(a: K, b: K) {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let p: P<K> = pace(&clock, ms(100), 3);
    let of_a = p.reserve(&a).unwrap().detach();
    let of_b = p.reserve(&b).unwrap().detach();
    let outcome = p.refund(&b, of_a);
    assert_eq!(p.peek(&a), 2);
    assert_eq!(p.peek(&b), 2, "a debit of another key minted tokens");
    assert_eq!(outcome, Refunded::Misdirected);
    // b's own debit still comes back, whole.
    assert_eq!(p.refund(&b, of_b), Refunded::Removed);
    assert_eq!(p.peek(&b), 3);
}

/// Each outcome of a refund, exactly.
fn each_outcome<K: Hash + Eq + Clone>(key: K) {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let p: P<K> = pace(&clock, ms(100), 3);
    // A lone reservation comes back whole and leaves no row.
    let r = p.reserve(&key).unwrap();
    assert_eq!(r.refund(), Refunded::Removed);
    assert_eq!((p.peek(&key), p.len()), (3, 0));
    // The newest debit of a key in debt comes back; the row stays.
    let _kept = p.reserve(&key).unwrap();
    let r = p.reserve(&key).unwrap();
    assert_eq!(r.refund(), Refunded::Restored);
    assert_eq!((p.peek(&key), p.len()), (2, 1));
    // A debit others stacked on returns nothing.
    let older = p.reserve(&key).unwrap().detach();
    let _newer = p.reserve(&key).unwrap();
    assert_eq!(p.refund(&key, older), Refunded::Superseded);
    assert_eq!(p.peek(&key), 0);
    // Once the row refilled and was swept, there is nothing to return.
    clock.set(Duration::from_secs(20));
    let d = p.reserve(&key).unwrap().detach();
    clock.advance(Duration::from_secs(10));
    assert_eq!(p.sweep(), 1);
    assert_eq!(p.refund(&key, d), Refunded::Refilled);
    assert_eq!((p.peek(&key), p.len()), (3, 0));
    // Zero tokens: nothing to return, nothing touched.
    let z = p.reserve_n(&key, 0).unwrap();
    assert_eq!(z.refund(), Refunded::Nothing);
    assert_eq!(p.len(), 0);
}

#[test]
fn misdirected_to_another_limiter_cells() {
    debit_of_another_limiter_returns_nothing(7u64);
}

#[test]
fn misdirected_to_another_limiter_entries() {
    debit_of_another_limiter_returns_nothing(String::from("client-7"));
}

#[test]
fn misdirected_to_another_key_cells() {
    debit_of_another_key_returns_nothing(1u64, 2u64);
}

#[test]
fn misdirected_to_another_key_entries() {
    debit_of_another_key_returns_nothing(String::from("a"), String::from("b"));
}

#[test]
fn a_refund_undoes_only_the_newest_debit_cells() {
    each_outcome(7u64);
}

#[test]
fn a_refund_undoes_only_the_newest_debit_entries() {
    each_outcome(String::from("client-7"));
}

#[test]
fn a_misdirected_zero_debit_is_nothing() {
    let clock = ManualClock::new();
    let a: P<u64> = pace(&clock, ms(100), 3);
    let b: P<u64> = pace(&clock, ms(100), 3);
    let z = a.reserve_n(&1, 0).unwrap().detach();
    assert_eq!(b.refund(&1, z), Refunded::Nothing);
    assert!(!Refunded::Nothing.returned());
    assert!(Refunded::Removed.returned() && Refunded::Restored.returned());
}
