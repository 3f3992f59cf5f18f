//! Where features meet: turns beside holds, denials beside holds, edge
//! quotas, and every `Drop` while its thread unwinds (DESIGN.md §3). Each
//! test is a case that broke the promise, or a documented outcome, before
//! its fix; through the public API, on a `ManualClock`.

use std::collections::hash_map::RandomState;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pace::internals::PaceInternals;
use pace::{Clock, ConfigError, DenyReason, ManualClock, Pace, Quota, Rate, Refunded};

const MS: u64 = 1_000_000;

type P<K> = Pace<K, RandomState, ManualClock>;

/// 10 per second (100 ms a token), capacity `capacity`, the clock at 10 s.
fn limiter<K: Hash + Eq>(capacity: u64) -> (P<K>, ManualClock) {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let p = Pace::builder(Rate::per_second(10).unwrap())
        .capacity(capacity)
        .clock(clock.clone())
        .build()
        .unwrap();
    (p, clock)
}

/// A turn's slot lies behind the held tokens its decision counted: with one
/// token held and one reserved of a capacity of 2, a turn waits a whole
/// interval, and keeping the hold leaves 2 kept tokens at one reading, not 3.
#[test]
fn a_turn_waits_behind_held_tokens() {
    let (p, clock) = limiter::<u64>(2);
    let hold = p.hold(&1).unwrap();
    let _kept = p.reserve(&1).unwrap();
    // Nothing is left at 10 s: the turn is let through at 10.1 s, which the
    // frozen clock never reaches, so it is denied within 50 ms ...
    let d = p
        .acquire_blocking(&1, Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(d.reason(), DenyReason::Held);
    // ... and waits for its slot within a second: another thread moves the
    // clock to the slot, and the turn returns only then.
    let mover = {
        let clock = clock.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            clock.set(Duration::from_nanos(10_000 * MS + 100 * MS));
        })
    };
    let turn = p.acquire_blocking(&1, Duration::from_secs(1)).unwrap();
    assert_eq!(
        p.clock().now_ns(),
        10_100 * MS,
        "the turn came before its slot"
    );
    mover.join().unwrap();
    assert!(hold.keep());
    drop(turn);
    // Kept: the hold and the reserve at 10 s, the turn at 10.1 s; the bucket
    // is empty at 10.1 s (2 tokens spent by 10 s, 1 refilled, 1 spent).
    assert_eq!(p.peek(&1), 0);
}

/// With both tokens held, a turn has no instant where it fits beside them:
/// it is denied with the reason `Held` and the wait if they are kept; once
/// they are refunded it fits at once.
#[test]
fn a_turn_beside_a_full_hold_is_denied_as_held() {
    let (p, _clock) = limiter::<u64>(2);
    let a = p.hold(&1).unwrap();
    let b = p.hold(&1).unwrap();
    // The turn's reservation alone (no sleep): a turn admitted here would
    // otherwise wait for a frozen clock.
    let now = p.clock().now_ns();
    let d = p
        .reserve_turn_at(&1, 1, None, 5_000 * MS, now)
        .map(|(_, slot)| slot)
        .unwrap_err();
    assert_eq!(d.reason(), DenyReason::Held);
    assert!(!d.is_permanent());
    // Kept at 10 s, the two tokens are back at 10.2 s; one of them at 10.1 s.
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    assert_eq!(a.refund(), Refunded::Restored);
    assert_eq!(b.refund(), Refunded::Restored);
    let turn = p.acquire_blocking(&1, Duration::from_secs(5)).unwrap();
    assert_eq!(turn.tokens(), 1);
}

/// A denial beside a live hold says so, with the wait if the hold is kept;
/// the wait does not move with the clock while the hold stays.
#[test]
fn a_denial_beside_a_hold_names_the_hold() {
    let (p, clock) = limiter::<u64>(1);
    let hold = p.hold(&1).unwrap();
    let d = p.reserve(&1).unwrap_err();
    assert_eq!(d.reason(), DenyReason::Held);
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    assert!(d.to_string().contains("held"), "{d}");
    // 100 ms later the hold is still out: still `Held`, and the same wait:
    // kept at 10.1 s, the token would be back at 10.2 s.
    clock.advance(Duration::from_millis(100));
    let d = p.reserve(&1).unwrap_err();
    assert_eq!(d.reason(), DenyReason::Held);
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    // Kept from its reading (10 s), the token is back at 10.1 s: now.
    assert!(hold.keep());
    assert!(p.reserve(&1).is_ok());
    // Without holds, a denial is `Exhausted` with the exact wait.
    let d = p.reserve(&1).unwrap_err();
    assert_eq!(d.reason(), DenyReason::Exhausted);
    assert_eq!(d.retry_after(), Duration::from_millis(100));
}

/// One token of the longest interval the rate accepts: its second reserve
/// waits that interval, at any clock within the time space.
#[test]
fn the_longest_interval_answers_its_wait() {
    let longest = Duration::from_nanos((1 << 60) - 1);
    let rate = Rate::new(1, longest).unwrap();
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1));
    let p: P<u64> = Pace::builder(rate)
        .capacity(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(p.reserve(&1).is_ok());
    let d = p.reserve(&1).unwrap_err();
    assert_eq!(d.reason(), DenyReason::Exhausted);
    assert_eq!(d.retry_after(), longest);
    // A per-call quota of that interval, beside a default of 10/s.
    let (q, _) = limiter::<u64>(1);
    let long = Quota::new(rate, 1).unwrap();
    assert!(q.reserve_with(&1, long).is_ok());
    let d = q.reserve_with(&1, long).unwrap_err();
    assert_eq!(d.reason(), DenyReason::Exhausted);
    assert_eq!(d.retry_after(), longest);
}

