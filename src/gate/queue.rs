//! The waiting side: a first-come-first-served queue of callers under a
//! mutex and condition variable ([`Gate::admit`]), and the [`Cancel`]
//! token that calls a wait off.

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use super::state::Inner;
use super::{AdmitError, Gate, Resource, Ticket};
use crate::sync::{fence, AtomicBool, MutexGuard, Ordering};

pub(super) struct Waiters {
    /// FIFO of waiting callers' ids; only the front one tries to reserve.
    pub(super) queue: VecDeque<u64>,
    pub(super) next_id: u64,
    /// Wakers of the asynchronous waiters ([`Gate::admit_async`]) in
    /// `queue`, by id. Only the first in line is ever woken: a waiter becomes
    /// first only when the one before it leaves, and every leaving first
    /// waiter notifies the queue.
    pub(super) wakers: Vec<(u64, std::task::Waker)>,
}

impl Waiters {
    /// The waker of the first in line, if it waits asynchronously.
    pub(super) fn head_waker(&self) -> Option<std::task::Waker> {
        let head = *self.queue.front()?;
        self.wakers
            .iter()
            .find(|(id, _)| *id == head)
            .map(|(_, w)| w.clone())
    }
}

/// Calls off an [`Gate::admit_cancellable`] wait from another thread (a
/// client that disconnected, a shutdown). Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Cancel {
    pub(super) flag: Arc<AtomicBool>,
}

impl Cancel {
    /// A token not yet cancelled.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Whether [`Gate::cancel`] was called with this token (or a clone).
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

impl Gate {
    /// Reserve one slot and a byte share, waiting until `deadline` if needed.
    ///
    /// Waiters are served first come, first served: only the first in line
    /// tries to reserve, and [`Gate::try_admit`] refuses while anyone waits,
    /// so a large request is never overtaken by later small ones (the price
    /// is head-of-line blocking, as in Go's `semaphore.Weighted`). A caller
    /// whose deadline passes leaves the queue holding nothing. The waiting
    /// uses a mutex and condition variable, so it blocks the thread: call it
    /// from a blocking context (e.g. `spawn_blocking`), not from an async task.
    ///
    /// # Errors
    /// [`AdmitError::TooLarge`] when `declared` is over the body cap,
    /// [`AdmitError::TimedOut`] when the deadline passed first.
    pub fn admit(&self, declared: Option<u64>, deadline: Instant) -> Result<Ticket, AdmitError> {
        self.wait_for(declared, deadline, None)
    }

    /// [`Gate::admit`] that another thread can also call off, with
    /// [`Gate::cancel`]: the caller leaves the queue holding nothing and
    /// hears [`AdmitError::Cancelled`]. A token cancelled before the call
    /// still lets an admission that fits at once through (the cancellation
    /// is of the *waiting*).
    ///
    /// # Errors
    /// As [`Gate::admit`], plus [`AdmitError::Cancelled`].
    pub fn admit_cancellable(
        &self,
        declared: Option<u64>,
        deadline: Instant,
        cancel: &Cancel,
    ) -> Result<Ticket, AdmitError> {
        self.wait_for(declared, deadline, Some(cancel))
    }

    /// Cancel `token`: every `admit_cancellable` waiting with it returns
    /// [`AdmitError::Cancelled`] (or is admitted, if it already was).
    pub fn cancel(&self, token: &Cancel) {
        token.flag.store(true, Ordering::SeqCst);
        // Under the lock, so that a waiter either sees the flag before it
        // sleeps or is asleep and gets the notification. (Known-wrong
        // variant for the loom model: no notification.)
        #[cfg(not(pace_mutant = "gate_cancel_no_notify"))]
        self.inner.notify_queue();
    }

    fn wait_for(
        &self,
        declared: Option<u64>,
        deadline: Instant,
        cancel: Option<&Cancel>,
    ) -> Result<Ticket, AdmitError> {
        let inner = &*self.inner;
        let want = inner.want(declared)?;
        if inner.queued.load(Ordering::SeqCst) == 0 && inner.reserve_unlocked(want).is_ok() {
            return Ok(self.ticket(want));
        }
        let mut w = inner.lock();
        let id = w.next_id;
        w.next_id = w.next_id.wrapping_add(1);
        w.queue.push_back(id);
        inner.queued.fetch_add(1, Ordering::SeqCst);
        // The waiter's side of the Dekker pair in `wake_if_queued`: any
        // release that does not see us in `queued` is seen by the check below.
        #[cfg(not(pace_mutant = "gate_no_fence"))]
        fence(Ordering::SeqCst);
        loop {
            let short = if w.queue.front() == Some(&id) {
                // First in line: try for real. A failed byte reservation rolls
                // back the slot without waking anyone: the only waiter that
                // reserves is this one.
                match inner.reserve(want) {
                    Ok(()) => {
                        w.queue.pop_front();
                        inner.queued.fetch_sub(1, Ordering::SeqCst);
                        let more = !w.queue.is_empty();
                        drop(w);
                        if more {
                            // The next in line may fit too.
                            inner.notify_queue();
                        }
                        return Ok(self.ticket(want));
                    }
                    Err(resource) => {
                        inner.head_short.store(resource.code(), Ordering::Relaxed);
                        resource
                    }
                }
            } else {
                Resource::from_code(inner.head_short.load(Ordering::Relaxed))
            };
            let now = Instant::now();
            let cancelled = cancel.is_some_and(|c| c.flag.load(Ordering::SeqCst));
            if cancelled || now >= deadline {
                let was_head = w.queue.front() == Some(&id);
                w.queue.retain(|&x| x != id);
                inner.queued.fetch_sub(1, Ordering::SeqCst);
                let more = !w.queue.is_empty();
                drop(w);
                if was_head && more {
                    inner.notify_queue();
                }
                inner.count_saturation(short);
                return Err(if cancelled {
                    inner.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                    AdmitError::Cancelled { resource: short }
                } else {
                    inner.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                    AdmitError::TimedOut { resource: short }
                });
            }
            w = match inner.cv.wait_timeout(w, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

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
