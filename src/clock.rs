//! Clocks: where `now` comes from.
//!
//! A [`Clock`] answers nanoseconds since an origin of its own choosing. The
//! limiter reads it once per operation, inside the operation, and never trusts
//! it to be monotonic: a reading that goes backwards only makes a bucket look
//! emptier (fewer admissions), never fuller (see DESIGN.md, "Time").

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

/// A source of time in nanoseconds since an arbitrary, fixed origin.
///
/// Implementations should be cheap: the limiter calls `now_ns` once per
/// `reserve`, `refund` and `peek`. They need not be monotonic.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now_ns(&self) -> u64;

    /// The [`ManualClock`] whose readings this clock gives, if any: a turn
    /// waiting on a limiter of such a clock ([`Pace::acquire`],
    /// [`Pace::acquire_blocking`]) waits for that clock's moves instead of
    /// sleeping in real time. `None`, the default, for clocks of real time.
    /// A clock that wraps a `ManualClock` and reads the same returns it.
    ///
    /// [`Pace::acquire`]: crate::Pace::acquire
    /// [`Pace::acquire_blocking`]: crate::Pace::acquire_blocking
    fn manual(&self) -> Option<&ManualClock> {
        None
    }
}

/// The clock a [`Pace`](crate::Pace) uses unless told otherwise:
/// [`QuantaClock`] with the default `quanta` feature, else [`StdClock`].
#[cfg(feature = "quanta")]
#[cfg_attr(docsrs, doc(cfg(feature = "quanta")))]
pub type DefaultClock = QuantaClock;
/// The clock a [`Pace`](crate::Pace) uses unless told otherwise:
/// [`QuantaClock`] with the default `quanta` feature, else [`StdClock`].
#[cfg(not(feature = "quanta"))]
pub type DefaultClock = StdClock;

/// The default clock: [`quanta`]'s TSC-calibrated counter, read relative to
/// the moment the clock was created.
///
/// Some CPUs give quanta readings that are not monotonic across cores; the
/// limiter tolerates that by construction (a step back never mints tokens).
#[cfg(feature = "quanta")]
#[cfg_attr(docsrs, doc(cfg(feature = "quanta")))]
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
}

#[cfg(feature = "quanta")]
impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        QuantaClock { clock, origin }
    }
}

#[cfg(feature = "quanta")]
impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "quanta")]
impl Clock for QuantaClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// A cached clock: one background thread stores a reading of quanta's clock
/// into a shared atomic every [`resolution`](CoarseClock::resolution), and
/// [`now_ns`](Clock::now_ns) is one relaxed load of it (0.2–0.7 ns in a loop
/// against 33–44 ns for [`QuantaClock`] in one run of
/// `cargo bench -p pace-benches --bench clock`, DESIGN.md §5).
///
/// **Resolution.** [`CoarseClock::new`] has [`CoarseClock::DEFAULT_RESOLUTION`]
/// (1 ms); [`CoarseClock::with_resolution`] picks another. Successive
/// readings that differ, differ by at least the resolution; a reading is
/// older than the real time by up to one resolution plus however late the
/// operating system wakes the thread (under load, that lateness can exceed
/// the resolution).
///
/// **What the staleness costs.** A decision that uses a reading up to `s`
/// old sees a bucket emptier than it is by `s` of refill: it may deny, or
/// quote a `retry_after` longer, by up to `s` (`s/T` tokens at interval `T`:
/// 1 token at 1,000/s per key with the 1 ms default, 0.01 token at 10/s).
/// Over its readings it never admits more: the promise of DESIGN.md §3 is
/// stated over the readings the decisions used and holds for stale or
/// unordered readings (§5), so the tokens kept per window of readings stay
/// within `C + window/T`. Against real time, a window of real time may hold
/// decisions from a window wider by the staleness, so the real-time bound is
/// looser by at most `s/T` tokens, as for any lagging clock. Because time
/// moves in steps, a key whose interval is shorter than the resolution is
/// admitted in bursts at step edges (up to `resolution/T` tokens at once,
/// never beyond its capacity); keep the resolution below the interval.
///
/// **The thread.** Clones share one reading and one thread. `new` returns a
/// handle to a process-wide clock of the default resolution, started by the
/// first `new` and stopped (the thread is woken and joined) when the last
/// handle is dropped; every [`Pace`](crate::Pace) built with
/// `CoarseClock::new()` shares it. Each `with_resolution` call starts its own
/// thread, shared by its clones and stopped with the last of them.
///
/// **Monotone.** [`Clock`] does not require monotonic readings; this clock
/// gives them anyway: one thread writes, each value it stores is at least one
/// resolution above the previous one (a fresh reading below that, which the
/// TSC can give after a move across cores, is not stored), and a thread's
/// successive loads of one atomic never see an older value after a newer
/// one. Different threads may see a step at slightly different moments.
#[cfg(feature = "quanta")]
#[cfg_attr(docsrs, doc(cfg(feature = "quanta")))]
#[derive(Clone, Debug)]
pub struct CoarseClock {
    inner: Arc<Coarse>,
}

