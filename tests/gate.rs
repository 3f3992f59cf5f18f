//! Behaviour of `pace::Gate`: exact outcomes, exact counters, nothing leaked.

use std::error::Error;
use std::io::{self, Read};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use pace::gate::{
    AdmitError, BodyError, BytePermit, Cancel, ConfigError, Gate, GateStats, Resource, ShrinkError,
    SlotPermit,
};

fn gate(slots: usize, bytes: u64, cap: u64) -> Gate {
    Gate::builder()
        .slots(slots)
        .bytes(bytes)
        .body_cap(cap)
        .build()
        .unwrap()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// Held now, as a pair (slots, bytes).
fn held(g: &Gate) -> (usize, u64) {
    let s = g.stats();
    (s.slots_held, s.bytes_held)
}

fn assert_clean(g: &Gate) {
    let s = g.stats();
    assert_eq!((s.slots_held, s.bytes_held, s.waiting), (0, 0, 0), "{s:?}");
}

/// Spin (yielding) until `cond` holds. Synchronisation, not a timing check.
fn wait_until(mut cond: impl FnMut() -> bool) {
    while !cond() {
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn bad_configs_are_typed_errors() {
    let b = || Gate::builder().slots(1).bytes(10);
    assert_eq!(
        Gate::builder().bytes(10).build().unwrap_err(),
        ConfigError::ZeroSlots
    );
    assert_eq!(
        Gate::builder().slots(1).build().unwrap_err(),
        ConfigError::ZeroBytes
    );
    assert_eq!(
        b().body_cap(0).build().unwrap_err(),
        ConfigError::ZeroBodyCap
    );
    assert_eq!(
        b().body_cap(11).build().unwrap_err(),
        ConfigError::BodyCapOverBudget {
            body_cap: 11,
            bytes: 10
        }
    );
    assert_eq!(
        b().body_cap(u64::MAX).build().unwrap_err(),
        ConfigError::BodyCapOverBudget {
            body_cap: u64::MAX,
            bytes: 10
        }
    );
    // The default cap is the whole budget.
    let g = b().build().unwrap();
    assert_eq!((g.slots(), g.bytes(), g.body_cap()), (1, 10, 10));
    let e: Box<dyn Error> = Box::new(ConfigError::ZeroBytes);
    assert_eq!(e.to_string(), "a gate needs a byte budget above zero");
}

#[test]
fn declared_length_over_cap_budget_or_u64_max_is_too_large() {
    let g = gate(4, 100, 60);
    for declared in [61, 100, 101, u64::MAX] {
        let want = AdmitError::TooLarge {
            declared,
            body_cap: 60,
        };
        assert_eq!(g.try_admit(Some(declared)).unwrap_err(), want);
        assert_eq!(g.admit(Some(declared), far()).unwrap_err(), want);
    }
    assert_eq!(g.stats().too_large, 8);
    assert_eq!(g.stats().saturated_bytes + g.stats().saturated_slots, 0);
    assert_clean(&g);
    assert_eq!(
        AdmitError::TooLarge {
            declared: 61,
            body_cap: 60
        }
        .to_string(),
        "declared body length 61 exceeds the body cap 60"
    );
}

#[test]
fn admission_reserves_declared_length_or_the_cap() {
    let g = gate(4, 100, 60);
    let a = g.try_admit(Some(30)).unwrap();
    assert_eq!(a.reserved_bytes(), 30);
    assert_eq!(held(&g), (1, 30));
    let b = g.try_admit(None).unwrap();
    assert_eq!(b.reserved_bytes(), 60);
    assert_eq!(held(&g), (2, 90));
    let z = g.try_admit(Some(0)).unwrap();
    assert_eq!(z.reserved_bytes(), 0);
    assert_eq!(held(&g), (3, 90));
    drop((a, b, z));
    assert_clean(&g);
    assert_eq!((g.stats().peak_slots, g.stats().peak_bytes), (3, 90));
}

#[test]
fn saturation_names_the_resource_and_rolls_back_the_slot() {
    let g = gate(2, 100, 100);
    let a = g.try_admit(Some(70)).unwrap();
    // Bytes short: the slot taken first is given back.
    assert_eq!(
        g.try_admit(Some(31)).unwrap_err(),
        AdmitError::Saturated {
            resource: Resource::Bytes
        }
    );
    assert_eq!(held(&g), (1, 70));
    let b = g.try_admit(Some(30)).unwrap();
    assert_eq!(held(&g), (2, 100));
    // Slots short (checked first, bytes untouched).
    assert_eq!(
        g.try_admit(Some(0)).unwrap_err(),
        AdmitError::Saturated {
            resource: Resource::Slots
        }
    );
    assert_eq!(held(&g), (2, 100));
    let s = g.stats();
    assert_eq!((s.saturated_bytes, s.saturated_slots), (1, 1));
    drop(a);
    drop(b);
    assert_clean(&g);
}

#[test]
fn permits_split_shrink_and_release_exactly_once() {
    let g = gate(2, 100, 100);
    let mut t = g.try_admit(Some(80)).unwrap();
    assert_eq!(t.shrink_to(70), Ok(10));
    assert_eq!(held(&g), (1, 70));
    let (slot, mut bytes) = t.split();
    assert_eq!(
        bytes.shrink_to(71),
        Err(ShrinkError {
            requested: 71,
            held: 70
        })
    );
    assert_eq!(bytes.bytes(), 70);
    assert_eq!(
        bytes.shrink_to(u64::MAX).unwrap_err().to_string(),
        "cannot shrink a byte share of 70 to 18446744073709551615 (a permit never grows)"
    );
    assert_eq!(bytes.shrink_to(25), Ok(45));
    assert_eq!(held(&g), (1, 25));
    // The excess is available at once.
    let other = g.try_admit(Some(75)).unwrap();
    assert_eq!(held(&g), (2, 100));
    drop(slot);
    assert_eq!(held(&g), (1, 100));
    drop(bytes);
    assert_eq!(held(&g), (1, 75));
    drop(other);
    assert_clean(&g);
}

#[test]
fn body_is_read_under_its_share_and_shrinks_to_its_size() {
    let g = gate(2, 100_000, 50_000);
    let (slot, bytes) = g.try_admit(None).unwrap().split();
    let data: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    let body = bytes.read_body(&data[..]).unwrap();
    assert_eq!(&body[..], &data[..]);
    assert_eq!(body.charged(), 20_000);
    assert_eq!(held(&g), (1, 20_000));
    drop(body);
    assert_eq!(held(&g), (1, 0));
    drop(slot);

    // The buffer and its share can be taken apart; the share still counts.
    let (slot, bytes) = g.try_admit(Some(300)).unwrap().split();
    let (buf, permit) = bytes
        .read_body(io::repeat(2).take(200))
        .unwrap()
        .into_parts();
    assert_eq!((buf.len(), permit.bytes()), (200, 200));
    drop(buf);
    assert_eq!(held(&g), (1, 200));
    drop(permit);
    drop(slot);
    assert_clean(&g);

    // Exactly the share: accepted.
    let (_slot, bytes) = g.try_admit(Some(1000)).unwrap().split();
    let body = bytes.read_body(io::repeat(1).take(1000)).unwrap();
    assert_eq!((body.len(), body.charged()), (1000, 1000));
    drop(body);
    drop(_slot);
    assert_clean(&g);
}

#[test]
fn body_longer_than_reserved_is_refused_while_reading() {
    let g = gate(2, 100_000, 50_000);
    // One byte over a declared length.
    let (slot, bytes) = g.try_admit(Some(1000)).unwrap().split();
    let err = bytes.read_body(io::repeat(1).take(1001)).unwrap_err();
    assert!(matches!(err, BodyError::TooLong { limit: 1000 }), "{err:?}");
    assert_eq!(held(&g), (1, 0));
    drop(slot);

    // An endless body against the cap: reading stops past the cap.
    let counter = Counting {
        inner: io::repeat(7),
        read: 0,
    };
    let (slot, bytes) = g.try_admit(None).unwrap().split();
    let mut counter = counter;
    let err = bytes.read_body(&mut counter).unwrap_err();
    assert!(
        matches!(err, BodyError::TooLong { limit: 50_000 }),
        "{err:?}"
    );
    assert_eq!(counter.read, 50_001, "read stops at the first byte over");
    assert_eq!(err.to_string(), "body longer than its reserved 50000 bytes");
    drop(slot);
    assert_clean(&g);
}

struct Counting<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

struct Failing {
    left: usize,
}

impl Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "peer gone"));
        }
        let n = self.left.min(buf.len());
        self.left -= n;
        Ok(n)
    }
}

