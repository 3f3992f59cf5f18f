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
