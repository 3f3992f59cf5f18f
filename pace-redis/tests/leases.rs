//! Leases on real redis-server processes: several limiters (standing for
//! replicas) with leases, tasks reserving on one hot key, refunds, calls
//! the lease cannot decide (a quota of their own, holds, turns), and a
//! replica process killed (`kill -9`) while it holds a lease. Every kept admission is
//! recorded at its true instant — the server's reading for a decision of
//! the server, the local reading its lease's deadline was checked against
//! for a leased one (both on the machine's real-time clock, which the
//! server's `TIME` reads) — and checked over every window against the
//! bound (`pace_models::bound`, exact integers).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Clocks;

use pace::{Quota, Rate, Refunded};
use pace_redis::{BackendError, Error, LeaseConfig, RedisPace, Reservation, Source};

const INTERVAL_RATE: u64 = 2_000; // per second: 500 us a token
const CAP: u64 = 20;

fn config() -> LeaseConfig {
    LeaseConfig {
        lease: Duration::from_millis(20),
        grace: Duration::from_millis(5),
        hot_after: 2,
        want: Some(5),
        ..LeaseConfig::default()
    }
}

async fn limiter(url: &str) -> RedisPace {
    RedisPace::builder(Rate::per_second(INTERVAL_RATE).unwrap())
        .capacity(CAP)
        .timeout(Duration::from_secs(5))
        .leases(config())
        .connect(url)
        .await
        .unwrap()
}

/// Holds decided by a lease, over every task.
static LEASED_HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The instant a kept reservation was let through.
fn instant(r: &Reservation, clocks: &Clocks) -> u64 {
    match r.source() {
        Source::Server => r.server_now_ns().unwrap(),
        Source::Lease => clocks.real(r.leased_at().unwrap()),
        s => panic!("source {s:?}"),
    }
}

