//! Records: a held row's state that does not fit inline, behind an
//! immutable box named by the word's `tat` field, and the per-thread pool
//! they are taken from.

use super::{Held, DORMANT, HELD};

/// A record of `state` (the inline form's fallback), as a `tat` field:
/// `HELD` plus its address, owned by the caller until a CAS publishes it
/// ([`free`] it otherwise).
#[cold]
#[inline(never)]
pub(super) fn publish(state: Held) -> u64 {
    let addr = Box::into_raw(pool::take(state)).expose_provenance() as u64;
    debug_assert!(
        addr < DORMANT - HELD,
        "a record's address fits below the dormant fields"
    );
    HELD + addr
}

/// Frees the record named by the `tat` field `field`, if it names one.
///
/// # Safety
/// `field` came from [`Held::publish`], and the record is in no cell a
/// reader can reach (never published, or replaced and past every guard
/// that could read it), freed once.
pub(crate) unsafe fn free(field: u64) {
    if let Some(addr) = address(field) {
        // SAFETY: the caller's contract.
        unsafe { free_at(addr) };
    }
}

/// The address of the record a `tat` field names, if it names one: what a
/// retirement keeps (a plain address, which a conservative leak checker
/// scanning the collector's garbage recognises).
pub(crate) fn address(field: u64) -> Option<u64> {
    (HELD..DORMANT).contains(&field).then(|| field - HELD)
}

/// Frees the record at `addr` ([`address`] of a published field).
///
/// # Safety
/// As for [`free`].
pub(crate) unsafe fn free_at(addr: u64) {
    let p = std::ptr::with_exposed_provenance_mut::<Held>(addr as usize);
    // SAFETY: the caller's contract; `publish` made it with `Box::into_raw`.
    pool::give(unsafe { Box::from_raw(p) });
}

/// Records a thread keeps for its next holds, so that a hold whose record
/// is freed by the time the next one comes allocates nothing: a freed
/// record goes to the pool of the thread that frees it (the one whose pin
/// runs the epoch's deferred frees), up to [`pool::KEPT`] of them, and
/// [`publish`](Held::publish) takes one from its thread's pool before it
/// allocates. A pooled record is reused only after it was freed, that is
/// after every guard that could read it; that is when the allocator could
/// hand its memory out again too. Records in a pool are freed when their
/// thread exits. (Under loom every record comes from the allocator.)
#[cfg(not(loom))]
mod pool {
    use super::Held;
    use std::cell::RefCell;

    /// Records kept per thread (40 bytes each): more than the collector
    /// frees in one batch, so that a steady stream of holds never runs dry.
    pub(super) const KEPT: usize = 128;
    const _: () = assert!(std::mem::size_of::<Held>() == 40);

    std::thread_local! {
        // The boxes are the records: their addresses are what rows name.
        #[allow(clippy::vec_box)]
        static FREE: RefCell<Vec<Box<Held>>> = const { RefCell::new(Vec::new()) };
    }

    /// A box holding `h`: a pooled one if the thread has one.
    #[inline]
    pub(super) fn take(h: Held) -> Box<Held> {
        let pooled = FREE
            .try_with(|f| f.try_borrow_mut().ok().and_then(|mut f| f.pop()))
            .ok()
            .flatten();
        match pooled {
            Some(mut b) => {
                *b = h;
                b
            }
            None => Box::new(h),
        }
    }

    /// Pools `b`, or frees it when the pool is full (or the thread's
    /// storage is gone: a deferred free run while the thread exits).
    #[inline]
    pub(super) fn give(b: Box<Held>) {
        let mut b = Some(b);
        let _ = FREE.try_with(|f| {
            if let Ok(mut f) = f.try_borrow_mut() {
                if f.len() < KEPT {
                    if f.capacity() == 0 {
                        f.reserve_exact(KEPT);
                    }
                    f.extend(b.take());
                }
            }
        });
    }
}

#[cfg(loom)]
mod pool {
    use super::Held;

    pub(super) fn take(h: Held) -> Box<Held> {
        Box::new(h)
    }

    pub(super) fn give(b: Box<Held>) {
        drop(b);
    }
}
