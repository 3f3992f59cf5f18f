//! Redis down, slow, restarted, or without the script: typed errors, the
//! chosen policy, reconnection, no panic, no call longer than the timeout.
//!
//! No assertion here measures speed: a loaded machine can stretch any call.
//! The timeout is shown by its own event (a `Timeout` error from a server
//! that answers nothing for far longer than the test waits), and every wait
//! for "soon" has a bound that only a hang exceeds (`HANG`).

mod common;

use std::time::{Duration, Instant};

use pace::Rate;
use pace_redis::{BackendError, ConnectError, Error, OnUnavailable, RedisPace, Source};

const TIMEOUT: Duration = Duration::from_millis(200);
/// A bound only a hang exceeds, never load: a call or a reconnection that
/// takes this long waits for something that does not come.
const HANG: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Server,
    Local,
    DeniedServer,
    DeniedLocal,
    Unavailable,
}

struct Call {
    at: Duration,
    took: Duration,
    kind: Kind,
}

async fn limiter(url: &str, policy: OnUnavailable) -> RedisPace {
    RedisPace::builder(Rate::per_second(300).unwrap())
        .capacity(30)
        .timeout(TIMEOUT)
        .backoff(Duration::from_millis(50))
        .deny_cache(false)
        .on_unavailable(policy)
        .connect(url)
        .await
        .unwrap()
}

/// Three clients hammer one key for `run` while `fault` runs beside them.
async fn hammer<F: std::future::Future<Output = ()>>(
    clients: &[RedisPace],
    run: Duration,
    fault: F,
) -> Vec<Vec<Call>> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            while start.elapsed() < run {
                let t0 = Instant::now();
                let r = tokio::time::timeout(HANG, client.reserve("k"))
                    .await
                    .expect("a call hung");
                let kind = match r {
                    Ok(r) if r.source() == Source::Server => Kind::Server,
                    Ok(r) => {
                        assert_eq!(r.source(), Source::Local);
                        Kind::Local
                    }
                    Err(Error::Denied(d)) if d.source() == Source::Server => Kind::DeniedServer,
                    Err(Error::Denied(d)) => {
                        assert_eq!(d.source(), Source::Local);
                        Kind::DeniedLocal
                    }
                    Err(Error::Unavailable(_)) => Kind::Unavailable,
                    Err(e) => panic!("unexpected {e}"),
                };
                calls.push(Call {
                    at: t0 - start,
                    took: t0.elapsed(),
                    kind,
                });
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            calls
        }));
    }
    fault.await;
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a client task panicked"));
    }
    out
}

