//! The table for word-sized keys: rows live in 16-byte cells of the array
//! (`docs/cells.md`). Work in progress: one array (no migration yet), not
//! yet used by `Pace`.
#![allow(dead_code)]

mod cell;

use crossbeam_utils::Backoff;

use super::floor::Floors;
use super::slot::probe_seq;
use crate::bucket::{Decision, Limits, Refund};
use crate::sync::{cas_retry, fence, snooze, AtomicUsize, Ordering};
use cell::{Cell, CellState};

/// What a reserve did (as `Table::reserve`'s `Admitted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admitted {
    pub(crate) tat: u64,
    pub(crate) prev: u64,
    pub(crate) created: bool,
}

/// Why a reserve failed: the bucket's decision, or no room for a new row
/// (until migration exists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    Bucket(Decision),
    NoRoom,
}

/// Where a key's walk ended.
enum Found {
    /// The key's row: cell `idx` held `v` (live, `tat`).
    Row { idx: usize, v: u128, tat: u64 },
    /// No row: the first empty cell of the sequence, and the first tombstone
    /// before it (with the value it held).
    Absent {
        empty: usize,
        tomb: Option<(usize, u128)>,
    },
    /// Every cell probed, none empty.
    Full { tomb: Option<(usize, u128)> },
}

/// Why a claim failed.
enum Lost {
    /// The cell changed first: look again.
    Taken,
    /// The array is at its limit (until migration exists).
    NoRoom,
}

/// What [`CellTable::verify`] decides for a claim.
enum Verdict {
    Keep,
    Withdraw,
    /// Withdraw, wait while this earlier cell holds a claim of the key.
    Await(usize),
}

/// One power-of-two array of cells.
pub(crate) struct CellTable {
    cells: Box<[Cell]>,
    /// Cells not empty: rows, claims and tombstones.
    used: AtomicUsize,
    /// Rows: live cells plus claims in flight.
    len: AtomicUsize,
    floors: Floors,
}

impl CellTable {
    /// A table of `cells` cells (a power of two, at least 4).
    pub(crate) fn new(cells: usize) -> CellTable {
        let n = cells.max(4).next_power_of_two();
        CellTable {
            cells: (0..n).map(|_| Cell::new(CellState::Empty)).collect(),
            used: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            floors: Floors::new(),
        }
    }

    fn mask(&self) -> usize {
        self.cells.len() - 1
    }

