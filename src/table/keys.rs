//! How a cell's key half names its key: the key's own bits for word-sized
//! keys hashed by a hasher that cannot panic (`words.rs`), otherwise a
//! tagged pointer to an immutable boxed copy of the key and its hash
//! ([`KeyBox`]). Every dereference of a key pointer happens here
//! ([`box_ref`]), and every lookup goes through one [`Probe`].
//!
//! # A box's lifetime
//! A box is made by its inserter before it claims a cell and is published
//! by the claim. From then on any reader pinned before the box leaves the
//! table may hold its address, so it is only ever freed through the epoch:
//!
//! * a claim that does not become the row (withdrawn, or frozen by a
//!   copier) is retired by its inserter;
//! * a row's box is retired by whoever removes the row (a sweep or a
//!   refund to full), and rows are removed only from the array that is
//!   current at the time: the arrays before it were unpublished first, so
//!   no reader that pins after the removal can reach a cell of theirs
//!   (`Moved`, or `FrozenLive` between a copy and its `Moved`) that still
//!   names the box;
//! * a migration moves the address, never the box: the target's row owns it
//!   from the moment it is placed;
//! * the table's `Drop` frees the boxes of the rows still live.
//!
//! Readers dereference a key's address only in the states that name a box
//! that is alive for as long as they stay pinned: `Claimed`, `Live`,
//! `FrozenLive` and `Moved`. A `FrozenClaimed` cell names a box its
//! inserter retires as soon as it sees the freeze, while the frozen value
//! stays readable in the old array: it is never dereferenced (nobody needs
//! its key: a frozen claim is no row).

use std::borrow::Borrow;
use std::marker::PhantomData;

use crate::sync::epoch::Guard;

/// A row's key when it does not fit in a cell: the hash first (`repr(C)`),
/// so that a copier and a sweep read it without knowing `K` and without
/// calling the caller's hasher, which may panic (DESIGN.md §6).
#[repr(C)]
pub(crate) struct KeyBox<K> {
    hash: u64,
    key: K,
}

/// Where a key's hash tag sits in the bits of a tagged box: the top 16 bits,
/// which the address of a box below 2^48 leaves clear. Bit 0 (a box is
/// 8-aligned) says whether a tag is there at all.
const TAG_SHIFT: u32 = 48;
const TAGGED: u64 = 1;
const ADDR: u64 = ((1 << TAG_SHIFT) - 1) & !7;

/// The bits a cell holds for a box at `addr` of a key with this hash.
#[inline]
fn bits_of(addr: usize, hash: u64) -> u64 {
    let addr = addr as u64;
    debug_assert_eq!(addr & 7, 0);
    if addr >> TAG_SHIFT == 0 {
        addr | (hash >> TAG_SHIFT << TAG_SHIFT) | TAGGED
    } else {
        addr
    }
}

/// The bits of the same box without its tag: what a retirement keeps, so
/// that a conservative leak checker (LeakSanitizer) scanning the collector's
/// garbage sees the box's address as it is.
#[inline]
pub(crate) fn untagged(bits: u64) -> u64 {
    addr_of(bits) as u64
}

/// The address of the box named by `bits`.
#[inline]
fn addr_of(bits: u64) -> usize {
    (if bits & TAGGED != 0 {
        bits & ADDR
    } else {
        bits
    }) as usize
}

/// Whether the tag of `bits` (if it has one) allows the key of `hash`: a
/// probe compares tags before it dereferences, so a cell of another key
/// costs no cache miss but once in 65,536.
#[inline(always)]
fn tag_allows(bits: u64, hash: u64) -> bool {
    bits & TAGGED == 0 || (bits ^ hash) >> TAG_SHIFT == 0
}

/// The box named by `bits`.
///
/// # Safety
/// `bits` is the key half of a cell of one of this table's arrays, read
/// under `guard` in a state that names a live box (`Claimed`, `Live`,
/// `FrozenLive`, `Moved`; never `FrozenClaimed`: see the module docs), of a
/// table whose boxes hold `K`s.
#[inline]
unsafe fn box_ref<K>(bits: u64, _guard: &Guard) -> &KeyBox<K> {
    let p = std::ptr::with_exposed_provenance::<KeyBox<K>>(addr_of(bits));
    // SAFETY: the caller's contract: the box was made by `Box::into_raw`
    // in `make_box` (its address exposed there), is retired only through
    // the epoch after it left every cell a reader pinning later can reach,
    // and `guard` was pinned before the cell was read.
    unsafe { &*p }
}