#[cfg(feature = "quanta")]
#[derive(Debug)]
struct Coarse {
    ns: crossbeam_utils::CachePadded<AtomicU64>,
    resolution: u64,
    stop: AtomicBool,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[cfg(feature = "quanta")]
impl CoarseClock {
    /// The resolution of [`CoarseClock::new`]: 1 ms.
    pub const DEFAULT_RESOLUTION: Duration = Duration::from_millis(1);

    /// A handle to the process-wide coarse clock of
    /// [`DEFAULT_RESOLUTION`](CoarseClock::DEFAULT_RESOLUTION), starting its
    /// thread if no handle to it is alive.
    pub fn new() -> Self {
        static SHARED: std::sync::Mutex<std::sync::Weak<Coarse>> =
            std::sync::Mutex::new(std::sync::Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(inner) = shared.upgrade() {
            return CoarseClock { inner };
        }
        let clock = Self::with_resolution(Self::DEFAULT_RESOLUTION);
        *shared = Arc::downgrade(&clock.inner);
        clock
    }

    /// A coarse clock of its own, refreshed every `resolution` (at least
    /// 1 µs) by a new thread that stops when the last clone is dropped.
    ///
    /// # Panics
    /// If the thread cannot be spawned.
    pub fn with_resolution(resolution: Duration) -> Self {
        let resolution = duration_ns(resolution).max(1_000);
        let source = quanta::Clock::new();
        let origin = source.raw();
        let inner = Arc::new(Coarse {
            ns: crossbeam_utils::CachePadded::new(AtomicU64::new(0)),
            resolution,
            stop: AtomicBool::new(false),
            thread: std::sync::Mutex::new(None),
        });
        // The thread holds a Weak: it never keeps the clock alive.
        let weak = Arc::downgrade(&inner);
        let handle = std::thread::Builder::new()
            .name("pace-coarse-clock".into())
            .spawn(move || {
                let mut last = 0u64;
                loop {
                    let Some(c) = weak.upgrade() else { return };
                    if c.stop.load(Ordering::Acquire) {
                        return;
                    }
                    let now = source.delta_as_nanos(origin, source.raw()).max(last);
                    let due = last.saturating_add(c.resolution);
                    if now >= due {
                        c.ns.store(now, Ordering::Relaxed);
                        last = now;
                        drop(c);
                        std::thread::park_timeout(Duration::from_nanos(resolution));
                    } else {
                        drop(c);
                        std::thread::park_timeout(Duration::from_nanos(due - now));
                    }
                }
            })
            .expect("spawn the coarse clock thread");
        *inner.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        CoarseClock { inner }
    }

    /// The smallest step between two different readings.
    pub fn resolution(&self) -> Duration {
        Duration::from_nanos(self.inner.resolution)
    }
}

#[cfg(feature = "quanta")]
impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "quanta")]
impl Drop for Coarse {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let handle = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            h.thread().unpark();
            // The last handle can be dropped on the clock thread itself only
            // through its own upgrade, which it drops before parking; never
            // join oneself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(feature = "quanta")]
impl Clock for CoarseClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.inner.ns.load(Ordering::Relaxed)
    }
}

