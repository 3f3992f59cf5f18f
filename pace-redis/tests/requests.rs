//! Bad input gets a clear answer; the denial cache and pipelines save round
//! trips (counted by the client and by the server's own command statistics);
//! keys disappear when their bucket is full.

mod common;

use std::time::Duration;

use pace::Rate;
use pace_redis::{
    ConfigError, ConnectError, Error, KeyError, OnUnavailable, RedisPace, Refunded, Source,
};

async fn limiter(url: &str, rate: Rate, cap: u64, cache: bool) -> RedisPace {
    RedisPace::builder(rate)
        .capacity(cap)
        .timeout(Duration::from_secs(2))
        .deny_cache(cache)
        .connect(url)
        .await
        .unwrap()
}

/// EVALSHA calls the server has executed (its INFO commandstats).
fn server_evalsha_calls(server: &common::RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.admin())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer_without_a_round_trip() {
    let server = common::RedisServer::start();
    let p = limiter(&server.url(), Rate::per_second(10).unwrap(), 5, true).await;
    assert!(matches!(
        p.reserve("").await,
        Err(Error::InvalidKey(KeyError::Empty))
    ));
    let huge = "k".repeat(1 << 20);
    match p.reserve(&huge).await {
        Err(Error::InvalidKey(KeyError::TooLong { bytes, max })) => {
            assert_eq!((bytes, max), ((1 << 20) + "pace:".len(), 1_024));
        }
        other => panic!("{other:?}"),
    }
    let zero = p.reserve_n("k", 0).await.unwrap();
    assert_eq!((zero.tokens(), zero.source()), (0, Source::Request));
    assert_eq!(p.refund(zero).await.unwrap(), Refunded::Nothing);
    match p.reserve_n("k", 6).await {
        Err(Error::Denied(d)) => {
            assert!(d.is_permanent());
            assert_eq!(d.retry_after(), Duration::MAX);
            assert_eq!(d.source(), Source::Request);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        p.reserve_n_at("k", 1, 5).await,
        Err(Error::TimeInjectionDisabled)
    ));
    assert_eq!(p.stats().round_trips, 0);
    assert_eq!(server_evalsha_calls(&server), 0);
    // Errors read as sentences.
    assert_eq!(p.reserve("").await.unwrap_err().to_string(), "empty key");
    // A larger limit admits a large key; keys are bytes to Redis, any UTF-8.
    let big = RedisPace::builder(Rate::per_second(10).unwrap())
        .max_key_bytes(200_000)
        .connect(&server.url())
        .await
        .unwrap();
    let _ = big.reserve(&"k".repeat(100_000)).await.unwrap();
    let _ = big.reserve("{tenant-1}:ключ ✓").await.unwrap();
}

#[tokio::test]
async fn bad_configurations_are_typed_errors() {
    let server = common::RedisServer::start();
    let url = server.url();
    let r = |b: pace_redis::Builder| {
        let url = url.clone();
        async move { b.connect(&url).await.err().map(|e| e.to_string()) }
    };
    let rate = Rate::per_second(10).unwrap();
    let cfg = |e: Result<RedisPace, ConnectError>| match e {
        Err(ConnectError::Config(c)) => c,
        other => panic!("{:?}", other.err()),
    };
    assert_eq!(
        cfg(RedisPace::builder(rate).capacity(0).connect(&url).await),
        ConfigError::Pace(pace::ConfigError::ZeroCapacity)
    );
    // 1 token per day, 20 days of capacity: tau > 2^50 ns.
    let slow = Rate::new(1, Duration::from_secs(86_400)).unwrap();
    assert!(matches!(
        cfg(RedisPace::builder(slow).capacity(20).connect(&url).await),
        ConfigError::TauTooLarge { max_ns, .. } if max_ns == 1 << 50
    ));
    assert!(RedisPace::builder(slow)
        .capacity(13)
        .connect(&url)
        .await
        .is_ok());
    assert_eq!(
        cfg(RedisPace::builder(rate)
            .on_unavailable(OnUnavailable::LocalFallback { replicas: 0 })
            .connect(&url)
            .await),
        ConfigError::ZeroReplicas
    );
    assert_eq!(
        cfg(RedisPace::builder(rate)
            .timeout(Duration::ZERO)
            .connect(&url)
            .await),
        ConfigError::ZeroTimeout
    );
    assert_eq!(
        cfg(RedisPace::builder(rate)
            .max_key_bytes(3)
            .connect(&url)
            .await),
        ConfigError::PrefixTooLong
    );
    assert!(matches!(
        RedisPace::builder(rate).connect("not a url").await,
        Err(ConnectError::InvalidUrl(_))
    ));
    assert!(r(RedisPace::builder(rate).capacity(0))
        .await
        .unwrap()
        .contains("capacity"));
}

