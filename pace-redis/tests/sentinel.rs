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
