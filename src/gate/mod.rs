//! Admission gate: job slots plus a byte budget, held until the resources
//! are really free.
//!
//! "4 running + 8 queued = 12 jobs" bounds a count, not memory. A [`Gate`]
//! has `N` job slots, a budget of `B` bytes and a hard cap on one body's
//! size. Admission reserves ONE slot and a byte share (the declared length,
//! or the cap when the length is unknown) together, *before* the body is
//! read. If either is short, whatever was taken is given back and the caller
//! hears [`AdmitError::Saturated`] with the [`Resource`] that ran out.
//!
//! The [`Ticket`] splits into a [`SlotPermit`] (released at the end of the
//! job) and a [`BytePermit`] (released after the last use of the buffer; it
//! can shrink to the real size first). Both are RAII and release exactly
//! once. A caller that times out releases nothing: the permits belong to
//! whoever holds the resource they stand for.
//!
//! * [`Gate::try_admit`] answers at once and is lock-free (two CAS loops).
//! * [`Gate::admit`] waits, first come first served, until the caller's
//!   deadline ([`Gate::admit_cancellable`]: or until another thread calls
//!   it off); a waiter that gives up leaves no permit behind.
//! * With the `bytes` feature, `Body::into_bytes` attaches the byte share
//!   to a `bytes::Bytes` owner; with `journal`, `gate::journal` records what
//!   each job already did, for recovery after a crash.
//!
//! Held slots never exceed `N` and held bytes never exceed `B`, at any
//! instant: both are changed only by a CAS that checks the bound, or by a
//! release of what a permit took. DESIGN.md, section 10, gives the argument.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read};
use std::ops::Deref;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use crossbeam_utils::{Backoff, CachePadded};

use crate::sync::{
    cas_retry, fence, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
};

#[cfg(feature = "journal")]
pub mod journal;
#[doc(hidden)]
pub mod model;

/// Which of the gate's two resources ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// All `N` job slots are held.
    Slots,
    /// The byte budget `B` cannot hold the requested share.
    Bytes,
}

impl Resource {
    fn code(self) -> usize {
        match self {
            Resource::Slots => 0,
            Resource::Bytes => 1,
        }
    }

    fn from_code(code: usize) -> Resource {
        if code == 1 {
            Resource::Bytes
        } else {
            Resource::Slots
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Slots => "job slots",
            Resource::Bytes => "byte budget",
        })
    }
}

/// A gate configuration that cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateConfigError {
    /// `slots(0)`: nothing could ever be admitted.
    ZeroSlots,
    /// `bytes(0)`: no body could ever be reserved.
    ZeroBytes,
    /// `body_cap(0)`: every body with content would be refused.
    ZeroBodyCap,
    /// A body the cap allows could never fit in the budget, so a waiting
    /// [`Gate::admit`] could wait forever.
    BodyCapOverBudget {
        /// The requested cap on one body.
        body_cap: u64,
        /// The whole byte budget.
        bytes: u64,
    },
}

impl fmt::Display for GateConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateConfigError::ZeroSlots => f.write_str("a gate needs at least one job slot"),
            GateConfigError::ZeroBytes => f.write_str("a gate needs a byte budget above zero"),
            GateConfigError::ZeroBodyCap => f.write_str("a gate needs a body cap above zero"),
            GateConfigError::BodyCapOverBudget { body_cap, bytes } => write!(
                f,
                "body cap {body_cap} exceeds the whole byte budget {bytes}"
            ),
        }
    }
}

impl std::error::Error for GateConfigError {}

