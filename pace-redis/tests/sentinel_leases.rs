//! Sentinel failovers with leases in use (feature `sentinel`): a primary A
//! with a standby B (the only one the Sentinel can promote; it replicates
//! A through a loopback forwarder that can stall), B's own standby C
//! (replicating B: after B's promotion, `WAIT 1` on B counts C), and one
//! Sentinel. Two limiters (two `RedisPace` values, so two replica ids)
//! connect through the Sentinel with leases and `wait_replicas: 1`, 3
//! tasks each on one hot key, mixing leased and server decisions: reserves
//! (every fifth refunded at once), calls of a quota of their own (every
//! seventh; equal to the configuration's, so that one bound covers all),
//! holds (every eleventh; kept or refunded in turn) and turns (every 31st,
//! up to 10 ms of wait). Then the primary fails over:
//!
//! * `a_killed_primary_costs_no_excess_with_leases`: B's link stalls (B
//!   falls behind: every write A makes from then on is lost with A), the
//!   limiters go on calling A, A is killed (`kill -9`), the Sentinel sees
//!   it down and promotes B;
//! * `a_graceful_failover_costs_no_excess_with_leases`: `SENTINEL
//!   FAILOVER`, A still up and accepting writes until the Sentinel turns
//!   it into a replica, the limiters moving at `+switch-master`: what A
//!   writes after B's promotion is lost.
//! * `two_standbys_of_the_primary_need_wait_replicas_2`: the same with a
//!   second standby of A (C, never promoted) and `wait_replicas: 2`.
//!
//! Every kept admission, at its true instant, is checked over every window
//! against the bound (`pace_models::bound`, exact integers): 0 excess, no
//! margin. The true instant, on the machine's real-time clock, which all
//! servers' `TIME` read: a server decision at the server's reading (a turn
//! at its slot), a leased one at the local reading its lease's deadline
//! was checked against, moved onto the real-time clock by one pair of
//! readings (`common::Clocks`). A decision A made that B lacks shows as
//! excess once the limiters reach B, as long as the bucket was drained
//! when B fell behind (each test waits for a `peek` of 0 tokens before the
//! failover) and B's is not whole again by then (`τ` of 10 s, beside a
//! stall and a gap of 1–5 s together).
//!
//! Not vacuous: each limiter lets through leased and server decisions
//! before the failover and after it, "after" meaning at or after the
//! instant the Sentinel names B plus a lease time and its grace, when no
//! grant of A can be in use any more (a grant is used within a lease time
//! of its call, and A acknowledges none after B leaves it: A has no other
//! standby), so each limiter's leased decisions after it come from grants
//! B made and C acknowledged: the limiter reached the new primary.
//!
//! Runs end on counted admissions and debits, never on time; every wait is
//! bounded only by [`HANG`]. The tasks' sleeps (after a denial, after an
//! unavailable server) shape their demand; nothing asserted depends on
//! them. Each test runs 5–12 s.
#![cfg(feature = "sentinel")]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{failover_leases, real_now, Clocks, Proxy, RedisServer, Sentinel};
use pace::{Quota, Rate, Refunded};
use pace_redis::{Error, LeaseConfig, RedisPace, Source};

/// 100 tokens a second (10 ms each), capacity 1,000: a horizon `τ` of
/// 10 s, longer than a stall and a failover's gap together (the Sentinel
/// sees a dead primary down after 1 s, and switches a second or two
/// later), so that a debit the new primary lacks shows as excess: with a
/// `τ` shorter than the gap, its bucket would be whole again before any
/// limiter reached it, whatever it lost.
const RATE: u64 = 100;
const CAP: u64 = 1_000;
const INTERVAL: u64 = 1_000_000_000 / RATE;
const LIMITERS: usize = 2;
const TASKS: u64 = 3;
/// Admissions of each kind each limiter lets through before the failover
/// and after it.
const LEASED: usize = 50;
const SERVER: usize = 5;
/// Tokens of debits A makes while the standby's link stalls (a second of
/// the rate).
const LOST: u64 = 100;
/// A bound only a hang exceeds.
const HANG: Duration = Duration::from_secs(120);
const NO_SYNC_DELAY: &[&str] = &["--repl-diskless-sync-delay", "0"];

/// A kept admission: its true instant (ns on the real-time clock), its
/// tokens, and whether a lease decided it.
type Kept = (u64, u64, bool);

/// One limiter's kept admissions.
#[derive(Default)]
struct Record {
    kept: Mutex<Vec<Kept>>,
}

impl Record {
    fn keep(&self, at: u64, n: u64, source: Source) {
        let leased = match source {
            Source::Lease => true,
            Source::Server => false,
            s => panic!("an admission of source {s:?}"),
        };
        self.kept.lock().unwrap().push((at, n, leased));
    }

