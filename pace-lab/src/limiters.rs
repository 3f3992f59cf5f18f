//! The limiters under comparison, each deciding one key's requests in
//! virtual time with exact integer arithmetic.
//!
//! Times are nanoseconds on the limiter's own clock, which need not be
//! monotonic (imperfect clocks): every limiter here treats a reading that
//! steps back as "no time has passed", so a step back never frees capacity.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::mem::size_of;
use std::time::Duration;

use crate::{LabError, Settings};
use pace::{ManualClock, Pace, Rate};

/// One key's limiter in virtual time.
pub trait Limiter {
    /// Decides a request arriving at `now_ns` on this limiter's clock;
    /// `true` admits it (and charges it).
    fn admit(&mut self, now_ns: u64) -> bool;

    /// Bytes of per-key state held now: what a keyed store would keep for
    /// this key, not counting the key itself or the store's own overhead.
    fn state_bytes(&self) -> usize;
}

/// Which limiter to build, independent of the limit it is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimiterSpec {
    /// Fixed window counter: a count and the start of the current window,
    /// windows aligned to multiples of the window length.
    FixedWindow,
    /// Token bucket holding `capacity` tokens, refilled at limit per window.
    TokenBucket {
        /// Tokens a full bucket holds.
        capacity: u64,
    },
    /// Sliding log: the timestamps of the admitted requests of the last
    /// window.
    SlidingLog,
    /// Sliding-window counter: this window's and the previous window's
    /// counts, the previous weighted by how much of it the trailing window
    /// still overlaps.
    SlidingWindow,
    /// Conservative sub-window counter: the window cut into `slots` slots; a
    /// request is admitted while the current slot plus the `slots` previous
    /// ones hold fewer than the limit.
    SubWindow {
        /// Slots per window (k).
        slots: u32,
    },
    /// The crate's own [`Pace`], driven by a [`ManualClock`]: a token bucket
    /// (GCRA) with `capacity` tokens, or Pace's default capacity (one second
    /// of the rate, at least 1) when `None`.
    Pace {
        /// Bucket capacity; `None` for Pace's default.
        capacity: Option<u64>,
    },
}

impl LimiterSpec {
    /// The lineup the lab compares for `settings`: fixed window, token bucket
    /// with capacity = limit, the small token bucket (`small` tokens), sliding
    /// log, sliding window, sub-window with `slots` slots, and the real
    /// `Pace` at capacity = limit and at its default capacity.
    pub fn lineup(settings: &Settings, small: u64, slots: u32) -> Vec<LimiterSpec> {
        vec![
            LimiterSpec::FixedWindow,
            LimiterSpec::TokenBucket {
                capacity: settings.limit(),
            },
            LimiterSpec::TokenBucket { capacity: small },
            LimiterSpec::SlidingLog,
            LimiterSpec::SlidingWindow,
            LimiterSpec::SubWindow { slots },
            LimiterSpec::Pace {
                capacity: Some(settings.limit()),
            },
            LimiterSpec::Pace { capacity: None },
        ]
    }

    /// The default small bucket: a tenth of the limit, at least 1 token.
    pub fn small_capacity(settings: &Settings) -> u64 {
        (settings.limit() / 10).max(1)
    }

    /// A short, stable name for tables and JSON.
    pub fn label(&self, settings: &Settings) -> String {
        match *self {
            LimiterSpec::FixedWindow => "fixed-window".into(),
            LimiterSpec::TokenBucket { capacity } => format!("token-bucket(cap={capacity})"),
            LimiterSpec::SlidingLog => "sliding-log".into(),
            LimiterSpec::SlidingWindow => "sliding-window".into(),
            LimiterSpec::SubWindow { slots } => format!("sub-window(k={slots})"),
            LimiterSpec::Pace { capacity: Some(c) } => format!("pace(cap={c})"),
            LimiterSpec::Pace { capacity: None } => match rate_of(settings) {
                Ok(r) => format!("pace(cap={}, default)", r.one_second()),
                Err(_) => "pace(default)".into(),
            },
        }
    }

    /// The same limiter scaled for a node that gets `1/n` of the limit:
    /// bucket capacities are divided too (at least 1).
    pub fn divided(&self, n: u64) -> LimiterSpec {
        let n = n.max(1);
        match *self {
            LimiterSpec::TokenBucket { capacity } => LimiterSpec::TokenBucket {
                capacity: (capacity / n).max(1),
            },
            LimiterSpec::Pace { capacity: Some(c) } => LimiterSpec::Pace {
                capacity: Some((c / n).max(1)),
            },
            other => other,
        }
    }

    /// Builds one key's limiter for `settings`.
    ///
    /// # Errors
    /// [`LabError::Config`] for a zero capacity or slot count, or a
    /// configuration whose arithmetic would overflow.
    pub fn build(&self, settings: &Settings) -> Result<Box<dyn Limiter>, LabError> {
        Ok(match *self {
            LimiterSpec::FixedWindow => Box::new(FixedWindow::new(settings)),
            LimiterSpec::TokenBucket { capacity } => {
                Box::new(TokenBucket::new(settings, capacity)?)
            }
            LimiterSpec::SlidingLog => Box::new(SlidingLog::new(settings)),
            LimiterSpec::SlidingWindow => Box::new(SlidingWindow::new(settings)),
            LimiterSpec::SubWindow { slots } => Box::new(SubWindow::new(settings, slots)?),
            LimiterSpec::Pace { capacity } => Box::new(PaceLimiter::new(settings, capacity)?),
        })
    }
}