#[test]
fn a_zero_hold_limit_is_a_config_error() {
    let built: Result<Pace<u64>, _> = Pace::builder(Rate::per_second(10).unwrap())
        .hold_limit(Duration::ZERO)
        .build();
    assert_eq!(built.err(), Some(ConfigError::ZeroHoldLimit));
    assert!(Pace::<u64>::builder(Rate::per_second(10).unwrap())
        .hold_limit(Duration::from_nanos(1))
        .build()
        .is_ok());
}

/// A key whose `Hash` and `Eq` panic while `ARMED` is set (for keys `>= 100`).
#[derive(Clone, Debug)]
struct Touchy(u64, Arc<AtomicBool>);

impl Hash for Touchy {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if self.0 >= 100 && self.1.load(Ordering::SeqCst) {
            panic!("Hash of key {} panics", self.0);
        }
        self.0.hash(h);
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Touchy) -> bool {
        if self.0 >= 100 && self.1.load(Ordering::SeqCst) {
            panic!("Eq of key {} panics", self.0);
        }
        self.0 == other.0
    }
}

impl Eq for Touchy {}

/// A pending turn dropped while its thread unwinds, whose key's `Eq` panics
/// then, neither aborts the process nor loses count: the turn's debit stays
/// (as a panicking key leaves it) and nothing else moves.
#[cfg(feature = "timer")]
#[test]
fn a_turn_dropped_while_unwinding_with_a_panicking_key_does_not_abort() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let armed = Arc::new(AtomicBool::new(false));
    let (p, _clock) = limiter::<Touchy>(1);
    let key = Touchy(100, armed.clone());
    let _first = p.reserve(&key).unwrap();
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let mut turn = Box::pin(p.acquire(&key, Duration::from_secs(5)));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(turn.as_mut().poll(&mut cx), Poll::Pending));
        armed.store(true, Ordering::SeqCst);
        panic!("the handler panics while its turn is pending");
    }));
    assert!(unwound.is_err());
    armed.store(false, Ordering::SeqCst);
    // The pending turn's refund met a panicking key: its debit stays (the
    // bucket ends at 10.2 s, not at the first reserve's 10.1 s).
    let d = p.reserve(&key).unwrap_err();
    assert_eq!(d.retry_after(), Duration::from_millis(200));
    assert_eq!(p.len(), 1);
}

/// A hold dropped while its thread unwinds is kept (counts exact), and a
/// panicking key then does not abort.
#[test]
fn a_hold_dropped_while_unwinding_is_kept() {
    let armed = Arc::new(AtomicBool::new(false));
    let (p, clock) = limiter::<Touchy>(2);
    let calm = Touchy(1, armed.clone());
    let touchy = Touchy(100, armed.clone());
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let _a = p.hold(&calm).unwrap();
        let _b = p.hold(&touchy).unwrap();
        armed.store(true, Ordering::SeqCst);
        panic!("the handler panics while both are held");
    }));
    assert!(unwound.is_err());
    armed.store(false, Ordering::SeqCst);
    // The calm key's hold was kept: settled, nothing held, a token spent.
    assert!(p.reserve(&calm).is_ok());
    let d = p.reserve(&calm).unwrap_err();
    assert_eq!(d.reason(), DenyReason::Exhausted, "the hold is still held");
    // The touchy key's keep met its panic: the hold stays held, then
    // expires as kept; the token is not returned either way.
    assert_eq!(p.peek(&touchy), 1);
    clock.advance(Duration::from_secs(25));
    assert_eq!(p.peek(&touchy), 2);
}

/// A `pace::all` reservation dropped while its thread unwinds keeps every
/// pair, and a panicking key among them does not abort.
#[test]
fn an_all_reservation_dropped_while_unwinding_keeps_every_pair() {
    let armed = Arc::new(AtomicBool::new(false));
    let (per_source, _c1) = limiter::<u64>(2);
    let (per_client, _c2) = limiter::<Touchy>(2);
    let client = Touchy(100, armed.clone());
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let _all = pace::all()
            .with(&per_source, &7)
            .with(&per_client, &client)
            .reserve()
            .unwrap();
        armed.store(true, Ordering::SeqCst);
        panic!("the handler panics with both pairs held");
    }));
    assert!(unwound.is_err());
    armed.store(false, Ordering::SeqCst);
    assert_eq!(per_source.peek(&7), 1, "the first pair is kept");
    assert_eq!(per_client.peek(&client), 1, "the second is held, then kept");
}

/// When a later pair's `Hash` panics inside `pace::all`, the pairs held
/// before it are refunded on the way out, not left held until they expire.
#[test]
fn a_panicking_later_pair_releases_the_earlier_ones() {
    let armed = Arc::new(AtomicBool::new(true));
    let (per_source, _c1) = limiter::<u64>(2);
    let (per_client, _c2) = limiter::<Touchy>(2);
    let client = Touchy(100, armed.clone());
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        pace::all()
            .with(&per_source, &7)
            .with(&per_client, &client)
            .reserve()
    }));
    assert!(unwound.is_err(), "the key's panic reaches the caller");
    assert_eq!(per_source.peek(&7), 2, "the earlier pair is whole again");
    assert_eq!(per_source.len(), 0);
    armed.store(false, Ordering::SeqCst);
    assert_eq!(per_client.peek(&client), 2);
}
