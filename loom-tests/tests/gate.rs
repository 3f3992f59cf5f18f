//! loom models of `pace::Gate`: held slots never exceed N and held bytes
//! never exceed B under any interleaving (within the preemption bound), a
//! refused admission leaves nothing behind, and a waiter is never left
//! asleep while what it waits for is free (a lost wake-up is a loom
//! deadlock).
//!
//! Run: RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom \
//!      LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release --test gate
//!
//! Mutants: built with `--cfg pace_mutant="gate_…"`, the crate swaps in a
//! known-wrong variant and the `mutant_*` test for it asserts that a model
//! here fails: `gate_unchecked_bytes` (check the budget, then add blindly),
//! `gate_no_wake_on_rollback` (a refused admission gives its slot back
//! without waking the queue), `gate_no_fence` (no SeqCst fence between a
//! release and its look at the queue, nor between joining the queue and
//! looking at the counters), `gate_cancel_no_notify` (cancelling sets the
//! flag without waking the waiters) and `gate_shrink_keeps_excess` (a shrink
//! returns nothing to the gate: bytes stay held after every permit is gone).
//! `gate_async_drop_keeps_turn` (a dropped first-in-line `admit_async`
//! future does not wake the next waiter).
//! `gate_no_wake_on_rollback`, `gate_no_fence`, `gate_cancel_no_notify` and
//! `gate_async_drop_keeps_turn` leave a waiter asleep, which loom reports as
//! a deadlock.
#![cfg(loom)]

use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

use loom::thread;
use pace::gate::{AdmitError, Cancel, Gate, Resource};

fn gate(slots: usize, bytes: u64) -> Gate {
    Gate::builder().slots(slots).bytes(bytes).build().unwrap()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// While a thread holds a ticket, the counters it can see are within the
/// bounds and include its own share.
fn check_bounds(g: &Gate, mine: u64) {
    let s = g.stats();
    assert!(
        s.slots_held >= 1 && s.slots_held <= g.slots(),
        "slots over the bound: {s:?}"
    );
    assert!(
        s.bytes_held >= mine && s.bytes_held <= g.bytes(),
        "bytes over the bound: {s:?}"
    );
}

/// Two admissions that cannot both fit (6 + 6 > 10) race; the winner
/// shrinks its share, which may let the other in. Never over the budget,
/// never both refused, and the loser's rolled-back slot is really returned.
fn racing_admissions_stay_within_budget() {
    loom::model(|| {
        let g = gate(2, 10);
        let g2 = g.clone();
        let t = thread::spawn(move || match g2.try_admit(Some(6)) {
            Ok(mut t) => {
                check_bounds(&g2, 6);
                assert_eq!(t.shrink_to(2), Ok(4));
                check_bounds(&g2, 2);
                true
            }
            Err(e) => {
                assert_eq!(
                    e,
                    AdmitError::Saturated {
                        resource: Resource::Bytes
                    }
                );
                false
            }
        });
        let main_ok = match g.try_admit(Some(6)) {
            Ok(t) => {
                check_bounds(&g, 6);
                let (slot, bytes) = t.split();
                drop(bytes);
                drop(slot);
                true
            }
            Err(e) => {
                assert_eq!(
                    e,
                    AdmitError::Saturated {
                        resource: Resource::Bytes
                    }
                );
                false
            }
        };
        let t_ok = t.join().unwrap();
        assert!(main_ok || t_ok, "one of two must get in");
        let s = g.stats();
        assert_eq!(
            (s.slots_held, s.bytes_held),
            (0, 0),
            "held after every permit is gone: {s:?}"
        );
        assert!(s.peak_bytes <= 10 && s.peak_slots <= 2, "{s:?}");
        assert_eq!(s.saturated_bytes, u64::from(!main_ok) + u64::from(!t_ok));
    });
}

/// One slot, two admissions: exactly the slot bound.
fn one_slot_is_never_held_twice() {
    loom::model(|| {
        let g = gate(1, 10);
        let g2 = g.clone();
        let t = thread::spawn(move || {
            if let Ok(t) = g2.try_admit(Some(1)) {
                check_bounds(&g2, 1);
                drop(t);
            }
        });
        if let Ok(t) = g.try_admit(Some(1)) {
            check_bounds(&g, 1);
            drop(t);
        }
        t.join().unwrap();
        let s = g.stats();
        assert_eq!(
            (s.slots_held, s.bytes_held, s.peak_slots),
            (0, 0, 1),
            "{s:?}"
        );
    });
}

/// A waiter in `admit` must be woken when its slot frees, even when the
/// only release it could see was hidden by another caller's transient
/// slot (a `try_admit` that took the slot and then rolled back for lack of
/// bytes). Slots: 2, bytes: 10; `p` holds 8 bytes throughout, `q` a slot.
fn waiter_is_woken_after_release_and_rollback() {
    loom::model(|| {
        let g = gate(2, 10);
        // Not dropped while unwinding from a loom failure: a permit's
        // release touches loom atomics, which would then abort the process
        // instead of failing the test.
        let p = ManuallyDrop::new(g.try_admit(Some(8)).unwrap());
        let q = g.try_admit(Some(0)).unwrap();
        let g1 = g.clone();
        let waiter = thread::spawn(move || {
            let t = g1.admit(Some(0), far()).unwrap();
            check_bounds(&g1, 0);
            drop(t);
        });
        let g2 = g.clone();
        let barger = thread::spawn(move || match g2.try_admit(Some(5)) {
            Ok(_) => panic!("5 more bytes can never fit beside 8 of 10"),
            Err(AdmitError::Saturated { .. }) => {}
            Err(e) => panic!("{e:?}"),
        });
        drop(q);
        barger.join().unwrap();
        waiter.join().unwrap();
        drop(ManuallyDrop::into_inner(p));
        let s = g.stats();
        assert_eq!((s.slots_held, s.bytes_held, s.waiting), (0, 0, 0), "{s:?}");
    });
}

/// Two callers wait in `admit` for the only slot; one release must let
/// both through in turn (the first one's release, or its success, wakes
/// the next). A waiter left asleep is a loom deadlock.
fn two_waiters_are_both_served() {
    loom::model(|| {
        let g = gate(1, 10);
        let t = g.try_admit(Some(10)).unwrap();
        let spawn_waiter = |want: u64| {
            let g = g.clone();
            thread::spawn(move || {
                let t = g.admit(Some(want), far()).unwrap();
                check_bounds(&g, want);
                drop(t);
            })
        };
        let w1 = spawn_waiter(4);
        let w2 = spawn_waiter(6);
        drop(t);
        w1.join().unwrap();
        w2.join().unwrap();
        let s = g.stats();
        assert_eq!((s.slots_held, s.bytes_held, s.waiting), (0, 0, 0), "{s:?}");
        assert_eq!((s.peak_slots, s.timed_out), (1, 0), "{s:?}");
    });
}

/// A waiter that can never fit is cancelled from another thread: it must
/// wake, leave the queue and hold nothing (a missed wake-up is a deadlock).
fn cancel_wakes_the_waiter() {
    loom::model(|| {
        let g = gate(1, 10);
        let hold = ManuallyDrop::new(g.try_admit(Some(1)).unwrap());
        let cancel = Cancel::new();
        let (g1, c1) = (g.clone(), cancel.clone());
        let waiter = thread::spawn(move || g1.admit_cancellable(Some(1), far(), &c1).map(|_| ()));
        cancel.cancel();
        assert_eq!(
            waiter.join().unwrap(),
            Err(AdmitError::Cancelled {
                resource: Resource::Slots
            })
        );
        let s = g.stats();
        assert_eq!((s.slots_held, s.waiting, s.cancelled), (1, 0, 1), "{s:?}");
        drop(ManuallyDrop::into_inner(hold));
    });
}

/// An async waiter (`Gate::admit_async`) first in line gives up (is
/// dropped) after the slot it waited for was released: the async waiter
/// behind it, on another thread, must be woken and admitted (a turn kept by
/// the dropped future is a loom deadlock).
fn dropped_async_head_passes_the_turn() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Waker};
    loom::model(|| {
        let g = gate(1, 10);
        let hold = g.try_admit(Some(1)).unwrap();
        let mut a = g.admit_async(Some(1), None);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut a).poll(&mut cx).is_pending());
        let g1 = g.clone();
        let b = thread::spawn(move || {
            loom::future::block_on(g1.admit_async(Some(1), None)).map(|_| ())
        });
        drop(hold);
        drop(a);
        assert_eq!(b.join().unwrap(), Ok(()));
        let s = g.stats();
        assert_eq!((s.slots_held, s.bytes_held, s.waiting), (0, 0, 0), "{s:?}");
    });
}