/// `std::time::Instant`, relative to the moment the clock was created.
#[derive(Clone, Copy, Debug)]
pub struct StdClock {
    origin: Instant,
}

impl StdClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        StdClock {
            origin: Instant::now(),
        }
    }
}

impl Default for StdClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock moved by hand, for tests, simulations and the lab.
///
/// Clones share one reading. It starts at zero; [`set`](ManualClock::set) may
/// move it backwards, which the limiter must (and does) tolerate.
///
/// **Waits follow the clock, not real time.** A turn waiting on a limiter
/// built with this clock ([`Pace::acquire`](crate::Pace::acquire),
/// [`Pace::acquire_blocking`](crate::Pace::acquire_blocking)) never sleeps
/// in real time: it waits until [`advance`](ManualClock::advance) or
/// [`set`](ManualClock::set) moves the reading to its slot or past it, and is
/// woken by that call. A turn that nobody moves the clock for waits forever,
/// unless the clock advances itself:
///
/// **Auto-advance** ([`auto_advancing`](ManualClock::auto_advancing),
/// [`set_auto_advance`](ManualClock::set_auto_advance)), as a paused tokio
/// clock: while turns wait on the clock, it jumps forward to the earliest
/// slot waited for whenever a wait starts or ends, so code that waits runs
/// in no real time, each turn let through at its own slot, in order. The
/// clock never jumps backwards, and moves only when a turn waits.
///
/// ```
/// use std::time::Duration;
/// use pace::{ManualClock, Pace, Rate};
///
/// let clock = ManualClock::auto_advancing();
/// let pace = Pace::<u64, _, _>::builder(Rate::per_minute(1)?)
///     .clock(clock.clone())
///     .build()?;
/// drop(pace.reserve(&1).unwrap());
/// // The next token is a minute away: the wait jumps the clock there.
/// drop(pace.acquire_blocking(&1, Duration::from_secs(60)).unwrap());
/// assert_eq!(clock.now(), Duration::from_secs(60));
/// # Ok::<(), pace::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[doc(alias = "FakeRelativeClock", alias = "mock", alias = "pause")]
pub struct ManualClock {
    inner: Arc<Manual>,
}

/// The shared state of a [`ManualClock`]: its reading and the turns waiting
/// for it.
#[derive(Debug, Default)]
struct Manual {
    ns: AtomicU64,
    auto: AtomicBool,
    waiters: Mutex<Waiters>,
    /// Notified on every move, for waiting threads.
    moved: Condvar,
    /// How many turns wait (the list's length, stored under the lock): a
    /// move with none waiting takes no lock and wakes nobody, so a clock a
    /// test or benchmark advances at every call stays cheap. (A Dekker pair
    /// with the wait's registration: the mover stores the reading, then
    /// reads this; the waiter stores this, then reads the reading, both
    /// SeqCst, so one of them sees the other.)
    waiting: AtomicUsize,
}

/// The turns waiting on a [`ManualClock`]: each with its deadline (ns on the
/// clock) and, for a task, its waker (threads wait on the condvar).
#[derive(Debug, Default)]
struct Waiters {
    next_id: u64,
    list: Vec<Waiter>,
    /// Wakers of tasks released, woken once the lock is let go (a waker
    /// may poll its task at once, which takes the lock).
    woken: Vec<Waker>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    deadline: u64,
    waker: Option<Waker>,
}

impl Waiters {
    fn remove(&mut self, id: u64) {
        self.list.retain(|w| w.id != id);
    }
}

