//! A lease's local counter (DESIGN.md §11): one word packing
//! `(generation, pool, fresh)` — `pool` the granted tokens not yet
//! reserved, `fresh` the tokens reserved since the last report — and the
//! deadline, changed only by compare-and-swap. A report (each take/renew
//! call) moves `fresh` into the cumulative kept count and starts a new
//! generation, so that:
//!
//! * a reserve reads its clock **after** loading the word: the deadline it
//!   checks covers every token the word holds (a renewal publishes its
//!   deadline before its tokens; a new lease starts a new generation
//!   before its deadline);
//! * a new lease (after the old one was settled at its expiry) starts from
//!   a new generation with nothing fresh: no kept count of an old lease is
//!   reported for a new one;
//! * a refund returns its tokens to the pool only in the generation that
//!   reserved them (unreported): a reported token stays kept.
//!
//! A release drains the pool in a new generation: a released token is
//! never taken.
//!
//! `loom-tests/tests/lease_counter.rs` includes this file and checks the
//! four under loom, with a known-wrong variant of each of the first three
//! (`.ci/suites/10-loom.sh`).

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// Pool and fresh counts are 24 bits each; the generation 16.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// The largest grant a replica can hold: the pool's field.
pub(crate) const MAX_LEASED: u64 = COUNT_MASK;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Word {
    pub(crate) generation: u64,
    pub(crate) pool: u64,
    pub(crate) fresh: u64,
}

impl Word {
    pub(crate) fn unpack(w: u64) -> Word {
        Word {
            generation: w >> (2 * COUNT_BITS),
            pool: (w >> COUNT_BITS) & COUNT_MASK,
            fresh: w & COUNT_MASK,
        }
    }

    pub(crate) fn pack(self) -> u64 {
        ((self.generation & 0xffff) << (2 * COUNT_BITS))
            | ((self.pool & COUNT_MASK) << COUNT_BITS)
            | (self.fresh & COUNT_MASK)
    }
}

/// The lock-free part of a key's lease: the counter word and the deadline.
pub(crate) struct Counter {
    pub(crate) word: AtomicU64,
    /// Local ns (since the limiter's origin) before which the pool may be
    /// spent.
    pub(crate) deadline: AtomicU64,
}

impl Default for Counter {
    fn default() -> Self {
        Counter {
            word: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
        }
    }
}

impl Counter {
    /// One CAS from each loaded word to `f`'s change of it (`None`: none,
    /// and nothing written): the word it changed.
    fn change(&self, mut f: impl FnMut(Word) -> Option<Word>) -> Option<Word> {
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let cur = Word::unpack(w);
            let next = f(cur)?;
            match self.word.compare_exchange_weak(
                w,
                next.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(cur),
                Err(seen) => w = seen,
            }
        }
    }

    /// Takes `n` tokens from the pool if the clock (`now`, read after the
    /// word) is before the deadline: the generation they count in and the
    /// reading.
    pub(crate) fn take(&self, n: u64, now: impl Fn() -> u64) -> Option<(u64, u64)> {
        // Known-wrong: the clock read before the word.
        #[cfg(pace_mutant = "lease_clock_before_word")]
        let early = now();
        let mut at = 0;
        let cur = self.change(|cur| {
            #[cfg(not(pace_mutant = "lease_clock_before_word"))]
            {
                at = now();
            }
            #[cfg(pace_mutant = "lease_clock_before_word")]
            {
                at = early;
            }
            if at >= self.deadline.load(Ordering::Acquire) || cur.pool < n {
                return None;
            }
            Some(Word {
                pool: cur.pool - n,
                fresh: cur.fresh + n,
                ..cur
            })
        })?;
        Some((cur.generation, at))
    }

    /// Returns `n` tokens taken in `generation` to the pool, if no report
    /// counted them since.
    pub(crate) fn give_back(&self, generation: u64, n: u64) -> bool {
        self.change(|cur| {
            #[cfg(not(pace_mutant = "lease_refund_reported"))]
            if cur.generation != generation || cur.fresh < n {
                return None;
            }
            // Known-wrong: back to the pool even once reported.
            #[cfg(pace_mutant = "lease_refund_reported")]
            let _ = generation;
            Some(Word {
                pool: cur.pool + n,
                fresh: cur.fresh.saturating_sub(n),
                ..cur
            })
        })
        .is_some()
    }

    /// A report: a new generation; the tokens fresh until now.
    pub(crate) fn report(&self) -> u64 {
        self.change(|cur| {
            Some(Word {
                generation: (cur.generation + 1) & 0xffff,
                fresh: 0,
                ..cur
            })
        })
        .map_or(0, |cur| cur.fresh)
    }

    /// A release: a new generation with nothing in it; the tokens fresh
    /// until now (kept) and the pool's (released, never to be taken).
    pub(crate) fn drain(&self) -> (u64, u64) {
        self.change(|cur| {
            Some(Word {
                generation: (cur.generation + 1) & 0xffff,
                pool: 0,
                fresh: 0,
            })
        })
        .map_or((0, 0), |cur| (cur.fresh, cur.pool))
    }

    /// A grant of `n` more tokens usable before `deadline`: the deadline
    /// first, then the tokens.
    pub(crate) fn grant(&self, n: u64, deadline: u64) {
        self.deadline.fetch_max(deadline, Ordering::AcqRel);
        self.change(|cur| {
            Some(Word {
                pool: (cur.pool + n).min(COUNT_MASK),
                ..cur
            })
        });
    }

    /// The lease is gone (settled at its expiry): a new generation with
    /// nothing in it, then no deadline. What the pool had (stranded).
    pub(crate) fn strand(&self) -> u64 {
        let cur = self.change(|cur| {
            Some(Word {
                generation: (cur.generation + 1) & 0xffff,
                pool: 0,
                #[cfg(not(pace_mutant = "lease_fresh_across_leases"))]
                fresh: 0,
                // Known-wrong: the old lease's fresh tokens stay, to be
                // reported for the new one.
                #[cfg(pace_mutant = "lease_fresh_across_leases")]
                fresh: cur.fresh,
            })
        });
        self.deadline.store(0, Ordering::Release);
        cur.map_or(0, |cur| cur.pool)
    }
}
