//! Floors: what a row created now must assume about its key's past.
//!
//! A removed row is a full bucket, but only by the remover's clock reading;
//! a thread that read an earlier time and is about to create the key's row
//! again must not start from an empty debt. So every removal first raises the
//! floor of the key's stripe to the removed row's own `tat` (never to the
//! remover's reading), and a row that was never debited starts from the floor
//! of its stripe instead of 0. A fresh row is thereby never below any earlier
//! row of its key, which is all DESIGN.md's over-admission argument needs.
//!
//! Floors are striped so that one key's removal delays no other key unless
//! they share a stripe and the creator's clock reading is older than that
//! removed `tat`: with a sane clock a swept row's `tat` lies in the past, so
//! new keys are not delayed. A key's stripe is any function of the key that
//! every remover and creator of its rows computes alike: for boxed keys the
//! top bits of the key's hash (which the box keeps), for word-sized keys in
//! cells a multiply-shift of the key's own bits under a random odd
//! multiplier drawn per table ([`Floors::of_word`]), so that a sweep, which
//! reads only the bits from a cell, removes a row without hashing its key.

use crate::sync::{AtomicU64, Ordering};

/// Stripes per table (a power of two). Loom models use few so that a
/// collision between their keys is exercised.
#[cfg(not(loom))]
const STRIPES: usize = 1024;
#[cfg(loom)]
const STRIPES: usize = 2;

/// The largest removed `tat` of each stripe of keys.
pub(crate) struct Floors {
    stripes: Box<[AtomicU64]>,
    /// The odd multiplier of [`Floors::of_word`].
    mul: u64,
    /// Marks of keys whose rows a sweep removed lately, one per slot of a
    /// small direct-mapped array ([`Floors::remember`]): a new row of a key
    /// found here is a client coming back (`Table::returning`).
    recent: Box<[std::sync::atomic::AtomicU64]>,
}

/// Slots of [`Floors::recent`] (a power of two): 16 KiB.
#[cfg(not(loom))]
const RECENT: usize = 2048;
#[cfg(loom)]
const RECENT: usize = 2;

/// Bits of a stripe's index.
const STRIPE_BITS: u32 = STRIPES.trailing_zeros();

impl Floors {
    pub(crate) fn new() -> Floors {
        Floors {
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            mul: stripe_multiplier(),
            recent: (0..RECENT)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        }
    }

    /// A key's mark for [`remember`](Floors::remember): the hash its box
    /// keeps, or a word key's bits mixed by the table's multiplier.
    #[inline]
    pub(crate) fn mark(&self, boxed: bool, hash: u64, bits: u64) -> u64 {
        if boxed {
            hash
        } else {
            bits.wrapping_mul(self.mul)
        }
    }

    /// A sweep removed the row of the key of mark `mark`.
    #[inline]
    pub(crate) fn remember(&self, mark: u64) {
        if let Some(slot) = sampled(mark) {
            self.recent[slot].store(mark | 1, Ordering::Relaxed);
        }
    }

    /// Whether the key of mark `mark`, making a row, had one removed lately
    /// (or shares its slot and 31 more bits with such a key). Only one key
    /// in [`SAMPLE`] is remembered: each return found stands for `SAMPLE`.
    #[inline]
    pub(crate) fn returned(&self, mark: u64) -> bool {
        sampled(mark).is_some_and(|slot| self.recent[slot].load(Ordering::Relaxed) == mark | 1)
    }

    /// The stripe of a boxed key with this hash: the hash's top bits (the
    /// table indexes cells with its low bits).
    #[inline]
    pub(crate) fn of_hash(hash: u64) -> usize {
        (hash >> (64 - STRIPE_BITS)) as usize
    }

    /// The stripe of a word-sized key held in cells by its bits: the top
    /// bits of their product with the table's random odd multiplier, which
    /// callers who choose keys cannot predict (a multiply-shift hash).
    #[inline]
    pub(crate) fn of_word(&self, bits: u64) -> usize {
        (bits.wrapping_mul(self.mul) >> (64 - STRIPE_BITS)) as usize
    }

