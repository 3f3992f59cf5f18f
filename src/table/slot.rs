//! Every encoding of the table in one place: the row (an [`Entry`] holding
//! its bucket word), the slot word (what a slot of an array points at), the
//! array, and the one probe sequence that every caller walks.
//!
//! # The slot word
//!
//! A slot is one pointer-sized atomic: an entry pointer with, on 64-bit
//! targets, a 16-bit tag of the key's hash in its top bits (so a probe skips
//! other keys' rows without dereferencing them). Its states, decoded by
//! [`State`]:
//!
//! ```text
//! Vacant (null) --insert--> Row(e) --unlink (e's word is DEAD)--> Tombstone
//!      \                       \--copy: mark--> Copying(e) --moved--> Closed
//!       \--migration closes it--> Sealed
//! Vacant (target) --copy: link marked--> Copying(e) --arrived--> Row(e)
//! Tombstone --insert (reuse)--> Row(e)
//! Tombstone --migration closes it--> Closed
//! Tombstone --clean (next slot Fence)--> Vacant
//! Vacant --clean--> Fence --clean--> Vacant
//! ```
//!
//! A `Tombstone` is reusable: an insert may link a new row there instead of
//! at the end of its key's sequence, so a steady flood of new keys at a
//! steady number of live rows keeps the array at its size. A `Closed` slot
//! is a tombstone of an array under migration: nothing links there again
//! (the copier closes every tombstone of its chunk, so no row can be linked
//! behind it into a slot it already passed). Lookups pass over both.
//!
//! `Copying(e)` is `e` with the low tag bit set: only the copier of a
//! migration chunk moves it on, and an unlinker (whose CAS expects the
//! untagged `e`) cannot take an entry away from a copier that is linking it
//! into the next array. The copier links `e` into the target marked too,
//! closes the old slot, and only then unmarks it in the target: so `e` is
//! linked unmarked in at most one slot, and never while another slot still
//! links it. Whoever unlinks an entry (a CAS that expects it unmarked) has
//! therefore removed its last link, and may retire it: a reader that pins
//! afterwards cannot reach it.
//!
//! # The row word
//!
//! A row's bucket word (`tat`) lives in its [`Entry`], not in the slot, so a
//! migration moves pointers and never copies words: a debit lands on the same
//! atomic whichever array it found the entry in. A new row is linked with
//! the word [`CLAIMED`] (its key may have a row elsewhere: its inserter
//! checks, see `Table::verify`), which becomes 0 (never debited: starts from
//! its floor) or DEAD (the inserter withdraws), then live `tat`s, then
//! [`DEAD`] (removed, entered only from a full bucket or from CLAIMED, never
//! left).

use std::marker::PhantomData;
use std::ptr;

use crossbeam_utils::CachePadded;

use crate::bucket::MAX_TIME;
use crate::sync::epoch::Atomic;
use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// The word of a removed row: above every live `tat`.
pub(crate) const DEAD: u64 = MAX_TIME + 1;

/// The word of a row whose inserter has not yet checked that its key has no
/// other row: no debit, refund or sweep acts on it.
pub(crate) const CLAIMED: u64 = MAX_TIME + 2;

/// Slots of a migration chunk, the unit a copier claims; a call copies one,
/// or more while they are sparse (see [`CALL_SLOTS`]). Loom models copy 2
/// slots at a time, so a 4-slot array migrates over calls.
#[cfg(not(loom))]
pub(crate) const CHUNK: usize = 64;
#[cfg(loom)]
pub(crate) const CHUNK: usize = 2;

/// The most slots one call copies: a call copies chunks until it has
/// copied [`SPARSE_ROWS`] rows or scanned this many slots, so a sparse array
/// (a shrink) migrates in `slots / CALL_SLOTS` calls while a dense one
/// (growth) copies one chunk per call. Loom models copy one chunk per call.
#[cfg(not(loom))]
pub(crate) const CALL_SLOTS: usize = 1024;
#[cfg(loom)]
pub(crate) const CALL_SLOTS: usize = CHUNK;

/// Rows after which a call copies no further chunk: a call copies fewer than
/// `SPARSE_ROWS + CHUNK` rows.
pub(crate) const SPARSE_ROWS: usize = 16;

/// `sweep_next` when no pass is running. Far above any array length, and far
/// below `usize::MAX`, so that late `fetch_add`s cannot wrap it.
pub(crate) const SWEEP_IDLE: usize = usize::MAX / 2;

/// A row: its bucket word, the key and the key's hash.
pub(crate) struct Entry<K> {
    pub(crate) word: AtomicU64,
    pub(crate) hash: u64,
    pub(crate) key: K,
}

