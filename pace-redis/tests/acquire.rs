//! Waiting for a turn (`acquire`) and quotas per call against a real server:
//! exact slots on the server's clock, FIFO order, no turn early, typed
//! errors at once, cancellation by the refund rule; a denial cached under
//! one quota denies no call that fits under another; the local fallback
//! decides with the call's quota.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pace::{DenyReason, Quota, Rate};
use pace_redis::{ConfigError, Error, OnUnavailable, RedisPace, Source, MAX_TAU_NS};

const MS: u64 = 1_000_000;

async fn limiter(url: &str, per_s: u64, cap: u64, cache: bool) -> RedisPace {
    RedisPace::builder(Rate::per_second(per_s).unwrap())
        .capacity(cap)
        .timeout(Duration::from_secs(2))
        .deny_cache(cache)
        .connect(url)
        .await
        .unwrap()
}

/// The server's clock (ns), read after the caller returned.
fn server_now(admin: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(admin).unwrap();
    s * 1_000_000_000 + us * 1_000
}

fn stored(admin: &mut redis::Connection, key: &str) -> Option<u64> {
    redis::cmd("GET").arg(key).query(admin).unwrap()
}

/// Whether `check` comes to hold (checked every 2 ms), within 60 s: a bound
/// only a hang exceeds, never load.
async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    check()
}

#[tokio::test]
async fn capacity_three_passes_three_at_once_and_the_fourth_waits_one_interval() {
    let server = common::RedisServer::start();
    let mut admin = server.admin();
    // 10/s: 100 ms per token, capacity 3.
    let p = limiter(&server.url(), 10, 3, true).await;
    let tau = 300 * MS;
    let max_wait = Duration::from_secs(1);
    let mut tats = Vec::new();
    for _ in 0..3 {
        let r = p.acquire("k", max_wait).await.unwrap();
        assert_eq!(r.wait(), Duration::ZERO, "a token was there");
        assert_eq!(r.source(), Source::Server);
        tats.push(r.tat_ns());
    }
    let t0 = Instant::now();
    let r = p.acquire("k", max_wait).await.unwrap();
    let waited = t0.elapsed();
    let now = r.server_now_ns().unwrap();
    // Each debit adds exactly one interval to the key's tat.
    assert_eq!(tats[1] - tats[0], 100 * MS);
    assert_eq!(tats[2] - tats[1], 100 * MS);
    assert_eq!(r.tat_ns() - tats[2], 100 * MS);
    // The wait is exactly the time until the debit fits the bucket: one
    // interval after the first debit's decision (its tat - interval).
    let slot = r.tat_ns() - tau;
    assert_eq!(slot, tats[0]);
    assert_eq!(r.wait(), Duration::from_nanos(slot - now));
    assert!(waited >= r.wait(), "slept {waited:?} < {:?}", r.wait());
    assert!(
        server_now(&mut admin) >= slot,
        "went through before its slot"
    );
    assert_eq!(r.remaining(), Some(0));
    println!(
        "4th: wait {:?} by the server's clock, slept {waited:?}",
        r.wait()
    );
}

