//! The server's `maxmemory-policy` is read at connect: a policy that can
//! evict the limiter's keys is logged (default) or refused; and what a lost
//! key costs: a full bucket, at most one capacity per key, after `FLUSHALL`
//! or a restart.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use pace::Rate;
use pace_redis::{ConfigError, ConnectError, Error, EvictionCheck, RedisPace, Source};

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        // The policy's warnings only: the other test's restart logs an
        // outage meanwhile.
        let line = r.args().to_string();
        if r.level() <= log::Level::Warn
            && r.target() == "pace_redis"
            && line.contains("maxmemory-policy")
        {
            WARNINGS.lock().unwrap().push(line);
        }
    }
    fn flush(&self) {}
}

fn take_warnings() -> Vec<String> {
    std::mem::take(&mut *WARNINGS.lock().unwrap())
}

const POLICIES: [&str; 8] = [
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

fn builder(check: EvictionCheck) -> pace_redis::Builder {
    // One token per hour, capacity 10: nothing refills during the test.
    RedisPace::builder(Rate::new(1, Duration::from_secs(3600)).unwrap())
        .capacity(10)
        .timeout(Duration::from_secs(2))
        .backoff(Duration::from_millis(20))
        .deny_cache(false)
        .eviction_check(check)
}

/// One test: the log capture is process-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policy_is_warned_about_or_refused() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let server = common::RedisServer::start();
    for policy in POLICIES {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query(&mut server.admin())
            .unwrap();
        let evicts = policy != "noeviction";
        take_warnings();
        let p = builder(EvictionCheck::Warn)
            .connect(&server.url())
            .await
            .unwrap();
        assert_eq!(p.maxmemory_policy().as_deref(), Some(policy));
        let warned = take_warnings();
        assert_eq!(warned.len(), usize::from(evicts), "{policy}: {warned:?}");
        if evicts {
            assert!(warned[0].contains(policy), "{warned:?}");
        }
        match builder(EvictionCheck::Refuse).connect(&server.url()).await {
            Ok(p) => {
                assert!(!evicts, "{policy} was not refused");
                assert_eq!(p.maxmemory_policy().as_deref(), Some(policy));
            }
            Err(ConnectError::Config(ConfigError::EvictingPolicy { policy: got })) => {
                assert!(evicts, "noeviction was refused");
                assert_eq!(got, policy);
            }
            Err(e) => panic!("{policy}: {e}"),
        }
        let p = builder(EvictionCheck::Ignore)
            .connect(&server.url())
            .await
            .unwrap();
        assert_eq!(p.maxmemory_policy(), None);
        assert!(take_warnings().is_empty());
    }
    // Configured on the command line, as an operator would.
    let lru = common::RedisServer::start_args(&["--maxmemory-policy", "volatile-lru"]);
    match builder(EvictionCheck::Refuse).connect(&lru.url()).await {
        Err(ConnectError::Config(ConfigError::EvictingPolicy { policy })) => {
            assert_eq!(policy, "volatile-lru")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("volatile-lru was not refused"),
    }
}

async fn drain(p: &RedisPace, key: &str) -> u64 {
    let mut admitted = 0;
    loop {
        match p.reserve(key).await {
            Ok(r) => {
                assert_eq!(r.source(), Source::Server);
                admitted += 1;
                assert!(admitted <= 10, "more than the capacity from one bucket");
            }
            Err(Error::Denied(d)) => {
                assert_eq!(d.source(), Source::Server);
                return admitted;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_key_hands_out_one_full_bucket() {
    let mut server = common::RedisServer::start();
    let p = builder(EvictionCheck::Warn)
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(drain(&p, "k").await, 10);
    assert_eq!(drain(&p, "k").await, 0);
    let _: () = redis::cmd("FLUSHALL").query(&mut server.admin()).unwrap();
    // The key is gone: a full bucket, exactly one capacity more.
    assert_eq!(drain(&p, "k").await, 10);
    assert_eq!(drain(&p, "k").await, 0);
    // A restart without persistence loses every key the same way.
    server.restart();
    let mut after = None;
    for _ in 0..200 {
        match p.reserve("k").await {
            Ok(r) => {
                after = Some(r);
                break;
            }
            Err(Error::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{e}"),
        }
    }
    let first = after.expect("no answer within 4 s of the restart");
    assert_eq!(first.prev_ns(), 0);
    assert_eq!(drain(&p, "k").await, 9);
}