    /// Claims allowed (3/4 of the cells), so every sequence ends.
    fn limit(&self) -> usize {
        self.cells.len() - self.cells.len() / 4
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Walks `key`'s sequence.
    fn find(&self, hash: u64, key: u64) -> Found {
        let backoff = Backoff::new();
        let mut tomb = None;
        for idx in probe_seq(hash, self.mask()) {
            loop {
                let v = self.cells[idx].load();
                match CellState::decode(v) {
                    // A cleaner's fence ends the sequence as an empty cell
                    // does (nothing lies beyond it); an insert there waits.
                    CellState::Empty | CellState::Fence => {
                        return Found::Absent { empty: idx, tomb }
                    }
                    CellState::Tomb => {
                        if tomb.is_none() {
                            tomb = Some((idx, v));
                        }
                    }
                    CellState::Live { key: k, tat } if k == key => {
                        return Found::Row { idx, v, tat }
                    }
                    // Another key's row, or a claim (its inserter decides).
                    CellState::Live { .. } | CellState::Claimed { .. } => {}
                    s => {
                        // Frozen states belong to migrations, which this
                        // stage does not have.
                        debug_assert!(false, "unexpected {s:?}");
                        snooze(&backoff);
                        continue;
                    }
                }
                break;
            }
        }
        Found::Full { tomb }
    }

    /// Debits `n` tokens from `key`'s bucket at `now`, creating its row if
    /// absent (from its floor). A denial writes and creates nothing.
    pub(crate) fn reserve(
        &self,
        limits: &Limits,
        hash: u64,
        key: u64,
        n: u64,
        mut now: u64,
        reread: &dyn Fn() -> u64,
    ) -> Result<Admitted, Denied> {
        let backoff = Backoff::new();
        loop {
            let (empty, tomb) = match self.find(hash, key) {
                Found::Row { idx, v, tat } => match self.debit(idx, v, tat, key, limits, n, now) {
                    Some(r) => return r.map_err(Denied::Bucket),
                    None => continue, // the row was removed under us
                },
                Found::Absent { empty, tomb } => (Some(empty), tomb),
                Found::Full { tomb } => (None, tomb),
            };
            // An absent row starts from its floor: decide before creating.
            let floor = self.floors.get(hash);
            if floor > now {
                now = now.max(reread());
            }
            if let d @ (Decision::Wait(_) | Decision::Never | Decision::TimeExhausted) =
                limits.reserve(floor, now, n)
            {
                return Err(Denied::Bucket(d));
            }
            let at = match self.claim(key, empty, tomb) {
                Ok(at) => at,
                Err(Lost::NoRoom) => return Err(Denied::NoRoom),
                Err(Lost::Taken) => {
                    // Taken first, or a cleaner's fence: look again.
                    snooze(&backoff);
                    continue;
                }
            };
            // Dekker with every other inserter of the key: each claims, fences,
            // then reads the whole sequence (see `verify`).
            fence(Ordering::SeqCst);
            match self.verify(hash, key, at) {
                Verdict::Keep => {}
                verdict => {
                    self.withdraw(at, key);
                    snooze(&backoff);
                    if let Verdict::Await(earlier) = verdict {
                        let claim = CellState::Claimed { key }.encode();
                        while self.cells[earlier].load() == claim {
                            snooze(&backoff);
                        }
                    }
                    continue;
                }
            }
            // The floor again, after the check: a row of the key removed
            // while we checked raised it before its cell became a tombstone.
            // The claim becomes the row with this debit in one CAS, so no
            // row is ever live without its first debit (a sweep would take
            // it for full); a denial now withdraws the claim.
            let floor = self.floors.get(hash);
            if floor > now {
                now = now.max(reread());
            }
            match limits.reserve(floor, now, n) {
                Decision::Admit(tat) => {
                    let claim = CellState::Claimed { key }.encode();
                    let live = CellState::Live { key, tat }.encode();
                    let promoted = self.cells[at].cas(claim, live);
                    debug_assert!(promoted.is_ok(), "only its inserter changes a claim");
                    return Ok(Admitted {
                        tat,
                        prev: floor,
                        created: true,
                    });
                }
                denied => {
                    self.withdraw(at, key);
                    return Err(Denied::Bucket(denied));
                }
            }
        }
    }

    /// Claims a cell for `key`: the tombstone if there is one, else the empty
    /// cell (if the array has room for one more used cell).
    fn claim(
        &self,
        key: u64,
        empty: Option<usize>,
        tomb: Option<(usize, u128)>,
    ) -> Result<usize, Lost> {
        let claim = CellState::Claimed { key }.encode();
        self.len.fetch_add(1, Ordering::SeqCst);
        let lost = if let Some((at, v)) = tomb {
            // A tombstone is already counted in `used`.
            if self.cells[at].cas(v, claim).is_ok() {
                return Ok(at);
            }
            Lost::Taken
        } else if let Some(at) = empty {
            if self.used.fetch_add(1, Ordering::Relaxed) < self.limit() {
                if self.cells[at].cas(0, claim).is_ok() {
                    return Ok(at);
                }
                self.used.fetch_sub(1, Ordering::Relaxed);
                Lost::Taken
            } else {
                self.used.fetch_sub(1, Ordering::Relaxed);
                Lost::NoRoom
            }
        } else {
            Lost::NoRoom
        };
        self.len.fetch_sub(1, Ordering::SeqCst);
        Err(lost)
    }

    /// Withdraws our claim at `at`: it becomes a tombstone (still used).
    fn withdraw(&self, at: usize, key: u64) {
        let claim = CellState::Claimed { key }.encode();
        let gone = self.cells[at].cas(claim, CellState::Tomb.encode());
        debug_assert!(gone.is_ok(), "only its inserter changes a claim");
        self.len.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether our claim at `at` may become `key`'s row: no live row of the
    /// key on its sequence, and no claim of it earlier in the sequence.
    fn verify(&self, hash: u64, key: u64, at: usize) -> Verdict {
        // Known-wrong variant: keep every claim unchecked.
        if cfg!(pace_mutant = "cells_verify_off") {
            return Verdict::Keep;
        }
        let backoff = Backoff::new();
        let mut seen_me = false;
        for idx in probe_seq(hash, self.mask()) {
            loop {
                if idx == at {
                    seen_me = true;
                    break;
                }
                match CellState::decode(self.cells[idx].load()) {
                    CellState::Empty | CellState::Fence => {
                        // A cleaner may have emptied a cell before ours since
                        // the walk that chose it: ours must still be on the
                        // sequence.
                        return if seen_me {
                            Verdict::Keep
                        } else {
                            Verdict::Withdraw
                        };
                    }
                    CellState::Live { key: k, .. } if k == key => return Verdict::Withdraw,
                    CellState::Claimed { key: k } if k == key => {
                        if !seen_me {
                            return Verdict::Await(idx);
                        }
                        // A later claim: its inserter sees ours and
                        // withdraws, or is promoted (we then withdraw).
                        snooze(&backoff);
                        continue;
                    }
                    _ => {}
                }
                break;
            }
        }
        if seen_me {
            Verdict::Keep
        } else {
            Verdict::Withdraw
        }
    }

    /// The CAS loop that debits the row of `key` in cell `idx`, which held
    /// `v` (live at `tat`). `None` if the row was removed first.
    #[allow(clippy::too_many_arguments)]
    fn debit(
        &self,
        idx: usize,
        mut v: u128,
        mut tat: u64,
        key: u64,
        limits: &Limits,
        n: u64,
        now: u64,
    ) -> Option<Result<Admitted, Decision>> {
        let backoff = Backoff::new();
        loop {
            match limits.reserve(tat, now, n) {
                Decision::Admit(new) => {
                    let next = CellState::Live { key, tat: new }.encode();
                    match self.cells[idx].cas(v, next) {
                        Ok(_) => {
                            return Some(Ok(Admitted {
                                tat: new,
                                prev: tat,
                                created: false,
                            }))
                        }
                        Err(actual) => match CellState::decode(actual) {
                            CellState::Live { key: k, tat: t } if k == key => {
                                v = actual;
                                tat = t;
                                cas_retry(&backoff);
                            }
                            _ => return None,
                        },
                    }
                }
                denied => return Some(Err(denied)),
            }
        }
    }

    /// Undoes a reservation that moved `key`'s row from `prev` to `own_tat`,
    /// if the row still ends at `own_tat`. A refund that makes the bucket
    /// full raises the floor to `prev` and removes the row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn refund(
        &self,
        limits: &Limits,
        hash: u64,
        key: u64,
        n: u64,
        own_tat: u64,
        prev: u64,
        now: u64,
    ) {
        let Found::Row {
            idx,
            mut v,
            mut tat,
        } = self.find(hash, key)
        else {
            return;
        };
        let backoff = Backoff::new();
        loop {
            let (next, full) = match limits.refund(tat, now, n, own_tat, prev) {
                Refund::Unchanged => return,
                Refund::Set(t) => (CellState::Live { key, tat: t }.encode(), false),
                Refund::Full => {
                    if !cfg!(pace_mutant = "cells_refund_keeps_floor") {
                        self.floors.raise(hash, prev);
                    }
                    (CellState::Tomb.encode(), true)
                }
            };
            match self.cells[idx].cas(v, next) {
                Ok(_) => {
                    if full {
                        self.len.fetch_sub(1, Ordering::SeqCst);
                    }
                    return;
                }
                Err(actual) => match CellState::decode(actual) {
                    CellState::Live { key: k, tat: t } if k == key => {
                        v = actual;
                        tat = t;
                        cas_retry(&backoff);
                    }
                    _ => return,
                },
            }
        }
    }

    /// The `tat` of `key`'s row, if it has one.
    pub(crate) fn peek(&self, hash: u64, key: u64) -> Option<u64> {
        match self.find(hash, key) {
            Found::Row { tat, .. } => Some(tat),
            _ => None,
        }
    }

    /// Removes every row whose bucket is full at `now` (floor raised to its
    /// own `tat` first). `hash_of` gives a key's hash: cells do not keep it.
    pub(crate) fn sweep(&self, now: u64, hash_of: &dyn Fn(u64) -> u64) -> usize {
        let mut removed = 0;
        for cell in self.cells.iter() {
            let v = cell.load();
            if let CellState::Live { key, tat } = CellState::decode(v) {
                if tat <= now {
                    if !cfg!(pace_mutant = "cells_sweep_keeps_floor") {
                        self.floors.raise(hash_of(key), tat);
                    }
                    if cell.cas(v, CellState::Tomb.encode()).is_ok() {
                        self.len.fetch_sub(1, Ordering::SeqCst);
                        removed += 1;
                    }
                }
            }
        }
        removed
    }

    /// Keys of the live rows (for tests; nothing in flight).
    pub(crate) fn live_keys(&self) -> Vec<u64> {
        self.cells
            .iter()
            .filter_map(|c| match CellState::decode(c.load()) {
                CellState::Live { key, .. } => Some(key),
                _ => None,
            })
            .collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