#[test]
fn reader_failure_is_reported_and_releases_the_share() {
    let g = gate(1, 100, 100);
    let t = g.try_admit(Some(100)).unwrap();
    let (slot, bytes) = t.split();
    let err = bytes.read_body(Failing { left: 10 }).unwrap_err();
    match &err {
        BodyError::Io(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
        other => panic!("{other:?}"),
    }
    assert!(err.source().is_some());
    assert_eq!(held(&g), (1, 0));
    drop(slot);
    assert_clean(&g);
}

#[test]
fn admit_grants_at_once_or_times_out_holding_nothing() {
    let g = gate(1, 100, 100);
    let t = g.admit(Some(10), Instant::now()).unwrap();
    assert_eq!(held(&g), (1, 10));
    let past = Instant::now();
    assert_eq!(
        g.admit(Some(10), past).unwrap_err(),
        AdmitError::TimedOut {
            resource: Resource::Slots
        }
    );
    assert_eq!(held(&g), (1, 10));
    let s = g.stats();
    assert_eq!((s.timed_out, s.saturated_slots, s.waiting), (1, 1, 0));
    drop(t);
    assert_clean(&g);
}

#[test]
fn admit_waits_for_a_release() {
    let g = gate(1, 100, 100);
    let t = g.try_admit(Some(100)).unwrap();
    let g2 = g.clone();
    let waiter = thread::spawn(move || g2.admit(Some(100), far()).map(|t| t.reserved_bytes()));
    wait_until(|| g.stats().waiting == 1);
    drop(t);
    assert_eq!(waiter.join().unwrap(), Ok(100));
    assert_clean(&g);
    assert_eq!(g.stats().timed_out, 0);
}

/// A large request waiting first is not overtaken by a small one that would
/// fit, and a small `try_admit` does not barge in while anyone waits.
#[test]
fn waiters_are_served_in_order_and_large_ones_are_not_starved() {
    let g = gate(8, 100, 100);
    let hold = g.try_admit(Some(50)).unwrap();

    let (done_tx, done_rx) = mpsc::channel();
    let (release_large_tx, release_large_rx) = mpsc::channel::<()>();
    let (g2, tx) = (g.clone(), done_tx.clone());
    let large = thread::spawn(move || {
        let t = g2.admit(Some(60), far()).unwrap();
        tx.send(("large", t.reserved_bytes())).unwrap();
        release_large_rx.recv().unwrap();
        drop(t);
    });
    wait_until(|| g.stats().waiting == 1);

    // 50 bytes are free, yet 45 must not get in ahead of the 60 waiting.
    let (g3, tx) = (g.clone(), done_tx);
    let small = thread::spawn(move || {
        let t = g3.admit(Some(45), far()).unwrap();
        tx.send(("small", t.reserved_bytes())).unwrap();
        drop(t);
    });
    wait_until(|| g.stats().waiting == 2);
    assert_eq!(held(&g), (1, 50));
    assert_eq!(
        g.try_admit(Some(1)).unwrap_err(),
        AdmitError::Saturated {
            resource: Resource::Bytes
        }
    );

    drop(hold);
    assert_eq!(done_rx.recv().unwrap(), ("large", 60));
    // 60 + 45 > 100: the small one still waits, and nothing else got in.
    assert_eq!(g.stats().waiting, 1);
    assert_eq!(held(&g), (1, 60));
    release_large_tx.send(()).unwrap();
    assert_eq!(done_rx.recv().unwrap(), ("small", 45));
    large.join().unwrap();
    small.join().unwrap();
    assert_clean(&g);
}

/// A waiter first in line gives up; the one behind it, which fits, must be
/// woken and admitted (a missed wake-up shows as its own time-out); the one
/// that gave up holds nothing.
#[test]
fn cancelled_head_waiter_leaves_nothing_and_passes_the_turn() {
    let g = gate(8, 100, 100);
    let hold = g.try_admit(Some(50)).unwrap();
    let g1 = g.clone();
    let first = thread::spawn(move || {
        g1.admit(Some(60), Instant::now() + Duration::from_millis(200))
            .map(|t| t.reserved_bytes())
    });
    wait_until(|| g.stats().waiting == 1 || first.is_finished());
    // Usually queued behind `first`; if `first` already left, it gets in
    // directly. Either way it must be admitted long before its deadline.
    let g2 = g.clone();
    let second = thread::spawn(move || {
        g2.admit(Some(40), Instant::now() + Duration::from_secs(60))
            .map(|t| t.reserved_bytes())
    });
    assert_eq!(
        first.join().unwrap(),
        Err(AdmitError::TimedOut {
            resource: Resource::Bytes
        })
    );
    assert_eq!(second.join().unwrap(), Ok(40));
    assert_eq!(held(&g), (1, 50));
    let s = g.stats();
    assert_eq!((s.timed_out, s.saturated_bytes), (1, 1));
    drop(hold);
    assert_clean(&g);
}

/// A waiter behind the first one gives up: it leaves the queue holding
/// nothing, reports what the first waiter lacks, and the first one is still
/// served when capacity comes back.
#[test]
fn cancelled_waiter_behind_the_head_leaves_nothing() {
    let g = gate(1, 100, 100);
    let hold = g.try_admit(Some(10)).unwrap();
    let g1 = g.clone();
    let first = thread::spawn(move || g1.admit(Some(10), far()).map(|t| t.reserved_bytes()));
    wait_until(|| g.stats().waiting == 1);
    assert_eq!(
        g.admit(Some(1), Instant::now() + Duration::from_millis(5))
            .unwrap_err(),
        AdmitError::TimedOut {
            resource: Resource::Slots
        }
    );
    assert_eq!(g.stats().waiting, 1);
    assert_eq!(held(&g), (1, 10));
    assert_eq!(
        g.try_admit(Some(1)).unwrap_err(),
        AdmitError::Saturated {
            resource: Resource::Slots
        }
    );
    drop(hold);
    assert_eq!(first.join().unwrap(), Ok(10));
    let s = g.stats();
    assert_eq!((s.timed_out, s.saturated_slots), (1, 2));
    assert_clean(&g);
}

/// Cancelling the first waiter from another thread: it leaves holding
/// nothing, and the waiter behind it, which fits, is served. No timing
/// involved: both deadlines are far away.
#[test]
fn cancelled_waiter_leaves_nothing_and_passes_the_turn() {
    let g = gate(8, 100, 100);
    let hold = g.try_admit(Some(50)).unwrap();
    let cancel = Cancel::new();
    let (g1, c1) = (g.clone(), cancel.clone());
    let first = thread::spawn(move || {
        g1.admit_cancellable(Some(60), far(), &c1)
            .map(|t| t.reserved_bytes())
    });
    wait_until(|| g.stats().waiting == 1);
    let g2 = g.clone();
    let second = thread::spawn(move || g2.admit(Some(40), far()).map(|t| t.reserved_bytes()));
    wait_until(|| g.stats().waiting == 2);
    assert_eq!(held(&g), (1, 50), "40 fits but must wait behind 60");
    cancel.cancel();
    assert!(cancel.is_cancelled());
    assert_eq!(
        first.join().unwrap(),
        Err(AdmitError::Cancelled {
            resource: Resource::Bytes
        })
    );
    assert_eq!(second.join().unwrap(), Ok(40));
    assert_eq!(held(&g), (1, 50));
    let s = g.stats();
    assert_eq!(
        (s.cancelled, s.timed_out, s.saturated_bytes, s.waiting),
        (1, 0, 1, 0)
    );
    drop(hold);
    assert_clean(&g);
    assert_eq!(
        AdmitError::Cancelled {
            resource: Resource::Slots
        }
        .to_string(),
        "cancelled while waiting for job slots"
    );
}

/// One token calls off waits on two gates at once; afterwards it still
/// refuses new waits on either.
#[test]
fn one_token_cancels_waits_on_several_gates() {
    let (a, b) = (gate(1, 100, 100), gate(1, 100, 100));
    let (ha, hb) = (a.try_admit(Some(1)).unwrap(), b.try_admit(Some(1)).unwrap());
    let cancel = Cancel::new();
    // A deadline that does not hang the test if the wake-up is lost.
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiters: Vec<_> = [&a, &b]
        .into_iter()
        .map(|g| {
            let (g, c) = (g.clone(), cancel.clone());
            thread::spawn(move || g.admit_cancellable(Some(1), deadline, &c).map(drop))
        })
        .collect();
    wait_until(|| a.stats().waiting == 1 && b.stats().waiting == 1);
    cancel.cancel();
    for w in waiters {
        assert_eq!(
            w.join().unwrap(),
            Err(AdmitError::Cancelled {
                resource: Resource::Slots
            })
        );
    }
    // A lost wake-up ends the waits at the deadline (as `Cancelled`, since
    // the flag is set by then).
    assert!(Instant::now() < deadline, "the cancel woke nobody");
    for g in [&a, &b] {
        let s = g.stats();
        assert_eq!((s.cancelled, s.timed_out, s.waiting), (1, 0, 0), "{s:?}");
    }
    drop((ha, hb));
    assert_clean(&a);
    assert_clean(&b);
}

/// A token cancelled before the call cancels the waiting, not an admission
/// that fits at once.
#[test]
fn cancelled_token_refuses_only_what_would_wait() {
    let g = gate(1, 100, 100);
    let cancel = Cancel::new();
    cancel.cancel();
    let t = g.admit_cancellable(Some(10), far(), &cancel).unwrap();
    assert_eq!(
        g.admit_cancellable(Some(10), far(), &cancel).unwrap_err(),
        AdmitError::Cancelled {
            resource: Resource::Slots
        }
    );
    assert_eq!(held(&g), (1, 10));
    drop(t);
    assert_clean(&g);
    assert_eq!(g.stats().cancelled, 1);
}

#[test]
fn stats_count_saturations_by_reason_and_peaks() {
    let g = gate(2, 10, 10);
    let a = g.try_admit(Some(6)).unwrap();
    let _ = g.try_admit(Some(5)).unwrap_err(); // bytes
    let b = g.try_admit(Some(4)).unwrap();
    let _ = g.try_admit(Some(0)).unwrap_err(); // slots
    let _ = g.try_admit(Some(0)).unwrap_err(); // slots
    let _ = g.try_admit(Some(11)).unwrap_err(); // too large
    drop((a, b));
    assert_eq!(
        g.stats(),
        GateStats {
            slots_held: 0,
            bytes_held: 0,
            peak_slots: 2,
            peak_bytes: 10,
            saturated_slots: 2,
            saturated_bytes: 1,
            timed_out: 0,
            cancelled: 0,
            too_large: 1,
            waiting: 0,
        }
    );
}

// ---------------------------------------------------------------------------
// Ownership: permits belong to whoever holds the resource.

struct Job {
    slot: pace::gate::SlotPermit,
    body: pace::gate::Body,
    reply: mpsc::Sender<pace::gate::Body>,
    /// The test lets the worker finish reading when it says so.
    go: mpsc::Receiver<()>,
}

/// 4 workers + a queue of 8 = 12 slots. Every caller times out and gives
/// up; nothing is released until the workers are done with the buffers.
#[test]
fn timed_out_callers_release_nothing_workers_do() {
    const LEN: u64 = 1000;
    let g = gate(12, 12 * LEN, LEN);
    let (queue_tx, queue_rx) = mpsc::sync_channel::<Job>(8);
    let queue_rx = std::sync::Arc::new(std::sync::Mutex::new(queue_rx));
    let (finished_tx, finished_rx) = mpsc::channel::<()>();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let rx = queue_rx.clone();
            let finished = finished_tx.clone();
            thread::spawn(move || loop {
                let job = match rx.lock().unwrap().recv() {
                    Ok(job) => job,
                    Err(_) => return,
                };
                job.go.recv().unwrap();
                let sum: u64 = job.body.iter().map(|&b| u64::from(b)).sum();
                assert_eq!(sum, LEN * 3);
                // The caller is gone: the reply (and its payload) is dropped
                // by `send` at once.
                assert!(job.reply.send(job.body).is_err());
                drop(job.slot); // end of the job
                finished.send(()).unwrap();
            })
        })
        .collect();

    let mut go = Vec::new();
    for _ in 0..12 {
        let (slot, bytes) = g.try_admit(Some(LEN)).unwrap().split();
        let body = bytes.read_body(io::repeat(3).take(LEN)).unwrap();
        let (reply_tx, reply_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        queue_tx
            .send(Job {
                slot,
                body,
                reply: reply_tx,
                go: go_rx,
            })
            .unwrap();
        // The caller's deadline passes (the worker is held by `go`).
        assert_eq!(
            reply_rx.recv_timeout(Duration::from_millis(1)).unwrap_err(),
            mpsc::RecvTimeoutError::Timeout
        );
        drop(reply_rx); // gives up
        go.push(go_tx);
    }
    // 4 running + 8 queued: all twelve still hold their slot and bytes.
    assert_eq!(held(&g), (12, 12 * LEN));
    assert_eq!(
        g.try_admit(Some(0)).unwrap_err(),
        AdmitError::Saturated {
            resource: Resource::Slots
        }
    );
    for (i, tx) in go.into_iter().enumerate() {
        tx.send(()).unwrap();
        finished_rx.recv().unwrap();
        let left = 11 - i as u64;
        assert_eq!(held(&g), (left as usize, left * LEN));
    }
    drop(queue_tx);
    for w in workers {
        w.join().unwrap();
    }
    assert_clean(&g);
    assert_eq!(g.stats().peak_bytes, 12 * LEN);
}