/// The hash kept in the box named by `bits`.
///
/// # Safety
/// As for [`box_ref`], for a box of any key type (the hash comes first in
/// every `KeyBox`).
#[inline]
pub(crate) unsafe fn hash_in_box(bits: u64, guard: &Guard) -> u64 {
    // SAFETY: the caller's contract; `KeyBox` is `repr(C)` with the hash
    // first, so reading it as a `KeyBox<()>` reads the same field whatever
    // the key type.
    unsafe { box_ref::<()>(bits, guard) }.hash
}

/// The key kept in the box named by `bits`.
///
/// # Safety
/// As for [`box_ref`].
#[cfg(feature = "__internals")]
pub(crate) unsafe fn key_in_box<K>(bits: u64, guard: &Guard) -> &K {
    // SAFETY: the caller's contract.
    &unsafe { box_ref::<K>(bits, guard) }.key
}

/// Frees the box named by `bits` (a `KeyBox<K>`). A panicking `Drop` of the
/// key is caught: it must not unwind through the collector, or through a
/// table's `Drop` before it has freed the other rows.
///
/// # Safety
/// `bits` names a box made by [`make_box`] for `K` that no cell a reader
/// can reach names any more (or whose readers are all gone), freed once.
pub(crate) unsafe fn free_box<K>(bits: u64) {
    let p = std::ptr::with_exposed_provenance_mut::<KeyBox<K>>(addr_of(bits));
    // SAFETY: the caller's contract; the box came from `Box::into_raw`.
    let owned = unsafe { Box::from_raw(p) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(owned)));
}

/// Boxes a copy of a key with its hash: the bits its claim publishes. The
/// key's `Clone` runs here, before anything in the table changes, so one
/// that panics leaves the table as it was.
fn make_box<K>(key: K, hash: u64) -> u64 {
    let p = Box::into_raw(Box::new(KeyBox { hash, key }));
    bits_of(p.expose_provenance(), hash)
}

/// A key as a lookup sees it: which cells are its rows.
pub(crate) trait Probe {
    /// Whether the key half `bits` of a cell names this key.
    ///
    /// # Safety
    /// `bits` was read under the guard the probe was made with, from a cell
    /// of its table in a state that names a live key (`Claimed`, `Live`,
    /// `FrozenLive`, `Moved`).
    unsafe fn matches(&self, bits: u64) -> bool;

    /// A word-sized key's own bits, which its cells hold (its floor's stripe
    /// comes from them), when the probe has them: `None` for a boxed key
    /// (its stripe comes from its hash) and for a borrowed form of a
    /// word-sized key other than the key's own type.
    fn word(&self) -> Option<u64>;
}

/// A key an insert can make a row of.
pub(crate) trait NewRow: Probe {
    /// The bits of a new row of this key (for a boxed key, a new box: if
    /// the claim that publishes them does not become the row, the table
    /// retires it, and frees it at once if it was never published).
    fn make(&self) -> u64;
}

/// A word-sized key given as its own type: its bits.
pub(crate) struct Bits(pub(crate) u64);

impl Probe for Bits {
    #[inline(always)]
    unsafe fn matches(&self, bits: u64) -> bool {
        bits == self.0
    }

    #[inline(always)]
    fn word(&self) -> Option<u64> {
        Some(self.0)
    }
}

impl NewRow for Bits {
    #[inline]
    fn make(&self) -> u64 {
        self.0
    }
}

/// A boxed key, given as any borrowed form `Q` of `K`.
pub(crate) struct Boxed<'a, K, Q: ?Sized> {
    hash: u64,
    key: &'a Q,
    guard: &'a Guard,
    _keys: PhantomData<fn() -> K>,
}

