//! `Gate::admit_async`: first come first served together with the blocking
//! waiters, deadlines, cancellation by drop, and a threaded model that mixes
//! both kinds of waiters. Futures are driven by hand (std only: a Waker that
//! counts its wakes, and a park-based block_on).
//!
//! Known-wrong variant caught here: `gate_async_drop_keeps_turn` (a dropped
//! first-in-line future does not wake the next waiter), with
//! `RUSTFLAGS='--cfg pace_mutant="gate_async_drop_keeps_turn"' cargo test --test gate_async`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use pace::gate::{AdmitError, Gate, Resource};

fn gate(slots: usize, bytes: u64, cap: u64) -> Gate {
    Gate::builder()
        .slots(slots)
        .bytes(bytes)
        .body_cap(cap)
        .build()
        .unwrap()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

#[derive(Default)]
struct CountWaker(AtomicUsize);

impl Wake for CountWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<CountWaker>, Waker) {
    let c = Arc::new(CountWaker::default());
    (c.clone(), Waker::from(c))
}

fn poll<F: Future + Unpin>(f: &mut F, w: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(w))
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future + Unpin>(mut f: F) -> F::Output {
    let w = Waker::from(Arc::new(Unpark(thread::current())));
    loop {
        if let Poll::Ready(v) = poll(&mut f, &w) {
            return v;
        }
        thread::park();
    }
}

fn wait_until(mut cond: impl FnMut() -> bool) {
    while !cond() {
        thread::yield_now();
    }
}

