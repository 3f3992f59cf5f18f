//! An optional intent journal (feature `journal`): what a restarted worker
//! can know about a job that died mid-write.
//!
//! Admission counts say how many jobs are in flight, not what each one had
//! already done. The journal is an append-only file of checksummed records.
//! A job records each step *before* acting on it, and each record is on
//! disk (`sync_data`) before [`Journal::record`] returns:
//!
//! 1. [`Stage::Admitted`]: the job was accepted; nothing external done yet.
//! 2. [`Stage::WriteSent`]: recorded just before the external write is sent.
//! 3. [`Stage::Completed`]: recorded after the write was acknowledged.
//!
//! Recovery classifies every job by the furthest step among its valid
//! records: admitted only → [`JobState::SafeToRetry`]; write sent but not
//! completed → [`JobState::InDoubt`] (the outcome is unknown: report it, or
//! retry only idempotently); completed → [`JobState::Done`]. Because "write
//! sent" is durable before the write starts, a job whose write may have
//! happened is never called safe to retry; because "completed" is durable
//! before the caller is told, a completed job is never lost.
//!
//! # What recovery guarantees
//!
//! Every record starts with a fixed 4-byte marker and carries a CRC-32 of
//! its length and content, and its own byte offset in the file. A record is
//! *valid* when the marker matches, the length is within bounds, the
//! checksum holds and the stored offset is where it lies. Recovery reads
//! valid records one after another; where it meets bytes that are not a
//! valid record, it scans forward for the next valid record. So:
//!
//! * **Damage in the middle** (bytes that are not a valid record, followed
//!   by a valid one) is reported as a [`Damage`] range and every valid
//!   record after it is kept. A record is only written after the previous
//!   one was synced, so such a range was once a durable record: losing it
//!   silently could turn a sent write into "safe to retry". [`recover`]
//!   and [`Journal::open`] therefore refuse with
//!   [`JournalError::Corrupt`] naming its offset, and `open` leaves the
//!   file untouched. [`parse`] returns everything it found, damage listed.
//!   [`Journal::repair`] is the explicit way on: it appends a record that
//!   acknowledges each damaged range (keeping every valid record), after
//!   which recovery and `open` accept the file again.
//! * **A torn tail** (bytes after the last valid record that no valid
//!   record follows) is what a crash during an append leaves; that
//!   append's `record` never returned, so nothing acted on it. It is
//!   reported ([`Recovery::torn_tail`]), ignored, and [`Journal::open`]
//!   truncates it, never cutting into a valid record. A damaged *last*
//!   record looks exactly like a torn append and is treated as one. A
//!   file with bytes but no valid record that does not start with the
//!   marker (a torn first append does) is not taken for a torn journal:
//!   it is refused with [`JournalError::NotAJournal`] and left untouched.
//! * **Classification** uses every valid record in the file, wherever it
//!   lies: a job with a valid [`Stage::WriteSent`] or [`Stage::Completed`]
//!   record is never [`JobState::SafeToRetry`].
//! * **A failed [`Journal::record`]** (a write that stops part-way, a
//!   failed sync) truncates the file back to its length before the call
//!   and syncs it; if that fails too, the handle is poisoned and every
//!   later call returns [`JournalError::Poisoned`]. Either way, no record
//!   is ever appended after garbage.
//! * **One writer**: [`Journal::open`] takes an exclusive advisory lock on
//!   the file (`File::try_lock`, Rust ≥ 1.89) and a second `open` or
//!   `repair` of the same file, from this process or another, gets
//!   [`JournalError::Locked`] until the first [`Journal`] is dropped.
//!
//! Not covered: a file system that loses synced data; bit rot in the last
//! record (dropped as a torn tail, so a rotten last `WriteSent` leaves its
//! job classified by its `Admitted` record); and a detail that embeds a
//! whole valid record *at its own offset* (only then could a scan past
//! damage mistake detail bytes for a record).
//!
//! Record layout (little-endian): `marker: [u8; 4]`, `crc32: u32` (of the
//! next `4 + len` bytes), `len: u32` (of what follows it), then
//! `offset: u64` (where the record starts), `job: u64`, `kind: u8` (a
//! [`Stage`], or a damage acknowledgement), `detail: [u8]`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The largest record accepted (its `len` field); anything larger is not a
/// valid record and is never allocated.
pub const MAX_RECORD: u32 = 1 << 20;