/// Tag bit on an entry pointer: the row is being copied to the next array.
const COPYING: usize = 1;
/// Address of the tombstone marker (never dereferenced).
const TOMBSTONE: usize = 1;
/// Address of the sealed marker (never dereferenced).
const SEALED: usize = 2;
/// Address of the closed-tombstone marker (never dereferenced).
const CLOSED: usize = 3;
/// Address of the fence marker (never dereferenced).
const FENCE: usize = 4;
/// Where the key's hash tag sits in a slot word (64-bit targets): the top 16
/// bits, which user-space pointers leave clear. A probe compares tags before
/// it dereferences an entry, so a slot of another key costs no cache miss
/// (unless the 16 bits collide: 1 in 32,768).
#[cfg(target_pointer_width = "64")]
const TAG_SHIFT: u32 = 48;

/// The tag a key with this hash carries in its slot: never 0 (0 means "no
/// tag": an entry whose address does not fit below the tag bits).
#[inline]
fn tag_of(hash: u64, p: usize) -> usize {
    #[cfg(target_pointer_width = "64")]
    {
        if p >> TAG_SHIFT == 0 {
            return (((hash >> TAG_SHIFT) as usize) | 1) << TAG_SHIFT;
        }
    }
    let _ = (hash, p);
    0
}

/// The tag bits of a slot word.
#[inline]
fn tag_bits(raw: usize) -> usize {
    #[cfg(target_pointer_width = "64")]
    {
        raw & !((1usize << TAG_SHIFT) - 1)
    }
    #[cfg(not(target_pointer_width = "64"))]
    {
        let _ = raw;
        0
    }
}

/// A decoded slot word. Entry pointers are untagged.
pub(crate) enum State<K> {
    Vacant,
    /// A reusable tombstone.
    Tombstone,
    /// A tombstone of a migrating array: never reused.
    Closed,
    Sealed,
    /// A vacant slot held for a moment by a cleaner (see `clean.rs`): ends
    /// every sequence as a vacant slot does, but nothing links there.
    Fence,
    /// A linked row.
    Row(*mut Entry<K>),
    /// A linked row that a migration copier is moving to the next array.
    Copying(*mut Entry<K>),
    /// A linked row whose hash tag differs from the probed key's (only from
    /// [`Slot::load_for`]).
    Other,
}

/// One slot: a tagged entry pointer. `repr(transparent)` so that an array of
/// them can be allocated zeroed (all vacant).
#[repr(transparent)]
pub(crate) struct Slot<K>(AtomicPtr<Entry<K>>);

impl<K> Slot<K> {
    #[inline]
    pub(crate) fn load(&self) -> State<K> {
        decode(self.0.load(Ordering::Acquire))
    }

    /// As [`load`](Slot::load), but a row whose tag says it is not a key
    /// with `hash` is [`State::Other`], without dereferencing anything.
    #[inline]
    pub(crate) fn load_for(&self, hash: u64) -> State<K> {
        let raw = self.0.load(Ordering::Acquire);
        let tag = tag_bits(raw as usize);
        if tag != 0 && tag != tag_of(hash, 0) {
            return State::Other;
        }
        decode(raw)
    }

    /// Links a new row (of a key with `hash`) into a vacant slot.
    #[inline]
    pub(crate) fn link(&self, e: *mut Entry<K>, hash: u64) -> bool {
        self.cas(ptr::null_mut(), row(e, hash))
    }

    /// Links a new row (of a key with `hash`) into a reusable tombstone.
    #[inline]
    pub(crate) fn reuse(&self, e: *mut Entry<K>, hash: u64) -> bool {
        self.cas(marker(TOMBSTONE), row(e, hash))
    }

    /// Closes a tombstone for a migration.
    #[inline]
    pub(crate) fn close(&self) -> bool {
        self.cas(marker(TOMBSTONE), marker(CLOSED))
    }

    /// Fences a vacant slot (a cleaner is about to vacate the slot before).
    #[inline]
    pub(crate) fn fence(&self) -> bool {
        self.cas(ptr::null_mut(), marker(FENCE))
    }

    /// Lifts a fence: the slot is vacant again.
    #[inline]
    pub(crate) fn unfence(&self) {
        let done = self.cas(marker(FENCE), ptr::null_mut());
        debug_assert!(done, "only the cleaner that fenced a slot lifts it");
    }

    /// Turns a tombstone back into a vacant slot (its successor is fenced).
    #[inline]
    pub(crate) fn vacate(&self) -> bool {
        self.cas(marker(TOMBSTONE), ptr::null_mut())
    }

    /// Closes a vacant slot for a migration.
    #[inline]
    pub(crate) fn seal(&self) -> bool {
        self.cas(ptr::null_mut(), marker(SEALED))
    }

