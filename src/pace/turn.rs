//! Waiting for a turn (`acquire`): a slot reserved ahead, then one sleep.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

#[cfg(feature = "timer")]
use super::each_in_drop;
use super::{call, Denied, Pace, Reservation, Turned};
use crate::clock::Clock;
use crate::rate::Quota;

/// A turn being waited for (`Pace::acquire`): refunded if dropped before
/// the turn comes.
#[cfg(feature = "timer")]
struct Turn<'a, K, Q, S, C>(Option<Reservation<'a, K, Q, S, C>>)
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock;

#[cfg(feature = "timer")]
impl<K, Q, S, C> Drop for Turn<'_, K, Q, S, C>
where
    K: Hash + Eq + Borrow<Q>,
    Q: ?Sized + Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    fn drop(&mut self) {
        // Refunded also while the thread unwinds (a key's panic then is
        // caught: the debit stays, as a panicking key leaves it).
        each_in_drop(self.0.take(), |r| {
            r.refund();
        });
    }
}

/// Sleeps taken by callers waiting for a turn, in this process (for the
/// fairness benchmark: one per waiter means no wasted wake-up).
static TURN_SLEEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

std::thread_local! {
    /// Sleeps taken by callers waiting for a turn on this thread (counted
    /// where the sleep starts: in an async turn, the poll that starts it).
    static TURN_SLEEPS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub(super) fn note_turn_sleep() {
    TURN_SLEEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    TURN_SLEEPS_HERE.with(|c| c.set(c.get() + 1));
}

/// Sleeps taken by callers waiting for a turn in this process so far.
#[cfg(feature = "__internals")]
pub(crate) fn turn_sleeps() -> u64 {
    TURN_SLEEPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sleeps taken by callers waiting for a turn on this thread so far.
#[cfg(feature = "__internals")]
pub(crate) fn turn_sleeps_here() -> u64 {
    TURN_SLEEPS_HERE.with(std::cell::Cell::get)
}

impl<K, S, C> Pace<K, S, C>
where
    K: Hash + Eq,
    S: BuildHasher,
    C: Clock,
{
    /// Waits for a turn instead of being refused: reserves a token of
    /// `key` in a slot that may lie up to `max_wait` in the future (one CAS,
    /// as [`reserve_n`](Pace::reserve_n)), then sleeps the thread until the
    /// limiter's clock reaches the slot. Callers of one key are let through
    /// in the order of their debits (first come, first served), each after
    /// one exact sleep (re-checking the clock, since a sleep and the clock
    /// may disagree), with no retries. `quota` is the call's quota, `None`
    /// for the default.
    ///
    /// Over the instants callers are let through, the kept admissions of a
    /// key obey the same bound as reserves (DESIGN.md §3, "Waiting for a
    /// turn"). With a [`ManualClock`](crate::ManualClock) (or a clock whose
    /// [`Clock::manual`] is one) the thread never sleeps in real time: it
    /// blocks until another thread's [`advance`](crate::ManualClock::advance)
    /// or [`set`](crate::ManualClock::set) moves the clock to the slot, and
    /// an [auto-advancing](crate::ManualClock::auto_advancing) clock jumps
    /// there by itself (the crate's "Testing with `ManualClock`").
    ///
    /// # Errors
    /// [`Denied`] at once, having written nothing, when the turn lies more
    /// than `max_wait` ahead (its [`retry_after`](Denied::retry_after) is the
    /// whole wait the request would need now), or when the request can never
    /// pass ([`Denied::is_permanent`]).
    #[doc(alias = "until_key_ready", alias = "until_ready")]
    pub fn acquire_blocking<'a, Q>(
        &'a self,
        key: &'a Q,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_blocking_inner(key, 1, None, max_wait)
    }

    /// [`acquire_blocking`](Pace::acquire_blocking) of `n` tokens at once.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    pub fn acquire_n_blocking<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_blocking_inner(key, n, None, max_wait)
    }

    /// [`acquire_n_blocking`](Pace::acquire_n_blocking) under the call's own
    /// `quota` (see [`reserve_with`](Pace::reserve_with)).
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    pub fn acquire_n_with_blocking<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_blocking_inner(key, n, Some(quota), max_wait)
    }

    pub(super) fn acquire_blocking_inner<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let (r, slot) = self.reserve_turn(key, n, quota, max_wait)?;
        while let Some(wait) = self.until(slot) {
            note_turn_sleep();
            match self.clock.manual() {
                // Woken by the clock's move to the slot.
                Some(manual) => manual.wait_blocking(slot),
                None => std::thread::sleep(wait),
            }
        }
        Ok(r)
    }

    /// [`acquire_blocking`](Pace::acquire_blocking) for async code on any
    /// executor (feature `timer`): the task sleeps until its turn on
    /// `futures-timer`'s timer thread, whose deadlines are exact to the
    /// nanosecond (a runtime's own timer may round up to its tick: tokio's
    /// makes a turn 0 to 2 ms late). Never before its slot; after it by the
    /// timer thread's wake-up and the scheduler's delay.
    ///
    /// Dropping the future before its turn refunds the reservation by the
    /// refund rule: the slot comes back when nothing was debited from the key
    /// since, and is otherwise lost (later callers keep their slots: fewer
    /// admissions, never more).
    ///
    /// With a [`ManualClock`](crate::ManualClock) the task waits for the
    /// clock's moves, not on the timer, as
    /// [`acquire_blocking`](Pace::acquire_blocking) does.
    ///
    /// governor's `until_key_ready(&k).await` is `acquire(&k, max_wait).await`:
    /// one reservation and one sleep, refused at once past `max_wait`
    /// (`Duration::MAX` to wait however long).
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    #[cfg(feature = "timer")]
    #[cfg_attr(docsrs, doc(cfg(feature = "timer")))]
    #[doc(
        alias = "until_key_ready",
        alias = "until_ready",
        alias = "until_key_n_ready",
        alias = "wait"
    )]
    pub async fn acquire<'a, Q>(
        &'a self,
        key: &'a Q,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_inner(key, 1, None, max_wait).await
    }

    /// [`acquire`](Pace::acquire) of `n` tokens at once.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    #[cfg(feature = "timer")]
    #[cfg_attr(docsrs, doc(cfg(feature = "timer")))]
    pub async fn acquire_n<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_inner(key, n, None, max_wait).await
    }

    /// [`acquire_n`](Pace::acquire_n) under the call's own `quota` (see
    /// [`reserve_with`](Pace::reserve_with)).
    ///
    /// # Errors
    /// As [`acquire_blocking`](Pace::acquire_blocking).
    #[cfg(feature = "timer")]
    #[cfg_attr(docsrs, doc(cfg(feature = "timer")))]
    pub async fn acquire_n_with<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Quota,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        self.acquire_inner(key, n, Some(quota), max_wait).await
    }

    #[cfg(feature = "timer")]
    pub(super) async fn acquire_inner<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Result<Reservation<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let (r, slot) = self.reserve_turn(key, n, quota, max_wait)?;
        let mut turn = Turn(Some(r));
        while let Some(wait) = self.until(slot) {
            note_turn_sleep();
            match self.clock.manual() {
                // Woken by the clock's move to the slot.
                Some(manual) => manual.sleep_until(slot).await,
                None => futures_timer::Delay::new(wait).await,
            }
        }
        Ok(turn.0.take().expect("taken only here"))
    }

    /// The reservation of a turn and its slot (ns on the limiter's clock).
    pub(super) fn reserve_turn<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        max_wait: Duration,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        self.reserve_turn_clocked(key, n, quota, wait_ns, || self.clock.now_ns())
    }

    /// A turn's reservation (a slot up to `wait_ns` ahead) and its slot, on
    /// `clock`.
    pub(super) fn reserve_turn_clocked<'a, Q, F>(
        &'a self,
        key: &'a Q,
        n: u64,
        quota: Option<Quota>,
        wait_ns: u64,
        clock: F,
    ) -> Result<Turned<'a, K, Q, S, C>, Denied>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        F: Fn() -> u64,
    {
        let req = call::Request {
            key,
            n,
            quota: quota.as_ref().map(Quota::limits_ref),
            clock,
        };
        let turn = call::Turn { wait: wait_ns };
        self.reserve_slot(req, turn, |p, key, debit, slot| {
            (p.reservation(key, debit, ()), slot)
        })
    }

    /// How long until the limiter's clock reaches `slot`, if it has not.
    pub(super) fn until(&self, slot: u64) -> Option<Duration> {
        let now = self.clock.now_ns();
        (now < slot).then(|| Duration::from_nanos(slot - now))
    }
}