/// Why an admission was refused. Nothing is held after any of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmitError {
    /// [`Gate::try_admit`]: the resource is exhausted now (or is owed to
    /// callers already waiting in [`Gate::admit`], in which case `resource`
    /// is what the first of them lacks).
    Saturated {
        /// What ran out.
        resource: Resource,
    },
    /// [`Gate::admit`]: the deadline passed before capacity was granted.
    TimedOut {
        /// What was still short when the caller gave up (for a caller that
        /// was not first in line: what the first one lacked).
        resource: Resource,
    },
    /// [`Gate::admit_cancellable`]: the caller cancelled while waiting.
    Cancelled {
        /// What was still short when the caller cancelled.
        resource: Resource,
    },
    /// The declared length is over the gate's body cap (and so possibly over
    /// the budget, or `u64::MAX`). Waiting would not help.
    TooLarge {
        /// The declared body length.
        declared: u64,
        /// The gate's cap on one body.
        body_cap: u64,
    },
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmitError::Saturated { resource } => write!(f, "saturated: no free {resource}"),
            AdmitError::TimedOut { resource } => {
                write!(f, "deadline passed while waiting for {resource}")
            }
            AdmitError::Cancelled { resource } => {
                write!(f, "cancelled while waiting for {resource}")
            }
            AdmitError::TooLarge { declared, body_cap } => write!(
                f,
                "declared body length {declared} exceeds the body cap {body_cap}"
            ),
        }
    }
}

impl std::error::Error for AdmitError {}

/// [`BytePermit::shrink_to`] was asked to grow the share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShrinkError {
    /// The size asked for.
    pub requested: u64,
    /// The share currently held (unchanged).
    pub held: u64,
}

impl fmt::Display for ShrinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot shrink a byte share of {} to {} (a permit never grows)",
            self.held, self.requested
        )
    }
}

impl std::error::Error for ShrinkError {}

/// Reading a body under its byte share failed; the share is released.
#[derive(Debug)]
pub enum BodyError {
    /// The body went on past the reserved share. Reading stopped at the first
    /// byte over `limit`.
    TooLong {
        /// The reserved share the body exceeded.
        limit: u64,
    },
    /// The reader failed (or the buffer could not be allocated).
    Io(io::Error),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::TooLong { limit } => {
                write!(f, "body longer than its reserved {limit} bytes")
            }
            BodyError::Io(e) => write!(f, "reading the body failed: {e}"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::TooLong { .. } => None,
            BodyError::Io(e) => Some(e),
        }
    }
}

/// A snapshot of a gate's counters. Fields are read one by one, so under
/// concurrent use they are each exact but not one instant's picture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Slots held now (by tickets, slot permits, and transiently by an
    /// admission that is about to roll back).
    pub slots_held: usize,
    /// Bytes held now.
    pub bytes_held: u64,
    /// Highest `slots_held` reached by a successful admission (a refused
    /// admission's transient slot is not counted).
    pub peak_slots: usize,
    /// Highest `bytes_held` reached by a successful admission.
    pub peak_bytes: u64,
    /// Refusals ([`AdmitError::Saturated`] or [`AdmitError::TimedOut`])
    /// because of slots.
    pub saturated_slots: u64,
    /// Refusals because of the byte budget.
    pub saturated_bytes: u64,
    /// How many of those refusals were [`Gate::admit`] deadlines passing.
    pub timed_out: u64,
    /// How many of those refusals were cancellations
    /// ([`Gate::admit_cancellable`]).
    pub cancelled: u64,
    /// [`AdmitError::TooLarge`] refusals.
    pub too_large: u64,
    /// Callers waiting in [`Gate::admit`] now.
    pub waiting: usize,
}

struct Held {
    slots: AtomicUsize,
    bytes: AtomicU64,
}

struct Counters {
    peak_slots: AtomicUsize,
    peak_bytes: AtomicU64,
    saturated_slots: AtomicU64,
    saturated_bytes: AtomicU64,
    timed_out: AtomicU64,
    cancelled: AtomicU64,
    too_large: AtomicU64,
}

struct Waiters {
    /// FIFO of waiting callers' ids; only the front one tries to reserve.
    queue: VecDeque<u64>,
    next_id: u64,
}

struct Inner {
    slots_cap: usize,
    bytes_cap: u64,
    body_cap: u64,
    /// The two bounded counters, on one line: every admission touches both.
    held: CachePadded<Held>,
    /// Number of callers in `admit`'s queue. Read by every `try_admit`
    /// (which refuses while anyone waits: no barging) and every release
    /// (which wakes the queue only when it is not empty).
    queued: CachePadded<AtomicUsize>,
    /// What the first waiter lacked last time it tried ([`Resource::code`]).
    head_short: AtomicUsize,
    counters: CachePadded<Counters>,
    waiters: Mutex<Waiters>,
    cv: Condvar,
}

