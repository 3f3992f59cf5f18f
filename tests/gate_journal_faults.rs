//! The intent journal under injected faults, each checked exactly against a
//! model built from the record boundaries the writer produced (the storage
//! length after each acknowledged `record`), not from the parser:
//!
//! * every single-bit flip of a small journal (jobs at every stage);
//! * a write that fails after every possible byte count of every record,
//!   and a failed sync, with and without a failing truncation;
//! * two writers on one file.
#![cfg(feature = "journal")]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;

use pace::gate::journal::{
    parse, recover, Damage, JobState, Journal, JournalError, Stage, Storage,
};

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("pace-journal-faults-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Put `bytes` in the file without truncating it to zero first (ext4 flushes
/// a file rewritten that way on close, which makes thousands of rewrites
/// slow on a busy disk).
fn overwrite(path: &std::path::Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
    f.set_len(bytes.len() as u64).unwrap();
}

/// An in-memory file with one-shot faults.
#[derive(Clone, Debug, Default)]
struct Mem {
    data: Rc<RefCell<Vec<u8>>>,
    /// The next write stores this many bytes (at most) and then fails.
    fail_write_after: Rc<RefCell<Option<usize>>>,
    /// The next sync fails.
    fail_sync: Rc<RefCell<bool>>,
    /// Every truncation fails.
    fail_truncate: Rc<RefCell<bool>>,
    /// Writes attempted.
    writes: Rc<RefCell<usize>>,
}

impl Mem {
    fn bytes(&self) -> Vec<u8> {
        self.data.borrow().clone()
    }
}

impl Storage for Mem {
    fn read_all(&mut self) -> io::Result<Vec<u8>> {
        Ok(self.bytes())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        *self.writes.borrow_mut() += 1;
        let limit = self.fail_write_after.borrow_mut().take();
        let n = limit.map_or(buf.len(), |l| l.min(buf.len()));
        let mut data = self.data.borrow_mut();
        let offset = offset as usize;
        if data.len() < offset + n {
            data.resize(offset + n, 0);
        }
        data[offset..offset + n].copy_from_slice(&buf[..n]);
        match limit {
            Some(_) => Err(io::Error::other("injected: disk full")),
            None => Ok(()),
        }
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        if *self.fail_truncate.borrow() {
            return Err(io::Error::other("injected truncate failure"));
        }
        self.data.borrow_mut().resize(len as usize, 0);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        if std::mem::take(&mut *self.fail_sync.borrow_mut()) {
            return Err(io::Error::other("injected sync failure"));
        }
        Ok(())
    }
}

type Rec = (u64, Stage, &'static [u8]);

/// Five jobs, every stage, interleaved.
const SEQ: &[Rec] = &[
    (1, Stage::Admitted, b"put /a"),
    (2, Stage::Admitted, b"put /b"),
    (1, Stage::WriteSent, b""),
    (3, Stage::Admitted, b"put /c"),
    (2, Stage::WriteSent, b""),
    (1, Stage::Completed, b""),
    (4, Stage::Admitted, b"put /d"),
    (4, Stage::WriteSent, b"x"),
    (5, Stage::Admitted, b""),
    (4, Stage::Completed, b"ok"),
    (5, Stage::WriteSent, b""),
];

/// The model: each job's furthest stage among the given records.
fn classify<'a>(records: impl IntoIterator<Item = &'a Rec>) -> BTreeMap<u64, JobState> {
    let mut furthest: BTreeMap<u64, Stage> = BTreeMap::new();
    for &(job, stage, _) in records {
        let f = furthest.entry(job).or_insert(stage);
        *f = (*f).max(stage);
    }
    furthest
        .into_iter()
        .map(|(job, stage)| {
            let state = match stage {
                Stage::Admitted => JobState::SafeToRetry,
                Stage::WriteSent => JobState::InDoubt,
                Stage::Completed => JobState::Done,
            };
            (job, state)
        })
        .collect()
}

/// Write `records` cleanly; return the bytes and each record's byte range
/// as the writer produced it.
fn write_clean(records: &[Rec]) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mem = Mem::default();
    let (mut j, rec) = Journal::open_storage(mem.clone()).unwrap();
    assert_eq!(rec, Default::default());
    let mut ranges = Vec::new();
    for &(job, stage, detail) in records {
        let start = mem.bytes().len();
        j.record(job, stage, detail).unwrap();
        ranges.push((start, mem.bytes().len()));
    }
    (mem.bytes(), ranges)
}