#[tokio::test]
async fn concurrent_waiters_go_through_one_per_interval_in_slot_order_none_early() {
    let server = common::RedisServer::start();
    // 10/s: 100 ms per token, capacity 1: one turn per interval.
    let p = limiter(&server.url(), 10, 1, true).await;
    let interval = 100 * MS;
    let key = p.redis_key("fifo");
    let order = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (p, order) = (p.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let r = p.acquire("fifo", Duration::from_secs(1)).await.unwrap();
            let rank = order.fetch_add(1, Ordering::SeqCst);
            // The server's clock as soon as the turn came.
            let seen = p.peek("other").await.unwrap().server_now_ns().unwrap();
            (rank, r.tat_ns(), r.wait(), r.server_now_ns().unwrap(), seen)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out.sort_by_key(|o| o.1);
    let first = out[0].1;
    let mut worst_late = 0;
    for (i, &(_rank, tat, wait, decided, seen)) in out.iter().enumerate() {
        // Slots one interval apart, in the order of the debits.
        assert_eq!(tat, first + i as u64 * interval, "waiter {i}");
        let slot = tat - interval; // tat - tau
        assert_eq!(
            decided + wait.as_nanos() as u64,
            slot.max(decided),
            "waiter {i}"
        );
        assert!(
            seen >= slot,
            "waiter {i} went through {} ns early",
            slot - seen
        );
        worst_late = worst_late.max(seen - slot);
    }
    // Let through in the order of their slots (100 ms apart).
    let mut by_rank = out.clone();
    by_rank.sort_by_key(|o| o.0);
    let tats: Vec<u64> = by_rank.iter().map(|o| o.1).collect();
    let mut sorted = tats.clone();
    sorted.sort_unstable();
    assert_eq!(tats, sorted, "not let through in slot order");
    assert_eq!(
        stored(&mut server.admin(), &key),
        Some(first + 7 * interval)
    );
    println!(
        "8 waiters: slots {} ms apart, latest reading after a slot {:.2} ms",
        interval / MS,
        worst_late as f64 / 1e6
    );
}

#[tokio::test]
async fn a_turn_beyond_max_wait_or_capacity_is_refused_at_once_writing_nothing() {
    let server = common::RedisServer::start();
    let mut admin = server.admin();
    let p = limiter(&server.url(), 10, 1, false).await;
    let key = p.redis_key("k");
    let r = p.acquire("k", Duration::ZERO).await.unwrap();
    let before = stored(&mut admin, &key);
    assert_eq!(before, Some(r.tat_ns()));
    // The turn is ~100 ms away: 60 ms of wait is not enough. Refused at
    // once: on the script's one answer (one round trip), without a wait
    // and a second try.
    let trips = p.stats().round_trips;
    assert!(
        matches!(p.acquire("k", Duration::from_millis(60)).await, Err(Error::Denied(d)) if !d.is_permanent()),
        "a turn beyond max_wait was admitted"
    );
    assert_eq!(p.stats().round_trips, trips + 1, "not at once");
    let d = match p.acquire("k", Duration::from_millis(10)).await {
        Err(Error::Denied(d)) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(p.stats().round_trips, trips + 2, "not at once");
    assert_eq!(d.reason(), DenyReason::Exhausted);
    assert_eq!(d.source(), Source::Server);
    // The whole wait: until the bucket holds the token again.
    let now = d.server_now_ns().unwrap();
    assert_eq!(
        d.retry_after(),
        Duration::from_nanos(r.tat_ns() - now),
        "retry_after is the whole wait"
    );
    assert_eq!(stored(&mut admin, &key), before, "a refused turn wrote");
    // n above the capacity: permanent, no round trip, with or without quota.
    let trips = p.stats().round_trips;
    let d = match p.acquire_n("k", 2, Duration::from_secs(10)).await {
        Err(Error::Denied(d)) => d,
        other => panic!("{other:?}"),
    };
    assert!(d.is_permanent());
    assert_eq!(d.reason(), DenyReason::ExceedsCapacity);
    let q = Quota::new(Rate::per_second(10).unwrap(), 4).unwrap();
    let d = match p.acquire_n_with("k", 5, q, Duration::from_secs(10)).await {
        Err(Error::Denied(d)) => d,
        other => panic!("{other:?}"),
    };
    assert!(d.is_permanent());
    assert_eq!(p.stats().round_trips, trips);
    // A quota beyond what the script computes exactly: a typed error.
    let huge = Quota::new(Rate::new(1, Duration::from_secs(3600)).unwrap(), 400).unwrap();
    assert!(huge.horizon().as_nanos() > u128::from(MAX_TAU_NS));
    assert!(matches!(
        p.reserve_with("k", huge).await,
        Err(Error::InvalidQuota(ConfigError::TauTooLarge { .. }))
    ));
    assert!(matches!(
        p.acquire_n_with("k", 1, huge, Duration::ZERO).await,
        Err(Error::InvalidQuota(ConfigError::TauTooLarge { .. }))
    ));
    assert_eq!(p.stats().round_trips, trips);
}

/// Turns waited for and dropped before they come. The interval is a
/// minute, so a turn aborted once its debit is stored is dropped before it
/// comes unless the machine stalls for a minute (a hang); every "after" is
/// an event: the stored tat, or the count of the server's decisions (a
/// refund is one).
#[tokio::test]
async fn a_cancelled_turn_comes_back_unless_debited_since() {
    let server = common::RedisServer::start();
    let mut admin = server.admin();
    let p = RedisPace::builder(Rate::new(1, Duration::from_secs(60)).unwrap())
        .capacity(1)
        .timeout(Duration::from_secs(60))
        .deny_cache(false)
        .connect(&server.url())
        .await
        .unwrap();
    let interval = 60_000 * MS;
    let max_wait = Duration::from_secs(300);
    let key = p.redis_key("c");
    let decisions = |n: u64| {
        let p = p.clone();
        async move {
            assert!(
                eventually(|| p.stats().server_decisions == n).await,
                "{} server decisions, not {n}",
                p.stats().server_decisions
            );
        }
    };
    let first = p.acquire("c", Duration::ZERO).await.unwrap();
    let t = first.tat_ns();
    // Dropped before its turn, nothing debited since: the slot comes back.
    let gone = {
        let p = p.clone();
        tokio::spawn(async move { p.acquire("c", max_wait).await })
    };
    assert!(eventually(|| stored(&mut admin, &key) == Some(t + interval)).await);
    gone.abort();
    assert!(
        gone.await.unwrap_err().is_cancelled(),
        "the turn came a minute early"
    );
    // The refund runs in the background.
    assert!(
        eventually(|| stored(&mut admin, &key) == Some(t)).await,
        "the slot did not come back"
    );
    decisions(3).await;
    // Dropped after a later caller debited: the slot is lost, the later
    // caller keeps its own.
    let a = {
        let p = p.clone();
        tokio::spawn(async move { p.acquire("c", max_wait).await })
    };
    assert!(eventually(|| stored(&mut admin, &key) == Some(t + interval)).await);
    let b = {
        let p = p.clone();
        tokio::spawn(async move { p.acquire("c", max_wait).await })
    };
    assert!(eventually(|| stored(&mut admin, &key) == Some(t + 2 * interval)).await);
    decisions(5).await;
    a.abort();
    assert!(a.await.unwrap_err().is_cancelled());
    // Its refund was decided (the sixth decision), and changed nothing.
    decisions(6).await;
    assert_eq!(
        stored(&mut admin, &key),
        Some(t + 2 * interval),
        "a superseded turn was refunded"
    );
    // The later caller's turn, dropped in its turn with nothing debited
    // since, comes back to the tat before it.
    b.abort();
    assert!(b.await.unwrap_err().is_cancelled());
    decisions(7).await;
    assert_eq!(
        stored(&mut admin, &key),
        Some(t + interval),
        "the last turn's slot did not come back"
    );
}

#[tokio::test]
async fn quotas_per_call_decide_with_their_own_capacity_and_interval() {
    let server = common::RedisServer::start();
    // The configuration: 10/s, capacity 1; the paid quota: 10/s, capacity 4.
    let p = limiter(&server.url(), 10, 1, true).await;
    let paid = Quota::new(Rate::per_second(10).unwrap(), 4).unwrap();
    let r = p.reserve("k").await.unwrap();
    let d = match p.reserve("k").await {
        Err(Error::Denied(d)) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.source(), Source::Server);
    // Cached under the configuration's quota...
    assert!(matches!(p.reserve("k").await, Err(Error::Denied(d)) if d.source() == Source::Cache));
    // ... yet a call with the larger quota is not denied by the cache: the
    // key's debt (one token) leaves it three of four.
    let before = p.stats().cache_denials;
    let q1 = match p.reserve_n_with("k", 3, paid).await {
        Ok(r) => r,
        other => panic!("a denial cached under another quota answered: {other:?}"),
    };
    assert_eq!(q1.source(), Source::Server);
    assert_eq!(q1.tat_ns(), r.tat_ns() + 300 * MS);
    assert_eq!(q1.remaining(), Some(0));
    assert_eq!(p.stats().cache_denials, before);
    // Now four tokens of debt: denied under the paid quota too, and the
    // cache answers the next paid call for one token.
    let d = match p.reserve_with("k", paid).await {
        Err(Error::Denied(d)) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.source(), Source::Server);
    assert_eq!(d.remaining(), Some(0));
    let d = match p.reserve_with("k", paid).await {
        Err(Error::Denied(d)) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.source(), Source::Cache);
    // A turn that fits under the paid quota within its wait is not denied by
    // the cache, and its wait is the paid quota's.
    let t = p
        .acquire_n_with("k", 1, paid, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(t.tat_ns(), q1.tat_ns() + 100 * MS);
    assert_eq!(
        t.wait(),
        Duration::from_nanos(t.tat_ns() - 400 * MS - t.server_now_ns().unwrap())
    );
    // peek_with reads the same key under either quota.
    let peek = p.peek_with("k", paid).await.unwrap();
    let debt = peek.reset_after().unwrap().as_nanos() as u64;
    assert_eq!(
        peek.remaining(),
        (400 * MS).saturating_sub(debt) / (100 * MS)
    );
    assert_eq!(p.peek("k").await.unwrap().remaining(), 0);
}

#[tokio::test]
async fn the_local_fallback_decides_with_the_calls_quota() {
    // No server on this port: LocalFallback starts on the local limiter.
    let port = common::free_port();
    let p = RedisPace::builder(Rate::per_second(10).unwrap())
        .capacity(2)
        .timeout(Duration::from_millis(100))
        .on_unavailable(OnUnavailable::LocalFallback { replicas: 2 })
        .connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap();
    // The call's quota, 100/s with capacity 10, is 50/s with capacity 5
    // locally (over 2 replicas); the configuration's is capacity 1.
    let paid = Quota::new(Rate::per_second(100).unwrap(), 10).unwrap();
    for i in 0..5 {
        let r = p.reserve_with("k", paid).await.unwrap();
        assert_eq!(r.source(), Source::Local, "call {i}");
    }
    let d = match p.reserve_with("k", paid).await {
        Err(Error::Denied(d)) => d,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.source(), Source::Local);
    assert!(d.retry_after() <= Duration::from_millis(20));
    assert!(matches!(p.reserve("other").await, Ok(r) if r.source() == Source::Local));
    assert!(
        matches!(p.reserve("other").await, Err(Error::Denied(d)) if d.source() == Source::Local)
    );
    // A turn waits on the local fallback: 20 ms at 50/s.
    let t0 = Instant::now();
    let r = p
        .acquire_n_with("k", 1, paid, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(r.source(), Source::Local);
    assert!(t0.elapsed() >= Duration::from_millis(1));
    assert_eq!(
        p.peek_with("k", paid).await.unwrap().source(),
        Source::Local
    );
}