macro_rules! models {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(not(pace_mutant))]
        #[test]
        fn $name() {
            super::$name();
        }
    )*};
}

mod model {
    models!(
        racing_admissions_stay_within_budget,
        one_slot_is_never_held_twice,
        waiter_is_woken_after_release_and_rollback,
        two_waiters_are_both_served,
        cancel_wakes_the_waiter,
        dropped_async_head_passes_the_turn,
    );
}

#[cfg(pace_mutant = "gate_unchecked_bytes")]
#[test]
#[should_panic(expected = "bytes over the bound")]
fn mutant_gate_unchecked_bytes_is_caught() {
    racing_admissions_stay_within_budget();
}

#[cfg(pace_mutant = "gate_no_wake_on_rollback")]
#[test]
#[should_panic(expected = "deadlock")]
fn mutant_gate_no_wake_on_rollback_is_caught() {
    waiter_is_woken_after_release_and_rollback();
}

#[cfg(pace_mutant = "gate_no_fence")]
#[test]
#[should_panic(expected = "deadlock")]
fn mutant_gate_no_fence_is_caught() {
    waiter_is_woken_after_release_and_rollback();
}

#[cfg(pace_mutant = "gate_shrink_keeps_excess")]
#[test]
#[should_panic(expected = "held after every permit is gone")]
fn mutant_gate_shrink_keeps_excess_is_caught() {
    racing_admissions_stay_within_budget();
}

#[cfg(pace_mutant = "gate_cancel_no_notify")]
#[test]
#[should_panic(expected = "deadlock")]
fn mutant_gate_cancel_no_notify_is_caught() {
    cancel_wakes_the_waiter();
}

#[cfg(pace_mutant = "gate_async_drop_keeps_turn")]
#[test]
#[should_panic(expected = "deadlock")]
fn mutant_gate_async_drop_keeps_turn_is_caught() {
    dropped_async_head_passes_the_turn();
}
