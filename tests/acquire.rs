//! Waiting for a turn (`acquire`, `acquire_blocking`): one reservation of a
//! slot up to `max_wait` ahead, let through when the limiter's clock reaches
//! it, in the order of the debits; refused at once when the turn lies
//! further; a cancelled turn refunded by the refund rule.
//!
//! The bound over the instants turns are let through is checked with the
//! quotas' random histories (tests/quotas.rs).

use std::collections::hash_map::RandomState;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pace::internals::{PaceInternals, ReservationInternals};
#[cfg(feature = "timer")]
use pace::Refunded;
use pace::{Clock, DenyReason, ManualClock, Pace, Quota, Rate};

type P = Pace<u64, RandomState, ManualClock>;

const MS: u64 = 1_000_000;

fn limiter(interval: Duration, capacity: u64) -> (P, ManualClock) {
    let clock = ManualClock::new();
    let p = Pace::builder(Rate::new(1, interval).unwrap())
        .capacity(capacity)
        .clock(clock.clone())
        .build()
        .unwrap();
    (p, clock)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_turn_beyond_max_wait_is_refused_at_once_and_writes_nothing() {
    let (p, clock) = limiter(ms(100), 2);
    clock.set(Duration::from_secs(10));
    drop(p.reserve_n(&1, 2).unwrap());
    // The next token fits in 100 ms: refused with 99 ms to wait at most.
    let d = p.acquire_blocking(&1, ms(99)).unwrap_err();
    assert_eq!(d.reason(), DenyReason::Exhausted);
    assert_eq!(d.retry_after(), ms(100), "the whole wait it would need");
    // Two tokens fit in 200 ms.
    assert_eq!(
        p.acquire_n_blocking(&1, 2, ms(150))
            .unwrap_err()
            .retry_after(),
        ms(200)
    );
    assert_eq!(p.peek(&1), 0);
    assert_eq!(p.row_tat(&1), Some(10_200 * MS), "a refusal writes nothing");
    // More than the capacity can never pass, whatever the wait.
    let never = p.acquire_n_blocking(&1, 3, Duration::MAX).unwrap_err();
    assert!(never.is_permanent());
    assert_eq!(never.reason(), DenyReason::ExceedsCapacity);
    // A turn that is due now returns at once.
    clock.advance(ms(100));
    let r = p.acquire_blocking(&1, Duration::ZERO).unwrap();
    assert_eq!(r.tokens(), 1);
}

/// Four callers queue on a drained key (slots 1, 2, 3 and 4 ms ahead, in the
/// order they came); each is let through only once the clock reaches its
/// slot, in that order.
#[test]
fn turns_are_let_through_in_order_and_never_before_their_slot() {
    let (p, clock) = limiter(ms(1), 1);
    let p = Arc::new(p);
    clock.set(Duration::from_secs(1));
    drop(p.reserve(&9).unwrap());
    let through = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for i in 0..4u64 {
        let (p2, through2) = (p.clone(), through.clone());
        threads.push(std::thread::spawn(move || {
            let r = p2.acquire_blocking(&9, ms(10)).unwrap();
            let order = through2.fetch_add(1, Ordering::SeqCst);
            drop(r);
            order
        }));
        // Wait until this caller's debit has landed: its slot is i + 1 ms.
        let want = 1_000 * MS + (i + 2) * MS;
        let start = Instant::now();
        while p.row_tat(&9) != Some(want) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "caller {i} never queued"
            );
            std::thread::yield_now();
        }
    }
    for step in 1..=4usize {
        // Nobody is let through before the clock reaches their slot.
        std::thread::sleep(ms(30));
        assert_eq!(
            through.load(Ordering::SeqCst),
            step - 1,
            "let through early"
        );
        clock.advance(ms(1));
        let start = Instant::now();
        while through.load(Ordering::SeqCst) < step {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "turn {step} never came"
            );
            std::thread::sleep(ms(1));
        }
    }
    let orders: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(orders, vec![0, 1, 2, 3], "first come, first served");
}