/// Flip every bit of the journal, one at a time. A flip damages exactly the
/// record holding it (CRC-32 catches every single-bit error; the marker and
/// the stored offset are compared exactly). If that record is followed by
/// another, recovery and `open` report damage at its offset and `open`
/// leaves the file untouched, while `parse` keeps every other record. If it
/// is the last one, it is a torn tail: dropped, and `open` truncates the
/// file exactly to the end of the record before it (checked in memory for
/// every flip, and on the file for the record's first and last byte, to
/// keep the syncs few). Either way, no job with
/// a valid WriteSent or Completed record is ever SafeToRetry.
#[test]
fn every_single_bit_flip_is_reported_or_dropped_as_a_tail_never_misclassified() {
    let dir = scratch("flip");
    let path = dir.join("journal");
    let (bytes, ranges) = write_clean(SEQ);
    let n = SEQ.len();
    let mut flips = 0;
    for byte in 0..bytes.len() {
        let k = ranges
            .iter()
            .position(|&(s, e)| s <= byte && byte < e)
            .unwrap();
        let (start, end) = ranges[k];
        let others: Vec<Rec> = (0..n).filter(|&i| i != k).map(|i| SEQ[i]).collect();
        let expected = classify(&others);
        for bit in 0..8 {
            flips += 1;
            let mut flipped = bytes.clone();
            flipped[byte] ^= 1 << bit;
            let at = format!("byte {byte} bit {bit} (record {k})");

            let r = parse(&flipped);
            assert_eq!(r.jobs, expected, "{at}");
            assert_eq!(r.records, n as u64 - 1, "{at}");
            for &(job, stage, _) in &others {
                if stage >= Stage::WriteSent {
                    assert_ne!(r.jobs[&job], JobState::SafeToRetry, "{at}: job {job}");
                }
            }

            overwrite(&path, &flipped);
            if k + 1 < n {
                let damage = Damage {
                    offset: start as u64,
                    len: (end - start) as u64,
                    acknowledged: false,
                };
                assert_eq!(r.damage, vec![damage], "{at}");
                assert_eq!(r.torn_tail, None, "{at}");
                assert_eq!(r.valid_len, bytes.len() as u64, "{at}");
                let corrupt = |e: JournalError| match e {
                    JournalError::Corrupt { offset, len } => (offset, len),
                    e => panic!("{at}: {e}"),
                };
                let want = (start as u64, (end - start) as u64);
                assert_eq!(corrupt(recover(&path).unwrap_err()), want, "{at}");
                assert_eq!(corrupt(Journal::open(&path).unwrap_err()), want, "{at}");
                assert_eq!(fs::read(&path).unwrap(), flipped, "{at}: open changed it");
                let mem = Mem::default();
                *mem.data.borrow_mut() = flipped.clone();
                let refused = Journal::open_storage(mem.clone()).map(|_| ()).unwrap_err();
                assert_eq!(corrupt(refused), want, "{at}");
                assert_eq!(mem.bytes(), flipped, "{at}: open changed it");
            } else {
                assert_eq!(r.damage, vec![], "{at}");
                assert_eq!(r.torn_tail, Some(start as u64), "{at}");
                assert_eq!(r.valid_len, start as u64, "{at}");
                assert_eq!(recover(&path).unwrap(), r, "{at}");
                // `open` truncates (and syncs): on the file for the first
                // and last byte of the record, in memory for every byte.
                let mem = Mem::default();
                *mem.data.borrow_mut() = flipped.clone();
                let (_, opened) = Journal::open_storage(mem.clone()).unwrap();
                assert_eq!(
                    (opened, mem.bytes()),
                    (r.clone(), bytes[..start].to_vec()),
                    "{at}"
                );
                if byte == start || byte + 1 == end {
                    let (j, opened) = Journal::open(&path).unwrap();
                    drop(j);
                    assert_eq!(opened, r, "{at}");
                    assert_eq!(fs::read(&path).unwrap(), bytes[..start], "{at}");
                }
            }
        }
    }
    assert_eq!(flips, bytes.len() * 8);
    eprintln!("journal bit flips: {flips} ({} records)", SEQ.len());
    let _ = fs::remove_dir_all(&dir);
}