/// The admission gate. Cheap to clone (one `Arc`); clones share the counters.
///
/// ```
/// use pace::gate::{AdmitError, Gate, Resource};
///
/// let gate = Gate::builder().slots(2).bytes(1000).body_cap(600).build()?;
/// let a = gate.try_admit(Some(600))?;           // declared length
/// assert_eq!(
///     gate.try_admit(None).unwrap_err(),          // unknown length: reserve the cap
///     AdmitError::Saturated { resource: Resource::Bytes }
/// );
/// let (slot, mut bytes) = a.split();
/// bytes.shrink_to(100)?;                          // the body was smaller
/// assert_eq!(gate.stats().bytes_held, 100);
/// drop(bytes);                                    // last use of the buffer
/// drop(slot);                                     // end of the job
/// assert_eq!(gate.stats().slots_held, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("slots", &self.inner.slots_cap)
            .field("bytes", &self.inner.bytes_cap)
            .field("body_cap", &self.inner.body_cap)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Builds a [`Gate`]. `slots` and `bytes` are required; `body_cap` defaults
/// to `bytes`.
#[derive(Clone, Copy, Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct GateBuilder {
    slots: usize,
    bytes: u64,
    body_cap: Option<u64>,
}

impl GateBuilder {
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
    /// [`GateConfigError`] for zero slots, zero bytes, a zero body cap or a
    /// body cap above the budget.
    pub fn build(self) -> Result<Gate, GateConfigError> {
        let body_cap = self.body_cap.unwrap_or(self.bytes);
        if self.slots == 0 {
            return Err(GateConfigError::ZeroSlots);
        }
        if self.bytes == 0 {
            return Err(GateConfigError::ZeroBytes);
        }
        if body_cap == 0 {
            return Err(GateConfigError::ZeroBodyCap);
        }
        if body_cap > self.bytes {
            return Err(GateConfigError::BodyCapOverBudget {
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
                }),
                cv: Condvar::new(),
            }),
        })
    }
}

impl Gate {
    /// Starts a [`GateBuilder`].
    pub fn builder() -> GateBuilder {
        GateBuilder::default()
    }

    /// Number of job slots `N`.
    pub fn slots(&self) -> usize {
        self.inner.slots_cap
    }

    /// Byte budget `B`.
    pub fn bytes(&self) -> u64 {
        self.inner.bytes_cap
    }

    /// Cap on one body.
    pub fn body_cap(&self) -> u64 {
        self.inner.body_cap
    }

    /// Reserve one slot and a byte share now, or refuse now. Lock-free.
    ///
    /// `declared` is the body's declared length; `None` reserves the body
    /// cap. Refuses while callers wait in [`Gate::admit`], so that a stream
    /// of small requests cannot starve a large one.
    ///
    /// # Errors
    /// [`AdmitError::TooLarge`] when `declared` is over the body cap,
    /// [`AdmitError::Saturated`] when a resource is short.
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
        {
            drop(self.inner.lock());
            self.inner.cv.notify_all();
        }
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
                            inner.cv.notify_all();
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
                    inner.cv.notify_all();
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

    /// The counters now.
    pub fn stats(&self) -> GateStats {
        let i = &*self.inner;
        let c = &i.counters;
        GateStats {
            slots_held: i.held.slots.load(Ordering::SeqCst),
            bytes_held: i.held.bytes.load(Ordering::SeqCst),
            peak_slots: c.peak_slots.load(Ordering::Relaxed),
            peak_bytes: c.peak_bytes.load(Ordering::Relaxed),
            saturated_slots: c.saturated_slots.load(Ordering::Relaxed),
            saturated_bytes: c.saturated_bytes.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            too_large: c.too_large.load(Ordering::Relaxed),
            waiting: i.queued.load(Ordering::SeqCst),
        }
    }