#[test]
fn a_turn_under_its_own_quota() {
    let (p, clock) = limiter(ms(100), 1);
    clock.set(Duration::from_secs(10));
    let q = Quota::new(Rate::new(1, ms(10)).unwrap(), 5).unwrap();
    drop(p.reserve_n_with(&1, 5, q).unwrap());
    // 50 ms of debt. Under q (horizon 50 ms) the next token fits in 10 ms;
    // under the default (100 ms a token, horizon 100 ms) in 50 ms.
    assert_eq!(
        p.acquire_n_with_blocking(&1, 1, q, ms(5))
            .unwrap_err()
            .retry_after(),
        ms(10)
    );
    assert_eq!(
        p.acquire_blocking(&1, ms(5)).unwrap_err().retry_after(),
        ms(50)
    );
}

#[cfg(feature = "timer")]
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// A turn dropped while it waits is refunded: it comes back when it is the
/// newest debit, and is lost (never returned twice) when a later turn was
/// debited after it.
#[cfg(feature = "timer")]
#[test]
fn a_cancelled_turn_follows_the_refund_rule() {
    let (p, clock) = limiter(ms(100), 3);
    clock.set(Duration::from_secs(10));
    let rt = runtime();
    rt.block_on(async {
        drop(p.reserve_n(&1, 3).unwrap());
        let tat = p.row_tat(&1);
        // Alone: dropped before its turn, it is returned whole.
        let waited = tokio::time::timeout(ms(20), p.acquire(&1, Duration::from_secs(1))).await;
        assert!(waited.is_err(), "the turn is 100 ms away on a frozen clock");
        assert_eq!(p.row_tat(&1), tat, "the cancelled turn came back");
        // Two queued: the older cancelled first is lost, the newer returns.
        let a = p.acquire(&1, Duration::from_secs(1));
        let b = p.acquire(&1, Duration::from_secs(1));
        let (mut a, mut b) = (Box::pin(a), Box::pin(b));
        assert!(tokio::time::timeout(ms(5), &mut a).await.is_err());
        assert!(tokio::time::timeout(ms(5), &mut b).await.is_err());
        assert_eq!(p.row_tat(&1), Some(10_500 * MS));
        drop(a); // others stacked on it: nothing comes back
        assert_eq!(p.row_tat(&1), Some(10_500 * MS));
        drop(b); // the newest: back to where it was before it
        assert_eq!(p.row_tat(&1), Some(10_400 * MS));
        // A turn that came is kept when the future completes.
        clock.advance(ms(500));
        let r = p.acquire(&1, Duration::ZERO).await.unwrap();
        assert_eq!(r.refund(), Refunded::Removed, "lone: back to full");
    });
}

/// A turn that waits on a real clock is let through at or after its slot,
/// by the limiter's own clock: its debit fits the bucket when it returns.
#[test]
fn a_turn_waits_on_the_limiters_own_clock() {
    let p: Pace<u64> = Pace::builder(Rate::new(1, ms(20)).unwrap())
        .capacity(1)
        .build()
        .unwrap();
    let horizon = 20 * MS;
    drop(p.reserve(&1).unwrap());
    #[cfg(feature = "timer")]
    {
        let rt = runtime();
        let r = rt.block_on(p.acquire(&1, ms(100))).unwrap();
        let now = p.clock().now_ns();
        let slot = r.debit_end_ns() - horizon;
        assert!(now >= slot, "let through {} ns before its slot", slot - now);
    }
    let r = p.acquire_blocking(&1, ms(100)).unwrap();
    let now = p.clock().now_ns();
    let slot = r.debit_end_ns() - horizon;
    assert!(now >= slot, "let through {} ns before its slot", slot - now);
}

/// A turn's sleeps are counted on the thread that slept them
/// (`internals::turn_sleeps_here`, read around each poll of a turn by the
/// turns benchmark to count each call's sleeps): a turn 1 ms ahead on a
/// frozen clock sleeps at least once on its own thread, and the thread that
/// advances the clock counts none.
#[test]
fn a_turns_sleeps_are_counted_on_its_own_thread() {
    let (p, clock) = limiter(ms(1), 1);
    clock.set(Duration::from_secs(10));
    drop(p.reserve(&1).unwrap());
    let before = pace::internals::turn_sleeps_here();
    let advancer = {
        let clock = clock.clone();
        std::thread::spawn(move || {
            std::thread::sleep(ms(20));
            clock.advance(ms(1));
            pace::internals::turn_sleeps_here()
        })
    };
    drop(p.acquire_blocking(&1, ms(10)).unwrap());
    assert!(
        pace::internals::turn_sleeps_here() > before,
        "a turn 1 ms ahead on a frozen clock sleeps"
    );
    assert_eq!(advancer.join().unwrap(), 0, "counted on another thread");
    #[cfg(feature = "timer")]
    {
        let before = pace::internals::turn_sleeps_here();
        let rt = runtime();
        let waited =
            rt.block_on(async { tokio::time::timeout(ms(5), p.acquire(&1, ms(10))).await });
        assert!(waited.is_err(), "the turn is 1 ms away on a frozen clock");
        assert!(
            pace::internals::turn_sleeps_here() > before,
            "an async turn's sleep is counted on the thread that polled it"
        );
    }
}