/// The marker every record starts with.
const MARKER: [u8; 4] = [0xA7, b'P', b'J', 0x1E];
/// Marker, CRC, length.
const HEADER: usize = 12;
/// Offset, job, kind.
const FIXED: usize = 17;
/// The kind byte of a damage acknowledgement (`job` = offset of the range,
/// `detail` = its length as a `u64`).
const KIND_ACK: u8 = 0x7F;

/// A step of a job, recorded before acting on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Accepted; nothing external done yet.
    Admitted,
    /// The external write is about to be sent (it may or may not happen).
    WriteSent,
    /// The external write was acknowledged and the job is finished.
    Completed,
}

impl Stage {
    fn code(self) -> u8 {
        match self {
            Stage::Admitted => 1,
            Stage::WriteSent => 2,
            Stage::Completed => 3,
        }
    }

    fn from_code(code: u8) -> Option<Stage> {
        match code {
            1 => Some(Stage::Admitted),
            2 => Some(Stage::WriteSent),
            3 => Some(Stage::Completed),
            _ => None,
        }
    }
}

/// What recovery concludes about a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Only admitted: nothing external happened; run it again.
    SafeToRetry,
    /// The write may or may not have happened: report it, or retry it only
    /// if the write is idempotent.
    InDoubt,
    /// Completed.
    Done,
}

impl From<Stage> for JobState {
    fn from(stage: Stage) -> JobState {
        match stage {
            Stage::Admitted => JobState::SafeToRetry,
            Stage::WriteSent => JobState::InDoubt,
            Stage::Completed => JobState::Done,
        }
    }
}

/// A range of bytes that is not a valid record, followed by a valid record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Damage {
    /// Where the range starts.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// A valid acknowledgement record ([`Journal::repair`]) names exactly
    /// this range.
    pub acknowledged: bool,
}

/// The result of reading a journal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovery {
    /// Every job seen, by the furthest stage among its valid records.
    pub jobs: BTreeMap<u64, JobState>,
    /// The detail bytes of each job's furthest record.
    pub details: BTreeMap<u64, Vec<u8>>,
    /// Valid records read (damage acknowledgements included).
    pub records: u64,
    /// The end of the last valid record (where the next record goes).
    pub valid_len: u64,
    /// Where a torn tail starts (always `valid_len`), if bytes that no
    /// valid record follows come after the last valid record.
    pub torn_tail: Option<u64>,
    /// Damaged ranges, in file order: bytes that are not valid records,
    /// each followed by a valid record.
    pub damage: Vec<Damage>,
}

impl Recovery {
    /// Jobs that did not complete, with what may be done about them.
    pub fn unfinished(&self) -> impl Iterator<Item = (u64, JobState)> + '_ {
        self.jobs
            .iter()
            .filter(|(_, s)| **s != JobState::Done)
            .map(|(j, s)| (*j, *s))
    }

    /// The first damaged range no acknowledgement covers, if any: while
    /// there is one, [`recover`] and [`Journal::open`] refuse the file.
    pub fn unacknowledged_damage(&self) -> Option<Damage> {
        self.damage.iter().copied().find(|d| !d.acknowledged)
    }
}