impl Manual {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets go of the lock, then wakes the tasks it released.
    fn unlock(&self, mut w: MutexGuard<'_, Waiters>) {
        let woken = std::mem::take(&mut w.woken);
        drop(w);
        for waker in woken {
            waker.wake();
        }
    }

    #[inline]
    fn now(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }

    /// Publishes how many turns wait, after the list changed.
    fn count(&self, w: &Waiters) {
        self.waiting.store(w.list.len(), Ordering::SeqCst);
    }

    /// Wakes the waiters whose deadline the reading has reached, taking them
    /// off the list.
    fn release(&self, w: &mut Waiters) {
        let now = self.now();
        let Waiters { list, woken, .. } = w;
        list.retain_mut(|x| {
            if x.deadline > now {
                return true;
            }
            woken.extend(x.waker.take());
            false
        });
        self.count(w);
        self.moved.notify_all();
    }

    /// In auto-advance mode, moves the reading forward to the earliest
    /// deadline waited for and releases who it reaches.
    fn jump(&self, w: &mut Waiters) {
        if !self.auto.load(Ordering::Acquire) {
            return;
        }
        if let Some(earliest) = w.list.iter().map(|x| x.deadline).min() {
            if earliest > self.now() {
                self.ns.fetch_max(earliest, Ordering::AcqRel);
                self.release(w);
            }
        }
    }

    /// One check of a wait for `deadline`: `true` when the reading has
    /// reached it (the wait is over and off the list), else registered (or
    /// its waker renewed) under `id`.
    fn check(
        &self,
        w: &mut Waiters,
        deadline: u64,
        id: &mut Option<u64>,
        waker: Option<&Waker>,
    ) -> bool {
        if self.now() < deadline {
            match w.list.iter_mut().find(|x| Some(x.id) == *id) {
                Some(x) => {
                    if let Some(waker) = waker {
                        x.waker = Some(waker.clone());
                    }
                }
                None => {
                    let new = w.next_id;
                    w.next_id += 1;
                    w.list.push(Waiter {
                        id: new,
                        deadline,
                        waker: waker.cloned(),
                    });
                    self.count(w);
                    *id = Some(new);
                }
            }
            self.jump(w);
            if self.now() < deadline {
                return false;
            }
        }
        if let Some(id) = id.take() {
            w.remove(id);
            self.count(w);
        }
        // The wait ends: the clock moves on for those still waiting.
        self.jump(w);
        true
    }
}

impl ManualClock {
    /// A clock reading zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock reading zero that advances itself to the earliest slot a
    /// turn waits for (see the type's docs).
    pub fn auto_advancing() -> Self {
        let c = Self::new();
        c.set_auto_advance(true);
        c
    }

    /// Turns auto-advance on or off (see the type's docs); turning it on
    /// while turns wait jumps the clock to the earliest of their slots.
    pub fn set_auto_advance(&self, on: bool) {
        let m = &*self.inner;
        let mut w = m.lock();
        m.auto.store(on, Ordering::Release);
        m.jump(&mut w);
        m.unlock(w);
    }

    /// Whether the clock advances itself (see the type's docs).
    pub fn is_auto_advancing(&self) -> bool {
        self.inner.auto.load(Ordering::Acquire)
    }

    /// Moves the clock forward by `d` (saturating at `u64::MAX` nanoseconds)
    /// and wakes the turns whose slot it reaches.
    #[inline]
    pub fn advance(&self, d: Duration) {
        let d = duration_ns(d);
        // A CAS loop rather than `fetch_update`, which nightly deprecates
        // in favour of `try_update` (not in the MSRV).
        let ns = &self.inner.ns;
        let mut t = ns.load(Ordering::Acquire);
        while let Err(actual) =
            ns.compare_exchange_weak(t, t.saturating_add(d), Ordering::SeqCst, Ordering::Acquire)
        {
            t = actual;
        }
        self.moved();
    }

