//! The cell: one row of a word-sized key, `{key bits, word}` in one 128-bit
//! atomic, and every encoding of its word in one place ([`CellState`]).
//! DESIGN.md §2 gives the states and the transitions
//! between them.

/// The largest `tat` field a live cell holds: a `tat` (at most
/// `bucket::MAX_TIME`, below `2^61`), a held row's record address (in
/// `[2^61, 2^62)`) or a held row's inline state (from `2^62` up to here;
/// `held/`). The row states that are not live take the words above it.
pub(crate) const FIELD_MAX: u64 = (1 << 63) - 6;
#[cfg(not(loom))]
use crate::sync::Ordering;

/// Set on every word of a cell a migration copier holds.
const FROZEN: u64 = 1 << 63;

/// The word of a never-used cell (a zeroed array is all empty).
const EMPTY: u64 = 0;
const TOMB: u64 = 1;
const FENCE: u64 = 2;
const CLAIMED: u64 = 3;
/// Only ever frozen.
const MOVED: u64 = 4;
/// A live word is its `tat` field plus `LIVE`: `LIVE..=LIVE_MAX`, above
/// every other state and below `FROZEN`, so that "live" is one signed
/// comparison of the word (a frozen word is negative).
const LIVE: u64 = 5;
const LIVE_MAX: u64 = FIELD_MAX + LIVE;
const _: () = assert!(LIVE_MAX == FROZEN - 1);

/// A decoded cell. Keys are the key's 64 bits (`WordKey::bits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CellState {
    /// Never used: ends every probe sequence.
    Empty,
    /// A removed row: passed over, reusable. Its key bits are stale.
    Tomb,
    /// An empty cell a cleaner holds for a moment.
    Fence,
    /// A new row of `key` whose inserter checks the sequence.
    Claimed { key: u64 },
    /// The row of `key`, bucket at `tat`.
    Live { key: u64, tat: u64 },
    /// A frozen empty cell: the sequence goes on in the migration's target.
    Sealed,
    /// A frozen tombstone: passed over, never reused.
    Closed,
    /// A claim a copier froze: its inserter withdraws and looks again.
    FrozenClaimed { key: u64 },
    /// A row a copier holds: final until it is moved.
    FrozenLive { key: u64, tat: u64 },
    /// The row of `key` is in the migration's target.
    Moved { key: u64 },
}

impl CellState {
    /// The 128-bit value of this state. The key bits of an empty cell, a
    /// tombstone and their frozen forms are zero here; [`freeze`] keeps
    /// whatever a cell holds.
    pub(crate) fn encode(self) -> u128 {
        let (key, word) = match self {
            CellState::Empty => (0, EMPTY),
            CellState::Tomb => (0, TOMB),
            CellState::Fence => (0, FENCE),
            CellState::Claimed { key } => (key, CLAIMED),
            CellState::Live { key, tat } => {
                debug_assert!(tat <= FIELD_MAX);
                (key, tat + LIVE)
            }
            CellState::Sealed => (0, FROZEN | EMPTY),
            CellState::Closed => (0, FROZEN | TOMB),
            CellState::FrozenClaimed { key } => (key, FROZEN | CLAIMED),
            CellState::FrozenLive { key, tat } => {
                debug_assert!(tat <= FIELD_MAX);
                (key, FROZEN | (tat + LIVE))
            }
            CellState::Moved { key } => (key, FROZEN | MOVED),
        };
        pack(key, word)
    }

