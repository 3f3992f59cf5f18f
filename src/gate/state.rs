//! The gate's shared state and its lock-free side: the two bounded
//! counters, reserved by CAS loops that check their bounds
//! ([`Gate::try_admit`]), and released by permits.

use std::sync::PoisonError;

use crossbeam_utils::{Backoff, CachePadded};

use super::waiters::Waiters;
use super::{AdmitError, Gate, Resource, Ticket};
use crate::sync::{cas_retry, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

pub(super) struct Held {
    pub(super) slots: AtomicUsize,
    pub(super) bytes: AtomicU64,
}

pub(super) struct Counters {
    pub(super) peak_slots: AtomicUsize,
    pub(super) peak_bytes: AtomicU64,
    pub(super) saturated_slots: AtomicU64,
    pub(super) saturated_bytes: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) too_large: AtomicU64,
}

pub(super) struct Inner {
    pub(super) slots_cap: usize,
    pub(super) bytes_cap: u64,
    pub(super) body_cap: u64,
    /// The two bounded counters, on one line: every admission touches both.
    pub(super) held: CachePadded<Held>,
    /// Number of callers in `admit`'s queue. Read by every `try_admit`
    /// (which refuses while anyone waits: no barging) and every release
    /// (which wakes the queue only when it is not empty).
    pub(super) queued: CachePadded<AtomicUsize>,
    /// What the first waiter lacked last time it tried ([`Resource::code`]).
    pub(super) head_short: AtomicUsize,
    pub(super) counters: CachePadded<Counters>,
    pub(super) waiters: Mutex<Waiters>,
    pub(super) cv: Condvar,
}

impl Gate {
    /// Reserve one slot and a byte share now, or refuse now. Lock-free.
    ///
    /// `declared` is the body's declared length; `None` reserves the body
    /// cap. Refuses while callers wait in [`Gate::admit`], so that a stream
    /// of small requests cannot starve a large one.
    ///
    /// # Errors
    /// [`AdmitError::TooLarge`] when `declared` is over the body cap,
    /// [`AdmitError::Saturated`] when a resource is short.
    #[doc(alias = "try_acquire")]
    pub fn try_admit(&self, declared: Option<u64>) -> Result<Ticket, AdmitError> {
        let inner = &*self.inner;
        let want = inner.want(declared)?;
        if inner.queued.load(Ordering::SeqCst) != 0 {
            let resource = Resource::from_code(inner.head_short.load(Ordering::Relaxed));
            inner.count_saturation(resource);
            return Err(AdmitError::Saturated { resource });
        }
        match inner.reserve_unlocked(want) {
            Ok(()) => Ok(self.ticket(want)),
            Err(resource) => {
                inner.count_saturation(resource);
                Err(AdmitError::Saturated { resource })
            }
        }
    }
}

impl Inner {
    pub(super) fn want(&self, declared: Option<u64>) -> Result<u64, AdmitError> {
        match declared {
            None => Ok(self.body_cap),
            Some(n) if n <= self.body_cap => Ok(n),
            Some(n) => {
                self.counters.too_large.fetch_add(1, Ordering::Relaxed);
                Err(AdmitError::TooLarge {
                    declared: n,
                    body_cap: self.body_cap,
                })
            }
        }
    }