#[test]
fn admits_at_once_when_there_is_room() {
    let g = gate(2, 100, 50);
    let (_, w) = counting();
    let mut f = g.admit_async(Some(30), None);
    let t = match poll(&mut f, &w) {
        Poll::Ready(Ok(t)) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!((g.stats().slots_held, g.stats().bytes_held), (1, 30));
    drop(t);
    let mut f = g.admit_async(Some(51), None);
    assert!(matches!(
        poll(&mut f, &w),
        Poll::Ready(Err(AdmitError::TooLarge {
            declared: 51,
            body_cap: 50
        }))
    ));
    assert_eq!(g.stats().slots_held, 0);
}

#[test]
fn waits_then_is_woken_once_room_appears() {
    let g = gate(1, 100, 100);
    let held = g.try_admit(Some(10)).unwrap();
    let (count, w) = counting();
    let mut f = g.admit_async(Some(10), None);
    assert!(poll(&mut f, &w).is_pending());
    assert_eq!(g.stats().waiting, 1);
    // try_admit does not barge past a waiter.
    assert_eq!(
        g.try_admit(Some(1)).unwrap_err(),
        AdmitError::Saturated {
            resource: Resource::Slots
        }
    );
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
    drop(held);
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        1,
        "the release woke the head"
    );
    let t = match poll(&mut f, &w) {
        Poll::Ready(Ok(t)) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!(g.stats().waiting, 0);
    drop(t);
    drop(f);
    let s = g.stats();
    assert_eq!(
        (s.slots_held, s.bytes_held, s.waiting, s.cancelled),
        (0, 0, 0, 0)
    );
}

#[test]
fn a_deadline_passed_answers_timed_out_and_leaves_nothing() {
    let g = gate(1, 100, 100);
    let held = g.try_admit(Some(10)).unwrap();
    let (_, w) = counting();
    let mut f = g.admit_async(Some(10), Some(Instant::now() + Duration::from_millis(20)));
    assert!(poll(&mut f, &w).is_pending());
    thread::sleep(Duration::from_millis(25));
    assert!(matches!(
        poll(&mut f, &w),
        Poll::Ready(Err(AdmitError::TimedOut {
            resource: Resource::Slots
        }))
    ));
    let s = g.stats();
    assert_eq!((s.waiting, s.timed_out, s.saturated_slots), (0, 1, 1));
    drop(held);
    assert_eq!(g.stats().slots_held, 0);
}

/// Async A, blocking B, async C queue in that order behind a held slot:
/// they are admitted A, B, C.
#[test]
fn first_come_first_served_across_async_and_blocking_waiters() {
    let g = gate(1, 100, 100);
    let held = g.try_admit(Some(10)).unwrap();
    let (a_count, aw) = counting();
    let mut a = g.admit_async(Some(10), None);
    assert!(poll(&mut a, &aw).is_pending());
    let gb = g.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let b = thread::spawn(move || {
        let t = gb.admit(Some(10), far()).unwrap();
        tx.send(()).unwrap();
        thread::sleep(Duration::from_millis(5));
        drop(t);
    });
    wait_until(|| g.stats().waiting == 2);
    let (c_count, cw) = counting();
    let mut c = g.admit_async(Some(10), None);
    assert!(poll(&mut c, &cw).is_pending());
    assert_eq!(g.stats().waiting, 3);

    drop(held);
    // A is first: woken; B and C are not admitted.
    assert_eq!(a_count.0.load(Ordering::SeqCst), 1);
    assert!(rx.try_recv().is_err());
    assert!(poll(&mut c, &cw).is_pending());
    let ta = match poll(&mut a, &aw) {
        Poll::Ready(Ok(t)) => t,
        other => panic!("{other:?}"),
    };
    thread::sleep(Duration::from_millis(10));
    assert!(rx.try_recv().is_err(), "B must wait for A's slot");
    drop(ta);
    rx.recv().unwrap(); // B admitted
    b.join().unwrap(); // B released: C is woken
    wait_until(|| c_count.0.load(Ordering::SeqCst) > 0);
    let tc = match poll(&mut c, &cw) {
        Poll::Ready(Ok(t)) => t,
        other => panic!("{other:?}"),
    };
    drop(tc);
    let s = g.stats();
    assert_eq!((s.slots_held, s.waiting), (0, 0));
}

/// Dropping the first-in-line future, woken but not yet polled, passes the
/// turn: the blocking waiter behind it is admitted.
#[test]
fn dropping_the_head_future_passes_the_turn() {
    let g = gate(1, 100, 100);
    let held = g.try_admit(Some(10)).unwrap();
    let (_, aw) = counting();
    let mut a = g.admit_async(Some(10), None);
    assert!(poll(&mut a, &aw).is_pending());
    let gb = g.clone();
    let b = thread::spawn(move || {
        // A deadline only a lost hand-over reaches, never load.
        let deadline = Instant::now() + Duration::from_secs(60);
        gb.admit(Some(10), deadline).map(drop)
    });
    wait_until(|| g.stats().waiting == 2);
    drop(held); // wakes A (the head); B stays asleep
    drop(a); // A gives up: B must get the slot
    assert_eq!(b.join().unwrap(), Ok(()));
    let s = g.stats();
    assert_eq!(
        (s.slots_held, s.bytes_held, s.waiting, s.cancelled),
        (0, 0, 0, 1)
    );
}

/// The same with an async waiter behind: dropping the head wakes it, at
/// once (counted by its waker, no timing involved).
#[test]
fn dropping_the_head_future_wakes_the_next_async_waiter() {
    let g = gate(1, 100, 100);
    let held = g.try_admit(Some(10)).unwrap();
    let (a_count, aw) = counting();
    let (b_count, bw) = counting();
    let mut a = g.admit_async(Some(10), None);
    let mut b = g.admit_async(Some(10), None);
    assert!(poll(&mut a, &aw).is_pending());
    assert!(poll(&mut b, &bw).is_pending());
    drop(held);
    assert_eq!(a_count.0.load(Ordering::SeqCst), 1);
    assert_eq!(
        b_count.0.load(Ordering::SeqCst),
        0,
        "only the head is woken"
    );
    drop(a);
    assert_eq!(b_count.0.load(Ordering::SeqCst), 1, "the turn passed to b");
    assert!(matches!(poll(&mut b, &bw), Poll::Ready(Ok(_))));
    let s = g.stats();
    assert_eq!((s.slots_held, s.waiting, s.cancelled), (0, 0, 1));
}

/// Dropping a future that is not first leaves the queue too.
#[test]
fn dropping_a_queued_future_leaves_nothing() {
    let g = gate(1, 100, 100);
    let held = g.try_admit(Some(10)).unwrap();
    let (_, w) = counting();
    let mut a = g.admit_async(Some(10), None);
    let mut b = g.admit_async(Some(10), None);
    assert!(poll(&mut a, &w).is_pending());
    assert!(poll(&mut b, &w).is_pending());
    drop(b);
    assert_eq!(g.stats().waiting, 1);
    drop(held);
    assert!(matches!(poll(&mut a, &w), Poll::Ready(Ok(_))));
    let s = g.stats();
    assert_eq!((s.slots_held, s.waiting), (0, 0));
}

/// Threads mix blocking and async waiters on a small gate; some futures are
/// dropped after waiting. At every admission the holdings are within the
/// caps; at the end nothing is held or queued and every attempt is
/// accounted for.
#[test]
fn threaded_mixed_waiters_never_exceed_the_caps_and_leak_nothing() {
    const THREADS: usize = 4;
    const ROUNDS: usize = if cfg!(miri) { 10 } else { 400 };
    let g = gate(2, 100, 60);
    let admitted = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (g, admitted, dropped, start) =
                (g.clone(), admitted.clone(), dropped.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for r in 0..ROUNDS {
                    let want = 10 + ((t * 7 + r * 13) % 50) as u64;
                    let ticket = match (t + r) % 3 {
                        0 => g.admit(Some(want), far()).unwrap(),
                        1 => block_on(g.admit_async(Some(want), None)).unwrap(),
                        _ => {
                            // Poll once; if it waits, give up (drop).
                            let (_, w) = counting();
                            let mut f = g.admit_async(Some(want), None);
                            match poll(&mut f, &w) {
                                Poll::Ready(t) => t.unwrap(),
                                Poll::Pending => {
                                    drop(f);
                                    dropped.fetch_add(1, Ordering::SeqCst);
                                    continue;
                                }
                            }
                        }
                    };
                    let s = g.stats();
                    assert!(s.slots_held <= 2 && s.bytes_held <= 100, "{s:?}");
                    admitted.fetch_add(1, Ordering::SeqCst);
                    thread::yield_now();
                    drop(ticket);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = g.stats();
    assert_eq!((s.slots_held, s.bytes_held, s.waiting), (0, 0, 0), "{s:?}");
    assert_eq!(
        admitted.load(Ordering::SeqCst) + dropped.load(Ordering::SeqCst),
        THREADS * ROUNDS
    );
    assert_eq!(s.cancelled as usize, dropped.load(Ordering::SeqCst));
    assert!(s.peak_slots <= 2 && s.peak_bytes <= 100);
}