    /// The state of a 128-bit cell value. Every value decodes: an empty
    /// word reads as empty whatever its key bits, and words no transition
    /// writes read as `Tomb` or `Closed`, which nobody acts on but the
    /// cleaner and the copier.
    pub(crate) fn decode(v: u128) -> CellState {
        let key = (v >> 64) as u64;
        let word = v as u64;
        let frozen = word & FROZEN != 0;
        match (frozen, word & !FROZEN) {
            (false, EMPTY) => CellState::Empty,
            (true, EMPTY) => CellState::Sealed,
            (false, w @ LIVE..=LIVE_MAX) => CellState::Live { key, tat: w - LIVE },
            (true, w @ LIVE..=LIVE_MAX) => CellState::FrozenLive { key, tat: w - LIVE },
            (false, FENCE) => CellState::Fence,
            (false, CLAIMED) => CellState::Claimed { key },
            (true, CLAIMED) => CellState::FrozenClaimed { key },
            (true, MOVED) => CellState::Moved { key },
            (false, _) => CellState::Tomb,
            (true, _) => CellState::Closed,
        }
    }
}

/// Whether a walk for a key passes over `v` without looking further: a
/// tombstone or a claim, neither frozen.
#[inline(always)]
pub(crate) fn passed_over(v: u128) -> bool {
    matches!(
        CellState::decode(v),
        CellState::Tomb | CellState::Claimed { .. }
    )
}

/// The key half and `tat` of `v` if it is a live row: the fast path's test.
#[inline(always)]
pub(crate) fn live(v: u128) -> Option<(u64, u64)> {
    let word = v as u64;
    is_live(word).then(|| ((v >> 64) as u64, word - LIVE))
}

/// Whether a word is a live row's: `LIVE..=LIVE_MAX`, which is every word
/// at or above `LIVE` read as a signed number (a frozen one is negative).
#[inline(always)]
fn is_live(word: u64) -> bool {
    word as i64 >= LIVE as i64
}

/// The key half and `tat` of `v`, which is a live row's value (as
/// [`live`] returns them, without the check).
#[inline(always)]
pub(crate) fn live_parts(v: u128) -> (u64, u64) {
    let word = v as u64;
    debug_assert!(is_live(word), "a live row's value");
    ((v >> 64) as u64, word.wrapping_sub(LIVE))
}

/// The `tat` of `v` if it is `key`'s live row: the lookup's fast test, one
/// compare of each half, without decoding every state.
#[inline(always)]
pub(crate) fn live_tat(v: u128, key: u64) -> Option<u64> {
    let word = v as u64;
    ((v >> 64) as u64 == key && is_live(word)).then(|| word - LIVE)
}

/// The value of the live row of `key` whose `tat` field is `field` (as
/// [`CellState::Live`] encodes it, without the match).
#[inline(always)]
pub(crate) fn live_value(key: u64, field: u64) -> u128 {
    debug_assert!(field <= FIELD_MAX);
    pack(key, field + LIVE)
}

/// The frozen value of a cell holding `v`: what a copier's CAS writes.
/// A fence is never frozen (the copier waits for its cleaner).
pub(crate) fn freeze(v: u128) -> u128 {
    debug_assert!(!matches!(CellState::decode(v), CellState::Fence));
    v | u128::from(FROZEN)
}

#[inline]
fn pack(key: u64, word: u64) -> u128 {
    (u128::from(key) << 64) | u128::from(word)
}

/// One cell: a 128-bit atomic. Under loom, a mutex stands for it: loom
/// has no 128-bit atomics, and a mutex models a linearizable one (every
/// access sequentially consistent, stronger than the orderings used here).
#[cfg(not(loom))]
#[repr(transparent)]
pub(crate) struct Cell(portable_atomic::AtomicU128);

#[cfg(loom)]
pub(crate) struct Cell(crate::sync::Mutex<u128>);

