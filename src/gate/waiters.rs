//! The queue's data: who waits on a gate, in order ([`Gate::admit`]), and
//! the wakers of those who wait asynchronously. The gate's state keeps it
//! under its lock; the waiting side (`queue`) works on it.
//!
//! [`Gate::admit`]: super::Gate::admit

use std::collections::VecDeque;

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