/// A bound on real time that only a hang reaches: a wait on a
/// `ManualClock` that slept its wait in real time would take 60 s.
const HANG: Duration = Duration::from_secs(30);

/// One token a minute, drained at 0: the next turn's slot is 60 s.
fn per_minute(clock: &ManualClock) -> P {
    let p = Pace::builder(Rate::new(1, Duration::from_secs(60)).unwrap())
        .capacity(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    drop(p.reserve(&1).unwrap());
    p
}

/// Waits (hang-only bound) until `n` turns wait on `clock`.
fn until_waiting(clock: &ManualClock, n: usize) {
    let start = Instant::now();
    while clock.waiting() != n {
        assert!(start.elapsed() < HANG, "{n} turns never waited");
        std::thread::yield_now();
    }
}

/// A blocked thread's 60 s turn on a `ManualClock` is woken by the advance
/// that reaches its slot, not by a sleep: 59 s leave it waiting, the 60th
/// second lets it through at once.
#[test]
fn a_minute_long_blocking_wait_ends_with_the_advance_that_reaches_it() {
    let clock = ManualClock::new();
    let p = Arc::new(per_minute(&clock));
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let p = p.clone();
        std::thread::spawn(move || {
            let r = p.acquire_blocking(&1, Duration::from_secs(60)).unwrap();
            tx.send((r.debit_end_ns(), p.clock().now_ns())).unwrap();
            drop(r);
        })
    };
    until_waiting(&clock, 1);
    clock.advance(Duration::from_secs(59));
    assert_eq!(clock.waiting(), 1, "59 s do not reach the slot");
    assert!(rx.try_recv().is_err(), "let through before its slot");
    clock.advance(Duration::from_secs(1));
    let (debit_end, now) = rx.recv_timeout(HANG).expect("the advance woke it");
    waiter.join().unwrap();
    assert_eq!(now, 60_000 * MS, "let through at its slot");
    assert_eq!(debit_end, 120_000 * MS, "its debit is the second minute's");
    assert_eq!(clock.waiting(), 0);
    let real = start.elapsed();
    eprintln!("a 60 s wait on a ManualClock took {real:?} of real time");
    assert!(real < HANG, "slept in real time: {real:?}");
}

/// `set` past the slot wakes a waiting thread too.
#[test]
fn a_blocking_wait_ends_with_a_set_past_its_slot() {
    let clock = ManualClock::new();
    let p = Arc::new(per_minute(&clock));
    let waiter = {
        let p = p.clone();
        std::thread::spawn(move || {
            drop(p.acquire_blocking(&1, Duration::from_secs(60)).unwrap());
            p.clock().now_ns()
        })
    };
    until_waiting(&clock, 1);
    clock.set(Duration::from_secs(90));
    assert_eq!(waiter.join().unwrap(), 90_000 * MS);
}

/// An async turn on a `ManualClock` waits for the clock, not the timer: the
/// advance from another thread wakes the task.
#[cfg(feature = "timer")]
#[test]
fn a_minute_long_async_wait_ends_with_the_advance_that_reaches_it() {
    let clock = ManualClock::new();
    let p = per_minute(&clock);
    let start = Instant::now();
    let advancer = {
        let clock = clock.clone();
        std::thread::spawn(move || {
            until_waiting(&clock, 1);
            clock.advance(Duration::from_secs(30));
            // Still waiting: 30 s do not reach the slot.
            let still = clock.waiting();
            clock.advance(Duration::from_secs(30));
            still
        })
    };
    let r = runtime()
        .block_on(p.acquire(&1, Duration::from_secs(60)))
        .unwrap();
    assert_eq!(p.clock().now_ns(), 60_000 * MS);
    assert_eq!(r.debit_end_ns(), 120_000 * MS);
    assert_eq!(advancer.join().unwrap(), 1);
    assert_eq!(clock.waiting(), 0);
    assert!(start.elapsed() < HANG, "slept in real time");
}