    /// Leased and server admissions at or after `from` (and before `to`).
    fn count(&self, from: u64, to: u64) -> (usize, usize) {
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
fn instant(clocks: &Clocks, source: Source, server: Option<u64>, leased: Option<Instant>) -> u64 {
    match source {
        Source::Server => server.unwrap(),
        Source::Lease => clocks.real(leased.unwrap()),
        s => panic!("an admission of source {s:?}"),
    }
}

/// After a denial: its retry time, at most 10 ms.
async fn denied(d: &pace_redis::Denied) {
    tokio::time::sleep(d.retry_after().min(Duration::from_millis(10))).await;
}

async fn unavailable() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// One task: until `stop`, 1 or 2 tokens of "hot" per call (the mix of
/// the file's header). A refund that does not restore leaves the tokens
/// kept; a keep that fails leaves the hold to expire as kept.
async fn task(p: RedisPace, record: Arc<Record>, clocks: Clocks, stop: Arc<AtomicBool>, seed: u64) {
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
/// through a forwarder that can stall), C B's standby, the Sentinel
/// monitoring A and knowing B.
struct Deployment {
    a: RedisServer,
    b: RedisServer,
    c: RedisServer,
    /// With two standbys of A: B's own standby.
    _d: Option<RedisServer>,
    link: Option<Link>,
    sentinel: Sentinel,
}

/// Where C replicates from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Standbys {
    /// C replicates B: A has one standby, B.
    Chained,
    /// C replicates A too (`replica-priority 0`: never promoted, the
    /// Sentinel sets it to the new primary after the switch), and D
    /// replicates B: A has two standbys, B has one before the failover
    /// and two after it.
    TwoOfA,
}

/// The forwarder of B's replication, on a runtime of its own (one thread),
/// so that the limiters' tasks never delay the stream or its
/// acknowledgements.
struct Link {
    proxy: Option<Proxy>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Link {
    fn start(target: u16) -> Link {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let proxy = std::thread::scope(|s| {
            s.spawn(|| runtime.block_on(Proxy::start(target)))
                .join()
                .unwrap()
        });
        Link {
            proxy: Some(proxy),
            runtime: Some(runtime),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        drop(self.proxy.take());
        if let Some(r) = self.runtime.take() {
            r.shutdown_background();
        }
    }
}

impl Deployment {
    async fn start(standbys: Standbys) -> Deployment {
        let a = RedisServer::start_args(NO_SYNC_DELAY);
        let b = RedisServer::start_args(NO_SYNC_DELAY);
        let link = Link::start(a.port);
        b.replicate_via(&a, link.proxy.as_ref().unwrap().port);
        let (c, d) = match standbys {
            Standbys::Chained => {
                let c = RedisServer::start_args(NO_SYNC_DELAY);
                c.replicate(&b);
                (c, None)
            }
            Standbys::TwoOfA => {
                let c = RedisServer::start_args(
                    &[NO_SYNC_DELAY, &["--replica-priority", "0"]].concat(),
                );
                c.replicate(&a);
                let d = RedisServer::start_args(NO_SYNC_DELAY);
                d.replicate(&b);
                (c, Some(d))
            }
        };
        let sentinel = Sentinel::start("pace", a.port);
        let mut admin = sentinel.admin();
        // B names the forwarder as its primary, not A's address: a
        // Sentinel sets such a replica to A itself once the failover
        // timeout has passed since it saw it. Not within this test.
        let _: () = redis::cmd("SENTINEL")
            .arg("SET")
            .arg("pace")
            .arg("failover-timeout")
            .arg(HANG.as_millis().to_string())
            .query(&mut admin)
            .unwrap();
        let deadline = Instant::now() + HANG;
        loop {
            let replicas: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg("pace")
                .query(&mut admin)
                .unwrap();
            if replicas.iter().any(|r| {
                r.get("flags").map(String::as_str) == Some("slave")
                    && r.get("port") == Some(&b.port.to_string())
            }) {
                break;
            }
            assert!(Instant::now() < deadline, "hang: the Sentinel never saw B");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Deployment {
            a,
            b,
            c,
            _d: d,
            link: Some(link),
            sentinel,
        }
    }

    /// Whether the Sentinel's configuration names B the primary
    /// (`SENTINEL MASTER`: it changes at `+switch-master`) and B says so.
    fn switched_to_b(&self) -> bool {
        let master: HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg("pace")
            .query(&mut self.sentinel.admin())
            .unwrap();
        master["port"] == self.b.port.to_string()
            && self.b.info_field("replication", "role").as_deref() == Some("master")
    }

    /// Waits until the Sentinel has switched to B, then until C
    /// replicates B (the standby `WAIT` counts on B, beside D).
    async fn await_switch(&self) -> u64 {
        let deadline = Instant::now() + HANG;
        while !self.switched_to_b() {
            assert!(
                Instant::now() < deadline,
                "hang: the failover never switched"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let switched = real_now();
        let b = Some(self.b.port.to_string());
        while self.c.info_field("replication", "master_port") != b {
            assert!(Instant::now() < deadline, "hang: C never replicated B");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        switched
    }
}

/// The limiters and their tasks.
struct Run {
    limiters: Vec<RedisPace>,
    records: Vec<Arc<Record>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Run {
    async fn start(d: &Deployment, leases: LeaseConfig) -> Run {
        let url = d.sentinel.url();
        let clocks = Clocks::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut run = Run {
            limiters: Vec::new(),
            records: Vec::new(),
            stop: stop.clone(),
            tasks: Vec::new(),
        };
        for l in 0..LIMITERS as u64 {
            let p = RedisPace::builder(Rate::per_second(RATE).unwrap())
                .capacity(CAP)
                .timeout(Duration::from_millis(500))
                .backoff(Duration::from_millis(50))
                .leases(leases)
                .connect_sentinel(&[url.as_str()], "pace")
                .await
                .unwrap();
            let record = Arc::new(Record::default());
            for t in 0..TASKS {
                run.tasks.push(tokio::spawn(task(
                    p.clone(),
                    record.clone(),
                    clocks,
                    stop.clone(),
                    l * 1_000 + t * 7,
                )));
            }
            run.limiters.push(p);
            run.records.push(record);
        }
        run
    }

    /// Waits until the bucket is drained (a `peek` of 0 tokens): a debit a
    /// failover loses is then one too many, not room the bucket had.
    async fn until_drained(&self) {
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
    async fn until_each_admits(&self, from: u64, to: u64, what: &str) {
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
    async fn check(self, what: &str, failed: u64, switched: u64, after: u64) {
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
            // Reaching the new primary meant a new connection.
            assert!(s.connects >= 1, "limiter {i} never moved");
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
fn tat(server: &RedisServer) -> u64 {
    let v: Option<String> = redis::cmd("GET")
        .arg("pace:hot")
        .query(&mut server.admin())
        .unwrap();
    v.map_or(0, |v| v.split('|').next().unwrap().parse().unwrap())
}

/// A lease time and its grace, in ns: a grant of A is used no later than
/// this after its call.
fn lease_span() -> u64 {
    let c = failover_leases();
    (c.lease + c.grace).as_nanos() as u64
}

/// The standby falls behind, then the primary dies: B's link to A stalls
/// (what A writes from then on never reaches B; `WAIT 1` on A times out),
/// the limiters go on calling A until A's bucket holds `LOST` tokens of
/// debits B lacks, A is killed (`kill -9`) and the link cut, and the
/// Sentinel promotes B, which lacks every write A made during the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_costs_no_excess_with_leases() {
    let mut d = Deployment::start(Standbys::Chained).await;
    let run = Run::start(&d, failover_leases()).await;
    run.until_each_admits(0, u64::MAX, "leases on A").await;
    run.until_drained().await;
    let stalled = real_now();
    d.link.as_ref().unwrap().proxy.as_ref().unwrap().stall();
    // Until A's bucket holds a second of debits (100 tokens) B lacks.
    let deadline = Instant::now() + HANG;
    while tat(&d.a) < tat(&d.b) + LOST * INTERVAL {
        assert!(Instant::now() < deadline, "hang: debits during the stall");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // kill -9: the Sentinel sees A down (1 s) and promotes B.
    let killed = real_now();
    d.a.stop();
    drop(d.link.take());
    let switched = d.await_switch().await;
    println!(
        "killed primary: the stall lasted {} ms; the Sentinel switched {} ms after the kill",
        (killed - stalled) / 1_000_000,
        (switched - killed) / 1_000_000
    );
    let after = switched + lease_span();
    run.until_each_admits(after, u64::MAX, "leases on B").await;
    run.check("killed primary", stalled, switched, after).await;
}

/// `SENTINEL FAILOVER` over `standbys`, the limiters leasing with `leases`.
async fn graceful(what: &str, standbys: Standbys, leases: LeaseConfig) {
    let d = Deployment::start(standbys).await;
    let run = Run::start(&d, leases).await;
    run.until_each_admits(0, u64::MAX, "leases on A").await;
    run.until_drained().await;
    let failed = real_now();
    d.sentinel.failover("pace", Instant::now() + HANG).await;
    let switched = d.await_switch().await;
    println!(
        "{what}: the Sentinel switched {} ms after SENTINEL FAILOVER",
        (switched - failed) / 1_000_000
    );
    let after = switched + lease_span();
    run.until_each_admits(after, u64::MAX, "leases on B").await;
    run.check(what, failed, switched, after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_failover_costs_no_excess_with_leases() {
    graceful("graceful failover", Standbys::Chained, failover_leases()).await;
}

/// Two standbys of A: after B's promotion, C still acknowledges A's
/// writes until the Sentinel sets it to B, so `WAIT 1` on A lets A's
/// admissions of that gap through, and B lacks them (with `wait_replicas:
/// 1` this test's kept admissions are 67, 77 and 81 tokens over the bound
/// in 3 runs). Every standby of A a `WAIT` may count has to acknowledge:
/// `wait_replicas: 2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_standbys_of_the_primary_need_wait_replicas_2() {
    let leases = LeaseConfig {
        wait_replicas: 2,
        ..failover_leases()
    };
    graceful("two standbys", Standbys::TwoOfA, leases).await;
}
