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
//! [`recover`] classifies every job by the last step it recorded:
//! admitted only → [`JobState::SafeToRetry`]; write sent but not completed →
//! [`JobState::InDoubt`] (the outcome is unknown: report it, or retry only
//! idempotently); completed → [`JobState::Done`]. Because "write sent" is
//! durable before the write starts, a job whose write may have happened is
//! never called safe to retry; because "completed" is durable before the
//! caller is told, a completed job is never lost.
//!
//! A crash can tear the last record. Each record carries its length and a
//! CRC-32 of its content; recovery stops at the first record that is short
//! or does not check, reports where, and [`Journal::open`] truncates the
//! file there before appending, so a torn tail is ignored and never hides
//! later records.
//!
//! Record layout (little-endian): `len: u32` (of what follows the CRC),
//! `crc32: u32` (of those `len` bytes), then `job: u64`, `stage: u8`,
//! `detail: [u8]`.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The largest record accepted (its `len` field); anything larger is taken
/// as a torn or corrupt tail rather than allocated.
pub const MAX_RECORD: u32 = 1 << 20;

const HEADER: usize = 8;
const FIXED: usize = 9;

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

/// The result of reading a journal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Every job seen, by the furthest stage it recorded.
    pub jobs: BTreeMap<u64, JobState>,
    /// The detail bytes of each job's furthest record.
    pub details: BTreeMap<u64, Vec<u8>>,
    /// Valid records read.
    pub records: u64,
    /// Bytes of valid records (where the next record goes).
    pub valid_len: u64,
    /// Where a torn or corrupt tail starts, if the file goes on past the
    /// last valid record.
    pub torn_tail: Option<u64>,
}

impl Recovery {
    /// Jobs that did not complete, with what may be done about them.
    pub fn unfinished(&self) -> impl Iterator<Item = (u64, JobState)> + '_ {
        self.jobs
            .iter()
            .filter(|(_, s)| **s != JobState::Done)
            .map(|(j, s)| (*j, *s))
    }
}

/// A record could not be written.
#[derive(Debug)]
pub enum JournalError {
    /// The detail is longer than [`MAX_RECORD`] allows.
    DetailTooLong {
        /// Its length.
        len: usize,
    },
    /// The file could not be read, written or synced.
    Io(io::Error),
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::DetailTooLong { len } => {
                write!(f, "journal detail of {len} bytes exceeds the record limit")
            }
            JournalError::Io(e) => write!(f, "journal I/O failed: {e}"),
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JournalError::DetailTooLong { .. } => None,
            JournalError::Io(e) => Some(e),
        }
    }
}

impl From<io::Error> for JournalError {
    fn from(e: io::Error) -> Self {
        JournalError::Io(e)
    }
}

/// An open journal, appending.
#[derive(Debug)]
pub struct Journal {
    file: File,
}

impl Journal {
    /// Open (or create) the journal at `path`: recover what it holds,
    /// truncate a torn tail, and position for appending.
    ///
    /// # Errors
    /// The file cannot be opened, read, truncated or synced.
    pub fn open(path: impl AsRef<Path>) -> io::Result<(Journal, Recovery)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let recovery = read_records(&mut file)?;
        if recovery.torn_tail.is_some() {
            file.set_len(recovery.valid_len)?;
            file.sync_data()?;
        }
        file.seek(SeekFrom::Start(recovery.valid_len))?;
        Ok((Journal { file }, recovery))
    }

    /// Append one record and wait until it is on disk. Call it *before*
    /// doing what `stage` says.
    ///
    /// # Errors
    /// [`JournalError::DetailTooLong`], or the write or sync failed (then
    /// the job must not go ahead: its intent is not durable).
    pub fn record(&mut self, job: u64, stage: Stage, detail: &[u8]) -> Result<(), JournalError> {
        let body_len = FIXED + detail.len();
        let len = u32::try_from(body_len)
            .ok()
            .filter(|&l| l <= MAX_RECORD)
            .ok_or(JournalError::DetailTooLong { len: detail.len() })?;
        let mut buf = Vec::with_capacity(HEADER + body_len);
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&job.to_le_bytes());
        buf.push(stage.code());
        buf.extend_from_slice(detail);
        let crc = crc32fast::hash(&buf[HEADER..]);
        buf[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        // One write of the whole record: a crash leaves a prefix of it at
        // worst, which recovery detects as a torn tail.
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        Ok(())
    }
}

/// Read the journal at `path` without changing it. A journal that does not
/// exist yet holds nothing.
///
/// # Errors
/// The file exists but cannot be opened or read.
pub fn recover(path: impl AsRef<Path>) -> io::Result<Recovery> {
    match File::open(path) {
        Ok(mut file) => read_records(&mut file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Recovery::default()),
        Err(e) => Err(e),
    }
}

fn read_records(file: &mut File) -> io::Result<Recovery> {
    let mut data = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut data)?;
    Ok(parse(&data))
}

/// Parse journal bytes: every valid record up to the first short or
/// corrupt one. Public for tests and fuzzing; never panics.
pub fn parse(data: &[u8]) -> Recovery {
    let mut r = Recovery::default();
    let mut at = 0usize;
    let mut furthest: BTreeMap<u64, Stage> = BTreeMap::new();
    while at < data.len() {
        let Some(record) = parse_one(&data[at..]) else {
            r.torn_tail = Some(at as u64);
            break;
        };
        let (job, stage, detail, used) = record;
        let further = match furthest.get(&job) {
            Some(&p) => stage >= p,
            None => true,
        };
        if further {
            furthest.insert(job, stage);
            r.details.insert(job, detail.to_vec());
        }
        r.records += 1;
        at += used;
        r.valid_len = at as u64;
    }
    r.jobs = furthest
        .into_iter()
        .map(|(j, s)| (j, JobState::from(s)))
        .collect();
    r
}

fn parse_one(data: &[u8]) -> Option<(u64, Stage, &[u8], usize)> {
    let len = u32::from_le_bytes(data.get(0..4)?.try_into().ok()?);
    let crc = u32::from_le_bytes(data.get(4..HEADER)?.try_into().ok()?);
    if len > MAX_RECORD || (len as usize) < FIXED {
        return None;
    }
    let body = data.get(HEADER..HEADER + len as usize)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    let job = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
    let stage = Stage::from_code(*body.get(8)?)?;
    Some((job, stage, body.get(FIXED..)?, HEADER + len as usize))
}