    /// The floor a fresh row of a key in `stripe` starts from.
    #[cfg(not(pace_mutant = "fresh_row_from_zero"))]
    #[inline]
    pub(crate) fn get(&self, stripe: usize) -> u64 {
        // Acquire is enough: the caller reached this point through the
        // release CAS that removed the row (its cell a tombstone), which the
        // raise precedes.
        self.stripes[stripe].load(Ordering::Acquire)
    }

    /// Known-wrong variant `fresh_row_from_zero`: a fresh row forgets every
    /// removed row's debt.
    #[cfg(pace_mutant = "fresh_row_from_zero")]
    #[inline]
    pub(crate) fn get(&self, _stripe: usize) -> u64 {
        0
    }

    /// Raises the floor of a row that a refund fills before it removes the
    /// row, so that a stale reserve starts a fresh row from it.
    #[cfg(not(pace_mutant = "refund_keeps_floor"))]
    #[inline]
    pub(crate) fn raise_refunded(&self, stripe: usize, tat: u64) {
        self.raise(stripe, tat);
    }

    /// Known-wrong variant `refund_keeps_floor`: a refund that fills a row
    /// removes it without raising its floor.
    #[cfg(pace_mutant = "refund_keeps_floor")]
    pub(crate) fn raise_refunded(&self, _: usize, _: u64) {}

    /// Raises the floor of `stripe` to `tat`. Called before the row is
    /// removed, so whoever finds the row gone also finds the floor.
    #[inline]
    pub(crate) fn raise(&self, stripe: usize, tat: u64) {
        let s = &self.stripes[stripe];
        if s.load(Ordering::Acquire) < tat {
            s.fetch_max(tat, Ordering::AcqRel);
        }
    }

    /// The highest floor of any stripe (a scan of every stripe).
    pub(crate) fn highest(&self) -> u64 {
        (0..STRIPES).map(|s| self.get(s)).max().unwrap_or(0)
    }

    /// Bytes held by the floors.
    pub(crate) fn bytes(&self) -> usize {
        (STRIPES + RECENT) * std::mem::size_of::<AtomicU64>()
    }
}

/// One key in this many is remembered ([`Floors::remember`]): the marks a
/// working set of `n` clients leaves between two visits of one of them
/// are `n / SAMPLE`, so the slots keep many of them across a return
/// period of thousands of removals (a full array of removals between a
/// client's visits would overwrite every mark).
#[cfg(not(loom))]
pub(crate) const SAMPLE: usize = 8;
#[cfg(loom)]
pub(crate) const SAMPLE: usize = 1;

/// The slot of [`Floors::recent`] of a sampled mark ([`SAMPLE`]), `None`
/// for a mark not sampled: the mark folded and multiplied again (a word
/// key's mark is one multiply-shift product, whose top bits alone repeat
/// for keys in arithmetic sequence), its top bits the slot, lower ones the
/// sample.
#[inline]
fn sampled(mark: u64) -> Option<usize> {
    let m = (mark ^ (mark >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((m >> 20) as usize).is_multiple_of(SAMPLE).then(|| (m >> (64 - RECENT.trailing_zeros())) as usize)
}

/// A random odd multiplier for [`Floors::of_word`], from the standard
/// library's randomly keyed hasher. Loom models take a fixed one, 1: an
/// execution must replay the same way, and a model's keys (hashed to
/// themselves) then share a stripe exactly when their hashes do, as the
/// models choose their keys (`loom-tests/tests/cells.rs`: a new key in the
/// other stripe than the keys a copier removes).
#[cfg(not(loom))]
fn stripe_multiplier() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(STRIPES) | 1
}

#[cfg(loom)]
fn stripe_multiplier() -> u64 {
    1
}
