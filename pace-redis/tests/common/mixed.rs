//! Mixed traffic with leases on one hot key across a failover
//! (`sentinel_leases.rs`, `cluster_leases.rs`): [`LIMITERS`] limiters (each
//! a `RedisPace` of its own, so a replica id of its own), [`TASKS`] tasks
//! each, mixing leased and server decisions: reserves (every fifth refunded
//! at once), calls of a quota of their own (every seventh; equal to the
//! configuration's, so that one bound covers all), holds (every eleventh;
//! kept or refunded in turn) and turns (every 31st, up to 10 ms of wait).
//! Each kept admission is recorded at its true instant on the machine's
//! real-time clock, which every server's `TIME` reads: a server decision at
//! the server's reading (a turn at its slot), a leased one at the local
//! reading its lease's deadline was checked against, moved onto the
//! real-time clock by one pair of readings ([`Clocks`]). [`Run::check`]
//! checks every window against the bound (`pace_models::bound`, exact
//! integers): 0 excess, no margin.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{failover_leases, Clocks, RedisServer};
use pace::{Quota, Rate, Refunded};
use pace_redis::{Error, LeaseConfig, RedisPace, Source};

/// 100 tokens a second (10 ms each), capacity 1,000: a horizon `τ` of
/// 10 s, longer than a stall and a failover's gap together (a Sentinel
/// sees a dead primary down after 1 s and switches a second or two later;
/// a Cluster of node timeout 1 s promotes a replica within a few seconds),
/// so that a debit the new primary lacks shows as excess: with a
/// `τ` shorter than the gap, its bucket would be whole again before any
/// limiter reached it, whatever it lost.
pub const RATE: u64 = 100;
pub const CAP: u64 = 1_000;
pub const INTERVAL: u64 = 1_000_000_000 / RATE;
pub const LIMITERS: usize = 2;
pub const TASKS: u64 = 3;
/// Admissions of each kind each limiter lets through before the failover
/// and after it.
pub const LEASED: usize = 50;
pub const SERVER: usize = 5;
/// Tokens of debits the primary makes while its standby lags (a second
/// of the rate).
pub const LOST: u64 = 100;
/// A bound only a hang exceeds.
pub const HANG: Duration = Duration::from_secs(120);

/// A kept admission: its true instant (ns on the real-time clock), its
/// tokens, and whether a lease decided it.
pub type Kept = (u64, u64, bool);

/// One limiter's kept admissions.
#[derive(Default)]
pub struct Record {
    pub kept: Mutex<Vec<Kept>>,
}

impl Record {
    pub fn keep(&self, at: u64, n: u64, source: Source) {
        let leased = match source {
            Source::Lease => true,
            Source::Server => false,
            s => panic!("an admission of source {s:?}"),
        };
        self.kept.lock().unwrap().push((at, n, leased));
    }

    /// Leased and server admissions at or after `from` (and before `to`).
    pub fn count(&self, from: u64, to: u64) -> (usize, usize) {
        let kept = self.kept.lock().unwrap();
        let within = |leased: bool| {
            kept.iter()
                .filter(|k| k.2 == leased && k.0 >= from && k.0 < to)
                .count()
        };
        (within(true), within(false))
    }
}

/// The true instant of an admission of `source`: the server's reading, or
/// the lease's local reading on the real-time clock.
pub fn instant(
    clocks: &Clocks,
    source: Source,
    server: Option<u64>,
    leased: Option<Instant>,
) -> u64 {
    match source {
        Source::Server => server.unwrap(),
        Source::Lease => clocks.real(leased.unwrap()),
        s => panic!("an admission of source {s:?}"),
    }
}

/// After a denial: its retry time, at most 10 ms.
pub async fn denied(d: &pace_redis::Denied) {
    tokio::time::sleep(d.retry_after().min(Duration::from_millis(10))).await;
}