/// Calls `client` until the server decides (admits or denies), each call
/// and the whole within `HANG`; every answer before it is a typed
/// `Unavailable` (fail closed) or a local decision (fallback).
async fn until_server(client: &RedisPace) {
    let deadline = Instant::now() + HANG;
    loop {
        let r = tokio::time::timeout(HANG, client.reserve("k"))
            .await
            .expect("a call hung");
        match r {
            Ok(r) if r.source() == Source::Server => return,
            Err(Error::Denied(d)) if d.source() == Source::Server => return,
            Ok(_) | Err(Error::Denied(_)) | Err(Error::Unavailable(_)) => {}
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(Instant::now() < deadline, "never back on the server");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long after `t_up` the first server decision came.
fn reconnected_after(calls: &[Call], t_up: Duration) -> Option<Duration> {
    calls
        .iter()
        .find(|c| c.at >= t_up && matches!(c.kind, Kind::Server | Kind::DeniedServer))
        .map(|c| c.at + c.took - t_up)
}

fn count(calls: &[Call], kind: Kind, from: Duration, to: Duration) -> usize {
    calls
        .iter()
        .filter(|c| c.kind == kind && c.at >= from && c.at < to)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_fail_closed_refuses_while_down_then_reconnects() {
    let mut server = common::RedisServer::start();
    let url = server.url();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(limiter(&url, OnUnavailable::FailClosed).await);
    }
    // When the stop began, when the server was dead (`stop` waits for the
    // killed process), when the restart began and when it was serving: a
    // loaded machine can spend hundreds of ms between these.
    let down = std::sync::Mutex::new([Duration::ZERO; 4]);
    let start = Instant::now();
    let calls = hammer(&clients, Duration::from_millis(3_000), async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let t_down = start.elapsed();
        tokio::task::block_in_place(|| server.stop());
        let t_dead = start.elapsed();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let t_restart = start.elapsed();
        tokio::task::block_in_place(|| server.restart());
        *down.lock().unwrap() = [t_down, t_dead, t_restart, start.elapsed()];
    })
    .await;
    let [t_down, t_dead, t_restart, t_up] = *down.lock().unwrap();
    for (i, c) in calls.iter().enumerate() {
        // Fail closed: nothing local, ever.
        assert_eq!(count(c, Kind::Local, Duration::ZERO, Duration::MAX), 0);
        assert_eq!(
            count(c, Kind::DeniedLocal, Duration::ZERO, Duration::MAX),
            0
        );
        // While down (from 250 ms after the process died, when the kill is
        // surely seen, to the start of the restart): only typed Unavailable
        // errors.
        let settled = t_dead + Duration::from_millis(250);
        assert_eq!(count(c, Kind::Server, settled, t_restart), 0, "client {i}");
        assert!(
            count(c, Kind::Unavailable, settled, t_restart) > 0,
            "client {i}"
        );
    }
    // Back up: each client reconnects (within `HANG`, a bound only a hang
    // exceeds) and is admitted or denied by the server again.
    for c in &clients {
        until_server(c).await;
    }
    // Both servers started without the script: it was loaded on each.
    let loads: u64 = clients.iter().map(|c| c.stats().script_loads).sum();
    assert!(loads >= 2, "{loads} script loads");
    for c in &clients {
        assert!(c.stats().unavailable > 0, "{:?}", c.stats());
    }
    println!(
        "fail closed: stopped {:?}, dead {:?}, restarted {:?}..{:?}; reconnected after {:?}; per client (admitted, unavailable): {:?}",
        t_down,
        t_dead,
        t_restart,
        t_up,
        calls.iter().map(|c| reconnected_after(c, t_up)).collect::<Vec<_>>(),
        calls
            .iter()
            .map(|c| (
                count(c, Kind::Server, Duration::ZERO, Duration::MAX),
                count(c, Kind::Unavailable, Duration::ZERO, Duration::MAX)
            ))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_local_fallback_admits_at_rate_over_replicas() {
    let mut server = common::RedisServer::start();
    let url = server.url();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(limiter(&url, OnUnavailable::LocalFallback { replicas: 3 }).await);
    }
    let down = std::sync::Mutex::new((Duration::ZERO, Duration::ZERO));
    let start = Instant::now();
    let calls = hammer(&clients, Duration::from_millis(3_000), async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let t_down = start.elapsed();
        tokio::task::block_in_place(|| server.stop());
        tokio::time::sleep(Duration::from_millis(900)).await;
        tokio::task::block_in_place(|| server.restart());
        *down.lock().unwrap() = (t_down, start.elapsed());
    })
    .await;
    let (t_down, t_up) = *down.lock().unwrap();
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(
            count(c, Kind::Unavailable, Duration::ZERO, Duration::MAX),
            0
        );
        let local: Vec<&Call> = c
            .iter()
            .filter(|x| x.kind == Kind::Local || x.kind == Kind::DeniedLocal)
            .collect();
        assert!(!local.is_empty(), "client {i} never fell back");
        // Local decisions only while the server was away: none ends before
        // the stop began, and none starts after the client's first server
        // decision once the server was back (it has reconnected).
        let back = c
            .iter()
            .find(|x| x.at >= t_up && matches!(x.kind, Kind::Server | Kind::DeniedServer))
            .map_or(Duration::MAX, |x| x.at);
        for x in &local {
            assert!(
                x.at + x.took >= t_down && x.at < back,
                "client {i}: a local decision at {:?} (took {:?}); down {t_down:?}..{t_up:?}, \
                 back on the server at {back:?}",
                x.at,
                x.took
            );
        }
        // The local bucket: 300/s over 3 replicas = 100/s, capacity 10.
        let admitted = local.iter().filter(|x| x.kind == Kind::Local).count() as u64;
        let span = local.last().unwrap().at + local.last().unwrap().took - local[0].at;
        let bound = 10 + span.as_millis() as u64 / 10 + 1;
        assert!(
            admitted <= bound,
            "client {i}: {admitted} local admissions in {span:?}; local bound {bound}"
        );
    }
    // Each client goes back to the server (within `HANG`, a bound only a
    // hang exceeds).
    for c in &clients {
        until_server(c).await;
    }
    println!(
        "local fallback: down {:?}..{:?}; reconnected after {:?}; per client (local admitted, local denied): {:?}",
        t_down,
        t_up,
        calls.iter().map(|c| reconnected_after(c, t_up)).collect::<Vec<_>>(),
        calls
            .iter()
            .map(|c| (
                count(c, Kind::Local, Duration::ZERO, Duration::MAX),
                count(c, Kind::DeniedLocal, Duration::ZERO, Duration::MAX)
            ))
            .collect::<Vec<_>>()
    );
}

/// A server that answers nothing (SIGSTOP: the kernel still accepts its
/// connections) until the test resumes it at its end: each call ends with
/// its own timeout's typed error, never by the server's answer. A call that
/// waited for the server would wait until it is resumed, which comes after
/// the call: it would outlast `HANG` and fail the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_gives_timeouts_not_hangs() {
    let server = common::RedisServer::start();
    let client = limiter(&server.url(), OnUnavailable::FailClosed).await;
    let _ = client.reserve("k").await.unwrap();
    server.signal("STOP");
    // Resumed on every exit (an assertion's too), so that the test's
    // server never outlives it stopped.
    struct Resume<'a>(&'a common::RedisServer);
    impl Drop for Resume<'_> {
        fn drop(&mut self) {
            self.0.signal("CONT");
        }
    }
    let resume = Resume(&server);
    let t0 = Instant::now();
    let r = tokio::time::timeout(HANG, client.reserve("k"))
        .await
        .expect("a call waited for a stopped server");
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::Unavailable(BackendError::Timeout(t))) if t == TIMEOUT),
        "{r:?}"
    );
    // Never before the timeout (a lower bound: load only adds to it).
    assert!(took >= TIMEOUT, "{took:?}");
    // Within the backoff: no round trip, an immediate typed error.
    let trips = client.stats().round_trips;
    let r = client.reserve("k").await;
    assert!(
        matches!(r, Err(Error::Unavailable(BackendError::CircuitOpen))),
        "{r:?}"
    );
    assert_eq!(client.stats().round_trips, trips, "a round trip while open");
    // Connecting to the stopped server is a typed error too, by the
    // timeout, not a wait for the server.
    let made = tokio::time::timeout(
        HANG,
        RedisPace::builder(Rate::per_second(10).unwrap())
            .timeout(TIMEOUT)
            .connect(&server.url()),
    )
    .await
    .expect("a connect waited for a stopped server");
    assert!(
        matches!(made, Err(ConnectError::Redis(_))),
        "{:?}",
        made.err()
    );
    drop(resume);
    // Resumed: decisions again (within `HANG`).
    until_server(&client).await;
}

