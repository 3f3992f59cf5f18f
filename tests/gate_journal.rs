//! The intent journal: crash tests that kill a child process at random
//! points and before every step, torn tails, one writer per file, and the
//! issue's damaged-middle-record case. The exact fault-injection tests are
//! in `gate_journal_faults.rs`.
#![cfg(feature = "journal")]

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{RwLock, RwLockReadGuard};
use std::thread;
use std::time::Duration;

use pace::gate::journal::{parse, recover, JobState, Journal, Stage};
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "PACE_JOURNAL_CHILD_DIR";

/// A child process holds a copy of every descriptor open in this process
/// from its spawn until its exec, and with it the journal's lock (a `flock`
/// belongs to the open file, not to the descriptor): a test that drops a
/// journal and opens it again while another test spawns a worker can find
/// it still locked. Spawns take this lock for writing; tests that reopen a
/// journal hold it for reading.
static SPAWNS: RwLock<()> = RwLock::new(());

fn no_spawns() -> RwLockReadGuard<'static, ()> {
    SPAWNS.read().unwrap_or_else(|e| e.into_inner())
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pace-journal-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Append a line and sync it: the "external system" and the acknowledgements.
fn append_line(path: &Path, line: u64) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
    f.sync_data().unwrap();
}

/// Complete lines only: a line torn by the kill names no job.
fn read_lines(path: &Path) -> BTreeSet<u64> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut out = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find('\n') {
        out.insert(rest[..i].parse().unwrap());
        rest = &rest[i + 1..];
    }
    out
}

const CRASH_AT_ENV: &str = "PACE_JOURNAL_CRASH_AT";

/// The worker the crash test kills: runs jobs forever, journaling each step
/// before acting. Does nothing unless started by `killed_worker_...`. With
/// `PACE_JOURNAL_CRASH_AT=n` it also aborts itself just before its n-th
/// step (a journal record or an external write), so every gap between two
/// steps is hit, not only the ones a timed kill happens to land in.
#[test]
fn journal_child_worker() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let crash_at: u64 = std::env::var(CRASH_AT_ENV).map_or(u64::MAX, |v| v.parse().unwrap());
    let mut steps = 0u64;
    let mut step = || {
        steps += 1;
        if steps == crash_at {
            std::process::abort();
        }
    };
    let (mut journal, recovery) = Journal::open(dir.join("journal")).unwrap();
    let mut run = |journal: &mut Journal, job: u64, admit: bool| {
        if admit {
            step();
            journal.record(job, Stage::Admitted, b"intent").unwrap();
        }
        step();
        journal.record(job, Stage::WriteSent, b"").unwrap();
        step();
        append_line(&dir.join("external"), job); // the external write
        step();
        journal.record(job, Stage::Completed, b"").unwrap();
        step();
        append_line(&dir.join("acked"), job); // the caller is told
    };
    // A restarted worker first re-runs what is safe to retry (in-doubt jobs
    // are left to be reported), then continues after the jobs it knows.
    let retry: Vec<u64> = recovery
        .unfinished()
        .filter(|(_, s)| *s == JobState::SafeToRetry)
        .map(|(j, _)| j)
        .collect();
    for job in retry {
        run(&mut journal, job, false);
    }
    let mut job = recovery.jobs.keys().next_back().map_or(0, |j| j + 1);
    loop {
        run(&mut journal, job, true);
        job += 1;
    }
}

/// What must hold after any crash of the worker: no job whose external
/// write happened is called safe to retry, no acknowledged job is anything
/// but done, done implies written, and each crash leaves at most the one
/// job it interrupted unfinished (restarts re-run the ones safe to retry).
/// Returns whether the journal had a torn tail.
fn check_after_crash(dir: &Path, round: usize) -> bool {
    let rec = recover(dir.join("journal")).unwrap();
    let external = read_lines(&dir.join("external"));
    let acked = read_lines(&dir.join("acked"));
    for job in &external {
        let state = rec.jobs.get(job);
        assert!(
            matches!(state, Some(JobState::InDoubt | JobState::Done)),
            "round {round}: job {job} was written but recovery says {state:?}"
        );
    }
    for job in &acked {
        assert_eq!(
            rec.jobs.get(job),
            Some(&JobState::Done),
            "round {round}: job {job}"
        );
    }
    for (job, state) in &rec.jobs {
        if *state == JobState::Done {
            assert!(
                external.contains(job),
                "round {round}: job {job} done, never written"
            );
        }
    }
    let safe = rec
        .unfinished()
        .filter(|(_, s)| *s == JobState::SafeToRetry)
        .count();
    assert!(safe <= 1, "round {round}: {:?}", rec.jobs);
    assert!(
        rec.unfinished().count() <= round + 1,
        "round {round}: {:?}",
        rec.jobs
    );
    rec.torn_tail.is_some()
}