pub async fn unavailable() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// One task: until `stop`, 1 or 2 tokens of "hot" per call (the mix of
/// the file's header). A refund that does not restore leaves the tokens
/// kept; a keep that fails leaves the hold to expire as kept.
pub async fn task(
    p: RedisPace,
    record: Arc<Record>,
    clocks: Clocks,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let own = Quota::new(Rate::per_second(RATE).unwrap(), CAP).unwrap();
    let mut i = seed;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let n = 1 + i % 2;
        if i.is_multiple_of(11) {
            match p.hold_n("hot", n).await {
                Ok(h) => {
                    let source = h.source();
                    let at = instant(&clocks, source, h.server_now_ns(), h.leased_at());
                    if (i / 11).is_multiple_of(2) {
                        let _ = h.keep().await;
                        record.keep(at, n, source);
                    } else if !matches!(h.refund().await, Ok(Refunded::Restored)) {
                        record.keep(at, n, source);
                    }
                }
                Err(Error::Denied(d)) => denied(&d).await,
                Err(Error::Unavailable(_)) => unavailable().await,
                Err(e) => panic!("{e}"),
            }
        } else if i.is_multiple_of(31) {
            match p.acquire_n("hot", n, Duration::from_millis(10)).await {
                Ok(r) => {
                    assert_eq!(r.source(), Source::Server, "a turn is the server's");
                    let slot = r.server_now_ns().unwrap() + r.wait().as_nanos() as u64;
                    record.keep(slot, n, Source::Server);
                }
                Err(Error::Denied(d)) => denied(&d).await,
                Err(Error::Unavailable(_)) => unavailable().await,
                Err(e) => panic!("{e}"),
            }
        } else {
            let r = if i.is_multiple_of(7) {
                p.reserve_n_with("hot", n, own).await
            } else {
                p.reserve_n("hot", n).await
            };
            match r {
                Ok(r) => {
                    let source = r.source();
                    let at = instant(&clocks, source, r.server_now_ns(), r.leased_at());
                    if !i.is_multiple_of(5)
                        || !matches!(
                            p.refund(r).await,
                            Ok(Refunded::Restored | Refunded::Removed)
                        )
                    {
                        record.keep(at, n, source);
                    }
                }
                Err(Error::Denied(d)) => denied(&d).await,
                Err(Error::Unavailable(_)) => unavailable().await,
                Err(e) => panic!("{e}"),
            }
        }
    }
}

/// The servers and the Sentinel: A primary, B its standby (replicating A
/// A limiter's configuration (before its `connect_*`): the bucket of
/// [`RATE`] and [`CAP`], a timeout of 500 ms, a backoff of 50 ms, `leases`.
pub fn builder(leases: LeaseConfig) -> pace_redis::Builder {
    RedisPace::builder(Rate::per_second(RATE).unwrap())
        .capacity(CAP)
        .timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(50))
        .leases(leases)
}

