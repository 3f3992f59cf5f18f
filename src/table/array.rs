//! The arrays of cells: their allocation, the key boxes they adopt, and
//! their retirement (frees of large arrays off the caller's path).

use crossbeam_utils::CachePadded;

use super::cell::{self, Cell};
use super::{grow_at, CHUNK, SWEEP_IDLE};
use crate::sync::epoch::{Atomic, Guard, Shared};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// One power-of-two array of cells and its migration state.
pub(super) struct Array {
    pub(super) cells: Box<[Cell]>,
    /// Cells not empty: rows, claims, tombstones, copies.
    pub(super) used: CachePadded<AtomicUsize>,
    /// Claims allowed (`grow_at`, less the rows a migration will copy in,
    /// raised as each chunk's copies arrive).
    pub(super) limit: AtomicUsize,
    /// The migration target: null, null tagged PENDING, or the next array.
    pub(super) next: Atomic<Array>,
    /// Next chunk to copy.
    pub(super) claim: AtomicUsize,
    /// Chunks copied.
    pub(super) copied: AtomicUsize,
    /// Next chunk to clean when the array meets its limit.
    pub(super) clean_next: AtomicUsize,
    /// Next cell of the running incremental sweep pass, or `SWEEP_IDLE`.
    pub(super) sweep_next: CachePadded<AtomicUsize>,
    /// Key boxes of rows removed from this array's migration target while
    /// this array was current: freed with this array (`keys.rs`).
    orphans: AtomicPtr<Orphan>,
    /// As a migration's target: whether it was sized for the dormant cells
    /// too, so that its copiers copy those within their retention (else
    /// they drop them all).
    pub(super) keeps_dormant: bool,
}

/// A key box or a held row's record waiting for the array it may still be
/// named in to go.
struct Orphan {
    bits: u64,
    free: unsafe fn(u64),
    pub(super) next: *mut Orphan,
}

impl Array {
    /// A migration target: an allocation failure aborts, as a `Vec`'s does.
    /// `huge`: see [`cell::empty_cells`].
    pub(super) fn new(n: usize, copies: usize, huge: bool) -> Array {
        Array::try_new(n, copies, huge).unwrap_or_else(|| {
            let layout = std::alloc::Layout::array::<Cell>(n)
                .unwrap_or_else(|_| std::alloc::Layout::new::<Cell>());
            std::alloc::handle_alloc_error(layout)
        })
    }

    pub(super) fn try_new(n: usize, copies: usize, huge: bool) -> Option<Array> {
        debug_assert!(n.is_power_of_two());
        Some(Array {
            cells: cell::empty_cells(n, huge)?,
            used: CachePadded::new(AtomicUsize::new(0)),
            limit: AtomicUsize::new(grow_at(n).saturating_sub(copies)),
            next: Atomic::null(),
            claim: AtomicUsize::new(0),
            copied: AtomicUsize::new(0),
            clean_next: AtomicUsize::new(0),
            sweep_next: CachePadded::new(AtomicUsize::new(SWEEP_IDLE)),
            orphans: AtomicPtr::new(std::ptr::null_mut()),
            keeps_dormant: false,
        })
    }