/// A journal operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum JournalError {
    /// The detail is longer than [`MAX_RECORD`] allows.
    DetailTooLong {
        /// Its length.
        len: usize,
    },
    /// Bytes that are not a valid record lie before a valid record: a
    /// durable record was damaged. Nothing was changed; [`parse`] shows
    /// what is readable and [`Journal::repair`] accepts the loss.
    Corrupt {
        /// Where the first unacknowledged damaged range starts.
        offset: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// The file holds bytes but no valid record, and does not start like
    /// one: it is not a journal (or its first record is damaged). Nothing
    /// was changed.
    NotAJournal,
    /// Another [`Journal`] (in this process or another) has the file open.
    Locked,
    /// An earlier [`Journal::record`] failed and the file could not be
    /// truncated back; this handle appends nothing more. Reopen the file.
    Poisoned,
    /// The file could not be opened, read, written, truncated or synced.
    Io(io::Error),
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::DetailTooLong { len } => {
                write!(f, "journal detail of {len} bytes exceeds the record limit")
            }
            JournalError::Corrupt { offset, len } => write!(
                f,
                "journal damaged: {len} bytes at offset {offset} are not a valid record \
                 but valid records follow"
            ),
            JournalError::NotAJournal => {
                write!(f, "file is not a journal: no valid record, no record start")
            }
            JournalError::Locked => write!(f, "journal is already open for writing"),
            JournalError::Poisoned => write!(
                f,
                "journal handle poisoned: a failed record could not be truncated away"
            ),
            JournalError::Io(e) => write!(f, "journal I/O failed: {e}"),
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JournalError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for JournalError {
    fn from(e: io::Error) -> Self {
        JournalError::Io(e)
    }
}

/// Where a journal lives. [`File`] is the real one; other implementations
/// put a journal elsewhere or inject faults in tests.
pub trait Storage {
    /// Read the whole content.
    ///
    /// # Errors
    /// The content cannot be read.
    fn read_all(&mut self) -> io::Result<Vec<u8>>;
    /// Write `buf` at byte `offset` (the current end). May write a prefix
    /// of `buf` and then fail.
    ///
    /// # Errors
    /// Not all of `buf` was written.
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Cut the content to `len` bytes.
    ///
    /// # Errors
    /// The length could not be set.
    fn truncate(&mut self, len: u64) -> io::Result<()>;
    /// Make everything written so far durable.
    ///
    /// # Errors
    /// Durability is not assured.
    fn sync(&mut self) -> io::Result<()>;
}

impl Storage for File {
    fn read_all(&mut self) -> io::Result<Vec<u8>> {
        let mut data = Vec::new();
        self.seek(SeekFrom::Start(0))?;
        self.read_to_end(&mut data)?;
        Ok(data)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.seek(SeekFrom::Start(offset))?;
        self.write_all(buf)
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.sync_data()
    }
}

/// An open journal, appending. At most one per file (an advisory lock).
#[derive(Debug)]
pub struct Journal<S: Storage = File> {
    store: S,
    /// The end of the last record known durable.
    len: u64,
    poisoned: bool,
}

impl Journal<File> {
    /// Open (or create) the journal at `path` for appending: lock it,
    /// recover what it holds, truncate a torn tail. On Unix, when the file
    /// is empty (new), its directory is synced too, so that the file
    /// itself survives a power loss.
    ///
    /// # Errors
    /// [`JournalError::Locked`] if another [`Journal`] has it open (the
    /// lock belongs to the open file: a child process spawned while a
    /// [`Journal`] was open holds it until the child's `exec` or exit,
    /// also after that [`Journal`] is dropped, so an `open` racing a
    /// spawn in another thread can find it locked for that moment);
    /// [`JournalError::Corrupt`] (the file left untouched) if it holds
    /// unacknowledged damage; [`JournalError::NotAJournal`] (untouched) if
    /// it holds no valid record and does not start like one;
    /// [`JournalError::Io`] if it cannot be opened, read, truncated or
    /// synced.
    pub fn open(path: impl AsRef<Path>) -> Result<(Journal, Recovery), JournalError> {
        Journal::open_storage(open_locked(path.as_ref())?)
    }

    /// Like [`Journal::open`], but accept damage: append a record that
    /// acknowledges each unacknowledged damaged range, keeping every valid
    /// record, so that later recoveries accept the file. The [`Recovery`]
    /// lists the ranges; a job whose records were lost in them is
    /// classified from its remaining records only, so look at
    /// [`Recovery::damage`] before retrying anything.
    ///
    /// # Errors
    /// [`JournalError::Locked`], [`JournalError::NotAJournal`], or an I/O
    /// failure.
    pub fn repair(path: impl AsRef<Path>) -> Result<(Journal, Recovery), JournalError> {
        Journal::repair_storage(open_locked(path.as_ref())?)
    }
}

// `File::try_lock` is stable since Rust 1.89: the `journal` feature needs it.
#[clippy::msrv = "1.89"]
fn open_locked(path: &Path) -> Result<File, JournalError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    lock(&file)?;
    // A journal with nothing in it may have just been created: make its
    // directory entry durable before any record relies on it.
    #[cfg(unix)]
    if file.metadata()?.len() == 0 {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(parent)?.sync_all()?;
    }
    Ok(file)
}