impl<'a, K, Q: ?Sized> Boxed<'a, K, Q> {
    /// The probe of `key`, whose hash is `hash`, for a walk under `guard`.
    #[inline]
    pub(crate) fn new(key: &'a Q, hash: u64, guard: &'a Guard) -> Self {
        Boxed {
            hash,
            key,
            guard,
            _keys: PhantomData,
        }
    }
}

impl<K, Q> Probe for Boxed<'_, K, Q>
where
    K: Borrow<Q>,
    Q: ?Sized + Eq,
{
    #[inline(always)]
    unsafe fn matches(&self, bits: u64) -> bool {
        if !tag_allows(bits, self.hash) {
            return false;
        }
        // SAFETY: the caller's contract is `box_ref`'s.
        let b = unsafe { box_ref::<K>(bits, self.guard) };
        b.hash == self.hash && b.key.borrow() == self.key
    }

    #[inline(always)]
    fn word(&self) -> Option<u64> {
        None
    }
}

impl<K, Q> NewRow for Boxed<'_, K, Q>
where
    K: Borrow<Q>,
    Q: ?Sized + Eq + ToOwned<Owned = K>,
{
    fn make(&self) -> u64 {
        make_box(self.key.to_owned(), self.hash)
    }
}

/// What a limiter holding boxed `K`s owns, for the compiler: `K`s shared
/// between threads (compared by any caller, dropped by whichever thread
/// collects them) make the limiter `Send` and `Sync` only when `K` is both,
/// and its drop drops `K`s.
pub(crate) type Owns<K> = PhantomData<(K, crate::sync::epoch::Atomic<KeyBox<K>>)>;

/// How a table's cells hold keys: made by [`inline`] or [`boxed`], so that
/// a table's free function always matches the type its boxes hold.
#[derive(Clone, Copy)]
pub(crate) struct KeyKind {
    /// `None` for keys' own bits, else the free function of the boxes.
    pub(super) free: Option<unsafe fn(u64)>,
    /// The type the boxes hold (for the `internals` key listing).
    #[cfg(feature = "__internals")]
    pub(super) key_type: std::any::TypeId,
}

/// Cells hold the keys' own bits.
pub(crate) fn inline() -> KeyKind {
    KeyKind {
        free: None,
        #[cfg(feature = "__internals")]
        key_type: std::any::TypeId::of::<()>(),
    }
}

/// Cells hold boxed `K`s.
pub(crate) fn boxed<K>() -> KeyKind {
    KeyKind {
        free: Some(free_box::<K>),
        #[cfg(feature = "__internals")]
        key_type: typeid::of::<K>(),
    }
}

/// Bytes of one key box of `K` (not what the key owns on the heap).
pub(crate) fn box_bytes<K>() -> usize {
    std::mem::size_of::<KeyBox<K>>()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bits_name_their_box_and_carry_the_tag() {
        for hash in [0u64, 1, u64::MAX, 0xABCD_0000_0000_1234] {
            let bits = make_box(String::from("k"), hash);
            assert_ne!(bits, 0, "a box is never the all-zero key half");
            assert!(tag_allows(bits, hash));
            assert!(!tag_allows(bits, hash ^ (1 << 63)) || bits & TAGGED == 0);
            let guard = crate::sync::epoch::pin();
            // SAFETY: just made, never published, freed below.
            assert_eq!(unsafe { hash_in_box(bits, &guard) }, hash);
            // SAFETY: made above for a `String`, freed once.
            unsafe { free_box::<String>(bits) };
        }
    }

    #[test]
    fn an_address_above_the_tag_bits_has_no_tag() {
        let bits = bits_of(1 << 50, 7);
        assert_eq!(bits & TAGGED, 0);
        assert_eq!(addr_of(bits), 1 << 50);
        assert!(tag_allows(bits, 12345));
        let tagged = bits_of(0x1000, 0xFFFF_0000_0000_0000);
        assert_eq!(addr_of(tagged), 0x1000);
        assert!(tag_allows(tagged, 0xFFFF_1111_2222_3333));
        assert!(!tag_allows(tagged, 0x7FFF_0000_0000_0000));
    }
}