    /// Keeps the box or record named by `bits` until this array is freed,
    /// then frees it with `free`.
    pub(super) fn adopt(&self, bits: u64, free: unsafe fn(u64)) {
        let node = Box::into_raw(Box::new(Orphan {
            bits,
            free,
            next: std::ptr::null_mut(),
        }));
        let mut head = self.orphans.load(Ordering::Acquire);
        loop {
            // SAFETY: `node` is ours until the CAS below publishes it.
            unsafe { (*node).next = head };
            match self
                .orphans
                .compare_exchange(head, node, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Frees the adopted boxes and records (the array is being freed:
    /// nothing else reads the list).
    pub(super) fn free_orphans(&mut self) {
        let mut p = self.orphans.swap(std::ptr::null_mut(), Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: every node was made by `Box::into_raw` in `adopt` and
            // is owned by this list alone, which `&mut self` holds.
            let node = unsafe { Box::from_raw(p) };
            // SAFETY: an orphan left every array a reader can reach once
            // this array is gone (`keys.rs`, `held/`), and is freed once:
            // here, by the free function of its kind.
            unsafe { (node.free)(node.bits) };
            p = node.next;
        }
    }

    pub(super) fn mask(&self) -> usize {
        self.cells.len() - 1
    }

    pub(super) fn chunks(&self) -> usize {
        self.cells.len().div_ceil(CHUNK)
    }
}

/// Arrays of at least this many bytes are freed on a short-lived thread:
/// returning tens of MB to the kernel (munmap) takes milliseconds, which no
/// caller should pay for.
#[cfg(not(any(loom, miri)))]
const FREE_OFF_CALLER: usize = 1 << 20;

/// Large arrays whose free is running on a thread of its own.
#[cfg(not(any(loom, miri)))]
pub(crate) static FREES_IN_FLIGHT: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Hands an array unpublished from `current` to the collector and flushes
/// the thread's garbage, so that it is freed soon (a growing table retires
/// little else); a large array is freed off the caller's path
/// ([`free_cells`]).
///
/// # Safety
/// `arr` was unpublished from `current` (unreachable for new readers) and
/// is retired exactly once.
pub(super) unsafe fn retire_array(guard: &Guard, arr: Shared<'_, Array>) {
    let ptr = arr.as_raw() as usize;
    // SAFETY: the caller's contract; the closure rebuilds the `Box` (made by
    // `Owned::new`) once, after every guard that could see `arr` is gone.
    // The array owns no key box or record but its orphans (rows own theirs,
    // `keys.rs`, `held/`), freed with it.
    unsafe {
        guard.defer_unchecked(move || {
            let mut owned = Box::from_raw(ptr as *mut Array);
            owned.free_orphans();
            let cells = std::mem::take(&mut owned.cells);
            drop(owned);
            free_cells(cells);
        })
    };
    flush_retired(guard);
}

/// Hands a retired array to the collector at once, so that a growing table,
/// which retires little else, does not hold its old arrays until its
/// thread's garbage bag fills. Not under loom: when garbage is collected is
/// not what the models check, and the extra collector steps would multiply
/// their executions.
#[cfg(not(pace_mutant = "arrays_wait_for_a_full_bag"))]
#[inline]
fn flush_retired(guard: &Guard) {
    #[cfg(not(loom))]
    guard.flush();
    #[cfg(loom)]
    let _ = guard;
}

/// Known-wrong variant `arrays_wait_for_a_full_bag`: no flush after
/// retiring an array.
#[cfg(pace_mutant = "arrays_wait_for_a_full_bag")]
fn flush_retired(_: &Guard) {}

/// Frees a retired array's cells (atomics: nothing to drop): at once if
/// small, else on a new thread (or at once if no thread can be started).
fn free_cells(cells: Box<[Cell]>) {
    #[cfg(not(any(loom, miri)))]
    {
        let layout = std::alloc::Layout::for_value::<[Cell]>(&cells);
        if layout.size() >= FREE_OFF_CALLER {
            let p = Box::into_raw(cells) as *mut u8 as usize;
            FREES_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
            let free = move || {
                discard_pages(p, layout.size());
                // SAFETY: `p` is the box's allocation, made by the global
                // allocator with `layout` (what `Box<[Cell]>` frees with),
                // and freed exactly once: here, or below if the thread never
                // started. `Cell` has no drop glue, so freeing without
                // dropping the elements loses nothing.
                unsafe { std::alloc::dealloc(p as *mut u8, layout) };
                FREES_IN_FLIGHT.fetch_sub(1, Ordering::Release);
            };
            // Deferred frees can run anywhere a guard collects, even in a
            // thread-local destructor at thread exit: a spawn that panics
            // there (or fails) falls back to freeing here.
            let spawned = std::panic::catch_unwind(move || {
                std::thread::Builder::new()
                    .name("pace-free".into())
                    .stack_size(64 * 1024)
                    .spawn(free)
                    .is_ok()
            });
            if !matches!(spawned, Ok(true)) {
                // The thread did not start and dropped `free` unrun (it
                // owns only integers): free here.
                // SAFETY: as above.
                unsafe { std::alloc::dealloc(p as *mut u8, layout) };
                FREES_IN_FLIGHT.fetch_sub(1, Ordering::Release);
            }
            return;
        }
    }
    drop(cells);
}

/// Gives the whole pages of the allocation `p..p + len`, which is about to
/// be freed and is read by nobody, back to the kernel 1 MiB at a time
/// (madvise DONTNEED). Each call holds the address space's lock only for
/// reading and only for its piece, so the free that follows has no pages
/// left to return and never holds it (for writing) for long; a munmap of
/// tens of MB holds it for milliseconds, stalling the page faults of every
/// other thread of the process.
#[cfg(not(any(loom, miri)))]
fn discard_pages(p: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const PIECE: usize = 1 << 20;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
        if !page.is_power_of_two() {
            return;
        }
        let mut at = p.next_multiple_of(page);
        let end = (p + len) & !(page - 1);
        while at < end {
            let n = PIECE.min(end - at);
            // SAFETY: `at..at + n` is whole pages inside the allocation,
            // which nobody reads or writes again before it is freed; DONTNEED
            // only replaces private anonymous pages with zero-fill-on-demand
            // ones. A failure leaves the pages as they were, for the free to
            // return.
            unsafe { libc::madvise(at as *mut libc::c_void, n, libc::MADV_DONTNEED) };
            at += n;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}
