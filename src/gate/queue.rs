//! The waiting side: a first-come-first-served queue of callers under a
//! mutex and condition variable ([`Gate::admit`]), and the [`Cancel`]
//! token that calls a wait off.

use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use super::state::{wakeup_fence, Inner};
use super::{AdmitError, Gate, Resource, Ticket};
use crate::sync::{AtomicBool, Mutex, MutexGuard, Ordering};

/// Calls off [`Gate::admit_cancellable`] waits from another thread (a
/// client that disconnected, a shutdown): [`Cancel::cancel`]. Clones share
/// the token; one token can serve waits on several gates.
///
/// ```
/// use std::time::{Duration, Instant};
/// use pace::gate::{AdmitError, Cancel, Gate, Resource};
///
/// let gate = Gate::builder().slots(1).bytes(100).build()?;
/// let held = gate.try_admit(Some(1))?; // the only slot
/// let cancel = Cancel::new();
/// let waiter = {
///     let (gate, cancel) = (gate.clone(), cancel.clone());
///     let deadline = Instant::now() + Duration::from_secs(3600);
///     std::thread::spawn(move || gate.admit_cancellable(Some(1), deadline, &cancel).map(drop))
/// };
/// cancel.cancel(); // e.g. the client went away
/// assert_eq!(
///     waiter.join().unwrap(),
///     Err(AdmitError::Cancelled { resource: Resource::Slots })
/// );
/// assert!(cancel.is_cancelled());
/// drop(held);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Cancel {
    shared: Arc<CancelShared>,
}

struct CancelShared {
    flag: AtomicBool,
    /// The gates a wait with this token is queued on now, one entry per
    /// waiter, so that `cancel` can wake them.
    waiting_on: Mutex<Vec<Arc<Inner>>>,
}

impl Default for Cancel {
    fn default() -> Cancel {
        Cancel::new()
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl Cancel {
    /// A token not yet cancelled.
    pub fn new() -> Cancel {
        Cancel {
            shared: Arc::new(CancelShared {
                flag: AtomicBool::new(false),
                waiting_on: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Cancel: every [`Gate::admit_cancellable`] waiting with this token (or
    /// a clone) returns [`AdmitError::Cancelled`] (or is admitted, if it
    /// already was), and later ones return it instead of waiting.
    pub fn cancel(&self) {
        self.shared.flag.store(true, Ordering::SeqCst);
        // A waiter registers itself before it first reads the flag, so it
        // either is in this list or sees the flag. The list is copied so that
        // no gate lock is taken under the token's lock.
        let gates = self.lock().clone();
        for gate in &gates {
            wake_cancelled(gate);
        }
    }

    /// Whether [`Cancel::cancel`] was called on this token (or a clone).
    pub fn is_cancelled(&self) -> bool {
        self.shared.flag.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Inner>>> {
        self.shared
            .waiting_on
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `gate` on the list `cancel` wakes, until the guard is dropped.
    fn register<'a>(&'a self, gate: &Arc<Inner>) -> Registered<'a> {
        self.lock().push(Arc::clone(gate));
        Registered {
            cancel: self,
            gate: Arc::as_ptr(gate),
        }
    }
}

/// A wait's entry in its token's list; dropping it takes the entry out.
struct Registered<'a> {
    cancel: &'a Cancel,
    gate: *const Inner,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut list = self.cancel.lock();
        if let Some(i) = list.iter().position(|g| Arc::as_ptr(g) == self.gate) {
            list.swap_remove(i);
        }
    }
}

/// Wakes the waiters of `gate` after their token's flag was set. Under the
/// gate's lock, so that a waiter either sees the flag before it sleeps or is
/// asleep and gets the notification.
#[cfg(not(pace_mutant = "gate_cancel_no_notify"))]
fn wake_cancelled(gate: &Inner) {
    drop(gate.lock());
    gate.cv.notify_all();
}

/// Known-wrong variant for the loom model: sets the flag but wakes nobody,
/// so a waiter sleeps on until its deadline.
#[cfg(pace_mutant = "gate_cancel_no_notify")]
fn wake_cancelled(_gate: &Inner) {}

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
    /// [`Cancel::cancel`]: the caller leaves the queue holding nothing and
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
        // Before the first look at the flag (below, under the gate's lock);
        // dropped after that lock is released.
        let _registered = cancel.map(|c| c.register(&self.inner));
        let mut w = inner.lock();
        let id = w.next_id;
        w.next_id = w.next_id.wrapping_add(1);
        w.queue.push_back(id);
        inner.queued.fetch_add(1, Ordering::SeqCst);
        // The waiter's side of the Dekker pair in `wake_if_queued`: any
        // release that does not see us in `queued` is seen by the check below.
        wakeup_fence();
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
            let cancelled = cancel.is_some_and(Cancel::is_cancelled);
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