    fn ticket(&self, bytes: u64) -> Ticket {
        Ticket(Hold {
            gate: Arc::clone(&self.inner),
            slots: 1,
            bytes,
        })
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn want(&self, declared: Option<u64>) -> Result<u64, AdmitError> {
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

    fn count_saturation(&self, resource: Resource) {
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
    fn reserve(&self, bytes: u64) -> Result<(), Resource> {
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
        let mut b = held.bytes.load(Ordering::SeqCst);
        loop {
            #[cfg(not(pace_mutant = "gate_unchecked_bytes"))]
            let fits = bytes <= self.bytes_cap.saturating_sub(b);
            // Known-wrong variant for the loom model: checks against a stale
            // reading and then adds blindly.
            #[cfg(pace_mutant = "gate_unchecked_bytes")]
            let fits = {
                if bytes > self.bytes_cap.saturating_sub(b) {
                    false
                } else {
                    held.bytes.fetch_add(bytes, Ordering::SeqCst);
                    self.note_peak(s + 1, b + bytes);
                    return Ok(());
                }
            };
            if !fits {
                held.slots.fetch_sub(1, Ordering::SeqCst);
                return Err(Resource::Bytes);
            }
            match held
                .bytes
                .compare_exchange_weak(b, b + bytes, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(now) => {
                    b = now;
                    cas_retry(&backoff);
                }
            }
        }
        self.note_peak(s + 1, b + bytes);
        Ok(())
    }

    /// `reserve` from a caller that does not hold the queue lock. Its rolled
    /// back slot may have been what the first waiter found missing, so the
    /// queue is woken as after any release.
    fn reserve_unlocked(&self, bytes: u64) -> Result<(), Resource> {
        let r = self.reserve(bytes);
        #[cfg(not(pace_mutant = "gate_no_wake_on_rollback"))]
        if r == Err(Resource::Bytes) {
            self.wake_if_queued();
        }
        r
    }

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
    fn release(&self, slots: usize, bytes: u64) {
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
        #[cfg(not(pace_mutant = "gate_no_fence"))]
        fence(Ordering::SeqCst);
        if self.queued.load(Ordering::Relaxed) != 0 {
            drop(self.lock());
            self.cv.notify_all();
        }
    }
}

/// Calls off an [`Gate::admit_cancellable`] wait from another thread (a
/// client that disconnected, a shutdown). Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
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

/// What a ticket or permit holds; dropping it gives that back, once.
struct Hold {
    gate: Arc<Inner>,
    slots: usize,
    bytes: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.gate.release(self.slots, self.bytes);
    }
}

impl Hold {
    fn shrink_to(&mut self, to: u64) -> Result<u64, ShrinkError> {
        if to > self.bytes {
            return Err(ShrinkError {
                requested: to,
                held: self.bytes,
            });
        }
        let excess = self.bytes - to;
        self.bytes = to;
        // Known-wrong variant for the model checker: the excess is never
        // returned to the gate.
        #[cfg(not(pace_mutant = "gate_shrink_keeps_excess"))]
        self.gate.release(0, excess);
        Ok(excess)
    }
}

/// One admitted job: a slot and a byte share, released when dropped (or
/// [`split`](Ticket::split) to release them at different times).
#[must_use = "dropping a ticket releases its slot and bytes at once"]
pub struct Ticket(Hold);

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("bytes", &self.0.bytes)
            .finish()
    }
}

impl Ticket {
    /// The byte share held.
    pub fn reserved_bytes(&self) -> u64 {
        self.0.bytes
    }

    /// Shrink the byte share to `to`, returning the excess to the gate now.
    /// Returns how many bytes were released.
    ///
    /// # Errors
    /// [`ShrinkError`] when `to` is above the share (nothing changes).
    pub fn shrink_to(&mut self, to: u64) -> Result<u64, ShrinkError> {
        self.0.shrink_to(to)
    }

    /// The slot (for the job) and the byte share (for the buffer).
    pub fn split(self) -> (SlotPermit, BytePermit) {
        let Ticket(mut slot) = self;
        let bytes = Hold {
            gate: Arc::clone(&slot.gate),
            slots: 0,
            bytes: slot.bytes,
        };
        slot.bytes = 0;
        (SlotPermit { _hold: slot }, BytePermit(bytes))
    }
}

/// One job slot; dropping it releases the slot (once).
#[must_use = "dropping a slot permit releases the slot at once"]
pub struct SlotPermit {
    _hold: Hold,
}

impl fmt::Debug for SlotPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SlotPermit")
    }
}