#[tokio::test]
async fn a_flood_of_denials_is_answered_locally_until_the_retry_time() {
    let server = common::RedisServer::start();
    // One a minute, capacity 1: after one admission, every request of the
    // flood is denied (a minute is a bound only a hang outlasts).
    let slow = Rate::per_minute(1).unwrap();
    let cached = limiter(&server.url(), slow, 1, true).await;
    let plain = limiter(&server.url(), slow, 1, false).await;
    const FLOOD: u64 = 1_000;
    for (p, key) in [(&cached, "c"), (&plain, "p")] {
        let _ = p.reserve(key).await.unwrap();
        let before = p.stats().round_trips;
        let mut denied = 0;
        let mut requests = 0;
        for _ in 0..FLOOD {
            requests += 1;
            match p.reserve(key).await {
                Err(Error::Denied(d)) => {
                    assert!(d.retry_after() <= Duration::from_secs(60));
                    denied += 1;
                }
                Ok(_) => panic!("admitted within the minute"),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(denied, FLOOD);
        let trips = p.stats().round_trips - before;
        println!("{key}: {denied} denials in {trips} round trips");
        if key == "c" {
            assert_eq!(trips, 1, "one server denial, the rest from the cache");
            assert_eq!(p.stats().cache_denials, denied - 1);
        } else {
            assert_eq!(trips, requests, "every request is a round trip");
        }
    }
    // The client's count is the server's count.
    let client_calls = cached.stats().round_trips + plain.stats().round_trips
        - cached.stats().script_loads
        - plain.stats().script_loads;
    assert_eq!(server_evalsha_calls(&server), client_calls);
    // Once the retry time has passed, the server is asked again and admits
    // (12 a minute, capacity 1: denied for 5 s after an admission, so the
    // denial and the cached one come first whatever the load).
    let cached = limiter(&server.url(), Rate::per_minute(12).unwrap(), 1, true).await;
    let _ = cached.reserve("c2").await.unwrap();
    let d = match cached.reserve("c2").await {
        Err(Error::Denied(d)) if d.source() == Source::Server => d,
        other => panic!("{other:?}"),
    };
    assert!(
        matches!(cached.reserve("c2").await, Err(Error::Denied(d)) if d.source() == Source::Cache)
    );
    tokio::time::sleep(d.retry_after() + Duration::from_millis(2)).await;
    let r = cached.reserve("c2").await.unwrap();
    assert_eq!(r.source(), Source::Server);
    // A request for fewer tokens than the cached denial goes to the server.
    let rate = Rate::per_second(20).unwrap();
    // The server's time is injected (60 ms after the drain: 1.2 tokens
    // back at 20/s), so no stall can refill the second token first.
    let p3 = RedisPace::builder(rate)
        .capacity(3)
        .timeout(Duration::from_secs(2))
        .deny_cache(true)
        .time_injection(true)
        .connect(&server.url())
        .await
        .unwrap();
    let t0 = 1_000_000_000_000;
    let _ = p3.reserve_n_at("m", 3, t0).await.unwrap();
    let later = t0 + 60_000_000;
    assert!(
        matches!(p3.reserve_n_at("m", 2, later).await, Err(Error::Denied(d)) if d.source() == Source::Server)
    );
    let r = p3.reserve_n_at("m", 1, later).await.unwrap();
    assert_eq!(r.source(), Source::Server);
}

#[tokio::test]
async fn pipelines_decide_many_requests_in_one_round_trip() {
    let server = common::RedisServer::start();
    let p = limiter(&server.url(), Rate::per_second(100).unwrap(), 2, false).await;
    let _ = p.reserve("warm").await.unwrap(); // loads the script
    let before = p.stats().round_trips;
    let reqs: Vec<(&str, u64)> = (0..10).map(|i| (["x", "y"][i % 2], 1)).collect();
    let out = p.reserve_many(&reqs).await;
    assert_eq!(p.stats().round_trips - before, 1);
    // Capacity 2 per key: the first two of each key admitted, in order.
    let admitted: Vec<bool> = out.iter().map(|r| r.is_ok()).collect();
    assert_eq!(
        admitted,
        [true, true, true, true, false, false, false, false, false, false]
    );
}

#[tokio::test]
async fn a_full_bucket_is_no_key() {
    let server = common::RedisServer::start();
    let p = limiter(&server.url(), Rate::per_second(10).unwrap(), 3, false).await;
    let mut admin = server.admin();
    let key = p.redis_key("gone");
    let r = p.reserve_n("gone", 2).await.unwrap();
    // Expires at tat (ms, rounded up): PEXPIRETIME is the tat's ms ceiling.
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut admin)
        .unwrap();
    assert_eq!(at as u64, r.tat_ns().div_ceil(1_000_000));
    assert_eq!(r.tat_ns() - r.server_now_ns().unwrap(), 200_000_000);
    // A refund right away restores the full bucket: no key.
    assert_eq!(p.refund(r).await.unwrap(), Refunded::Removed);
    let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut admin).unwrap();
    assert!(!exists);
    // Stacked debits: refunding the older one returns nothing; the newer
    // one restores the older's end, with its expiry.
    let a = p.reserve("gone").await.unwrap();
    let b = p.reserve("gone").await.unwrap();
    let (a_tat, b_tat) = (a.tat_ns(), b.tat_ns());
    // A one-token reserve on a key in debt: its expiry too is its tat's ms
    // ceiling.
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut admin)
        .unwrap();
    assert_eq!(at as u64, b_tat.div_ceil(1_000_000));
    assert_eq!(p.refund(a).await.unwrap(), Refunded::Superseded);
    assert_eq!(p.refund(b).await.unwrap(), Refunded::Restored);
    let stored: u64 = redis::cmd("GET").arg(&key).query(&mut admin).unwrap();
    assert_eq!(stored, a_tat);
    assert!(b_tat > a_tat);
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut admin)
        .unwrap();
    assert_eq!(at as u64, a_tat.div_ceil(1_000_000));
    // And the key is gone once the bucket is full.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut admin).unwrap();
    assert!(!exists);
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut admin).unwrap();
    assert_eq!(dbsize, 0);
    // A one-token reserve on no key: one interval of debt, the expiry its
    // tat's ms ceiling (several, so that sub-millisecond tats are met).
    for i in 0..20 {
        let k = format!("fresh{i}");
        let r = p.reserve(&k).await.unwrap();
        assert_eq!(r.tat_ns() - r.server_now_ns().unwrap(), 100_000_000);
        assert_eq!(r.prev_ns(), 0);
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(p.redis_key(&k))
            .query(&mut admin)
            .unwrap();
        assert_eq!(at as u64, r.tat_ns().div_ceil(1_000_000));
        let stored: u64 = redis::cmd("GET")
            .arg(p.redis_key(&k))
            .query(&mut admin)
            .unwrap();
        assert_eq!(stored, r.tat_ns());
    }
}

