//! A real Sentinel and a failover (feature `sentinel`): the limiter asks the
//! Sentinel for the primary; the primary dies, the Sentinel promotes the
//! replica, and the limiter's admissions continue there, from the replicated
//! bucket.
#![cfg(feature = "sentinel")]

mod common;

use std::time::{Duration, Instant};

use common::{RedisServer, Sentinel};
use pace::Rate;
use pace_redis::{Error, RedisPace, Source};

const INTERVAL_NS: u64 = 3_600_000_000_000;
const NO_SYNC_DELAY: &[&str] = &["--repl-diskless-sync-delay", "0"];

fn get(server: &RedisServer, key: &str) -> Option<u64> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.admin())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_sentinel_failover() {
    let mut a = RedisServer::start_args(NO_SYNC_DELAY);
    let b = RedisServer::start_args(NO_SYNC_DELAY);
    b.replicate(&a);
    let sentinel = Sentinel::start("pace", a.port);
    let url = sentinel.url();
    let p = RedisPace::builder(Rate::new(1, Duration::from_secs(3600)).unwrap())
        .capacity(30)
        .timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(50))
        .deny_cache(false)
        .connect_sentinel(&[url.as_str()], "pace")
        .await
        .unwrap();
    let r1 = p.reserve("k").await.unwrap();
    assert_eq!((r1.source(), r1.prev_ns()), (Source::Server, 0));
    assert_eq!(
        get(&a, "pace:k"),
        Some(r1.tat_ns()),
        "the first primary decided"
    );

    // Wait for the debit on the replica, then for a forced failover.
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&b, "pace:k") != Some(r1.tat_ns()) {
        assert!(Instant::now() < deadline, "never replicated");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The primary dies; the Sentinel sees it down (1 s) and promotes b.
    a.stop();
    let mut admin = sentinel.admin();
    loop {
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg("pace")
            .query(&mut admin)
            .unwrap();
        if addr.get(1) == Some(&b.port.to_string())
            && b.info_field("replication", "role").as_deref() == Some("master")
        {
            break;
        }
        assert!(Instant::now() < deadline, "the failover never finished");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The limiter follows: errors (a lost connection, an open circuit) until
    // it reaches the new primary, never an admission elsewhere.
    let mut errors = 0;
    let r2 = loop {
        match p.reserve("k").await {
            Ok(r) => break r,
            Err(Error::Unavailable(_)) => errors += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "never reached the new primary");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r2.source(), Source::Server);
    assert_eq!(r2.prev_ns(), r1.tat_ns(), "the replicated bucket");
    assert_eq!(r2.tat_ns(), r1.tat_ns() + INTERVAL_NS);
    assert_eq!(
        get(&b, "pace:k"),
        Some(r2.tat_ns()),
        "the new primary decided"
    );
    println!("errors before reaching the new primary: {errors}");
}

/// `SENTINEL FAILOVER` (graceful: the old primary stays up, accepting
/// writes until the Sentinel turns it into a replica, ~10 s later) while
/// two limiters call one key at full speed: one connected before the
/// failover, one connected after the switch (`SENTINEL MASTER` names the
/// new primary). The first moves to the new primary at the Sentinel's
/// `+switch-master`, so the two share one bucket again at once; the
/// admissions from the failover command to 2 s after the switch stay
/// within the bound (capacity + elapsed x rate) but for a small margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_failover_does_not_split_the_limit() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let a = RedisServer::start_args(NO_SYNC_DELAY);
    let b = RedisServer::start_args(NO_SYNC_DELAY);
    b.replicate(&a);
    let sentinel = Sentinel::start("pace", a.port);
    let url = sentinel.url();
    // 100 per second, capacity 10.
    let builder = || {
        RedisPace::builder(Rate::per_second(100).unwrap())
            .capacity(10)
            .timeout(Duration::from_millis(300))
            .backoff(Duration::from_millis(50))
            .deny_cache(false)
    };
    let before = builder()
        .connect_sentinel(&[url.as_str()], "pace")
        .await
        .unwrap();
    let mut admin = sentinel.admin();
    // The primary of the Sentinel's configuration (`SENTINEL MASTER`: it
    // changes at `+switch-master`; GET-MASTER-ADDR-BY-NAME already names
    // the replica being promoted).
    let primary_port = |admin: &mut redis::Connection| -> String {
        let master: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg("pace")
            .query(admin)
            .unwrap();
        master["port"].clone()
    };
    assert_eq!(primary_port(&mut admin), a.port.to_string());

    let admitted = Arc::new(AtomicU64::new(0));
    let in_window = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = |p: RedisPace| {
        let (admitted, in_window, stop) = (admitted.clone(), in_window.clone(), stop.clone());
        tokio::spawn(async move {
            let mut errors = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match p.reserve("k").await {
                    Ok(r) => {
                        assert_eq!(r.source(), Source::Server);
                        if in_window.load(Ordering::Relaxed) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(Error::Denied(_)) => {}
                    Err(Error::Unavailable(_)) => {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            errors
        })
    };
    let mut tasks = vec![hammer(before.clone())];
    // The replica is known to the Sentinel (a failover needs one), and the
    // bucket is drained.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let replicas: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg("pace")
            .query(&mut admin)
            .unwrap();
        if replicas
            .iter()
            .any(|r| r.get("flags").map(String::as_str) == Some("slave"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Sentinel never saw the replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let t0 = Instant::now();
    in_window.store(true, Ordering::Relaxed);
    sentinel.failover("pace", deadline).await;
    // The switch, then a limiter connected after it.
    while primary_port(&mut admin) != b.port.to_string() {
        assert!(Instant::now() < deadline, "the failover never switched");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let switched = t0.elapsed();
    let after = builder()
        .connect_sentinel(&[url.as_str()], "pace")
        .await
        .unwrap();
    tasks.push(hammer(after.clone()));
    // Two seconds after the switch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    in_window.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut errors = 0;
    for t in tasks {
        errors += t.await.unwrap();
    }
    let admitted = admitted.load(Ordering::Relaxed);
    // GCRA over `elapsed`: at most capacity + elapsed x rate (+1 for the
    // window's edges).
    let bound = 10 + (elapsed.as_millis() as u64) / 10 + 1;
    let excess = admitted.saturating_sub(bound);
    println!(
        "graceful failover: switch {switched:?} after SENTINEL FAILOVER; {admitted} admitted \
         over {elapsed:?}, bound {bound}, excess {excess} ({errors} errors); \
         connects of the first limiter: {}",
        before.stats().connects
    );
    // Without the follower the first limiter stays on the old primary
    // until it turns replica (~10 s): both admit the full rate, ~100 a
    // second over the bound. With it, both share the new primary's bucket
    // from the switch on: the admissions of the old primary between the
    // promotion and the switch cost at most a refilled capacity (10),
    // which the bound already counts.
    assert!(
        excess <= 50,
        "{admitted} admitted over {elapsed:?}: {excess} over the bound {bound}"
    );
    assert!(
        before.stats().connects >= 1,
        "the limiter connected before never moved"
    );
}