/// Takes the journal's exclusive lock: one writer per file.
#[cfg(not(pace_mutant = "journal_no_lock"))]
fn lock(file: &File) -> Result<(), JournalError> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(JournalError::Locked),
        Err(TryLockError::Error(e)) => Err(JournalError::Io(e)),
    }
}

/// Known-wrong variant `journal_no_lock`: no lock, so two writers
/// interleave their records.
#[cfg(pace_mutant = "journal_no_lock")]
fn lock(_: &File) -> Result<(), JournalError> {
    let _ = TryLockError::WouldBlock;
    Ok(())
}

impl<S: Storage> Journal<S> {
    /// [`Journal::open`] on any [`Storage`] (no lock is taken: the caller
    /// keeps it single-writer).
    ///
    /// # Errors
    /// As [`Journal::open`], without [`JournalError::Locked`].
    pub fn open_storage(store: S) -> Result<(Journal<S>, Recovery), JournalError> {
        Journal::open_inner(store, false)
    }

    /// [`Journal::repair`] on any [`Storage`].
    ///
    /// # Errors
    /// [`JournalError::NotAJournal`], or an I/O failure.
    pub fn repair_storage(store: S) -> Result<(Journal<S>, Recovery), JournalError> {
        Journal::open_inner(store, true)
    }

    fn open_inner(mut store: S, repair: bool) -> Result<(Journal<S>, Recovery), JournalError> {
        let data = store.read_all()?;
        let recovery = parse(&data);
        if foreign(&data, &recovery) {
            return Err(JournalError::NotAJournal);
        }
        let damaged: Vec<Damage> = recovery
            .damage
            .iter()
            .copied()
            .filter(|d| !d.acknowledged)
            .collect();
        if let (Some(d), false) = (damaged.first(), repair) {
            return Journal::open_damaged(store, d);
        }
        if recovery.torn_tail.is_some() {
            store.truncate(recovery.valid_len)?;
            store.sync()?;
        }
        let mut journal = Journal {
            store,
            len: recovery.valid_len,
            poisoned: false,
        };
        if damaged.is_empty() {
            return Ok((journal, recovery));
        }
        for d in &damaged {
            journal.append(d.offset, KIND_ACK, &d.len.to_le_bytes())?;
        }
        let recovery = parse(&journal.store.read_all()?);
        Ok((journal, recovery))
    }

    /// Opening (not repairing) a journal with damage `d` that no record
    /// acknowledges: refused, the file untouched.
    #[cfg(not(pace_mutant = "journal_open_truncates_damage"))]
    fn open_damaged(_: S, d: &Damage) -> Result<(Journal<S>, Recovery), JournalError> {
        Err(JournalError::Corrupt {
            offset: d.offset,
            len: d.len,
        })
    }

    /// Known-wrong variant `journal_open_truncates_damage`: the file is cut
    /// at the first bad byte, losing the valid records after it.
    #[cfg(pace_mutant = "journal_open_truncates_damage")]
    fn open_damaged(mut store: S, d: &Damage) -> Result<(Journal<S>, Recovery), JournalError> {
        store.truncate(d.offset)?;
        store.sync()?;
        let recovery = parse(&store.read_all()?);
        let len = recovery.valid_len;
        Ok((
            Journal {
                store,
                len,
                poisoned: false,
            },
            recovery,
        ))
    }

