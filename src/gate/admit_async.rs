//! The waiting side as a future: [`Gate::admit_async`].
//!
//! The future waits in the same first-come-first-served queue as the
//! blocking waiters of [`Gate::admit`]: only the first in line tries to
//! reserve, whichever way it waits. It needs only `std::task::Waker`: no
//! runtime, no timer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use super::state::wakeup_fence;
use super::{AdmitError, Gate, Resource, Ticket};
use crate::sync::Ordering;

/// The future of [`Gate::admit_async`].
///
/// Dropping it before it completes is the cancellation: it leaves the queue
/// holding nothing, and if it was first in line the next waiter is woken.
#[must_use = "futures do nothing unless polled"]
pub struct Admit {
    gate: Gate,
    declared: Option<u64>,
    deadline: Option<Instant>,
    /// Our place in the queue, once queued.
    id: Option<u64>,
    done: bool,
}

impl fmt::Debug for Admit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit")
            .field("declared", &self.declared)
            .field("deadline", &self.deadline)
            .field("queued", &self.id.is_some())
            .finish()
    }
}

impl Gate {
    /// [`Gate::admit`] as a future: one slot and a byte share, waiting first
    /// come first served (together with the blocking waiters) until there
    /// is room.
    ///
    /// The future has no timer: it answers [`AdmitError::TimedOut`] when it
    /// is polled at or after `deadline` (`None`: no deadline) while still
    /// short. To be woken at the deadline, wrap it in the runtime's timeout
    /// (`tokio::time::timeout_at`); the timeout drops the future, which
    /// leaves the queue holding nothing (see [`Admit`]).
    ///
    /// # Errors
    /// The future resolves to [`AdmitError::TooLarge`] when `declared` is
    /// over the body cap, [`AdmitError::TimedOut`] as above.
    #[doc(alias = "acquire", alias = "acquire_owned")]
    pub fn admit_async(&self, declared: Option<u64>, deadline: Option<Instant>) -> Admit {
        Admit {
            gate: self.clone(),
            declared,
            deadline,
            id: None,
            done: false,
        }
    }
}

impl Future for Admit {
    type Output = Result<Ticket, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        assert!(!this.done, "Admit polled after completion");
        let inner = &*this.gate.inner;
        let want = match inner.want(this.declared) {
            Ok(w) => w,
            Err(e) => {
                this.done = true;
                return Poll::Ready(Err(e));
            }
        };
        let mut w = match this.id {
            Some(_) => inner.lock(),
            None => {
                if inner.queued.load(Ordering::SeqCst) == 0 && inner.reserve_unlocked(want).is_ok()
                {
                    this.done = true;
                    return Poll::Ready(Ok(this.gate.ticket(want)));
                }
                let mut w = inner.lock();
                let id = w.next_id;
                w.next_id = w.next_id.wrapping_add(1);
                w.queue.push_back(id);
                inner.queued.fetch_add(1, Ordering::SeqCst);
                // The waiter's side of the Dekker pair in `wake_if_queued`.
                wakeup_fence();
                this.id = Some(id);
                w
            }
        };
        let id = this.id.expect("queued above");
        let short = if w.queue.front() == Some(&id) {
            match inner.reserve(want) {
                Ok(()) => {
                    w.queue.pop_front();
                    w.wakers.retain(|(x, _)| *x != id);
                    inner.queued.fetch_sub(1, Ordering::SeqCst);
                    let more = !w.queue.is_empty();
                    drop(w);
                    this.id = None;
                    this.done = true;
                    if more {
                        inner.notify_queue();
                    }
                    return Poll::Ready(Ok(this.gate.ticket(want)));
                }
                Err(resource) => {
                    inner.head_short.store(resource.code(), Ordering::Relaxed);
                    resource
                }
            }
        } else {
            Resource::from_code(inner.head_short.load(Ordering::Relaxed))
        };
        if this.deadline.is_some_and(|d| Instant::now() >= d) {
            let more = leave(&mut w, id);
            inner.queued.fetch_sub(1, Ordering::SeqCst);
            drop(w);
            this.id = None;
            this.done = true;
            if more {
                inner.notify_queue();
            }
            inner.count_saturation(short);
            inner.counters.timed_out.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Err(AdmitError::TimedOut { resource: short }));
        }
        // Register (or refresh) our waker while still holding the lock: a
        // release either happened before we took it (and `reserve` above saw
        // it) or notifies after we registered.
        match w.wakers.iter_mut().find(|(x, _)| *x == id) {
            Some((_, old)) => {
                if !old.will_wake(cx.waker()) {
                    old.clone_from(cx.waker());
                }
            }
            None => w.wakers.push((id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

/// Removes `id` from the queue and its waker; true when it was first in line
/// and others wait (they must be notified once the lock is dropped).
fn leave(w: &mut super::waiters::Waiters, id: u64) -> bool {
    let was_head = w.queue.front() == Some(&id);
    w.queue.retain(|&x| x != id);
    w.wakers.retain(|(x, _)| *x != id);
    was_head && !w.queue.is_empty()
}

/// A dropped `Admit` leaves the queue: [`leave`], whose answer says whether
/// the next in line must be woken (it was first and others wait).
#[cfg(not(pace_mutant = "gate_async_drop_keeps_turn"))]
fn leave_on_drop(w: &mut super::waiters::Waiters, id: u64) -> bool {
    leave(w, id)
}

/// Known-wrong variant `gate_async_drop_keeps_turn`: a dropped first waiter
/// wakes nobody, so the next in line sleeps on.
#[cfg(pace_mutant = "gate_async_drop_keeps_turn")]
fn leave_on_drop(w: &mut super::waiters::Waiters, id: u64) -> bool {
    leave(w, id);
    false
}

impl Drop for Admit {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let inner = &*self.gate.inner;
        let mut w = inner.lock();
        let more = leave_on_drop(&mut w, id);
        inner.queued.fetch_sub(1, Ordering::SeqCst);
        drop(w);
        if more {
            inner.notify_queue();
        }
        inner.counters.cancelled.fetch_add(1, Ordering::Relaxed);
    }
}