#[tokio::test]
async fn noscript_reloads_for_single_calls_and_pipelines() {
    let server = common::RedisServer::start();
    let client = limiter(&server.url(), OnUnavailable::FailClosed).await;
    let mut admin = server.admin();
    let _ = client.reserve("a").await.unwrap();
    assert_eq!(client.stats().script_loads, 1); // a fresh server has no script
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
    let _ = client.reserve("a").await.unwrap();
    assert_eq!(client.stats().script_loads, 2);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
    let reqs: Vec<(&str, u64)> = vec![("b", 1), ("c", 2), ("b", 1), ("d", 31), ("e", 0)];
    let out = client.reserve_many(&reqs).await;
    assert_eq!(client.stats().script_loads, 3);
    assert!(out[0].is_ok() && out[1].is_ok() && out[2].is_ok() && out[4].is_ok());
    assert!(matches!(&out[3], Err(Error::Denied(d)) if d.is_permanent()));
    // Each reservation ran exactly once: the second "b" stacks on the first.
    let (b1, b2) = (out[0].as_ref().unwrap(), out[2].as_ref().unwrap());
    assert_eq!(b2.prev_ns(), b1.tat_ns());
    assert_eq!(b2.tat_ns(), b1.tat_ns() + client.interval_ns());
    let c = out[1].as_ref().unwrap();
    assert_eq!(c.prev_ns(), 0);
    assert_eq!(
        c.tat_ns() - c.server_now_ns().unwrap(),
        2 * client.interval_ns()
    );
    // Per call: EVALSHA (NOSCRIPT), SCRIPT LOAD, EVALSHA again.
    assert_eq!(client.stats().round_trips, 3 + 3 + 3);
}

#[tokio::test]
async fn connecting_to_a_dead_port_is_a_typed_error() {
    let mut server = common::RedisServer::start();
    let url = server.url();
    server.stop();
    // Within `HANG`, a bound only a hang exceeds (a refused connection
    // ends at once; a server that answers nothing ends by the timeout:
    // `a_stopped_server_gives_timeouts_not_hangs`).
    let r = tokio::time::timeout(
        HANG,
        RedisPace::builder(Rate::per_second(10).unwrap())
            .timeout(TIMEOUT)
            .connect(&url),
    )
    .await
    .expect("connecting to a dead port hung");
    assert!(matches!(r, Err(ConnectError::Redis(_))), "{:?}", r.err());
}

#[tokio::test]
async fn fallback_reservations_refund_on_the_local_limiter() {
    let mut server = common::RedisServer::start();
    // 3 tokens over 3 replicas: the local bucket holds 1.
    let p = RedisPace::builder(Rate::per_second(3).unwrap())
        .capacity(3)
        .timeout(TIMEOUT)
        .on_unavailable(OnUnavailable::LocalFallback { replicas: 3 })
        .connect(&server.url())
        .await
        .unwrap();
    server.stop();
    let a = p.reserve("k").await.unwrap();
    assert_eq!(a.source(), Source::Local);
    assert!(matches!(p.reserve("k").await, Err(Error::Denied(d)) if d.source() == Source::Local));
    // Refunded by the local fallback, by the core's rule: the lone debit
    // comes back whole.
    assert_eq!(p.refund(a).await.unwrap(), pace_redis::Refunded::Removed);
    assert_eq!(p.reserve("k").await.unwrap().source(), Source::Local);
    let s = p.stats();
    assert_eq!((s.local_decisions, s.server_decisions), (3, 0));
}

/// The harness itself: a port taken between `free_port` and the server's bind
/// (here by a plain listener that accepts and says nothing) is not mistaken
/// for the server; the server moves to another port and answers there.
#[test]
fn a_port_taken_before_the_server_binds_gets_another() {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let server = common::RedisServer::start_on(taken);
    assert_ne!(server.port, taken);
    let pong: String = redis::cmd("PING").query(&mut server.admin()).unwrap();
    assert_eq!(pong, "PONG");
}
