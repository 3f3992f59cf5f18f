//! The intent journal: crash tests that kill a child process at random
//! points, and torn tails.
#![cfg(feature = "journal")]

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use pace::gate::journal::{parse, recover, JobState, Journal, Stage};
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "PACE_JOURNAL_CHILD_DIR";

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

/// Kill the worker at random points, several times over the same journal
/// (each restart recovers, truncates a torn tail and goes on). After every
/// kill: no job whose external write happened is called safe to retry, no
/// acknowledged job is anything but done, and done implies written.
#[test]
fn killed_worker_never_loses_a_completed_job_or_forgets_a_sent_write() {
    let dir = scratch("kill");
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut torn_seen = 0;
    for round in 0..12 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "journal_child_worker",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        thread::sleep(Duration::from_millis(rng.gen_range(10..120)));
        child.kill().unwrap();
        child.wait().unwrap();

        let rec = recover(dir.join("journal")).unwrap();
        torn_seen += usize::from(rec.torn_tail.is_some());
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
        // Each kill leaves at most the one job it interrupted unfinished, and
        // restarts re-run the ones that were safe to retry.
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
