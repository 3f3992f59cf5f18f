//! [`Builder`]: the gate's configuration, checked once at `build`.

use std::collections::VecDeque;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::state::{Counters, Held, Inner};
use super::waiters::Waiters;
use super::{ConfigError, Gate, Resource};
use crate::sync::{AtomicU64, AtomicUsize, Condvar, Mutex};

/// Builds a [`Gate`]. `slots` and `bytes` are required; `body_cap` defaults
/// to `bytes`.
#[derive(Clone, Copy, Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder {
    slots: usize,
    bytes: u64,
    body_cap: Option<u64>,
}

impl Builder {
    /// Number of job slots `N` (running + queued jobs).
    pub fn slots(mut self, n: usize) -> Self {
        self.slots = n;
        self
    }

    /// Byte budget `B` shared by all admitted bodies.
    pub fn bytes(mut self, b: u64) -> Self {
        self.bytes = b;
        self
    }

    /// Hard cap on one body; reserved when the length is unknown.
    pub fn body_cap(mut self, cap: u64) -> Self {
        self.body_cap = Some(cap);
        self
    }

    /// # Errors
    /// [`ConfigError`] for zero slots, zero bytes, a zero body cap or a
    /// body cap above the budget.
    pub fn build(self) -> Result<Gate, ConfigError> {
        let body_cap = self.body_cap.unwrap_or(self.bytes);
        if self.slots == 0 {
            return Err(ConfigError::ZeroSlots);
        }
        if self.bytes == 0 {
            return Err(ConfigError::ZeroBytes);
        }
        if body_cap == 0 {
            return Err(ConfigError::ZeroBodyCap);
        }
        if body_cap > self.bytes {
            return Err(ConfigError::BodyCapOverBudget {
                body_cap,
                bytes: self.bytes,
            });
        }
        Ok(Gate {
            inner: Arc::new(Inner {
                slots_cap: self.slots,
                bytes_cap: self.bytes,
                body_cap,
                held: CachePadded::new(Held {
                    slots: AtomicUsize::new(0),
                    bytes: AtomicU64::new(0),
                }),
                queued: CachePadded::new(AtomicUsize::new(0)),
                head_short: AtomicUsize::new(Resource::Slots.code()),
                counters: CachePadded::new(Counters {
                    peak_slots: AtomicUsize::new(0),
                    peak_bytes: AtomicU64::new(0),
                    saturated_slots: AtomicU64::new(0),
                    saturated_bytes: AtomicU64::new(0),
                    timed_out: AtomicU64::new(0),
                    cancelled: AtomicU64::new(0),
                    too_large: AtomicU64::new(0),
                }),
                waiters: Mutex::new(Waiters {
                    queue: VecDeque::new(),
                    next_id: 0,
                    wakers: Vec::new(),
                }),
                cv: Condvar::new(),
            }),
        })
    }
}