/// A byte share; dropping it releases what it still holds (once).
#[must_use = "dropping a byte permit releases its bytes at once"]
pub struct BytePermit(Hold);

impl fmt::Debug for BytePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytePermit")
            .field("bytes", &self.0.bytes)
            .finish()
    }
}

/// First read size when the share is larger; the buffer then doubles, never
/// past the share.
const FIRST_CHUNK: usize = 8 * 1024;

impl BytePermit {
    /// The share held now.
    pub fn bytes(&self) -> u64 {
        self.0.bytes
    }

    /// Shrink the share to `to` bytes, returning the excess to the gate at
    /// once. Returns how many bytes were released.
    ///
    /// # Errors
    /// [`ShrinkError`] when `to` is above the share (nothing changes).
    pub fn shrink_to(&mut self, to: u64) -> Result<u64, ShrinkError> {
        self.0.shrink_to(to)
    }

    /// Read a whole body under this share. The cap is enforced while
    /// reading: the buffer never grows past the share, and the first byte
    /// beyond it ends the read with [`BodyError::TooLong`]. On success the
    /// share shrinks to the buffer's real size and moves into the returned
    /// [`Body`], which releases it when dropped.
    ///
    /// # Errors
    /// [`BodyError::TooLong`] past the share, [`BodyError::Io`] when the
    /// reader fails. Either way the share is released.
    pub fn read_body<R: Read>(mut self, mut reader: R) -> Result<Body, BodyError> {
        let share = self.0.bytes;
        let limit = usize::try_from(share).unwrap_or(usize::MAX);
        let mut buf: Vec<u8> = Vec::new();
        let mut filled = 0usize;
        loop {
            if filled == buf.len() {
                if filled == limit {
                    if has_more(&mut reader)? {
                        return Err(BodyError::TooLong { limit: share });
                    }
                    break;
                }
                let grow = filled.max(FIRST_CHUNK).min(limit - filled);
                buf.try_reserve_exact(grow)
                    .map_err(|e| BodyError::Io(io::Error::new(io::ErrorKind::OutOfMemory, e)))?;
                buf.resize(filled + grow, 0);
            }
            let room = buf.len() - filled;
            let dst = buf.get_mut(filled..).unwrap_or_default();
            match reader.read(dst) {
                Ok(0) => break,
                Ok(n) => filled += n.min(room),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(BodyError::Io(e)),
            }
        }
        buf.truncate(filled);
        buf.shrink_to_fit();
        // Charge what the buffer really holds: its capacity, which after
        // `shrink_to_fit` is its length, and which never exceeds the share.
        let charged = (buf.capacity() as u64).clamp(filled as u64, share);
        let _ = self.shrink_to(charged);
        Ok(Body { buf, permit: self })
    }
}

fn has_more<R: Read>(reader: &mut R) -> Result<bool, BodyError> {
    let mut probe = [0u8; 1];
    loop {
        match reader.read(&mut probe) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(BodyError::Io(e)),
        }
    }
}

/// A body read under a byte share. The share is attached to the buffer:
/// dropping the body releases it. With the `bytes` feature,
/// `Body::into_bytes` moves both into a `bytes::Bytes` owner.
pub struct Body {
    buf: Vec<u8>,
    permit: BytePermit,
}

impl Body {
    /// Bytes counted against the gate for this buffer.
    pub fn charged(&self) -> u64 {
        self.permit.0.bytes
    }

    /// The buffer and its byte share, for callers that keep them together
    /// some other way. Drop the permit only after the last use of the
    /// buffer (or of anything borrowing from it).
    pub fn into_parts(self) -> (Vec<u8>, BytePermit) {
        (self.buf, self.permit)
    }

    /// Make it a `Bytes` whose owner holds the byte share: clones and slices
    /// share the owner, so the share is released only when the last of them
    /// is dropped. A short slice of a large body keeps the whole body counted,
    /// which is the truth: it keeps the whole buffer alive.
    #[cfg(feature = "bytes")]
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl AsRef<[u8]> for Body {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Body")
            .field("len", &self.buf.len())
            .field("charged", &self.permit.0.bytes)
            .finish()
    }
}