/// Damage in two middle records: `open` refuses at the first; `repair`
/// acknowledges both, keeps every valid record and every byte of the file,
/// appends after it; from then on `recover` and `open` accept the file.
#[test]
fn repair_acknowledges_damage_and_keeps_every_valid_record() {
    let dir = scratch("repair");
    let path = dir.join("journal");
    let (bytes, ranges) = write_clean(SEQ);
    let (a, b) = (2, 7); // 1 WriteSent, 4 WriteSent
    let mut flipped = bytes.clone();
    flipped[ranges[a].0 + 20] ^= 0x08;
    flipped[ranges[b].0 + 1] ^= 0x80;
    fs::write(&path, &flipped).unwrap();
    let damage = |i: usize, acknowledged| Damage {
        offset: ranges[i].0 as u64,
        len: (ranges[i].1 - ranges[i].0) as u64,
        acknowledged,
    };
    match Journal::open(&path) {
        Err(JournalError::Corrupt { offset, len }) => {
            assert_eq!(
                (offset, len),
                (damage(a, false).offset, damage(a, false).len)
            )
        }
        other => panic!("{other:?}"),
    }
    let kept: Vec<Rec> = (0..SEQ.len())
        .filter(|&i| i != a && i != b)
        .map(|i| SEQ[i])
        .collect();
    let (mut j, rec) = Journal::repair(&path).unwrap();
    assert_eq!(rec.damage, vec![damage(a, true), damage(b, true)]);
    assert_eq!(rec.jobs, classify(&kept));
    assert_eq!(rec.records, kept.len() as u64 + 2, "two acknowledgements");
    j.record(6, Stage::Admitted, b"after repair").unwrap();
    drop(j);
    let after = fs::read(&path).unwrap();
    assert_eq!(after[..flipped.len()], flipped[..], "repair rewrote bytes");
    let rec = recover(&path).unwrap();
    let mut kept_and_new = kept.clone();
    kept_and_new.push((6, Stage::Admitted, b"after repair"));
    assert_eq!(rec.jobs, classify(&kept_and_new));
    assert_eq!(rec.torn_tail, None);
    let (_j, reopened) = Journal::open(&path).unwrap();
    assert_eq!(reopened, rec);
    // Repairing a clean journal changes nothing.
    drop(_j);
    let (_j, again) = Journal::repair(&path).unwrap();
    assert_eq!(again, rec);
    assert_eq!(fs::read(&path).unwrap(), after);
    let _ = fs::remove_dir_all(&dir);
}

/// How the failing call goes wrong.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The write stores this many bytes of the record, then fails.
    Write(usize),
    /// The whole record is written, the sync fails.
    Sync,
}

/// Run SEQ through a journal on `mem`, injecting `fault` into record `i`.
/// Returns the results of every call.
fn run_with_fault(mem: &Mem, i: usize, fault: Fault) -> Vec<Result<(), JournalError>> {
    let (mut j, _) = Journal::open_storage(mem.clone()).unwrap();
    SEQ.iter()
        .enumerate()
        .map(|(idx, &(job, stage, detail))| {
            if idx == i {
                match fault {
                    Fault::Write(c) => *mem.fail_write_after.borrow_mut() = Some(c),
                    Fault::Sync => *mem.fail_sync.borrow_mut() = true,
                }
            }
            j.record(job, stage, detail)
        })
        .collect()
}

fn faults(size: usize) -> impl Iterator<Item = Fault> {
    (0..size).map(Fault::Write).chain([Fault::Sync])
}

/// A record whose write stops after every possible byte count (or whose
/// sync fails) returns an I/O error and leaves the journal exactly as it
/// was: the bytes afterwards are those of a clean journal of the
/// acknowledged records, so all of them are visible to recovery.
#[test]
fn failed_record_at_every_byte_leaves_the_journal_as_it_was() {
    let (_, ranges) = write_clean(SEQ);
    let mut cases = 0;
    for (i, &(start, end)) in ranges.iter().enumerate() {
        let acked: Vec<Rec> = (0..SEQ.len()).filter(|&x| x != i).map(|x| SEQ[x]).collect();
        let (clean, _) = write_clean(&acked);
        for fault in faults(end - start) {
            cases += 1;
            let mem = Mem::default();
            let results = run_with_fault(&mem, i, fault);
            for (idx, r) in results.iter().enumerate() {
                match (idx == i, r) {
                    (true, Err(JournalError::Io(_))) | (false, Ok(())) => {}
                    _ => panic!("record {i} {fault:?}: call {idx} returned {r:?}"),
                }
            }
            assert_eq!(mem.bytes(), clean, "record {i} {fault:?}");
            let rec = parse(&mem.bytes());
            assert_eq!(rec.jobs, classify(&acked), "record {i} {fault:?}");
            assert_eq!((rec.torn_tail, rec.damage.len()), (None, 0));
        }
    }
    assert_eq!(
        cases,
        ranges.iter().map(|(s, e)| e - s + 1).sum::<usize>(),
        "every byte count of every record, plus a sync failure each"
    );
    eprintln!("journal failed records: {cases} cases");
}