#[tokio::test]
async fn foreign_or_impossible_stored_state_is_a_typed_error() {
    let server = common::RedisServer::start();
    let p = limiter(&server.url(), Rate::per_second(10).unwrap(), 3, false).await;
    let mut admin = server.admin();
    let r = p.reserve("k").await.unwrap();
    // A tat 30 days ahead of the server's clock: no bucket can be there.
    let ahead = r.server_now_ns().unwrap() + 30 * 86_400 * 1_000_000_000;
    let _: () = redis::cmd("SET")
        .arg(p.redis_key("k"))
        .arg(ahead)
        .query(&mut admin)
        .unwrap();
    assert!(matches!(
        p.reserve("k").await,
        Err(Error::Unavailable(
            pace_redis::BackendError::ClockOutOfRange
        ))
    ));
    // Another program's value under the key: the script's error, typed.
    let _: () = redis::cmd("SET")
        .arg(p.redis_key("k"))
        .arg("not a time")
        .query(&mut admin)
        .unwrap();
    assert!(matches!(
        p.reserve("k").await,
        Err(Error::Unavailable(pace_redis::BackendError::Redis(_)))
    ));
    let _: () = redis::cmd("HSET")
        .arg(p.redis_key("h"))
        .arg("f")
        .arg(1)
        .query(&mut admin)
        .unwrap();
    assert!(matches!(
        p.reserve("h").await,
        Err(Error::Unavailable(pace_redis::BackendError::Redis(_)))
    ));
    // None of these opened the circuit: the next key is decided normally.
    assert_eq!(p.reserve("fine").await.unwrap().source(), Source::Server);
}
