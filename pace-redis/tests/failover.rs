//! The server away at start (LocalFallback starts and connects in the
//! background), a failover that leaves the connection on a replica
//! (`READONLY`) or on a replica cut from its primary (`MASTERDOWN`), and a
//! connection manager or client passed in.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, Proxy, RedisServer};
use pace::Rate;
use pace_redis::{BackendError, Error, OnUnavailable, RedisPace, Source};
use redis::ErrorKind;

/// One token per hour: nothing refills while a test runs, so every count
/// below is exact.
const HOUR: Duration = Duration::from_secs(3600);
const INTERVAL_NS: u64 = 3_600_000_000_000;
/// A replica syncs at once (the default waits 5 s for more replicas).
const NO_SYNC_DELAY: &[&str] = &["--repl-diskless-sync-delay", "0"];

fn builder() -> pace_redis::Builder {
    RedisPace::builder(Rate::new(1, HOUR).unwrap())
        .capacity(30)
        .timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(50))
        .deny_cache(false)
}

/// Reserves `key` every 10 ms until `accept` holds, at most 10 s; returns
/// the accepted answer and every answer before it.
async fn until<F>(
    p: &RedisPace,
    key: &str,
    accept: F,
) -> (
    Result<pace_redis::Reservation, Error>,
    Vec<Result<pace_redis::Reservation, Error>>,
)
where
    F: Fn(&Result<pace_redis::Reservation, Error>) -> bool,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut before = Vec::new();
    loop {
        let r = p.reserve(key).await;
        if accept(&r) {
            return (r, before);
        }
        assert!(
            Instant::now() < deadline,
            "no accepted answer within 10 s; last: {r:?}"
        );
        before.push(r);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A primary A, its standby B (replicating, counted by A's `WAIT`), and a
/// forwarder standing for the service's address, at A.
async fn primary_standby_proxy() -> (RedisServer, RedisServer, Proxy) {
    let a = RedisServer::start_args(NO_SYNC_DELAY);
    let b = RedisServer::start_args(NO_SYNC_DELAY);
    b.replicate(&a);
    let proxy = Proxy::start(a.port).await;
    (a, b, proxy)
}

/// An admission the one required standby did not acknowledge (or, within
/// the backoff after such an answer, not sent).
fn not_replicated(r: Result<(), Error>) {
    match r {
        Err(Error::Unavailable(BackendError::NotReplicated {
            acked: 0,
            wanted: 1,
        })) => {}
        other => panic!("{other:?}"),
    }
}

fn is_server_admit(r: &Result<pace_redis::Reservation, Error>) -> bool {
    matches!(r, Ok(r) if r.source() == Source::Server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fallback_starts_while_redis_is_down_then_moves_to_redis() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let p = builder()
        .on_unavailable(OnUnavailable::LocalFallback { replicas: 3 })
        .connect(&url)
        .await
        .expect("LocalFallback starts without the server");
    // The local bucket: capacity 30 / 3 = 10, one token per 3 hours.
    for i in 0..10 {
        let r = p.reserve("k").await.unwrap_or_else(|e| panic!("{i}: {e}"));
        assert_eq!(r.source(), Source::Local);
        assert_eq!(r.remaining(), Some(9 - i));
    }
    match p.reserve("k").await {
        Err(Error::Denied(d)) => {
            assert_eq!(d.source(), Source::Local);
            assert_eq!(d.remaining(), Some(0));
        }
        other => panic!("{other:?}"),
    }
    let peek = p.peek("k").await.unwrap();
    assert_eq!((peek.source(), peek.remaining()), (Source::Local, 0));
    assert_eq!(p.stats().local_decisions, 11);
    assert_eq!(p.stats().round_trips, 0);

    let server = RedisServer::start_on(port);
    assert_eq!(server.port, port, "the port was taken meanwhile");
    let (first, _) = until(&p, "k", is_server_admit).await;
    let first = first.unwrap();
    // The server's bucket is fresh: the local decisions never reached it.
    assert_eq!(first.prev_ns(), 0);
    let now = first.server_now_ns().unwrap();
    assert_eq!(first.tat_ns(), now + INTERVAL_NS);
    assert_eq!(first.remaining(), Some(29));
    for i in 2..=30u64 {
        let r = p.reserve("k").await.unwrap();
        assert_eq!(r.source(), Source::Server);
        assert_eq!(r.tat_ns(), now + i * INTERVAL_NS);
        assert_eq!(r.remaining(), Some(30 - i));
        let at = r.server_now_ns().unwrap();
        assert_eq!(
            r.reset_after(),
            Some(Duration::from_nanos(now + i * INTERVAL_NS - at))
        );
    }
    match p.reserve("k").await {
        Err(Error::Denied(d)) => {
            assert_eq!(d.source(), Source::Server);
            assert_eq!(d.remaining(), Some(0));
            let at = d.server_now_ns().unwrap();
            assert_eq!(
                d.reset_after(),
                Some(Duration::from_nanos(now + 30 * INTERVAL_NS - at))
            );
        }
        other => panic!("{other:?}"),
    }
    let stored: u64 = redis::cmd("GET")
        .arg("pace:k")
        .query(&mut server.admin())
        .unwrap();
    assert_eq!(stored, now + 30 * INTERVAL_NS);
    let peek = p.peek("k").await.unwrap();
    assert_eq!((peek.source(), peek.remaining()), (Source::Server, 0));
    assert_eq!(
        peek.reset_after(),
        Some(Duration::from_nanos(stored - peek.server_now_ns().unwrap()))
    );
    assert_eq!(p.stats().connects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_at_start_still_fails_without_a_server() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    assert!(builder().connect(&url).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_after_a_failover_reconnects_to_the_new_primary() {
    let (a, b, proxy) = primary_standby_proxy().await;
    let p = builder().connect(&proxy.url()).await.unwrap();
    let r1 = p.reserve("k").await.unwrap();
    assert_eq!((r1.source(), r1.prev_ns()), (Source::Server, 0));
    // Wait until the replica holds the debit, then fail over: b becomes the
    // primary, a its replica; the address still leads to a.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let on_b: Option<u64> = redis::cmd("GET")
            .arg("pace:k")
            .query(&mut b.admin())
            .unwrap();
        if on_b == Some(r1.tat_ns()) {
            break;
        }
        assert!(Instant::now() < deadline, "never replicated");
        std::thread::sleep(Duration::from_millis(10));
    }
    b.promote();
    a.replicate(&b);
    match p.reserve("k").await {
        Err(Error::Unavailable(BackendError::Redis(e))) => {
            assert_eq!(e.kind(), ErrorKind::ReadOnly, "{e}")
        }
        other => panic!("expected READONLY from the demoted primary, got {other:?}"),
    }
    // The circuit is open: the policy answers at once, no READONLY again.
    match p.reserve("k").await {
        Err(Error::Unavailable(BackendError::CircuitOpen)) => {}
        other => panic!("expected an open circuit, got {other:?}"),
    }
    // While the address still leads to the replica: one READONLY (and one
    // new connection) per backoff at most, never a burst of reconnects.
    let t0 = Instant::now();
    let connects_before = p.stats().connects;
    let mut readonly = 0u64;
    while t0.elapsed() < Duration::from_millis(300) {
        match p.reserve("k").await {
            Err(Error::Unavailable(BackendError::Redis(e))) => {
                assert_eq!(e.kind(), ErrorKind::ReadOnly, "{e}");
                readonly += 1;
            }
            Err(Error::Unavailable(BackendError::CircuitOpen)) => {}
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Each READONLY opens the circuit for 50 ms: over the loop's span (300
    // ms, more on a loaded machine: the bound grows with the span measured,
    // so load cannot break it), at most one per 50 ms and one more (the
    // limiter's backoff, not the call rate of 200/s, paces them).
    let span = t0.elapsed();
    let most = span.as_millis() as u64 / 50 + 1;
    assert!(
        (1..=most).contains(&readonly),
        "{readonly} READONLY answers in {span:?}"
    );
    let connects = p.stats().connects - connects_before;
    assert!(connects <= readonly + 1, "{connects} connections made");
    // The address moves to the new primary; the limiter follows.
    proxy.switch(b.port);
    let (r2, before) = until(&p, "k", is_server_admit).await;
    for r in &before {
        assert!(
            matches!(
                r,
                Err(Error::Unavailable(
                    BackendError::CircuitOpen | BackendError::Redis(_)
                ))
            ),
            "{r:?}"
        );
    }
    let r2 = r2.unwrap();
    // The bucket followed the failover (one debit replicated, one added).
    assert_eq!(r2.prev_ns(), r1.tat_ns());
    assert_eq!(r2.tat_ns(), r1.tat_ns() + INTERVAL_NS);
    let on_b: u64 = redis::cmd("GET")
        .arg("pace:k")
        .query(&mut b.admin())
        .unwrap();
    assert_eq!(on_b, r2.tat_ns());
    assert!(p.stats().connects >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masterdown_reconnects_and_falls_back_meanwhile() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let proxy = Proxy::start(a.port).await;
    let p = builder()
        .on_unavailable(OnUnavailable::LocalFallback { replicas: 1 })
        .connect(&proxy.url())
        .await
        .unwrap();
    assert!(is_server_admit(&p.reserve("k").await));
    // a becomes a replica of a dead address and refuses to serve stale data.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-serve-stale-data")
        .arg("no")
        .query(&mut a.admin())
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(free_port())
        .query(&mut a.admin())
        .unwrap();
    // MASTERDOWN: the local fallback decides.
    let r = p.reserve("k").await.unwrap();
    assert_eq!(r.source(), Source::Local);
    proxy.switch(b.port);
    let (r2, before) = until(&p, "k", is_server_admit).await;
    for r in &before {
        assert!(matches!(r, Ok(r) if r.source() == Source::Local), "{r:?}");
    }
    // b never saw the key: a fresh bucket there.
    assert_eq!(r2.unwrap().prev_ns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_manager_or_client_passed_in() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let manager = redis::aio::ConnectionManager::new(client.clone())
        .await
        .unwrap();
    let p = builder().connect_with(manager.clone()).await.unwrap();
    let q = builder().connect_client(client).await.unwrap();
    let r = p.reserve("k").await.unwrap();
    let now = r.server_now_ns().unwrap();
    assert_eq!(r.tat_ns(), now + INTERVAL_NS);
    // Both limiters share the key's bucket on the server.
    let s = q.reserve("k").await.unwrap();
    assert_eq!(s.prev_ns(), r.tat_ns());
    assert_eq!(s.tat_ns(), r.tat_ns() + INTERVAL_NS);
    // The manager still serves the application.
    let mut m = manager;
    let v: u64 = redis::cmd("GET")
        .arg("pace:k")
        .query_async(&mut m)
        .await
        .unwrap();
    assert_eq!(v, s.tat_ns());
}

/// `wait_replicas(1, ..)`: an admission is used only once a standby holds
/// it. The standby B is cut from the primary A (`REPLICAOF NO ONE`): A still
/// admits every reserve, call with a quota of its own, hold, turn and
/// `reserve_many` that follows, but none is used (each answers
/// `NotReplicated`). A dies and the address moves to B, which lacks A's
/// writes after the cut: the admissions used before and after the move are
/// exactly the capacity. The known-wrong variant `redis_wait_ignored` uses
/// A's admissions after the cut: 16 of a capacity of 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_no_admission_the_standby_acknowledged() {
    use pace::Quota;
    let (mut a, b, proxy) = primary_standby_proxy().await;
    let p = builder()
        .capacity(10)
        .wait_replicas(1, Duration::from_millis(200))
        .connect(&proxy.url())
        .await
        .unwrap();
    let quota = Quota::new(Rate::new(1, HOUR).unwrap(), 10).unwrap();
    // Before the cut: 4 admissions, each acknowledged and used.
    let mut used = 0u64;
    let _ = p.reserve("k").await.unwrap();
    let _ = p.reserve_with("k", quota).await.unwrap();
    p.hold("k").await.unwrap().keep().await.unwrap();
    let _ = p.acquire("k", Duration::ZERO).await.unwrap();
    used += 4;
    assert_eq!(p.stats().unreplicated, 0);

    b.promote();
    // Each answer after the cut: used (counted) or not replicated.
    let mut unused = 0u64;
    let mut count = |r: Result<(), Error>| match r {
        Ok(()) => used += 1,
        Err(Error::Unavailable(BackendError::NotReplicated {
            acked: 0,
            wanted: 1,
        })) => unused += 1,
        Err(e) => panic!("{e}"),
    };
    count(p.reserve("k").await.map(drop));
    count(p.reserve_with("k", quota).await.map(drop));
    count(match p.hold("k").await {
        Ok(h) => h.keep().await.map(drop),
        Err(e) => Err(e),
    });
    count(p.acquire("k", Duration::ZERO).await.map(drop));
    for r in p.reserve_many(&[("k", 1), ("k", 1)]).await {
        count(r.map(drop));
    }
    // A admitted them all, and gets them back in the background: a call
    // on A is never used.
    let on_a = match p.reserve("k").await {
        Err(Error::Denied(_)) => 0,
        Err(Error::Unavailable(BackendError::NotReplicated { .. })) => 1,
        other => panic!("{other:?}"),
    };
    // A dies; the address moves to B (with a standby C of its own): B's
    // bucket has the 4 used admissions.
    let c = RedisServer::start_args(NO_SYNC_DELAY);
    c.replicate(&b);
    a.stop();
    proxy.switch(b.port);
    let (first, before) = until(&p, "k", |r| {
        is_server_admit(r) || matches!(r, Err(Error::Denied(_)))
    })
    .await;
    for r in &before {
        // The lost connection, then (at most) B's admissions made before
        // C caught up with it: unused, so they only lower the count.
        assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");
    }
    let early = p.stats().unreplicated.saturating_sub(unused + on_a);
    let mut more = u64::from(first.is_ok());
    loop {
        match p.reserve("k").await {
            Ok(r) => {
                assert_eq!(r.source(), Source::Server);
                more += 1;
            }
            Err(Error::Denied(_)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        used + more + early,
        10,
        "{used} admissions used before the failover, {more} after it, \
         {early} made on B before its standby held them"
    );
    assert_eq!(unused, 6, "every admission after the cut is unused");
    assert_eq!(early, 0, "C held B's admissions at once");
}

/// `wait_replicas` is checked: zero standbys, a zero timeout or one above
/// the limiter's, or leases asking for another setting.
#[tokio::test]
async fn wait_replicas_is_checked() {
    use pace_redis::{ConfigError, ConnectError, LeaseConfig};
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let refused = |r: Result<RedisPace, ConnectError>| match r {
        Err(ConnectError::Config(ConfigError::WaitReplicas)) => {}
        other => panic!("{:?}", other.map(|_| ())),
    };
    let ms = Duration::from_millis;
    refused(builder().wait_replicas(0, ms(10)).connect(&url).await);
    refused(builder().wait_replicas(1, ms(0)).connect(&url).await);
    refused(builder().wait_replicas(1, ms(501)).connect(&url).await);
    let leases = LeaseConfig {
        wait_replicas: 2,
        wait_timeout: ms(10),
        ..LeaseConfig::default()
    };
    refused(
        builder()
            .wait_replicas(1, ms(10))
            .leases(leases)
            .connect(&url)
            .await,
    );
}

/// An admission no standby acknowledged is not used, and its tokens go
/// back: a hold is released (exactly), a reserve and a turn are refunded
/// (nothing was debited since). Without it, a flood of wrong presentations
/// during a failover (every hold answered `NotReplicated`, the layer's
/// 503) would leave its holds to settle as kept at their expiry: the
/// victim's budget spent. The known-wrong variant `redis_unused_kept`
/// leaves them: the bucket never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_not_used_goes_back() {
    let server = RedisServer::start();
    // One limiter a call: a limiter answers its next decisions unsent for
    // a backoff after a WAIT found too few standbys (below).
    let limiter = || async {
        builder()
            .capacity(10)
            .hold_limit(HOUR)
            .wait_replicas(1, Duration::from_millis(20))
            .connect(&server.url())
            .await
            .unwrap()
    };
    let p = limiter().await;
    let whole = || async {
        // An event: the background refund's answer (a bound only a hang
        // exceeds).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = p.peek("k").await.unwrap().remaining();
            if left == 10 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{left} of 10 tokens: never given back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    not_replicated(p.hold_n("k", 3).await.map(drop));
    whole().await;
    let q = limiter().await;
    not_replicated(q.reserve_n("k", 4).await.map(drop));
    whole().await;
    let r = limiter().await;
    not_replicated(r.acquire_n("k", 2, Duration::ZERO).await.map(drop));
    whole().await;
    for l in [&p, &q, &r] {
        assert_eq!(l.stats().unreplicated, 1);
    }
}

/// For `backoff` after a `WAIT` counted too few standbys, a decision is
/// answered `NotReplicated` without a round trip: it could not be used,
/// each would hold the shared connection in `WAIT`, and a caller that gives
/// up first (its timeout) would leave its debit (a hold, until its limit).
/// A lease's grant is still sent. The known-wrong variant
/// `redis_unreplicated_sent` sends each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_wait_out_a_backoff_once_the_standbys_miss_a_wait() {
    let server = RedisServer::start();
    let p = builder()
        .capacity(10)
        // Longer than the test: the decisions below all fall within it.
        .backoff(HOUR)
        .wait_replicas(1, Duration::from_millis(20))
        .connect(&server.url())
        .await
        .unwrap();
    not_replicated(p.reserve("k").await.map(drop));
    not_replicated(p.reserve("k").await.map(drop));
    not_replicated(p.hold("k").await.map(drop));
    not_replicated(p.acquire("k", Duration::ZERO).await.map(drop));
    for r in p.reserve_many(&[("k", 1), ("j", 1)]).await {
        not_replicated(r.map(drop));
    }
    // One admission by the server, not used; the others never sent (one
    // sent would be admitted, the key has the tokens, and count one more).
    assert_eq!(
        p.stats().unreplicated,
        1,
        "decisions sent within the backoff"
    );
}

/// A hold's release its standby missed is sent again until a standby
/// acknowledges it: the standby B is cut from the primary A after a hold
/// of 4 tokens reached it, the release reaches A alone, then A dies and
/// the address moves to B (with a standby C of its own), which still holds
/// the 4 tokens: the release sent again frees them on B (the bucket whole
/// again, an event waited for with a bound only a hang exceeds). Without
/// it (the known-wrong variant `redis_release_once`) B keeps the hold until
/// its limit (an hour), then settles it as kept: a flood's holds released
/// across a failover would spend its victim's tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_standby_missed_is_sent_again_after_a_failover() {
    let (mut a, b, proxy) = primary_standby_proxy().await;
    let p = builder()
        .capacity(10)
        .hold_limit(HOUR)
        .wait_replicas(1, Duration::from_millis(100))
        .connect(&proxy.url())
        .await
        .unwrap();
    let hold = p.hold_n("k", 4).await.unwrap();
    b.promote();
    let c = RedisServer::start_args(NO_SYNC_DELAY);
    c.replicate(&b);
    // A frees the tokens; its standby is gone.
    assert_eq!(hold.refund().await.unwrap(), pace_redis::Refunded::Restored);
    a.stop();
    proxy.switch(b.port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match p.peek("k").await {
            Ok(peek) if peek.remaining() == 10 => break,
            Ok(_) | Err(Error::Unavailable(_)) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the release never reached B: {:?}",
            p.peek("k").await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