    pub(super) fn count_saturation(&self, resource: Resource) {
        let c = match resource {
            Resource::Slots => &self.counters.saturated_slots,
            Resource::Bytes => &self.counters.saturated_bytes,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Take one slot, then `bytes`; each step is a CAS that checks its bound,
    /// so neither counter can pass its cap. On a byte shortage the slot is
    /// given back and `Err(Bytes)` returned; the caller must then wake the
    /// queue if it does not hold the queue lock (see `reserve_unlocked`).
    pub(super) fn reserve(&self, bytes: u64) -> Result<(), Resource> {
        let backoff = Backoff::new();
        let held = &*self.held;
        let mut s = held.slots.load(Ordering::SeqCst);
        loop {
            if s >= self.slots_cap {
                return Err(Resource::Slots);
            }
            match held
                .slots
                .compare_exchange_weak(s, s + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(now) => {
                    s = now;
                    cas_retry(&backoff);
                }
            }
        }
        match self.take_bytes(bytes, &backoff) {
            Some(total) => {
                self.note_peak(s + 1, total);
                Ok(())
            }
            None => {
                held.slots.fetch_sub(1, Ordering::SeqCst);
                Err(Resource::Bytes)
            }
        }
    }

    /// Add `bytes` to the held bytes if they fit under the budget, by a CAS
    /// that checks the bound against the value it replaces. Returns the new
    /// total, or `None` (nothing taken) when they do not fit.
    #[cfg(not(pace_mutant = "gate_unchecked_bytes"))]
    fn take_bytes(&self, bytes: u64, backoff: &Backoff) -> Option<u64> {
        let held = &self.held.bytes;
        let mut b = held.load(Ordering::SeqCst);
        loop {
            if bytes > self.bytes_cap.saturating_sub(b) {
                return None;
            }
            match held.compare_exchange_weak(b, b + bytes, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(b + bytes),
                Err(now) => {
                    b = now;
                    cas_retry(backoff);
                }
            }
        }
    }

    /// Known-wrong variant for the loom model: checks the budget against a
    /// reading that may be stale by the time it adds, blindly.
    #[cfg(pace_mutant = "gate_unchecked_bytes")]
    fn take_bytes(&self, bytes: u64, _backoff: &Backoff) -> Option<u64> {
        let held = &self.held.bytes;
        let b = held.load(Ordering::SeqCst);
        if bytes > self.bytes_cap.saturating_sub(b) {
            return None;
        }
        Some(held.fetch_add(bytes, Ordering::SeqCst) + bytes)
    }

    /// `reserve` from a caller that does not hold the queue lock. Its rolled
    /// back slot may have been what the first waiter found missing, so the
    /// queue is woken as after any release.
    pub(super) fn reserve_unlocked(&self, bytes: u64) -> Result<(), Resource> {
        let r = self.reserve(bytes);
        if r == Err(Resource::Bytes) {
            self.wake_after_rollback();
        }
        r
    }

    /// After `reserve` gave back its slot for lack of bytes.
    #[cfg(not(pace_mutant = "gate_no_wake_on_rollback"))]
    fn wake_after_rollback(&self) {
        self.wake_if_queued();
    }

    /// Known-wrong variant for the loom model: the rolled-back slot may be
    /// the release a waiter missed, and nobody wakes it.
    #[cfg(pace_mutant = "gate_no_wake_on_rollback")]
    fn wake_after_rollback(&self) {}

    fn note_peak(&self, slots: usize, bytes: u64) {
        let c = &*self.counters;
        if slots > c.peak_slots.load(Ordering::Relaxed) {
            c.peak_slots.fetch_max(slots, Ordering::Relaxed);
        }
        if bytes > c.peak_bytes.load(Ordering::Relaxed) {
            c.peak_bytes.fetch_max(bytes, Ordering::Relaxed);
        }
    }

    /// Give back `slots` and `bytes`, then wake the queue if anyone waits.
    pub(super) fn release(&self, slots: usize, bytes: u64) {
        if slots != 0 {
            self.held.slots.fetch_sub(slots, Ordering::SeqCst);
        }
        if bytes != 0 {
            self.held.bytes.fetch_sub(bytes, Ordering::SeqCst);
        }
        if slots != 0 || bytes != 0 {
            self.wake_if_queued();
        }
    }

    /// After a counter went down: if anyone waits, wake them.
    ///
    /// This is one side of a store-load (Dekker) pair: here "decrement a
    /// counter, then read `queued`"; in `admit`, "increment `queued`, then
    /// read the counters". The SeqCst fence on each side means at least one
    /// of them sees the other's write: either we see the waiter and wake it,
    /// or its check sees our decrement. (Fences rather than SeqCst accesses:
    /// loom models SeqCst fences exactly, SeqCst accesses only as AcqRel.)
    /// Taking the lock orders our notify after the waiter went to sleep.
    fn wake_if_queued(&self) {
        wakeup_fence();
        if self.queued.load(Ordering::Relaxed) != 0 {
            self.notify_queue();
        }
    }
}

/// The SeqCst fence on each side of the store-load pair between a release
/// (`wake_if_queued`) and a waiter joining the queue (`Gate::admit`).
#[cfg(not(pace_mutant = "gate_no_fence"))]
pub(super) fn wakeup_fence() {
    crate::sync::fence(Ordering::SeqCst);
}

/// Known-wrong variant for the loom model: no fence on either side, so a
/// release and a new waiter can each miss the other's write.
#[cfg(pace_mutant = "gate_no_fence")]
pub(super) fn wakeup_fence() {}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the queue: every blocking waiter (they re-check their place)
    /// and the first in line if it waits asynchronously. Taking the lock
    /// orders the notification after a waiter that checked and went to
    /// sleep (or registered its waker).
    pub(super) fn notify_queue(&self) {
        let waker = self.lock().head_waker();
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}