fn spawn_worker(dir: &Path, crash_at: Option<u64>) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "journal_child_worker",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, dir)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let Some(n) = crash_at {
        cmd.env(CRASH_AT_ENV, n.to_string());
    }
    let _spawning = SPAWNS.write().unwrap_or_else(|e| e.into_inner());
    cmd.spawn().unwrap()
}

/// Kill the worker at random points, several times over the same journal
/// (each restart recovers, truncates a torn tail and goes on). After every
/// kill: no job whose external write happened is called safe to retry, no
/// acknowledged job is anything but done, and done implies written.
#[test]
fn killed_worker_never_loses_a_completed_job_or_forgets_a_sent_write() {
    let dir = scratch("kill");
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut torn_seen = 0;
    for round in 0..12 {
        let mut child = spawn_worker(&dir, None);
        thread::sleep(Duration::from_millis(rng.gen_range(10..120)));
        child.kill().unwrap();
        child.wait().unwrap();

        torn_seen += usize::from(check_after_crash(&dir, round));
    }
    let rec = recover(dir.join("journal")).unwrap();
    assert!(rec.records > 0);
    eprintln!(
        "journal crash test: {} jobs, {} records, {} in doubt, {torn_seen} torn tails seen",
        rec.jobs.len(),
        rec.records,
        rec.unfinished()
            .filter(|(_, s)| *s == JobState::InDoubt)
            .count()
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Crash the worker just before its `first`-th step (a journal record or an
/// external write), restart it on the same journal and crash it again just
/// before its `second`-th step, for every `first` in 1..=6 (each gap around
/// the first job's five steps) and `second` in 1..=5 (which includes
/// re-running a job recovered as safe to retry), each pair on a fresh
/// journal: every gap between two steps is hit, not only those a timed
/// kill happens to land in.
#[test]
fn worker_crashed_at_every_step_never_loses_a_completed_job_or_forgets_a_sent_write() {
    let mut crashes = 0;
    for first in 1..=6 {
        for second in 1..=5 {
            let dir = scratch(&format!("steps-{first}-{second}"));
            for (round, crash_at) in [first, second].into_iter().enumerate() {
                let status = spawn_worker(&dir, Some(crash_at)).wait().unwrap();
                assert!(
                    !status.success(),
                    "step {crash_at}: the worker did not crash"
                );
                check_after_crash(&dir, round);
                crashes += 1;
            }
            let _ = fs::remove_dir_all(&dir);
        }
    }
    assert_eq!(crashes, 60);
}

/// A live worker in another process holds the journal: opening it is
/// refused; once the worker is killed (its lock dies with it), it opens.
#[test]
fn journal_of_a_live_worker_process_cannot_be_opened() {
    let dir = scratch("live");
    let path = dir.join("journal");
    let mut child = spawn_worker(&dir, None);
    while read_lines(&dir.join("acked")).is_empty() {
        thread::sleep(Duration::from_millis(5));
    }
    let second = Journal::open(&path);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(second.is_err(), "a second writer opened a live journal");
    let (_j, rec) = Journal::open(&path).unwrap();
    assert!(rec.jobs.values().any(|s| *s == JobState::Done));
    let _ = fs::remove_dir_all(&dir);
}

/// Two `open`s of one file in one process: the second is refused while the
/// first journal lives, and succeeds after it is dropped.
#[test]
fn second_open_is_refused_while_the_first_journal_lives() {
    let _no_spawns = no_spawns();
    let dir = scratch("twice");
    let path = dir.join("journal");
    let (mut first, _) = Journal::open(&path).unwrap();
    first.record(1, Stage::Admitted, b"a").unwrap();
    assert!(Journal::open(&path).is_err());
    first.record(1, Stage::WriteSent, b"").unwrap();
    drop(first);
    let (_second, rec) = Journal::open(&path).unwrap();
    assert_eq!(rec.jobs.get(&1), Some(&JobState::InDoubt));
    assert_eq!(rec.records, 2);
    let _ = fs::remove_dir_all(&dir);
}

/// One flipped bit anywhere in the middle record of a completed job: the
/// job is never reported safe to retry (recovery reports damage instead, or
/// classifies it from the later Completed record), and `open` never
/// shortens the file.
#[test]
fn flipped_bit_in_a_middle_record_is_never_a_silent_truncation() {
    let _no_spawns = no_spawns();
    let dir = scratch("middle");
    let path = dir.join("journal");
    let (mut j, _) = Journal::open(&path).unwrap();
    let mut ends = vec![0];
    for stage in [Stage::Admitted, Stage::WriteSent, Stage::Completed] {
        j.record(1, stage, b"put /a").unwrap();
        ends.push(fs::metadata(&path).unwrap().len() as usize);
    }
    drop(j);
    let bytes = fs::read(&path).unwrap();
    for byte in ends[1]..ends[2] {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[byte] ^= 1 << bit;
            fs::write(&path, &flipped).unwrap();
            if let Ok(rec) = recover(&path) {
                assert_eq!(
                    rec.jobs.get(&1),
                    Some(&JobState::Done),
                    "byte {byte} bit {bit}"
                );
            }
            drop(Journal::open(&path));
            assert_eq!(fs::read(&path).unwrap(), flipped, "byte {byte} bit {bit}");
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

fn sample_journal(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("journal");
    let (mut j, rec) = Journal::open(&path).unwrap();
    assert_eq!(rec, Default::default());
    j.record(1, Stage::Admitted, b"put /a").unwrap();
    j.record(1, Stage::WriteSent, b"").unwrap();
    j.record(1, Stage::Completed, b"").unwrap();
    j.record(2, Stage::Admitted, b"put /b").unwrap();
    j.record(2, Stage::WriteSent, b"").unwrap();
    j.record(3, Stage::Admitted, b"put /c").unwrap();
    drop(j);
    let bytes = fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn recovery_classifies_by_the_furthest_step() {
    let _no_spawns = no_spawns();
    let dir = scratch("classify");
    let (path, bytes) = sample_journal(&dir);
    let rec = recover(&path).unwrap();
    assert_eq!(rec.records, 6);
    assert_eq!(rec.torn_tail, None);
    assert_eq!(rec.valid_len, bytes.len() as u64);
    assert_eq!(
        rec.jobs.into_iter().collect::<Vec<_>>(),
        vec![
            (1, JobState::Done),
            (2, JobState::InDoubt),
            (3, JobState::SafeToRetry)
        ]
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Cut the journal at every byte of its last record, and append garbage:
/// the torn record is detected, the ones before it stand, and reopening
/// truncates it so that new records are readable after it.
#[test]
fn torn_tail_is_detected_ignored_and_truncated() {
    let _no_spawns = no_spawns();
    let dir = scratch("torn");
    let (path, bytes) = sample_journal(&dir);
    let whole = parse(&bytes);
    let before_last = parse(&bytes[..bytes.len() - 1]).valid_len as usize;
    assert!(before_last < bytes.len());
    let five = {
        let mut r = whole.clone();
        r.jobs.remove(&3);
        r.jobs
    };
    for cut in before_last + 1..bytes.len() {
        let r = parse(&bytes[..cut]);
        assert_eq!(r.torn_tail, Some(before_last as u64), "cut at {cut}");
        assert_eq!(r.records, 5);
        assert_eq!(r.jobs, five, "cut at {cut}");
    }
    // A flipped bit in the last record's content fails its checksum.
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 0x40;
    assert_eq!(parse(&flipped).torn_tail, Some(before_last as u64));
    // A huge length field is a torn tail, not an allocation.
    let mut huge = bytes.clone();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&[0; 20]);
    assert_eq!(parse(&huge).torn_tail, Some(bytes.len() as u64));

    // Reopen a file with a torn tail: truncated, then appended after.
    fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let (mut j, rec) = Journal::open(&path).unwrap();
    assert_eq!(rec.torn_tail, Some(before_last as u64));
    j.record(3, Stage::Admitted, b"put /c again").unwrap();
    drop(j);
    let rec = recover(&path).unwrap();
    assert_eq!(rec.torn_tail, None);
    assert_eq!(rec.records, 6);
    assert_eq!(rec.jobs.get(&3), Some(&JobState::SafeToRetry));
    assert_eq!(
        rec.details.get(&3).map(Vec::as_slice),
        Some(&b"put /c again"[..])
    );
    let _ = fs::remove_dir_all(&dir);
}

proptest::proptest! {
    /// Any bytes after a valid journal: parsing never panics, keeps every
    /// valid record before them, and reports a torn tail exactly when it
    /// stops short of the end.
    #[test]
    fn garbage_after_a_journal_is_a_torn_tail(garbage in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
        let dir = std::env::temp_dir().join(format!("pace-journal-{}-garbage", std::process::id()));
        let bytes = {
            static SAMPLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            SAMPLE.get_or_init(|| {
                let _no_spawns = no_spawns();
                let _ = fs::remove_dir_all(&dir);
                fs::create_dir_all(&dir).unwrap();
                let (_, bytes) = sample_journal(&dir);
                let _ = fs::remove_dir_all(&dir);
                bytes
            }).clone()
        };
        let mut data = bytes.clone();
        data.extend_from_slice(&garbage);
        let r = parse(&data);
        proptest::prop_assert!(r.records >= 6);
        proptest::prop_assert!(r.valid_len >= bytes.len() as u64 && r.valid_len <= data.len() as u64);
        proptest::prop_assert_eq!(r.torn_tail.is_none(), r.valid_len == data.len() as u64);
        if r.records == 6 {
            proptest::prop_assert_eq!(r.jobs, parse(&bytes).jobs);
        }
    }
}