/// A reply already queued when the caller gives up is dropped with the
/// receiver (std's channels discard queued messages on disconnect).
#[test]
fn reply_queued_before_the_caller_gave_up_is_dropped_with_it() {
    let g = gate(1, 100, 100);
    let (_slot, bytes) = g.try_admit(Some(100)).unwrap().split();
    let body = bytes.read_body(io::repeat(9).take(100)).unwrap();
    let (tx, rx) = mpsc::channel();
    tx.send(body).unwrap();
    assert_eq!(held(&g), (1, 100), "the queued reply holds its payload");
    drop(rx);
    assert_eq!(held(&g), (1, 0), "dropping the receiver frees it");
    drop(tx);
    drop(_slot);
    assert_clean(&g);
}

/// Many threads, random admissions, shrinks, splits and drops; a shadow
/// count that is raised only after an admission and lowered before each
/// release must never pass the bounds, and neither may the gate's own peak.
#[test]
fn stress_never_exceeds_slots_or_bytes() {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    const SLOTS: usize = 5;
    const BYTES: u64 = 1000;
    const CAP: u64 = 400;
    const THREADS: u64 = 4;
    const ROUNDS: usize = 4000;

    enum Kept {
        Slot(SlotPermit),
        Bytes(BytePermit, u64),
    }
    fn release(k: Kept, ss: &AtomicUsize, sb: &AtomicU64) {
        match k {
            Kept::Slot(p) => {
                ss.fetch_sub(1, SeqCst);
                drop(p);
            }
            Kept::Bytes(p, n) => {
                sb.fetch_sub(n, SeqCst);
                drop(p);
            }
        }
    }

    let g = gate(SLOTS, BYTES, CAP);
    let shadow_slots = Arc::new(AtomicUsize::new(0));
    let shadow_bytes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));

    let sampler = {
        let (g, stop) = (g.clone(), stop.clone());
        thread::spawn(move || {
            let mut samples = 0u64;
            while !stop.load(SeqCst) {
                let s = g.stats();
                assert!(s.slots_held <= SLOTS, "{s:?}");
                assert!(s.bytes_held <= BYTES, "{s:?}");
                samples += 1;
                thread::yield_now();
            }
            samples
        })
    };

    let workers: Vec<_> = (0..THREADS)
        .map(|seed| {
            let g = g.clone();
            let (ss, sb, admitted) = (shadow_slots.clone(), shadow_bytes.clone(), admitted.clone());
            thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let mut kept = Vec::new();
                for _ in 0..ROUNDS {
                    let declared = match rng.gen_range(0..10) {
                        0 => None,
                        1 => Some(CAP + rng.gen_range(1..3)),
                        _ => Some(rng.gen_range(0..=CAP)),
                    };
                    let r = if rng.gen_bool(0.2) {
                        g.admit(declared, Instant::now() + Duration::from_micros(200))
                    } else {
                        g.try_admit(declared)
                    };
                    let mut t = match r {
                        Ok(t) => t,
                        Err(AdmitError::TooLarge { declared: d, .. }) => {
                            assert!(d > CAP);
                            continue;
                        }
                        Err(AdmitError::Saturated { .. } | AdmitError::TimedOut { .. }) => {
                            continue;
                        }
                        Err(e) => panic!("nobody cancels: {e:?}"),
                    };
                    admitted.fetch_add(1, SeqCst);
                    let want = declared.unwrap_or(CAP);
                    assert_eq!(t.reserved_bytes(), want);
                    assert!(ss.fetch_add(1, SeqCst) < SLOTS);
                    let before = sb.fetch_add(want, SeqCst);
                    assert!(before + want <= BYTES, "shadow {} > {BYTES}", before + want);
                    if rng.gen_bool(0.5) {
                        let to = rng.gen_range(0..=want);
                        sb.fetch_sub(want - to, SeqCst);
                        assert_eq!(t.shrink_to(to), Ok(want - to));
                    }
                    let bytes_now = t.reserved_bytes();
                    let (slot, bytes) = t.split();
                    // Release one half now (shadow first), keep the other.
                    if rng.gen_bool(0.5) {
                        ss.fetch_sub(1, SeqCst);
                        drop(slot);
                        kept.push(Kept::Bytes(bytes, bytes_now));
                    } else {
                        sb.fetch_sub(bytes_now, SeqCst);
                        drop(bytes);
                        kept.push(Kept::Slot(slot));
                    }
                    if kept.len() > 2 || rng.gen_bool(0.3) {
                        let i = rng.gen_range(0..kept.len());
                        release(kept.swap_remove(i), &ss, &sb);
                    }
                    if rng.gen_bool(0.1) {
                        thread::yield_now();
                    }
                }
                for k in kept {
                    release(k, &ss, &sb);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, SeqCst);
    let samples = sampler.join().unwrap();
    let s = g.stats();
    assert!(s.peak_slots <= SLOTS && s.peak_bytes <= BYTES, "{s:?}");
    // The run did contend: admissions and refusals both happened.
    assert!(
        admitted.load(SeqCst) > 0 && s.saturated_slots + s.saturated_bytes > 0,
        "{s:?}"
    );
    assert!(samples > 0);
    assert_eq!(shadow_slots.load(SeqCst), 0);
    assert_eq!(shadow_bytes.load(SeqCst), 0);
    assert_clean(&g);
}

/// Admissions that cannot fit two at a time (600 + 600 > 1000), hammered
/// from several threads: the shadow count (raised after an admission,
/// lowered before its release) must never see two at once.
#[test]
fn stress_racing_admissions_never_share_the_budget() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;

    const ROUNDS: usize = 50_000;
    let g = gate(64, 1000, 1000);
    let shadow = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (g, shadow, admitted) = (g.clone(), shadow.clone(), admitted.clone());
            thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let Ok(t) = g.try_admit(Some(600)) else {
                        continue;
                    };
                    let before = shadow.fetch_add(600, SeqCst);
                    assert_eq!(before, 0, "two 600-byte shares in a 1000-byte budget");
                    admitted.fetch_add(1, SeqCst);
                    shadow.fetch_sub(600, SeqCst);
                    drop(t);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = g.stats();
    assert!(admitted.load(SeqCst) > 0);
    assert_eq!(s.peak_bytes, 600, "{s:?}");
    assert_eq!(
        admitted.load(SeqCst) + s.saturated_bytes + s.saturated_slots,
        4 * ROUNDS as u64
    );
    assert_clean(&g);
}
