//! A limiter's default quota, replaceable while reserves run.
//!
//! The quota lives in its own heap cell behind an epoch-managed pointer: a
//! reserve (already pinned for its table lookup) loads the pointer once and
//! decides with the one quota it points to, so it never sees half of an old
//! quota and half of a new one. A replacement swaps the pointer and retires
//! the old cell through the epoch. No lock is taken on either side.

use crate::rate::Quota;
use crate::sync::epoch::{Atomic, Guard, Owned};
use crate::sync::Ordering;

/// The default quota of a limiter (the quota a plain `reserve` uses).
pub(crate) struct QuotaCell {
    current: Atomic<Quota>,
}

impl QuotaCell {
    pub(crate) fn new(quota: Quota) -> QuotaCell {
        QuotaCell {
            current: Atomic::new(quota),
        }
    }

    /// The quota in force, valid while `guard` is pinned.
    #[inline]
    pub(crate) fn load<'g>(&self, guard: &'g Guard) -> &'g Quota {
        let p = self.current.load(Ordering::Acquire, guard);
        // SAFETY: `current` is never null (set in `new`, replaced only by
        // `store` with a fresh non-null box). A cell is freed only by
        // `store`'s `defer_destroy`, which runs after every guard pinned
        // before the swap (such as `guard`, if it loaded the old pointer) is
        // dropped, or by `drop`, which has `&mut self`, so no `&self` borrow
        // (and no reference loaded through one) is alive then.
        unsafe { p.deref() }
    }

    /// Replaces the quota; reserves that loaded the old one finish with it.
    pub(crate) fn store(&self, quota: Quota, guard: &Guard) {
        let old = self
            .current
            .swap(Owned::new(quota), Ordering::AcqRel, guard);
        // SAFETY: `old` was the cell's pointer until the swap above unlinked
        // it, so no thread can load it from now on; threads that loaded it
        // before are pinned, and the destruction waits for them. Each pointer
        // is swapped out once, so it is retired once.
        unsafe { guard.defer_destroy(old) };
    }
}

impl Drop for QuotaCell {
    fn drop(&mut self) {
        // SAFETY: `&mut self` means no other thread holds a reference into
        // the cell or can load it any more; the pointer is non-null and owned
        // by the cell (old ones were retired by `store`), so it is freed once.
        unsafe {
            let guard = crate::sync::epoch::unprotected();
            drop(self.current.load(Ordering::Relaxed, guard).into_owned());
        }
    }
}
