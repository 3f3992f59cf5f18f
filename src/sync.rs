//! The one switch between `std` and `loom` atomics.
//!
//! Every atomic that the table and the limiter touch comes from here, so that
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom"` turns the whole core into a
//! loom model (crossbeam-epoch switches itself on `crossbeam_loom`). The clock
//! is not loom state: models pass `now` explicitly.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering,
};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering,
};

// The gate's waiting path (`Gate::admit`) parks on these; under loom they are
// modelled too, so a lost wake-up shows up as a loom deadlock.
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

pub(crate) use crossbeam_epoch as epoch;

/// Where a limiter pins epochs: crossbeam-epoch's global collector, or under
/// loom a collector of the limiter's own (so that each model frees
/// everything it allocated) with one cached handle per loom thread.
pub(crate) struct Epochs {
    #[cfg(loom)]
    collector: crossbeam_epoch::Collector,
}

impl Epochs {
    pub(crate) fn new() -> Epochs {
        Epochs {
            #[cfg(loom)]
            collector: crossbeam_epoch::Collector::new(),
        }
    }

    #[inline]
    pub(crate) fn pin(&self) -> epoch::Guard {
        #[cfg(not(loom))]
        {
            epoch::pin()
        }
        #[cfg(loom)]
        {
            // One handle per (loom thread, collector), kept in a loom thread
            // local: registering on every call would multiply the model's
            // state space. A handle keeps its collector's global state alive,
            // so the equality check cannot be fooled by address reuse.
            loom::thread_local! {
                static HANDLES: std::cell::RefCell<Vec<crossbeam_epoch::LocalHandle>> =
                    std::cell::RefCell::new(Vec::new());
            }
            HANDLES.with(|handles| {
                let mut handles = handles.borrow_mut();
                if let Some(h) = handles.iter().find(|h| h.collector() == &self.collector) {
                    return h.pin();
                }
                let h = self.collector.register();
                let guard = h.pin();
                handles.push(h);
                guard
            })
        }
    }
}

/// Wait politely for another thread to finish a short step (a migration chunk).
///
/// Under loom this must yield so that the model can schedule the other thread.
#[inline]
pub(crate) fn snooze(backoff: &crossbeam_utils::Backoff) {
    #[cfg(loom)]
    {
        let _ = backoff;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    backoff.snooze();
}

/// Hint inside a CAS retry loop (another thread won the word).
#[inline]
pub(crate) fn cas_retry(backoff: &crossbeam_utils::Backoff) {
    #[cfg(loom)]
    {
        let _ = backoff;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    backoff.spin();
}