/// The same faults when truncating back fails too: the handle is poisoned,
/// every later call fails without touching the storage, and reopening
/// (a restart) recovers every acknowledged record, drops the garbage as a
/// torn tail and appends after it.
#[test]
fn failed_record_that_cannot_be_undone_poisons_the_handle() {
    let (_, ranges) = write_clean(SEQ);
    for (i, &(start, end)) in ranges.iter().enumerate() {
        let (before, _) = write_clean(&SEQ[..i]);
        for fault in faults(end - start) {
            let at = format!("record {i} {fault:?}");
            let mem = Mem::default();
            *mem.fail_truncate.borrow_mut() = true;
            let (mut j, _) = Journal::open_storage(mem.clone()).unwrap();
            for &(job, stage, detail) in &SEQ[..i] {
                j.record(job, stage, detail).unwrap();
            }
            match fault {
                Fault::Write(c) => *mem.fail_write_after.borrow_mut() = Some(c),
                Fault::Sync => *mem.fail_sync.borrow_mut() = true,
            }
            let (job, stage, detail) = SEQ[i];
            assert!(
                matches!(j.record(job, stage, detail), Err(JournalError::Io(_))),
                "{at}"
            );
            assert!(j.is_poisoned(), "{at}");
            let left = mem.bytes();
            let writes = *mem.writes.borrow();
            for &(job, stage, detail) in &SEQ[i + 1..] {
                assert!(
                    matches!(j.record(job, stage, detail), Err(JournalError::Poisoned)),
                    "{at}"
                );
            }
            assert_eq!(
                (mem.bytes(), *mem.writes.borrow()),
                (left.clone(), writes),
                "{at}"
            );
            drop(j);

            // What is left: the acknowledged records, then what the failed
            // call wrote (all of it, on a failed sync: a valid record that
            // was never acknowledged, which recovery may keep).
            let written = match fault {
                Fault::Write(c) => c,
                Fault::Sync => end - start,
            };
            assert_eq!(left.len(), start + written, "{at}");
            assert_eq!(left[..start], before[..], "{at}");
            *mem.fail_truncate.borrow_mut() = false;
            let (mut j, rec) = Journal::open_storage(mem.clone()).unwrap();
            let visible = if written == end - start { i + 1 } else { i };
            assert_eq!(rec.jobs, classify(&SEQ[..visible]), "{at}");
            assert_eq!(rec.damage, vec![], "{at}");
            let torn = (written > 0 && written < end - start).then_some(start as u64);
            assert_eq!(rec.torn_tail, torn, "{at}");
            for &(job, stage, detail) in &SEQ[visible..] {
                j.record(job, stage, detail).unwrap();
            }
            assert_eq!(mem.bytes(), write_clean(SEQ).0, "{at}");
        }
    }
}

/// A detail over the limit is refused before anything is written.
#[test]
fn detail_too_long_writes_nothing() {
    let mem = Mem::default();
    let (mut j, _) = Journal::open_storage(mem.clone()).unwrap();
    j.record(1, Stage::Admitted, b"a").unwrap();
    let before = mem.bytes();
    let big = vec![0u8; pace::gate::journal::MAX_RECORD as usize];
    assert!(matches!(
        j.record(2, Stage::Admitted, &big),
        Err(JournalError::DetailTooLong { len }) if len == big.len()
    ));
    assert_eq!(mem.bytes(), before);
    assert!(!j.is_poisoned());
    j.record(2, Stage::Admitted, b"b").unwrap();
    assert_eq!(parse(&mem.bytes()).records, 2);
}

/// One writer per file: a second `open` or `repair` is refused while the
/// first journal lives (reading with `recover` is not), and allowed after
/// it is dropped; the first journal's records are intact.
#[test]
fn second_writer_is_refused_until_the_first_is_dropped() {
    let dir = scratch("lock");
    let path = dir.join("journal");
    let (mut first, _) = Journal::open(&path).unwrap();
    first.record(1, Stage::Admitted, b"a").unwrap();
    assert!(matches!(Journal::open(&path), Err(JournalError::Locked)));
    assert!(matches!(Journal::repair(&path), Err(JournalError::Locked)));
    first.record(1, Stage::WriteSent, b"").unwrap();
    assert_eq!(recover(&path).unwrap().records, 2);
    drop(first);
    let (mut second, rec) = Journal::open(&path).unwrap();
    assert_eq!(rec.jobs, classify(&[(1, Stage::WriteSent, &b""[..])]));
    second.record(1, Stage::Completed, b"").unwrap();
    assert!(matches!(Journal::open(&path), Err(JournalError::Locked)));
    drop(second);
    assert_eq!(recover(&path).unwrap().jobs[&1], JobState::Done);
    let _ = fs::remove_dir_all(&dir);
}