fn rate_of(settings: &Settings) -> Result<Rate, LabError> {
    Rate::new(settings.limit(), settings.window()).map_err(|e| LabError::Config(e.to_string()))
}

/// Fixed window counter: admits while fewer than `limit` requests were
/// admitted since the start of the current window `[iW, (i+1)W)`.
#[derive(Clone, Debug)]
pub struct FixedWindow {
    limit: u64,
    window: u64,
    state: FixedState,
}

#[derive(Clone, Copy, Debug, Default)]
struct FixedState {
    start: u64,
    count: u64,
}

impl FixedWindow {
    /// A counter for `settings`, windows aligned to multiples of the window.
    pub fn new(settings: &Settings) -> FixedWindow {
        FixedWindow {
            limit: settings.limit(),
            window: settings.window_ns(),
            state: FixedState::default(),
        }
    }
}

impl Limiter for FixedWindow {
    fn admit(&mut self, now: u64) -> bool {
        let start = now - now % self.window;
        if start > self.state.start {
            self.state = FixedState { start, count: 0 };
        }
        if self.state.count < self.limit {
            self.state.count += 1;
            true
        } else {
            false
        }
    }

    fn state_bytes(&self) -> usize {
        size_of::<FixedState>()
    }
}

/// Token bucket: `capacity` tokens, refilled continuously at `limit` per
/// window, starting full. Exact: the level is kept in units of 1/W tokens
/// (W in ns), so a refill of `dt` ns adds exactly `dt * limit` units.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    per_token: u64,
    refill_per_ns: u64,
    full: u64,
    state: BucketState,
}

#[derive(Clone, Copy, Debug)]
struct BucketState {
    level: u64,
    stamp: u64,
}

impl TokenBucket {
    /// A full bucket of `capacity` tokens refilled at the rate of `settings`.
    ///
    /// # Errors
    /// [`LabError::Config`] for a zero capacity, or when `capacity x window`
    /// nanoseconds does not fit 64 bits.
    pub fn new(settings: &Settings, capacity: u64) -> Result<TokenBucket, LabError> {
        if capacity == 0 {
            return Err(LabError::Config(
                "a token bucket needs a capacity of at least 1".into(),
            ));
        }
        let full = capacity.checked_mul(settings.window_ns()).ok_or_else(|| {
            LabError::Config(format!(
                "token bucket capacity {capacity} x window is too large for the lab's arithmetic"
            ))
        })?;
        Ok(TokenBucket {
            per_token: settings.window_ns(),
            refill_per_ns: settings.limit(),
            full,
            state: BucketState {
                level: full,
                stamp: 0,
            },
        })
    }
}

impl Limiter for TokenBucket {
    fn admit(&mut self, now: u64) -> bool {
        if now > self.state.stamp {
            let refill = (now - self.state.stamp) as u128 * self.refill_per_ns as u128;
            let level = (self.state.level as u128 + refill).min(self.full as u128);
            self.state = BucketState {
                level: level as u64,
                stamp: now,
            };
        }
        if self.state.level >= self.per_token {
            self.state.level -= self.per_token;
            true
        } else {
            false
        }
    }

    fn state_bytes(&self) -> usize {
        size_of::<BucketState>()
    }
}

/// Sliding log: the timestamps of the requests admitted in the trailing
/// window `(now - W, now]`; admits while there are fewer than `limit`.
#[derive(Clone, Debug)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
    log: VecDeque<u64>,
}

impl SlidingLog {
    /// An empty log for `settings`.
    pub fn new(settings: &Settings) -> SlidingLog {
        SlidingLog {
            limit: settings.limit(),
            window: settings.window_ns(),
            log: VecDeque::new(),
        }
    }
}

impl Limiter for SlidingLog {
    fn admit(&mut self, now: u64) -> bool {
        let now = now.max(self.log.back().copied().unwrap_or(0));
        while let Some(&front) = self.log.front() {
            if front.saturating_add(self.window) <= now {
                self.log.pop_front();
            } else {
                break;
            }
        }
        if (self.log.len() as u64) < self.limit {
            self.log.push_back(now);
            true
        } else {
            false
        }
    }

    /// Eight bytes per stored timestamp (the container's own header aside).
    fn state_bytes(&self) -> usize {
        self.log.len() * size_of::<u64>()
    }
}

/// Sliding-window counter: estimates the trailing window's count as
/// `previous x (W - elapsed) / W + current` and admits while the estimate,
/// this request included, stays at or below the limit.
#[derive(Clone, Debug)]
pub struct SlidingWindow {
    limit: u64,
    window: u64,
    state: SlidingState,
}

#[derive(Clone, Copy, Debug, Default)]
struct SlidingState {
    index: u64,
    previous: u32,
    current: u32,
}

