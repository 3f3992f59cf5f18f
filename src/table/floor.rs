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
//! Floors are striped by the top bits of the key's hash so that one key's
//! removal delays no other key unless they share a stripe and the creator's
//! clock reading is older than that removed `tat`: with a sane clock a swept
//! row's `tat` lies in the past, so new keys are not delayed.

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
}

impl Floors {
    pub(crate) fn new() -> Floors {
        Floors {
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The stripe of a key with this hash: the hash's top bits (the table
    /// indexes slots with its low bits).
    #[inline]
    pub(crate) fn stripe(hash: u64) -> usize {
        (hash >> (64 - STRIPES.trailing_zeros())) as usize
    }

    /// The floor a fresh row of a key with this hash starts from.
    #[cfg(not(pace_mutant = "fresh_row_from_zero"))]
    #[inline]
    pub(crate) fn get(&self, hash: u64) -> u64 {
        // Acquire is enough: the caller reached this point through the
        // release CAS that removed the row (its cell a tombstone), which the
        // raise precedes.
        self.stripes[Floors::stripe(hash)].load(Ordering::Acquire)
    }

    /// Known-wrong variant `fresh_row_from_zero`: a fresh row forgets every
    /// removed row's debt.
    #[cfg(pace_mutant = "fresh_row_from_zero")]
    #[inline]
    pub(crate) fn get(&self, _hash: u64) -> u64 {
        0
    }

    /// Raises the floor of a row that a refund fills before it removes the
    /// row, so that a stale reserve starts a fresh row from it.
    #[cfg(not(pace_mutant = "refund_keeps_floor"))]
    #[inline]
    pub(crate) fn raise_refunded(&self, hash: u64, tat: u64) {
        self.raise(hash, tat);
    }

    /// Known-wrong variant `refund_keeps_floor`: a refund that fills a row
    /// removes it without raising its floor.
    #[cfg(pace_mutant = "refund_keeps_floor")]
    pub(crate) fn raise_refunded(&self, _: u64, _: u64) {}

    /// Raises the floor of `hash`'s stripe to `tat`. Called before the row is
    /// removed, so whoever finds the row gone also finds the floor.
    #[inline]
    pub(crate) fn raise(&self, hash: u64, tat: u64) {
        let s = &self.stripes[Floors::stripe(hash)];
        if s.load(Ordering::Acquire) < tat {
            s.fetch_max(tat, Ordering::AcqRel);
        }
    }

    /// Bytes held by the floors.
    pub(crate) fn bytes(&self) -> usize {
        STRIPES * std::mem::size_of::<AtomicU64>()
    }
}