    /// Replaces row `e` (unmarked) by a tombstone.
    #[inline]
    pub(crate) fn unlink(&self, e: *mut Entry<K>, hash: u64) -> bool {
        self.cas(row(e, hash), marker(TOMBSTONE))
    }

    /// Marks row `e` as being copied (see the module docs).
    #[inline]
    pub(crate) fn mark_copying(&self, e: *mut Entry<K>, hash: u64) -> bool {
        let r = row(e, hash);
        self.cas(r, r.wrapping_byte_add(COPYING))
    }

    /// Ends the copy of `e`: the slot becomes a closed tombstone. A slot
    /// marked `Copying` belongs to its copier (every other write is a CAS
    /// that expects another state), so this is a plain store.
    #[inline]
    pub(crate) fn moved(&self, e: *mut Entry<K>) {
        self.copier_store(e, marker(CLOSED));
    }

    /// Links row `e`, which a copier is moving here, into a vacant slot of
    /// a migration target, marked `Copying` until [`arrived`](Slot::arrived):
    /// while the old array still links `e` (marked), nobody can unlink it
    /// here, so an unlinked entry is linked nowhere else.
    #[inline]
    pub(crate) fn link_copying(&self, e: *mut Entry<K>, hash: u64) -> bool {
        self.cas(ptr::null_mut(), row(e, hash).wrapping_byte_add(COPYING))
    }

    /// Unmarks row `e` in the target once its old slot is closed: a plain
    /// store, as in [`moved`](Slot::moved).
    #[inline]
    pub(crate) fn arrived(&self, e: *mut Entry<K>, hash: u64) {
        self.copier_store(e, row(e, hash));
    }

    /// Replaces `Copying(e)`, which only its copier may change, by `new`.
    /// Release: a reader that loads `new` sees what the copier did before
    /// (the link into the target, before the old slot is closed).
    #[inline]
    fn copier_store(&self, e: *mut Entry<K>, new: *mut Entry<K>) {
        debug_assert!(
            matches!(self.load(), State::Copying(q) if q == e),
            "only the copier moves a copying slot on"
        );
        self.0.store(new, Ordering::Release);
    }

    #[inline]
    fn cas(&self, old: *mut Entry<K>, new: *mut Entry<K>) -> bool {
        self.0
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The untagged entry pointer, if the slot holds a row (for `Drop`).
    pub(crate) fn entry_unsync(&self) -> Option<*mut Entry<K>> {
        match decode(self.0.load(Ordering::Relaxed)) {
            State::Row(e) | State::Copying(e) => Some(e),
            _ => None,
        }
    }
}

#[inline]
fn marker<K>(addr: usize) -> *mut Entry<K> {
    // Never dereferenced: a marker compares by address only.
    addr as *mut Entry<K>
}

/// The slot word of row `e` of a key with `hash`: the pointer plus its tag
/// (pointer arithmetic keeps the entry's provenance).
#[inline]
fn row<K>(e: *mut Entry<K>, hash: u64) -> *mut Entry<K> {
    e.wrapping_byte_add(tag_of(hash, e as usize))
}

#[inline]
fn decode<K>(p: *mut Entry<K>) -> State<K> {
    match p as usize {
        0 => State::Vacant,
        TOMBSTONE => State::Tombstone,
        SEALED => State::Sealed,
        CLOSED => State::Closed,
        FENCE => State::Fence,
        a => {
            let e = p.wrapping_byte_sub(tag_bits(a) | (a & COPYING));
            if a & COPYING != 0 {
                State::Copying(e)
            } else {
                State::Row(e)
            }
        }
    }
}

/// The one probe sequence: linear from the hash's low bits, every slot once.
#[inline]
pub(crate) fn probe_seq(hash: u64, mask: usize) -> impl Iterator<Item = usize> {
    probe_seq_from(hash, mask, 0)
}

/// [`probe_seq`] without its first `skip` slots (a lookup that already
/// probed them).
#[inline]
pub(crate) fn probe_seq_from(hash: u64, mask: usize, skip: usize) -> impl Iterator<Item = usize> {
    let start = hash as usize & mask;
    (skip..=mask).map(move |i| (start + i) & mask)
}

/// One power-of-two array of slots plus its migration and sweep state.
pub(crate) struct Array<K> {
    pub(crate) slots: Box<[Slot<K>]>,
    /// Slots claimed in this array (rows, tombstones, claims in flight).
    pub(crate) used: CachePadded<AtomicUsize>,
    /// Claims allowed: `grow_at` once the array is the table's current
    /// array. While it is the target of a migration, `grow_at` less the rows
    /// counted when the migration started, raised by each chunk's copies as
    /// they are added to `used`: ordinary inserts keep the same room
    /// throughout, and the rows still to be copied always find theirs.
    pub(crate) limit: AtomicUsize,
    /// The migration target: null, null tagged PENDING, or the next array.
    pub(crate) next: Atomic<Array<K>>,
    /// Next chunk to copy.
    pub(crate) claim: AtomicUsize,
    /// Chunks copied.
    pub(crate) copied: AtomicUsize,
    /// Next slot of the running incremental sweep pass, or `SWEEP_IDLE`.
    pub(crate) sweep_next: CachePadded<AtomicUsize>,
    /// Next chunk to clean when the array meets its limit (see `clean.rs`).
    pub(crate) clean_next: AtomicUsize,
    _rows: PhantomData<Entry<K>>,
}

impl<K> Array<K> {
    /// An array of `slots` vacant slots; `copies` of them are kept for rows
    /// a migration will copy in.
    pub(crate) fn new(slots: usize, copies: usize) -> Array<K> {
        Array::with_slots(vacant_slots(slots), copies)
    }