proptest::proptest! {
    /// One or two bursts of random bytes anywhere (spanning record
    /// boundaries or not): exactly the records with a changed byte are
    /// lost; consecutive lost records form one damaged range, reported by
    /// `open` (which then changes nothing) unless they run to the end,
    /// where they are a torn tail `open` truncates; every other record is
    /// kept and classified.
    #[test]
    fn random_bursts_lose_exactly_the_records_they_touch(
        bursts in proptest::collection::vec(
            (0usize..400, proptest::collection::vec(proptest::num::u8::ANY, 1..40)),
            1..3,
        )
    ) {
        let (bytes, ranges) = write_clean(SEQ);
        let mut data = bytes.clone();
        for (at, burst) in &bursts {
            let at = at % data.len();
            let end = (at + burst.len()).min(data.len());
            data[at..end].copy_from_slice(&burst[..end - at]);
        }
        let touched: Vec<bool> = ranges.iter().map(|&(s, e)| data[s..e] != bytes[s..e]).collect();
        let kept: Vec<Rec> = (0..SEQ.len()).filter(|&i| !touched[i]).map(|i| SEQ[i]).collect();
        // The model's damage: maximal runs of touched records.
        let mut damage = Vec::new();
        let mut i = 0;
        while i < SEQ.len() {
            if touched[i] {
                let first = i;
                while i < SEQ.len() && touched[i] {
                    i += 1;
                }
                damage.push((ranges[first].0, ranges[i - 1].1, i == SEQ.len()));
            } else {
                i += 1;
            }
        }
        let tail = damage.last().filter(|d| d.2).map(|d| d.0);
        let middle: Vec<Damage> = damage
            .iter()
            .filter(|d| !d.2)
            .map(|&(s, e, _)| Damage { offset: s as u64, len: (e - s) as u64, acknowledged: false })
            .collect();

        let r = parse(&data);
        proptest::prop_assert_eq!(&r.jobs, &classify(&kept));
        proptest::prop_assert_eq!(r.records, kept.len() as u64);
        proptest::prop_assert_eq!(&r.damage, &middle);
        proptest::prop_assert_eq!(r.torn_tail, tail.map(|t| t as u64));
        proptest::prop_assert_eq!(r.valid_len, tail.unwrap_or(bytes.len()) as u64);

        let mem = Mem::default();
        *mem.data.borrow_mut() = data.clone();
        match (Journal::open_storage(mem.clone()), middle.first()) {
            (Err(JournalError::Corrupt { offset, len }), Some(d)) => {
                proptest::prop_assert_eq!((offset, len), (d.offset, d.len));
                proptest::prop_assert_eq!(mem.bytes(), data);
            }
            (Ok((_, opened)), None) => {
                proptest::prop_assert_eq!(opened, r);
                proptest::prop_assert_eq!(mem.bytes(), bytes[..tail.unwrap_or(bytes.len())].to_vec());
            }
            (other, d) => proptest::prop_assert!(false, "open gave {:?}, damage {:?}", other.map(|x| x.1), d),
        }
    }
}

/// A file with bytes but no valid record that does not start like a record
/// (a wrong path, zeros) is refused by `recover`, `open` and `repair` and
/// left untouched; a torn first append (every proper prefix of the first
/// record) is a torn tail, and `open` empties the file.
#[test]
fn a_file_that_is_not_a_journal_is_refused_untouched() {
    let dir = scratch("foreign");
    let path = dir.join("journal");
    for content in [
        &b"hello, world\n"[..],
        &[0u8; 64][..],
        &[0xA7, b'P', b'X'][..],
    ] {
        fs::write(&path, content).unwrap();
        assert!(matches!(recover(&path), Err(JournalError::NotAJournal)));
        assert!(matches!(
            Journal::open(&path),
            Err(JournalError::NotAJournal)
        ));
        assert!(matches!(
            Journal::repair(&path),
            Err(JournalError::NotAJournal)
        ));
        assert_eq!(fs::read(&path).unwrap(), content);
    }
    let (first, _) = write_clean(&SEQ[..1]);
    for cut in 1..first.len() {
        let mem = Mem::default();
        *mem.data.borrow_mut() = first[..cut].to_vec();
        let (_, rec) = Journal::open_storage(mem.clone()).unwrap();
        assert_eq!((rec.records, rec.torn_tail), (0, Some(0)), "cut {cut}");
        assert_eq!(mem.bytes(), Vec::<u8>::new(), "cut {cut}");
    }
    let _ = fs::remove_dir_all(&dir);
}