/// An auto-advancing clock jumps to the slot a lone turn waits for: a
/// minute-long `acquire_blocking` in a plain test returns at once, the
/// clock reading the slot, and so does each turn after it.
#[test]
fn an_auto_advancing_clock_lets_a_blocking_turn_through_at_its_slot() {
    let clock = ManualClock::auto_advancing();
    assert!(clock.is_auto_advancing());
    let p = per_minute(&clock);
    let start = Instant::now();
    for minute in 1..=3u64 {
        let r = p.acquire_blocking(&1, Duration::from_secs(60)).unwrap();
        assert_eq!(clock.now(), Duration::from_secs(60 * minute));
        assert_eq!(r.debit_end_ns(), (minute + 1) * 60_000 * MS);
    }
    // A turn due now does not move the clock.
    clock.advance(Duration::from_secs(60));
    drop(p.acquire_blocking(&1, Duration::ZERO).unwrap());
    assert_eq!(clock.now(), Duration::from_secs(240));
    assert_eq!(clock.waiting(), 0);
    assert!(start.elapsed() < HANG, "slept in real time");
}

/// The same with `acquire` on a current-thread runtime.
#[cfg(feature = "timer")]
#[test]
fn an_auto_advancing_clock_lets_an_async_turn_through_at_its_slot() {
    let clock = ManualClock::auto_advancing();
    let p = per_minute(&clock);
    let start = Instant::now();
    runtime().block_on(async {
        for minute in 1..=3u64 {
            let r = p.acquire(&1, Duration::from_secs(60)).await.unwrap();
            assert_eq!(clock.now(), Duration::from_secs(60 * minute));
            assert_eq!(r.debit_end_ns(), (minute + 1) * 60_000 * MS);
        }
    });
    assert!(start.elapsed() < HANG, "slept in real time");
}

/// Turns of several threads on an auto-advancing clock: every one is let
/// through, none before its slot, and the clock stops at the last slot
/// (it jumps only to slots waited for).
#[test]
fn an_auto_advancing_clock_lets_queued_threads_through_at_their_slots() {
    let clock = ManualClock::auto_advancing();
    let p = Arc::new(per_minute(&clock));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let r = p.acquire_blocking(&1, Duration::from_secs(600)).unwrap();
                let slot = r.debit_end_ns() - 60_000 * MS;
                (slot, p.clock().now_ns())
            })
        })
        .collect();
    let mut slots: Vec<u64> = threads
        .into_iter()
        .map(|t| {
            let (slot, now) = t.join().unwrap();
            assert!(now >= slot, "let through {} ns early", slot - now);
            slot
        })
        .collect();
    slots.sort_unstable();
    let minute = 60_000 * MS;
    assert_eq!(slots, vec![minute, 2 * minute, 3 * minute, 4 * minute]);
    assert_eq!(clock.now_ns(), 4 * minute, "no jump past the last slot");
    assert_eq!(clock.waiting(), 0);
}

/// A wait cancelled on a frozen clock leaves its list; turning auto-advance
/// on while a thread waits lets it through.
#[cfg(feature = "timer")]
#[test]
fn cancelled_waits_leave_the_clock_and_auto_advance_releases_waiters() {
    let clock = ManualClock::new();
    let p = Arc::new(per_minute(&clock));
    let waited = runtime().block_on(async {
        tokio::time::timeout(ms(5), p.acquire(&1, Duration::from_secs(60))).await
    });
    assert!(waited.is_err(), "a frozen clock never reaches the slot");
    assert_eq!(clock.waiting(), 0, "the cancelled wait left the list");
    let waiter = {
        let p = p.clone();
        std::thread::spawn(move || {
            drop(p.acquire_blocking(&1, Duration::from_secs(60)).unwrap());
            p.clock().now_ns()
        })
    };
    until_waiting(&clock, 1);
    clock.set_auto_advance(true);
    assert_eq!(waiter.join().unwrap(), 60_000 * MS);
}