impl SlidingWindow {
    /// A counter for `settings`, windows aligned to multiples of the window.
    pub fn new(settings: &Settings) -> SlidingWindow {
        SlidingWindow {
            limit: settings.limit(),
            window: settings.window_ns(),
            state: SlidingState::default(),
        }
    }
}

impl Limiter for SlidingWindow {
    fn admit(&mut self, now: u64) -> bool {
        let index = now / self.window;
        let s = &mut self.state;
        if index > s.index {
            s.previous = if index == s.index + 1 { s.current } else { 0 };
            s.current = 0;
            s.index = index;
        }
        // A reading behind the current window counts as its very start.
        let elapsed = if index == s.index {
            now - index * self.window
        } else {
            0
        };
        let w = self.window as u128;
        let estimate = s.previous as u128 * (w - elapsed as u128) + (s.current as u128 + 1) * w;
        if estimate <= self.limit as u128 * w {
            s.current += 1;
            true
        } else {
            false
        }
    }

    fn state_bytes(&self) -> usize {
        size_of::<SlidingState>()
    }
}

/// Conservative sub-window counter: slots of `ceil(W / k)` ns aligned to
/// multiples of the slot; a request is admitted while the current slot plus
/// the `k` previous ones hold fewer than `limit` admissions.
///
/// Those `k + 1` slots always cover the trailing window `(now - W, now]`, so
/// no window of length W ever holds more than the limit; a quiet client can
/// spend the whole limit at once; the price is that an admission is counted
/// for up to `W + W/k`, so steady throughput can fall to `k/(k+1)` of the
/// limit.
#[derive(Clone, Debug)]
pub struct SubWindow {
    limit: u64,
    slot_ns: u64,
    slot: u64,
    counts: Vec<u32>,
}

impl SubWindow {
    /// A counter for `settings` with `k` slots per window.
    ///
    /// # Errors
    /// [`LabError::Config`] for `k == 0` or more than 1,000 slots.
    pub fn new(settings: &Settings, k: u32) -> Result<SubWindow, LabError> {
        if k == 0 || k > 1_000 {
            return Err(LabError::Config(format!(
                "a sub-window counter needs between 1 and 1000 slots, not {k}"
            )));
        }
        Ok(SubWindow {
            limit: settings.limit(),
            slot_ns: settings.window_ns().div_ceil(k as u64),
            slot: 0,
            counts: vec![0; k as usize + 1],
        })
    }
}

impl Limiter for SubWindow {
    fn admit(&mut self, now: u64) -> bool {
        let ring = self.counts.len() as u64;
        let slot = now / self.slot_ns;
        if slot > self.slot {
            // Clear the slots that fell out of the span (all of them after a
            // long silence).
            let first = self.slot + 1;
            let last = slot.min(self.slot.saturating_add(ring));
            for s in first..=last {
                self.counts[(s % ring) as usize] = 0;
            }
            self.slot = slot;
        }
        let held: u64 = self.counts.iter().map(|&c| c as u64).sum();
        if held < self.limit {
            self.counts[(self.slot % ring) as usize] += 1;
            true
        } else {
            false
        }
    }

    /// The current slot's index (8 bytes) and `k + 1` 32-bit counters.
    fn state_bytes(&self) -> usize {
        size_of::<u64>() + self.counts.len() * size_of::<u32>()
    }
}

/// The crate's real [`Pace`] for one key, its clock set to each arrival.
pub struct PaceLimiter {
    pace: Pace<u64, RandomState, ManualClock>,
    clock: ManualClock,
}

/// The key the lab's client uses.
const KEY: u64 = 7;

impl PaceLimiter {
    /// A `Pace` at the rate of `settings` with `capacity` tokens (`None`:
    /// Pace's default, one second of the rate, at least 1).
    ///
    /// # Errors
    /// [`LabError::Config`] when `Pace` rejects the rate or capacity.
    pub fn new(settings: &Settings, capacity: Option<u64>) -> Result<PaceLimiter, LabError> {
        let clock = ManualClock::new();
        let mut builder = Pace::builder(rate_of(settings)?).clock(clock.clone());
        if let Some(c) = capacity {
            builder = builder.capacity(c);
        }
        let pace = builder
            .build()
            .map_err(|e| LabError::Config(format!("pace: {e}")))?;
        Ok(PaceLimiter { pace, clock })
    }

    /// The limiter being driven.
    pub fn pace(&self) -> &Pace<u64, RandomState, ManualClock> {
        &self.pace
    }
}

impl Limiter for PaceLimiter {
    fn admit(&mut self, now: u64) -> bool {
        self.clock.set(Duration::from_nanos(now));
        // Dropping the reservation keeps the debit.
        self.pace.reserve(&KEY).is_ok()
    }

    /// The bucket word (one `u64`) while the key has a row; zero once the
    /// row was removed as full. The row's slot and entry (key and hash) are
    /// the store's overhead, as for the other limiters.
    fn state_bytes(&self) -> usize {
        if self.pace.is_empty() {
            0
        } else {
            size_of::<u64>()
        }
    }
}