/// `n` empty cells, or `None` if no array can have that many or the
/// allocator refuses them. Outside loom the memory comes zeroed from the
/// allocator (an empty cell is all zero bits), so a large migration target
/// costs its starter no pass over it: the copies that fill it touch its
/// pages. With `huge`, an array of [`HUGE_FROM`] bytes or more asks for
/// transparent huge pages ([`advise_huge`]).
#[cfg(not(loom))]
pub(crate) fn empty_cells(n: usize, huge: bool) -> Option<Box<[Cell]>> {
    use std::alloc::{alloc_zeroed, Layout};
    debug_assert_eq!(CellState::Empty.encode(), 0);
    let layout = Layout::array::<Cell>(n).ok()?;
    if layout.size() == 0 {
        return None;
    }
    // SAFETY: `layout` has a non-zero size (checked above).
    let p = unsafe { alloc_zeroed(layout) } as *mut Cell;
    if p.is_null() {
        return None;
    }
    if huge {
        advise_huge(p as usize, layout.size());
    }
    // SAFETY: `p` points to `n` zeroed cells, aligned for `Cell` and
    // allocated by the global allocator with `Layout::array::<Cell>(n)`, the
    // layout `Box<[Cell]>` frees with. A `Cell` is a transparent
    // `AtomicU128`, for which all-zero bytes are the value 0: the empty cell.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) })
}

/// The size from which an array asks for huge pages: 4 MiB, 262,144
/// cells: the array a table grows to past about 100,000 rows; two huge
/// pages of x86-64.
#[cfg(not(loom))]
pub(crate) const HUGE_FROM: usize = 4 << 20;