/// One task's reserves on `key`: `calls` of them; every fifth admission
/// refunded at once; every seventh call under a quota of its own (equal
/// to the configuration's, so that one bound covers all), every eleventh a
/// hold (kept or refunded in turn), every 31st a turn (`acquire`, up to
/// 1 ms of wait, let through at its slot): none of those a lease
/// decides. Kept admissions as (instant, tokens).
async fn hammer(p: RedisPace, key: &'static str, calls: u64, seed: u64) -> (Vec<(u64, u64)>, u64) {
    let clocks = Clocks::now();
    let own = Quota::new(Rate::per_second(INTERVAL_RATE).unwrap(), CAP).unwrap();
    let mut kept = Vec::new();
    let mut restored = 0;
    for i in 0..calls {
        let n = 1 + (i + seed) % 2;
        if (i + seed).is_multiple_of(11) {
            match p.hold_n(key, n).await {
                Ok(h) => {
                    let at = match h.source() {
                        Source::Server => h.server_now_ns().unwrap(),
                        Source::Lease => {
                            LEASED_HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            clocks.real(h.leased_at().unwrap())
                        }
                        s => panic!("source {s:?}"),
                    };
                    let leased = h.source() == Source::Lease;
                    if (i / 11).is_multiple_of(2) {
                        // Kept: settled from its own reading.
                        assert!(h.keep().await.unwrap());
                        kept.push((at, n));
                    } else {
                        match h.refund().await.unwrap() {
                            Refunded::Restored => restored += 1,
                            // A leased hold a renewal reported: kept.
                            Refunded::Superseded if leased => kept.push((at, n)),
                            other => panic!("{other:?}"),
                        }
                    }
                }
                Err(Error::Denied(_)) => tokio::task::yield_now().await,
                Err(e) => panic!("{e}"),
            }
            continue;
        }
        if (i + seed).is_multiple_of(31) {
            match p.acquire_n(key, n, Duration::from_millis(1)).await {
                Ok(r) => {
                    assert_eq!(r.source(), Source::Server);
                    let slot = r.server_now_ns().unwrap() + r.wait().as_nanos() as u64;
                    kept.push((slot, n));
                }
                Err(Error::Denied(_)) => tokio::task::yield_now().await,
                Err(e) => panic!("{e}"),
            }
            continue;
        }
        let r = if (i + seed).is_multiple_of(7) {
            p.reserve_n_with(key, n, own).await
        } else {
            p.reserve_n(key, n).await
        };
        match r {
            Ok(r) => {
                let at = instant(&r, &clocks);
                if (i + seed).is_multiple_of(5) {
                    match p.refund(r).await.unwrap() {
                        Refunded::Restored | Refunded::Removed => restored += 1,
                        _ => kept.push((at, n)),
                    }
                } else {
                    kept.push((at, n));
                }
            }
            Err(Error::Denied(_)) => tokio::task::yield_now().await,
            Err(e) => panic!("{e}"),
        }
    }
    (kept, restored)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_replicas_never_exceed_the_bound() {
    let server = common::RedisServer::start();
    let url = server.url();
    let mut limiters = Vec::new();
    for _ in 0..3 {
        limiters.push(limiter(&url).await);
    }
    let mut tasks = Vec::new();
    for (c, l) in limiters.iter().enumerate() {
        for t in 0..3u64 {
            tasks.push(tokio::spawn(hammer(
                l.clone(),
                "hot",
                4_000,
                c as u64 * 3 + t,
            )));
        }
    }
    let mut kept = Vec::new();
    let mut restored = 0;
    for t in tasks {
        let (k, r) = t.await.unwrap();
        kept.extend(k);
        restored += r;
    }
    let stats: Vec<_> = limiters.iter().map(RedisPace::stats).collect();
    let leased: u64 = stats.iter().map(|s| s.leased_decisions).sum();
    let server_decisions: u64 = stats.iter().map(|s| s.server_decisions).sum();
    let grants: u64 = stats.iter().map(|s| s.lease_grants).sum();
    let interval = limiters[0].interval_ns();
    let excess = pace_models::bound::worst_excess_ns(&mut kept, CAP, interval);
    let tokens: u64 = kept.iter().map(|k| k.1).sum();
    println!(
        "{} kept admissions ({tokens} tokens), {leased} leased decisions, {server_decisions} \
         server decisions, {grants} tokens granted, {restored} refunds restored; worst \
         excess {excess} ns",
        kept.len()
    );
    assert!(
        excess <= 0,
        "the kept admissions exceed the bound by {excess} ns"
    );
    // Not vacuous: leases decided, the server decided, refunds restored.
    assert!(leased > 1_000, "{leased} leased decisions");
    assert!(server_decisions > 100);
    assert!(restored > 100);
    let leased_holds = LEASED_HOLDS.load(std::sync::atomic::Ordering::Relaxed);
    println!("{leased_holds} holds decided by a lease");
    assert!(leased_holds > 10, "{leased_holds} leased holds");
}

/// The replica process of `a_killed_replica_strands_its_grant_never_excess`
/// (run by it with `PACE_LEASE_CHILD` set): spends its lease on the hot
/// key, printing each kept admission as `K instant tokens`, then `READY`
/// once it has made 200 leased decisions and holds unspent tokens, and
/// goes on until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "run as a child process"]
async fn lease_child() {
    let Ok(url) = std::env::var("PACE_LEASE_CHILD") else {
        return;
    };
    let p = limiter(&url).await;
    let clocks = Clocks::now();
    let mut ready = false;
    loop {
        match p.reserve("hot").await {
            Ok(r) => {
                println!("K {} 1", instant(&r, &clocks));
                let s = p.stats();
                if !ready && s.leased_decisions >= 200 && s.lease_grants > s.leased_decisions {
                    println!("READY");
                    ready = true;
                }
            }
            Err(Error::Denied(_)) => tokio::time::sleep(Duration::from_micros(200)).await,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_strands_its_grant_never_excess() {
    let server = common::RedisServer::start();
    let url = server.url();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lease_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PACE_LEASE_CHILD", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut kept = Vec::new();
    // The other replica runs beside it all along.
    let other = limiter(&url).await;
    let beside = tokio::spawn(hammer(other.clone(), "hot", 1_500, 1));
    let reader = tokio::task::spawn_blocking(move || {
        let mut kept = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if line == "READY" {
                return (kept, lines);
            }
            let mut f = line.split(' ');
            if f.next() == Some("K") {
                let at: u64 = f.next().unwrap().parse().unwrap();
                let n: u64 = f.next().unwrap().parse().unwrap();
                kept.push((at, n));
            }
        }
        panic!("the child ended before READY");
    });
    let (child_kept, mut lines) = reader.await.unwrap();
    kept.extend(child_kept);
    // kill -9 while it holds a lease.
    let status = Command::new("kill")
        .args(["-KILL", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    child.wait().unwrap();
    // Whatever it printed before dying.
    for line in lines.by_ref() {
        let line = line.unwrap();
        let mut f = line.split(' ');
        if f.next() == Some("K") {
            if let (Some(at), Some(n)) = (f.next(), f.next()) {
                if let (Ok(at), Ok(n)) = (at.parse(), n.parse()) {
                    kept.push((at, n));
                }
            }
        }
    }
    let (k, _) = beside.await.unwrap();
    kept.extend(k);
    // After the kill, the survivor goes on (the stranded tokens settle at
    // the dead lease's expiry plus its grace).
    let (k, _) = hammer(other.clone(), "hot", 1_500, 2).await;
    let after = k.len();
    kept.extend(k);
    let interval = other.interval_ns();
    let excess = pace_models::bound::worst_excess_ns(&mut kept, CAP, interval);
    let s = other.stats();
    println!(
        "{} kept admissions, {after} after the kill; survivor: {} leased, {} granted; worst \
         excess {excess} ns",
        kept.len(),
        s.leased_decisions,
        s.lease_grants
    );
    assert!(
        excess <= 0,
        "the kept admissions exceed the bound by {excess} ns"
    );
    assert!(after > 100, "the survivor admitted {after} after the kill");
}

/// Reserves on `key` until one is decided by a lease, at most `calls`.
async fn until_leased(p: &RedisPace, key: &str, calls: u64) -> bool {
    for _ in 0..calls {
        match p.reserve(key).await {
            Ok(r) if r.source() == Source::Lease => return true,
            Ok(_) | Err(Error::Denied(_)) => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    false
}

fn standby_config() -> LeaseConfig {
    LeaseConfig {
        wait_replicas: 1,
        ..config()
    }
}

/// With a standby required (`wait_replicas: 1`) and one replicating, a
/// grant is used once `WAIT 1` returns, and the standby holds the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_used_once_the_standby_has_it() {
    let primary = common::RedisServer::start();
    let standby = common::RedisServer::start();
    standby.replicate(&primary);
    let p = RedisPace::builder(Rate::per_second(100_000).unwrap())
        .capacity(1_000)
        .timeout(Duration::from_secs(5))
        .leases(standby_config())
        .connect(&primary.url())
        .await
        .unwrap();
    assert!(until_leased(&p, "k", 10_000).await, "no leased decision");
    let s = p.stats();
    assert!(s.lease_grants > 0 && s.leased_decisions > 0, "{s:?}");
    // The lease (a hold of 48 hexadecimal digits of id) is on the standby.
    let on_standby: Option<String> = redis::cmd("GET")
        .arg(p.redis_key("k"))
        .query(&mut standby.admin())
        .unwrap();
    let v = on_standby.expect("the key on the standby");
    assert!(v.contains('|'), "no lease on the standby: {v}");
}

/// With a standby required and none replicating, `WAIT 1` reports no
/// acknowledgement: no grant is used, and no admission of the server's
/// either (each answers `NotReplicated`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_no_standby_acknowledged_is_never_used() {
    let server = common::RedisServer::start();
    let p = RedisPace::builder(Rate::per_second(100_000).unwrap())
        .capacity(1_000)
        .timeout(Duration::from_secs(5))
        // Longer than the test: after the first admission the server is
        // not asked again (the standbys missed its WAIT), but grants are.
        .backoff(Duration::from_secs(60))
        .leases(LeaseConfig {
            // Hot after one decision.
            hot_after: 1,
            ..standby_config()
        })
        .connect(&server.url())
        .await
        .unwrap();
    // The server's admission (not used): the key is hot (`hot_after` 1), and
    // a renewal asks for a grant. Then, once the grant's answer came (an
    // event, with a bound only a hang exceeds), more calls: none is leased.
    let not_replicated = |r: Result<Reservation, Error>| match r {
        Err(Error::Unavailable(BackendError::NotReplicated {
            acked: 0,
            wanted: 1,
        })) => {}
        other => panic!("{other:?}"),
    };
    not_replicated(p.reserve("k").await);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = p.stats();
        if s.unreplicated >= 2 || s.lease_grants > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no grant answered: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..10 {
        not_replicated(p.reserve("k").await);
    }
    let s = p.stats();
    assert_eq!(s.leased_decisions, 0, "{s:?}");
    assert_eq!(s.lease_grants, 0, "{s:?}");
}

/// A key that goes quiet has its lease released: within about half a
/// lease time of the last leased decision the replica reports its pool as
/// released, and the server's record of the lease holds nothing; the key
/// is then cold until hot again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_key_releases_its_lease() {
    let server = common::RedisServer::start();
    let p = RedisPace::builder(Rate::per_second(100_000).unwrap())
        .capacity(1_000)
        .timeout(Duration::from_secs(5))
        .leases(LeaseConfig {
            want: Some(100),
            // Long enough that the lease cannot expire before the release,
            // also on a loaded machine: the record expires at the lease's
            // end plus the grace, and a release after it finds no record.
            // The release comes one or two checks (half a lease time each)
            // after the last leased decision: here, made at once, the
            // second check, at the lease's end; the grace covers it.
            lease: Duration::from_secs(10),
            grace: Duration::from_secs(5),
            ..config()
        })
        .connect(&server.url())
        .await
        .unwrap();
    assert!(until_leased(&p, "q", 10_000).await, "no leased decision");
    let mut used = 1;
    for _ in 0..20 {
        if let Ok(r) = p.reserve("q").await {
            if r.source() == Source::Lease {
                used += 1;
            }
        }
    }
    // The release: the server's record of the lease comes to hold nothing
    // (its cost field); an event, waited for with a bound only a hang
    // exceeds.
    let lease_cost = || {
        let v: Option<String> = redis::cmd("GET")
            .arg(p.redis_key("q"))
            .query(&mut server.admin())
            .unwrap();
        let v = v.unwrap_or_else(|| {
            panic!(
                "the lease's record expired before its release: {:?}",
                p.stats()
            )
        });
        let entry = v
            .split('|')
            .find(|e| e.split(',').next().is_some_and(|id| id.len() == 48))
            .unwrap_or_else(|| panic!("no lease in {v}"))
            .to_owned();
        entry.split(',').nth(1).unwrap().to_owned()
    };
    let mut waited = 0;
    while lease_cost() != "0" {
        assert!(waited < 30_000, "no release after 30 s: {:?}", p.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 10;
    }
    let s = p.stats();
    assert_eq!(s.leased_decisions, used, "{s:?}");
    // Every granted token was used (kept) or released.
    assert!(s.lease_releases > 0, "{s:?}");
    assert_eq!(s.lease_releases + used, s.lease_grants, "{s:?}");
    // The key is cold again: the server decides until it is hot again,
    // then a lease (the same lease's record, renewed) decides.
    assert_eq!(p.reserve("q").await.unwrap().source(), Source::Server);
    assert!(
        until_leased(&p, "q", 10_000).await,
        "no lease once hot again"
    );
    assert!(p.stats().lease_grants > s.lease_grants);
}

/// A key only held (as pace-tower's layer holds a limit it may refund)
/// gets hot, and a lease, as a reserved one does; its holds are then the
/// lease's, kept or refunded at once without a round trip
/// (`Hold::try_keep_now`, `Hold::try_refund_now`), a refund back to the
/// lease's pool; a hold of the server comes back for its script call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_is_leased_and_its_holds_resolve_at_once() {
    let server = common::RedisServer::start();
    let p = RedisPace::builder(Rate::per_second(1).unwrap())
        .capacity(100)
        .timeout(Duration::from_secs(5))
        .hold_limit(Duration::from_secs(60))
        .leases(LeaseConfig {
            // Long enough that no renewal falls due during the test.
            lease: Duration::from_secs(60),
            want: Some(10),
            ..config()
        })
        .connect(&server.url())
        .await
        .unwrap();
    // Holds of the server (each refunded by its script call) until the
    // key's lease decides one (after two, and the grant's round trip); a
    // bound only a hang exceeds.
    let mut held = None;
    for _ in 0..2_000 {
        let h = p.hold("h").await.unwrap();
        if h.source() == Source::Lease {
            held = Some(h);
            break;
        }
        assert_eq!(h.source(), Source::Server);
        let mut h = h;
        assert_eq!(h.try_refund_now(), None, "a hold of the server");
        assert_eq!(h.refund().await.unwrap(), Refunded::Restored);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut h = held.expect("no hold decided by a lease: a held key never got hot");
    assert_eq!(h.try_refund_now(), Some(Refunded::Restored));
    // The lease's pool (10 tokens) takes every hold and every refund back,
    // with no round trip.
    let before = p.stats();
    for i in 0..1_000 {
        let mut h = p.hold("h").await.unwrap();
        assert_eq!(h.source(), Source::Lease, "hold {i}");
        assert_eq!(h.try_refund_now(), Some(Refunded::Restored));
    }
    let mut h = p.hold("h").await.unwrap();
    assert_eq!(h.source(), Source::Lease);
    assert_eq!(h.try_keep_now(), Some(true));
    // Resolved: nothing more to settle.
    assert_eq!(h.try_keep_now(), Some(false));
    let after = p.stats();
    assert_eq!(after.round_trips, before.round_trips, "{after:?}");
    assert_eq!(after.leased_decisions, before.leased_decisions + 1_001);
}