/// The limiters and their tasks.
pub struct Run {
    pub limiters: Vec<RedisPace>,
    pub records: Vec<Arc<Record>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Run {
    /// Starts `TASKS` tasks on each limiter (each a `RedisPace` of its own,
    /// made by [`builder`]).
    pub fn start(limiters: Vec<RedisPace>) -> Run {
        let clocks = Clocks::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut run = Run {
            limiters: Vec::new(),
            records: Vec::new(),
            stop: stop.clone(),
            tasks: Vec::new(),
        };
        for (l, p) in limiters.into_iter().enumerate() {
            let record = Arc::new(Record::default());
            for t in 0..TASKS {
                run.tasks.push(tokio::spawn(task(
                    p.clone(),
                    record.clone(),
                    clocks,
                    stop.clone(),
                    l as u64 * 1_000 + t * 7,
                )));
            }
            run.limiters.push(p);
            run.records.push(record);
        }
        run
    }

    /// Waits until the bucket is drained (a `peek` of 0 tokens): a debit a
    /// failover loses is then one too many, not room the bucket had.
    pub async fn until_drained(&self) {
        let deadline = Instant::now() + HANG;
        loop {
            if let Ok(peek) = self.limiters[0].peek("hot").await {
                if peek.remaining() == 0 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "hang: the bucket never drained");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until each limiter has let through `LEASED` leased and
    /// `SERVER` server admissions at instants in `[from, to)`.
    pub async fn until_each_admits(&self, from: u64, to: u64, what: &str) {
        let deadline = Instant::now() + HANG;
        while self.records.iter().any(|r| {
            let (leased, server) = r.count(from, to);
            leased < LEASED || server < SERVER
        }) {
            assert!(Instant::now() < deadline, "hang: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the tasks and checks every window: 0 excess. `failed` is the
    /// instant the failover began, `switched` the one the Sentinel named B
    /// at, `after` the one from which admissions count as after it.
    pub async fn check(self, what: &str, failed: u64, switched: u64, after: u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let mut all: Vec<Kept> = Vec::new();
        for (i, (r, p)) in self.records.iter().zip(&self.limiters).enumerate() {
            let (lb, sb) = r.count(0, failed);
            let (la, sa) = r.count(after, u64::MAX);
            let s = p.stats();
            println!(
                "{what}: limiter {i}: {lb} leased and {sb} server admissions before the \
                 failover, {la} and {sa} after it; stats: {} leased decisions, {} server \
                 decisions, {} tokens granted, {} expiries, {} stranded, {} connects",
                s.leased_decisions,
                s.server_decisions,
                s.lease_grants,
                s.lease_expiries,
                s.lease_stranded,
                s.connects
            );
            all.extend(r.kept.lock().unwrap().iter());
        }
        let tokens: u64 = all.iter().map(|k| k.1).sum();
        let leased = all.iter().filter(|k| k.2).count();
        let n = all.len() as u64;
        let mut kept: Vec<(u64, u64)> = all.iter().map(|&(at, n, _)| (at, n)).collect();
        let excess = pace_models::bound::worst_excess_ns(&mut kept, CAP, INTERVAL);
        println!(
            "{what}: {n} kept admissions ({tokens} tokens, {leased} leased), {} windows; \
             worst excess {excess} ns",
            n * (n + 1) / 2
        );
        // Where an excess would come from: the tokens let through from the
        // failover's start to the switch, and the worst excess without the
        // server's decisions among them (those a lost write can cost).
        let split = |leased: bool| -> u64 {
            all.iter()
                .filter(|k| k.2 == leased && k.0 >= failed && k.0 < switched)
                .map(|k| k.1)
                .sum()
        };
        let mut rest: Vec<(u64, u64)> = all
            .iter()
            .filter(|k| k.2 || k.0 < failed || k.0 >= switched)
            .map(|&(at, n, _)| (at, n))
            .collect();
        println!(
            "{what}: from the failover's start to the switch, {} server and {} leased tokens; \
             worst excess without those server ones {} ns",
            split(false),
            split(true),
            pace_models::bound::worst_excess_ns(&mut rest, CAP, INTERVAL)
        );
        assert!(
            excess <= 0,
            "{what}: the kept admissions exceed the bound by {excess} ns ({} tokens)",
            excess as f64 / INTERVAL as f64
        );
    }
}

/// The settled `tat` of "hot" on `server`, ns (0 without the key).
pub fn tat(server: &RedisServer) -> u64 {
    tat_on(&mut server.admin())
}

/// The settled `tat` of "hot" read on `conn`, ns (0 without the key).
pub fn tat_on(conn: &mut redis::Connection) -> u64 {
    let v: Option<String> = redis::cmd("GET").arg("pace:hot").query(conn).unwrap();
    v.map_or(0, |v| v.split('|').next().unwrap().parse().unwrap())
}

/// A lease time and its grace, in ns: a grant is used no later than this
/// after its call.
pub fn lease_span() -> u64 {
    let c = failover_leases();
    (c.lease + c.grace).as_nanos() as u64
}