/// Asks the kernel to back the whole 2 MiB pages of the allocation
/// `p..p + len` with transparent huge pages (`madvise(MADV_HUGEPAGE)`),
/// if it is at least [`HUGE_FROM`] bytes: a lookup in a large array then
/// misses the TLB far less. The kernel decides (THP `never`: nothing
/// changes); a failure changes nothing. Linux only, and not under miri.
#[cfg(not(any(loom, pace_mutant = "huge_pages_ignored")))]
fn advise_huge(p: usize, len: usize) {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        const HUGE: usize = 2 << 20;
        if len < HUGE_FROM {
            return;
        }
        let at = p.next_multiple_of(HUGE);
        let end = (p + len) & !(HUGE - 1);
        if at < end {
            // SAFETY: `at..end` is whole 2 MiB pages inside the allocation,
            // which nobody has seen yet; MADV_HUGEPAGE only sets how the
            // kernel backs them, never their contents (zero, as the
            // allocator gave them).
            unsafe { libc::madvise(at as *mut libc::c_void, end - at, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = (p, len);
}

/// Known-wrong variant `huge_pages_ignored`: no array asks for huge pages.
#[cfg(all(not(loom), pace_mutant = "huge_pages_ignored"))]
fn advise_huge(_p: usize, _len: usize) {}

/// Loom's mutexes cannot be made by zeroing memory: build each cell (models
/// use a handful).
#[cfg(loom)]
pub(crate) fn empty_cells(n: usize, _huge: bool) -> Option<Box<[Cell]>> {
    (n > 0).then(|| (0..n).map(|_| Cell::new(CellState::Empty)).collect())
}

impl Cell {
    #[cfg(loom)]
    pub(crate) fn new(state: CellState) -> Cell {
        #[cfg(not(loom))]
        {
            Cell(portable_atomic::AtomicU128::new(state.encode()))
        }
        #[cfg(loom)]
        {
            Cell(crate::sync::Mutex::new(state.encode()))
        }
    }

    /// The cell's value (Acquire).
    #[inline]
    pub(crate) fn load(&self) -> u128 {
        #[cfg(not(loom))]
        {
            self.0.load(Ordering::Acquire)
        }
        #[cfg(loom)]
        {
            *self.0.lock().unwrap()
        }
    }

    /// One CAS from `cur` to `new` (AcqRel; the value found on failure).
    #[inline]
    pub(crate) fn cas(&self, cur: u128, new: u128) -> Result<u128, u128> {
        #[cfg(not(loom))]
        {
            self.0
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
        }
        #[cfg(loom)]
        {
            let mut v = self.0.lock().unwrap();
            if *v == cur {
                *v = new;
                Ok(cur)
            } else {
                Err(*v)
            }
        }
    }

    /// Writes `new` (Release): only for a cell whose writer is alone by the
    /// protocol (a copier moving a cell it froze, a cleaner lifting its
    /// fence).
    #[inline]
    pub(crate) fn store(&self, new: u128) {
        #[cfg(not(loom))]
        {
            self.0.store(new, Ordering::Release)
        }
        #[cfg(loom)]
        {
            *self.0.lock().unwrap() = new;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn all_states(key: u64, tat: u64) -> Vec<CellState> {
        vec![
            CellState::Empty,
            CellState::Tomb,
            CellState::Fence,
            CellState::Claimed { key },
            CellState::Live { key, tat },
            CellState::Sealed,
            CellState::Closed,
            CellState::FrozenClaimed { key },
            CellState::FrozenLive { key, tat },
            CellState::Moved { key },
        ]
    }

    #[test]
    fn every_state_round_trips() {
        for key in [0, 1, 42, u64::MAX - 1, u64::MAX] {
            for tat in [0, 1, 1 << 40, 1 << 61, 1 << 62, FIELD_MAX - 1, FIELD_MAX] {
                for s in all_states(key, tat) {
                    assert_eq!(CellState::decode(s.encode()), s, "{s:?}");
                }
            }
        }
    }

    #[test]
    fn an_all_zero_cell_is_empty() {
        // Arrays come zeroed from the allocator.
        assert_eq!(CellState::decode(0), CellState::Empty);
        assert_eq!(CellState::Empty.encode(), 0);
    }

    /// A row of key 0 at `tat` 0 is not the empty cell (live words are
    /// offset by `LIVE` for it).
    #[test]
    fn key_zero_at_tat_zero_is_a_row() {
        let row = CellState::Live { key: 0, tat: 0 };
        assert_ne!(row.encode(), 0);
        assert_eq!(CellState::decode(row.encode()), row);
    }

    #[test]
    fn the_words_do_not_overlap() {
        let words = [EMPTY, TOMB, FENCE, CLAIMED, MOVED, LIVE, LIVE_MAX];
        for (i, a) in words.iter().enumerate() {
            assert!(a & FROZEN == 0);
            for b in &words[i + 1..] {
                assert!(a < b);
            }
        }
        for w in [0, 1, 4, FROZEN, FROZEN | LIVE, u64::MAX] {
            assert!(!is_live(w), "{w:#x}");
        }
        for w in [LIVE, LIVE + 1, 1 << 62, LIVE_MAX] {
            assert!(is_live(w), "{w:#x}");
        }
    }

    #[test]
    fn live_tat_agrees_with_decode() {
        for key in [0, 5, u64::MAX] {
            for tat in [0, 9, FIELD_MAX] {
                for s in all_states(key, tat) {
                    let want = match s {
                        CellState::Live { key: k, tat } if k == key => Some(tat),
                        _ => None,
                    };
                    assert_eq!(live_tat(s.encode(), key), want, "{s:?}");
                    if key != 5 {
                        assert_eq!(live_tat(s.encode(), 5), None, "{s:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn freezing_maps_each_state_to_its_frozen_one() {
        let (key, tat) = (7, 1234);
        let pairs = [
            (CellState::Empty, CellState::Sealed),
            (CellState::Tomb, CellState::Closed),
            (CellState::Claimed { key }, CellState::FrozenClaimed { key }),
            (
                CellState::Live { key, tat },
                CellState::FrozenLive { key, tat },
            ),
        ];
        for (from, to) in pairs {
            assert_eq!(CellState::decode(freeze(from.encode())), to, "{from:?}");
        }
    }

    #[test]
    fn every_value_decodes_without_panicking() {
        let mut x: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C834;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let _ = CellState::decode(x);
        }
        for w in [MOVED, MOVED + 1, FROZEN | (MOVED + 7), u64::MAX] {
            let _ = CellState::decode(pack(3, w));
        }
    }
}