    /// An array of `slots` vacant slots, or `None` if no array can have
    /// that many (see [`try_vacant_slots`]).
    pub(crate) fn try_new(slots: usize) -> Option<Array<K>> {
        try_vacant_slots(slots)
            .ok()
            .map(|s| Array::with_slots(s, 0))
    }

    fn with_slots(slots: Box<[Slot<K>]>, copies: usize) -> Array<K> {
        debug_assert!(slots.len().is_power_of_two());
        let grow_at = grow_at(slots.len());
        Array {
            slots,
            used: CachePadded::new(AtomicUsize::new(0)),
            limit: AtomicUsize::new(grow_at.saturating_sub(copies)),
            next: Atomic::null(),
            claim: AtomicUsize::new(0),
            copied: AtomicUsize::new(0),
            sweep_next: CachePadded::new(AtomicUsize::new(SWEEP_IDLE)),
            clean_next: AtomicUsize::new(0),
            _rows: PhantomData,
        }
    }

    #[inline]
    pub(crate) fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[inline]
    pub(crate) fn chunks(&self) -> usize {
        self.slots.len().div_ceil(CHUNK)
    }

    /// Claims allowed once this array is current.
    #[inline]
    pub(crate) fn grow_at(&self) -> usize {
        grow_at(self.slots.len())
    }
}

/// Claims allowed in an array of `slots` (3/4 of them), so vacant slots
/// always remain and every probe sequence ends.
#[inline]
pub(crate) fn grow_at(slots: usize) -> usize {
    slots - slots / 4
}

/// `n` vacant slots (for a migration target, whose size follows the rows:
/// a size that overflows panics, an allocator that refuses aborts, as for
/// any collection that grows).
fn vacant_slots<K>(n: usize) -> Box<[Slot<K>]> {
    match try_vacant_slots(n) {
        Ok(slots) => slots,
        #[cfg(not(loom))]
        Err(Some(layout)) => std::alloc::handle_alloc_error(layout),
        Err(_) => panic!("slot array size overflows"),
    }
}

/// `n` vacant slots, or why not: `Err(None)` if `n` slots do not fit a
/// layout, `Err(Some(layout))` if the allocator refused it. Outside loom the
/// memory comes zeroed from the allocator (a vacant slot is a null pointer),
/// so allocating a large migration target costs no pass over it: its pages
/// are touched by the copies that fill it.
#[cfg(not(loom))]
fn try_vacant_slots<K>(n: usize) -> Result<Box<[Slot<K>]>, Option<std::alloc::Layout>> {
    use std::alloc::{alloc_zeroed, Layout};
    let layout = Layout::array::<Slot<K>>(n).map_err(|_| None)?;
    if layout.size() == 0 {
        return Err(None);
    }
    // SAFETY: `layout` has a non-zero size (checked above).
    let p = unsafe { alloc_zeroed(layout) } as *mut Slot<K>;
    if p.is_null() {
        return Err(Some(layout));
    }
    // SAFETY: `p` points to `n` zeroed, properly aligned `Slot<K>`s allocated
    // by the global allocator with `Layout::array::<Slot<K>>(n)`, which is the
    // layout `Box<[Slot<K>]>` frees with. A `Slot` is a transparent
    // `AtomicPtr`, for which all-zero bytes are a valid null pointer.
    Ok(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(p, n)) })
}

/// Loom atomics cannot be made by zeroing memory: build each slot (models
/// use a handful).
#[cfg(loom)]
fn try_vacant_slots<K>(n: usize) -> Result<Box<[Slot<K>]>, Option<()>> {
    if n == 0 {
        return Err(None);
    }
    Ok((0..n)
        .map(|_| Slot(AtomicPtr::new(ptr::null_mut())))
        .collect())
}