    /// Sets the reading to `t` since the origin (it may move backwards) and
    /// wakes the turns whose slot it reaches.
    pub fn set(&self, t: Duration) {
        self.inner.ns.store(duration_ns(t), Ordering::SeqCst);
        self.moved();
    }

    /// The current reading.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.inner.now())
    }

    /// How many turns wait on the clock now.
    pub fn waiting(&self) -> usize {
        self.inner.lock().list.len()
    }

    /// After a move: wakes the turns whose slot the reading reaches, if any
    /// wait (one load when none does).
    #[inline]
    fn moved(&self) {
        if self.inner.waiting.load(Ordering::SeqCst) != 0 {
            self.wake(); // (see `Manual::waiting`)
        }
    }

    /// [`moved`](ManualClock::moved) with turns waiting: wakes those whose
    /// slot the reading reaches.
    #[cold]
    fn wake(&self) {
        let m = &*self.inner;
        let mut w = m.lock();
        m.release(&mut w);
        m.unlock(w);
    }

    /// Blocks the thread until the reading reaches `deadline` (ns).
    pub(crate) fn wait_blocking(&self, deadline: u64) {
        let m = &*self.inner;
        let mut id = None;
        loop {
            let mut w = m.lock();
            let done = m.check(&mut w, deadline, &mut id, None);
            if done || !w.woken.is_empty() {
                // Tasks to wake first (then check again), or done.
                m.unlock(w);
                if done {
                    return;
                }
                continue;
            }
            // Every move notifies under the lock: none is missed between
            // the check and the wait.
            drop(m.moved.wait(w).unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// A future ready once the reading reaches `deadline` (ns).
    #[cfg(feature = "timer")]
    pub(crate) fn sleep_until(&self, deadline: u64) -> ManualSleep<'_> {
        ManualSleep {
            clock: &self.inner,
            deadline,
            id: None,
        }
    }
}

/// A task's wait on a [`ManualClock`] (see [`ManualClock::sleep_until`]);
/// dropping it leaves the clock's list.
#[cfg(feature = "timer")]
pub(crate) struct ManualSleep<'a> {
    clock: &'a Manual,
    deadline: u64,
    id: Option<u64>,
}

#[cfg(feature = "timer")]
impl std::future::Future for ManualSleep<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let this = &mut *self;
        let mut w = this.clock.lock();
        let done = this
            .clock
            .check(&mut w, this.deadline, &mut this.id, Some(cx.waker()));
        this.clock.unlock(w);
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    }
}