    /// Append one record and wait until it is on disk. Call it *before*
    /// doing what `stage` says.
    ///
    /// # Errors
    /// [`JournalError::DetailTooLong`] (nothing written);
    /// [`JournalError::Io`] if the write or sync failed: the file is back
    /// at its length before the call, and the job must not go ahead (its
    /// intent is not durable); [`JournalError::Poisoned`] if an earlier
    /// failure could not be undone.
    pub fn record(&mut self, job: u64, stage: Stage, detail: &[u8]) -> Result<(), JournalError> {
        self.append(job, stage.code(), detail)
    }

    /// True once a failed record could not be undone: every later
    /// [`Journal::record`] returns [`JournalError::Poisoned`].
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// The underlying storage.
    pub fn storage(&self) -> &S {
        &self.store
    }

    fn append(&mut self, job: u64, kind: u8, detail: &[u8]) -> Result<(), JournalError> {
        if self.poisoned {
            return Err(JournalError::Poisoned);
        }
        let buf = encode(self.len, job, kind, detail)?;
        // One write of the whole record: a crash leaves a prefix of it at
        // worst, which recovery takes as a torn tail.
        let written = self
            .store
            .write_at(self.len, &buf)
            .and_then(|()| self.store.sync());
        match written {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                if self.roll_back().is_err() {
                    self.poisoned = true;
                }
                Err(JournalError::Io(e))
            }
        }
    }

    /// Cuts what a failed append may have written: the file back at its
    /// length before the append.
    #[cfg(not(pace_mutant = "journal_no_rollback"))]
    fn roll_back(&mut self) -> io::Result<()> {
        self.store
            .truncate(self.len)
            .and_then(|()| self.store.sync())
    }

    /// Known-wrong variant `journal_no_rollback`: a failed append's bytes
    /// stay in the file.
    #[cfg(pace_mutant = "journal_no_rollback")]
    fn roll_back(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn encode(offset: u64, job: u64, kind: u8, detail: &[u8]) -> Result<Vec<u8>, JournalError> {
    let body_len = FIXED + detail.len();
    let len = u32::try_from(body_len)
        .ok()
        .filter(|&l| l <= MAX_RECORD)
        .ok_or(JournalError::DetailTooLong { len: detail.len() })?;
    let mut buf = Vec::with_capacity(HEADER + body_len);
    buf.extend_from_slice(&MARKER);
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&offset.to_le_bytes());
    buf.extend_from_slice(&job.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(detail);
    let crc = crc32fast::hash(&buf[8..]);
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(buf)
}

/// Read the journal at `path` without changing it. A journal that does not
/// exist yet holds nothing.
///
/// # Errors
/// [`JournalError::Corrupt`] if it holds unacknowledged damage ([`parse`]
/// the bytes to see what is readable anyway); [`JournalError::NotAJournal`]
/// if it holds no valid record and does not start like one;
/// [`JournalError::Io`] if it exists but cannot be opened or read.
pub fn recover(path: impl AsRef<Path>) -> Result<Recovery, JournalError> {
    let recovery = match File::open(path) {
        Ok(mut file) => {
            let data = file.read_all()?;
            let recovery = parse(&data);
            if foreign(&data, &recovery) {
                return Err(JournalError::NotAJournal);
            }
            recovery
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Recovery::default(),
        Err(e) => return Err(e.into()),
    };
    match recovery.unacknowledged_damage() {
        Some(d) => Err(JournalError::Corrupt {
            offset: d.offset,
            len: d.len,
        }),
        None => Ok(recovery),
    }
}

/// Bytes with no valid record that do not start like one: truncating them
/// as a torn tail would destroy a file that was never a journal. (A torn
/// first append is a prefix of a record, so it starts with the marker.)
#[cfg(not(pace_mutant = "journal_truncates_foreign"))]
fn foreign(data: &[u8], recovery: &Recovery) -> bool {
    recovery.records == 0 && !data.is_empty() && !MARKER.starts_with(&data[..data.len().min(4)])
}

/// Known-wrong variant `journal_truncates_foreign`: no file is foreign, so
/// opening one that was never a journal truncates it as a torn tail.
#[cfg(pace_mutant = "journal_truncates_foreign")]
fn foreign(_: &[u8], _: &Recovery) -> bool {
    false
}

/// A valid record found in the bytes.
struct Decoded<'a> {
    job: u64,
    kind: u8,
    detail: &'a [u8],
    size: usize,
}

/// Where parsing resumes after bytes at `at` that are not a record: the next
/// place the marker occurs.
#[cfg(not(pace_mutant = "journal_no_resync"))]
fn resync(data: &[u8], at: usize) -> usize {
    data[at + 1..]
        .windows(MARKER.len())
        .position(|w| w == MARKER)
        .map_or(data.len(), |p| at + 1 + p)
}

/// Known-wrong: everything after the first bad bytes is taken as the tail.
#[cfg(pace_mutant = "journal_no_resync")]
fn resync(data: &[u8], _at: usize) -> usize {
    data.len()
}

/// Parse journal bytes: every valid record, wherever it lies, with the
/// damaged ranges between them and the torn tail after them. Never panics.
pub fn parse(data: &[u8]) -> Recovery {
    let mut r = Recovery::default();
    let mut at = 0usize;
    let mut bad_from: Option<usize> = None;
    let mut acks: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut furthest: BTreeMap<u64, Stage> = BTreeMap::new();
    while at < data.len() {
        let Some(rec) = decode(data, at) else {
            bad_from.get_or_insert(at);
            at = resync(data, at);
            continue;
        };
        if let Some(from) = bad_from.take() {
            r.damage.push(Damage {
                offset: from as u64,
                len: (at - from) as u64,
                acknowledged: false,
            });
        }
        if rec.kind == KIND_ACK {
            if let Ok(len) = <[u8; 8]>::try_from(rec.detail) {
                acks.insert((rec.job, u64::from_le_bytes(len)));
            }
        } else if let Some(stage) = Stage::from_code(rec.kind) {
            if furthest.get(&rec.job).is_none_or(|&p| stage >= p) {
                furthest.insert(rec.job, stage);
                r.details.insert(rec.job, rec.detail.to_vec());
            }
        }
        r.records += 1;
        at += rec.size;
        r.valid_len = at as u64;
    }
    if bad_from.is_some() {
        r.torn_tail = Some(r.valid_len);
    }
    for d in &mut r.damage {
        d.acknowledged = acks.contains(&(d.offset, d.len));
    }
    r.jobs = furthest
        .into_iter()
        .map(|(j, s)| (j, JobState::from(s)))
        .collect();
    r
}

/// The valid record starting at `at`, if there is one. The cheap checks
/// (marker, length, stored offset, kind) come before the checksum, so a
/// scan past damage hashes almost nothing but real records.
fn decode(data: &[u8], at: usize) -> Option<Decoded<'_>> {
    let rest = data.get(at..)?;
    if rest.get(0..4)? != MARKER {
        return None;
    }
    let crc = u32::from_le_bytes(rest.get(4..8)?.try_into().ok()?);
    let len = u32::from_le_bytes(rest.get(8..HEADER)?.try_into().ok()?);
    if len > MAX_RECORD || (len as usize) < FIXED {
        return None;
    }
    let size = HEADER + len as usize;
    let body = rest.get(HEADER..size)?;
    let offset = u64::from_le_bytes(body[0..8].try_into().ok()?);
    let job = u64::from_le_bytes(body[8..16].try_into().ok()?);
    let kind = body[16];
    let known = Stage::from_code(kind).is_some() || (kind == KIND_ACK && len as usize == FIXED + 8);
    if offset != at as u64 || !known || crc32fast::hash(&rest[8..size]) != crc {
        return None;
    }
    Some(Decoded {
        job,
        kind,
        detail: &body[FIXED..],
        size,
    })
}