#[cfg(feature = "timer")]
impl Drop for ManualSleep<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let mut w = self.clock.lock();
            w.remove(id);
            self.clock.count(&w);
            // A cancelled wait ends too: the clock moves on for the others.
            self.clock.jump(&mut w);
            self.clock.unlock(w);
        }
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.inner.now()
    }

    fn manual(&self) -> Option<&ManualClock> {
        Some(self)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn manual(&self) -> Option<&ManualClock> {
        (**self).manual()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn manual(&self) -> Option<&ManualClock> {
        (**self).manual()
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX`.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_ways_and_is_shared() {
        let c = ManualClock::new();
        let d = c.clone();
        assert_eq!(c.now_ns(), 0);
        c.advance(Duration::from_millis(5));
        assert_eq!(d.now_ns(), 5_000_000);
        d.set(Duration::from_millis(2));
        assert_eq!(c.now(), Duration::from_millis(2));
        c.set(Duration::MAX);
        assert_eq!(c.now_ns(), u64::MAX);
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now_ns(), u64::MAX, "advance saturates");
    }

    #[cfg(feature = "quanta")]
    #[test]
    fn real_clocks_start_near_zero_and_move_forward() {
        let q = QuantaClock::new();
        let s = StdClock::new();
        let (a, b) = (q.now_ns(), s.now_ns());
        std::thread::sleep(Duration::from_millis(2));
        assert!(q.now_ns() > a);
        assert!(s.now_ns() >= b + 2_000_000);
    }

    /// Waits (up to 20 s, for a loaded machine) until `c` reads above `t`.
    #[cfg(feature = "quanta")]
    fn wait_above(c: &CoarseClock, t: u64) -> u64 {
        let start = Instant::now();
        loop {
            let r = c.now_ns();
            if r > t {
                return r;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "clock stuck at {r}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    #[cfg(feature = "quanta")]
    #[test]
    fn coarse_clock_moves_forward_in_steps_of_its_resolution() {
        let c = CoarseClock::with_resolution(Duration::from_micros(500));
        assert_eq!(c.resolution(), Duration::from_micros(500));
        let first = c.now_ns();
        // Readings only change by a store of the thread; every change seen
        // is at least one resolution, and none goes back.
        let mut changes = 0;
        let mut last = first;
        let start = Instant::now();
        while changes < 20 {
            let r = c.now_ns();
            assert!(r >= last, "went back: {last} -> {r}");
            if r != last {
                assert!(
                    r - last >= 500_000,
                    "step {} below the resolution",
                    r - last
                );
                changes += 1;
                last = r;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "only {changes} steps"
            );
        }
        // 20 steps of at least 500 µs each.
        assert!(last - first >= 20 * 500_000);
    }

    #[cfg(feature = "quanta")]
    #[test]
    fn coarse_clock_is_shared_and_monotone_across_threads() {
        let c = CoarseClock::with_resolution(Duration::from_micros(100));
        let d = c.clone();
        assert!(Arc::ptr_eq(&c.inner, &d.inner), "clones share one reading");
        // Two threads each see a non-decreasing sequence of readings, and
        // each sees the clock move.
        let seen: Vec<(u64, u64)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let c = c.clone();
                    s.spawn(move || {
                        let a = c.now_ns();
                        let mut last = a;
                        for _ in 0..200_000 {
                            let r = c.now_ns();
                            assert!(r >= last, "went back: {last} -> {r}");
                            last = r;
                        }
                        (a, wait_above(&c, last))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (a, b) in seen {
            assert!(b > a);
        }
    }

    #[cfg(feature = "quanta")]
    #[test]
    fn default_coarse_clock_is_one_thread_stopped_by_its_last_handle() {
        let a = CoarseClock::new();
        let b = CoarseClock::new();
        assert!(Arc::ptr_eq(&a.inner, &b.inner), "one process-wide clock");
        assert_eq!(a.resolution(), CoarseClock::DEFAULT_RESOLUTION);
        // An own clock: its thread ends when its last handle is dropped
        // (Drop joins it), and the thread never keeps the clock alive.
        let own = CoarseClock::with_resolution(Duration::from_secs(3600));
        let own2 = own.clone();
        let weak = Arc::downgrade(&own.inner);
        let thread = own
            .inner
            .thread
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .thread()
            .clone();
        assert_eq!(thread.name(), Some("pace-coarse-clock"));
        drop(own);
        assert!(weak.upgrade().is_some(), "a clone is alive");
        drop(own2);
        // Dropping the last handle with a one-hour resolution returned at
        // once: the thread was woken, saw the clock gone and was joined.
        assert!(weak.upgrade().is_none());
    }

    #[cfg(feature = "quanta")]
    #[test]
    fn coarse_clock_decides_exactly_across_threads() {
        use crate::{Pace, Rate};
        // One token per hour, capacity 1,000: however the readings move in
        // this test, exactly 1,000 of 2 x 1,500 reserves on one key are
        // admitted (kept), and a second key is untouched.
        let p: Pace<u64, _, _> = Pace::builder(Rate::new(1, Duration::from_secs(3600)).unwrap())
            .capacity(1_000)
            .clock(CoarseClock::new())
            .build()
            .unwrap();
        let admitted: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        (0..1_500)
                            .filter(|_| p.reserve(&7).map(|r| r.detach()).is_ok())
                            .count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 1_000);
        assert_eq!(p.peek(&7), 0);
        assert_eq!(p.peek(&8), 1_000);
    }
}
