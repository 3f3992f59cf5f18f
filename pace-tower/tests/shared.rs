//! A local limit and a limit that answers asynchronously (as a shared one
//! does) in one `PaceLayer`, over real loopback HTTP: reserved in order,
//! all or nothing, refunds on the response, `RateLimit` items for both,
//! `503` when the shared limit gives no decision; with feature `redis`,
//! against a real `redis-server` on loopback.

mod support;

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use pace::{ManualClock, Pace, Rate};
use pace_tower::{
    from_fn, AsyncLimit, Limit, Limits, PaceLayer, PeerIp, Reason, Refusal, Rejection, Respond,
};
use support::{header, serve, Client};

type P<K> = Pace<K, RandomState, ManualClock>;

fn pace<K>(clock: &ManualClock, per_s: u64, capacity: u64) -> Arc<P<K>> {
    Arc::new(
        Pace::builder(Rate::per_second(per_s).unwrap())
            .capacity(capacity)
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

/// A limit that answers one poll late (as a round trip does), backed by a
/// local `Pace`; it logs what it is asked, and fails when told to.
struct Remote {
    pace: Arc<P<String>>,
    log: Mutex<Vec<String>>,
    down: std::sync::atomic::AtomicBool,
}

/// Pending on its first poll (waking itself), then its value.
struct Later<T> {
    value: Option<T>,
    yielded: bool,
}

impl<T: Unpin> Future for Later<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.value.take().expect("polled after completion"))
    }
}

#[derive(Debug)]
struct Down;

impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("remote down")
    }
}

impl std::error::Error for Down {}

impl AsyncLimit<String> for Remote {
    type Debit = pace::Debit;
    type Reserve = Later<Result<pace::Debit, Refusal>>;

    fn reserve(&self, key: &String, n: u64) -> Self::Reserve {
        self.log.lock().unwrap().push(format!("reserve {key} {n}"));
        let value = if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            Err(Refusal::Unavailable {
                error: Box::new(Down),
                retry_after: Some(Duration::from_millis(1500)),
            })
        } else {
            self.pace
                .reserve_n(key, n)
                .map(pace::Reservation::detach)
                .map_err(Refusal::from)
        };
        Later {
            value: Some(value),
            yielded: false,
        }
    }

    fn refund(&self, key: &String, debit: pace::Debit) {
        self.log.lock().unwrap().push(format!("refund {key}"));
        self.pace.refund(key, debit);
    }

    fn remaining(&self, key: &String, _: Option<&pace::Debit>) -> Option<u64> {
        Some(self.pace.peek(key))
    }

    fn capacity(&self) -> u64 {
        self.pace.capacity()
    }

    fn rate(&self) -> Rate {
        self.pace.rate()
    }
}

fn remote(clock: &ManualClock, capacity: u64) -> Arc<Remote> {
    Arc::new(Remote {
        pace: pace(clock, capacity, capacity),
        log: Mutex::new(Vec::new()),
        down: Default::default(),
    })
}

fn client_id() -> pace_tower::FromFn<impl Fn(&pace_tower::RequestHead<'_>) -> Option<String>> {
    from_fn(|h| Some(h.headers.get("x-client-id")?.to_str().ok()?.to_string()))
}

/// 200, or 401 when the request says `x-valid: no`.
async fn handler(req: Request) -> StatusCode {
    if req.headers().get("x-valid").is_some_and(|v| v == "no") {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    }
}

fn app<L: Limits, H: Respond<axum::body::Body>>(layer: PaceLayer<L, H>) -> Router {
    Router::new().route("/", get(handler)).layer(layer)
}

fn localhost() -> IpAddr {
    [127, 0, 0, 1].into()
}

#[tokio::test]
async fn a_local_and_an_async_limit_are_reserved_in_order_all_or_nothing() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    let local: Arc<P<IpAddr>> = pace(&clock, 100, 100);
    let shared = remote(&clock, 2);
    let layer = PaceLayer::builder()
        .limit(Limit::new("source", local.clone(), PeerIp::new()))
        .limit(
            Limit::new("client", shared.clone(), client_id())
                .refund_if(|r| r.status == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;

    let r = c.get("/", &[("x-client-id", "a")]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        header(&r, "ratelimit"),
        Some("\"source\";r=99;t=1, \"client\";r=1;t=1")
    );
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"source\";q=100;w=1, \"client\";q=2;w=1")
    );

    // Refunded on the response: the async limit gets its refund.
    let r = c.get("/", &[("x-client-id", "a"), ("x-valid", "no")]).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        header(&r, "ratelimit"),
        Some("\"source\";r=98;t=1, \"client\";r=1;t=1")
    );
    assert_eq!(
        *shared.log.lock().unwrap(),
        ["reserve a 1", "reserve a 1", "refund a"]
    );

    assert_eq!(
        c.get("/", &[("x-client-id", "a")]).await.status(),
        StatusCode::OK
    );
    assert_eq!(local.peek(&localhost()), 97);
    // The async limit denies: the local debit made for this request is
    // refunded, so the source is where it was.
    let r = c.get("/", &[("x-client-id", "a")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), Some("1"));
    // Every limit after the answer: the source as it was (97), the client
    // out.
    assert_eq!(
        header(&r, "ratelimit"),
        Some("\"source\";r=97;t=1, \"client\";r=0;t=1")
    );
    assert_eq!(local.peek(&localhost()), 97);
    assert_eq!(shared.pace.peek("a"), 0);
}

/// A limit that takes no quota per call and cannot wait (the trait's
/// defaults, as for a shared Redis limit): `Limit::quota` and
/// `Limit::wait_up_to` change nothing, and the fields show its own quota.
#[tokio::test]
async fn a_limit_without_quotas_or_waits_keeps_its_own_quota_and_answers_at_once() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    let shared = remote(&clock, 2);
    let big = pace::Quota::per_second(50).unwrap();
    let layer = PaceLayer::builder()
        .limit(
            Limit::new("client", shared.clone(), client_id())
                .quota(move |_| Some(big))
                .wait_up_to(Duration::from_secs(10)),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;

    for r in [1, 0] {
        let resp = c.get("/", &[("x-client-id", "a")]).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            header(&resp, "ratelimit-policy"),
            Some("\"client\";q=2;w=1")
        );
        let item = format!("\"client\";r={r};t=1");
        assert_eq!(header(&resp, "ratelimit"), Some(item.as_str()));
    }
    let resp = tokio::time::timeout(Duration::from_secs(1), c.get("/", &[("x-client-id", "a")]))
        .await
        .expect("answered without waiting");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some("\"client\";q=2;w=1")
    );
    assert_eq!(
        *shared.log.lock().unwrap(),
        ["reserve a 1", "reserve a 1", "reserve a 1"]
    );
}

#[tokio::test]
async fn a_later_local_denial_refunds_the_async_limit_and_a_local_first_denial_never_asks_it() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    let shared = remote(&clock, 10);
    let local: Arc<P<IpAddr>> = pace(&clock, 1, 1);
    // The async limit first, then the local one.
    let layer = PaceLayer::builder()
        .limit(Limit::new("client", shared.clone(), client_id()))
        .limit(Limit::new("source", local.clone(), PeerIp::new()))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;
    assert_eq!(
        c.get("/", &[("x-client-id", "b")]).await.status(),
        StatusCode::OK
    );
    let r = c.get("/", &[("x-client-id", "b")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Every limit after the answer: the client's debit for this request
    // returned (9, as below), the source out.
    assert_eq!(
        header(&r, "ratelimit"),
        Some("\"client\";r=9;t=1, \"source\";r=0;t=1")
    );
    assert_eq!(
        *shared.log.lock().unwrap(),
        ["reserve b 1", "reserve b 1", "refund b"]
    );
    assert_eq!(
        shared.pace.peek("b"),
        9,
        "the denied request's debit returned"
    );

    // The local limit first: its denial comes before the async one is asked.
    let shared2 = remote(&clock, 10);
    let local2: Arc<P<IpAddr>> = pace(&clock, 1, 1);
    let layer = PaceLayer::builder()
        .limit(Limit::new("source", local2.clone(), PeerIp::new()))
        .limit(Limit::new("client", shared2.clone(), client_id()))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;
    assert_eq!(
        c.get("/", &[("x-client-id", "b")]).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        c.get("/", &[("x-client-id", "b")]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(*shared2.log.lock().unwrap(), ["reserve b 1"]);
}

#[tokio::test]
async fn no_decision_from_the_async_limit_is_503_and_refunds_the_local_one() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    let local: Arc<P<IpAddr>> = pace(&clock, 100, 100);
    let shared = remote(&clock, 10);
    shared.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let layer = PaceLayer::builder()
        .limit(Limit::new("source", local.clone(), PeerIp::new()))
        .limit(Limit::new("client", shared.clone(), client_id()))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let r = support::get(addr, "/", &[("x-client-id", "c")]).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The limit's wait (1.5 s), rounded up.
    assert_eq!(header(&r, "retry-after"), Some("2"));
    assert_eq!(r.body().as_ref(), pace_tower::UNAVAILABLE_BODY.as_bytes());
    assert_eq!(local.peek(&localhost()), 100);

    // The hook sees it.
    let layer = PaceLayer::builder()
        .limit(Limit::new("source", local.clone(), PeerIp::new()))
        .limit(Limit::new("client", shared.clone(), client_id()))
        .on_reject(move |r: &Rejection<'_>, d: axum::http::Response<()>| {
            seen2.lock().unwrap().push((r.limit.to_string(), r.reason));
            d.map(|()| axum::body::Body::from("busy"))
        })
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let r = support::get(addr, "/", &[("x-client-id", "c")]).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.body().as_ref(), b"busy");
    assert_eq!(
        *seen.lock().unwrap(),
        [(
            "client".to_string(),
            Reason::Unavailable {
                retry_after: Some(Duration::from_millis(1500))
            }
        )]
    );
    assert_eq!(local.peek(&localhost()), 100);
}

#[cfg(feature = "redis")]
mod redis {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    use pace_redis::RedisPace;

    use super::*;

    /// A redis-server on a free loopback port, no persistence, killed on
    /// drop.
    struct Server(Child, u16);

    impl Server {
        fn start() -> Server {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let server = Server(
                Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server (the redis feature's tests need one)"),
                port,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                    let mut buf = [0u8; 7];
                    if s.write_all(b"PING\r\n").is_ok()
                        && s.read_exact(&mut buf).is_ok()
                        && &buf == b"+PONG\r\n"
                    {
                        return server;
                    }
                }
                assert!(Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[tokio::test]
    async fn a_redis_limit_and_a_local_one_in_one_layer() {
        let server = Server::start();
        let shared = Arc::new(
            RedisPace::builder(Rate::per_second(2).unwrap())
                .capacity(2)
                .deny_cache(false)
                .connect(&format!("redis://127.0.0.1:{}/", server.1))
                .await
                .unwrap(),
        );
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(100));
        let local: Arc<P<IpAddr>> = pace(&clock, 100, 100);
        let layer = PaceLayer::builder()
            .limit(Limit::new("source", local.clone(), PeerIp::new()))
            .limit(Limit::new("client", shared.clone(), client_id()))
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        let mut c = Client::connect(addr).await;
        let r = c.get("/", &[("x-client-id", "r")]).await;
        assert_eq!(r.status(), StatusCode::OK);
        // From the admission's own answer: 1 of 2 left (the server's clock
        // may have refilled a fraction, never a whole token within 500 ms).
        let fields = header(&r, "ratelimit").unwrap().to_string();
        assert!(
            fields.starts_with("\"source\";r=99;t=1, \"client\";r=1;t="),
            "{fields}"
        );
        assert_eq!(
            c.get("/", &[("x-client-id", "r")]).await.status(),
            StatusCode::OK
        );
        let r = c.get("/", &[("x-client-id", "r")]).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&r, "retry-after"), Some("1"));
        // All or nothing: the denied request's local debit was refunded.
        assert_eq!(local.peek(&localhost()), 98);
        assert_eq!(shared.stats().server_decisions, 3);
    }
}

#[cfg(feature = "redis")]
mod redis_down {
    use std::process::{Command, Stdio};

    use pace_redis::RedisPace;

    use super::*;

    /// A fail-closed `RedisPace` whose server dies: `503`, `Retry-After` the
    /// rest of the limiter's backoff (3 s) in whole seconds, rounded up,
    /// and the short body; its hook sees the same wait.
    #[tokio::test]
    async fn a_dead_redis_is_503_with_the_backoff_as_retry_after() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (the redis feature's tests need one)");
        let url = format!("redis://127.0.0.1:{port}/");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let shared = loop {
            let made = RedisPace::builder(Rate::per_second(100).unwrap())
                .timeout(Duration::from_millis(300))
                .backoff(Duration::from_secs(3))
                .connect(&url)
                .await;
            match made {
                Ok(p) => break Arc::new(p),
                Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let layer = PaceLayer::builder()
            .limit(Limit::new("client", shared.clone(), client_id()))
            .on_reject(move |r: &Rejection<'_>, d: axum::http::Response<()>| {
                seen2.lock().unwrap().push(r.reason);
                d.map(|()| axum::body::Body::from(pace_tower::UNAVAILABLE_BODY))
            })
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        let r = support::get(addr, "/", &[("x-client-id", "c")]).await;
        assert_eq!(r.status(), StatusCode::OK);
        // The backoff starts at the first failed call, after the kill: each
        // refusal's wait is the rest of it, so it is at most 3 s and at
        // least 3 s less the time since the kill (measured after the
        // answer: load only loosens this bound).
        let killed = std::time::Instant::now();
        let _ = child.kill();
        let _ = child.wait();
        let mut headers = Vec::new();
        let mut since = Vec::new();
        for i in 0..3 {
            let r = support::get(addr, "/", &[("x-client-id", "c")]).await;
            since.push(killed.elapsed());
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "request {i}");
            assert_eq!(r.body().as_ref(), pace_tower::UNAVAILABLE_BODY.as_bytes());
            headers.push(header(&r, "retry-after").map(str::to_owned));
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        for (i, reason) in seen.iter().enumerate() {
            match reason {
                Reason::Unavailable {
                    retry_after: Some(w),
                } => {
                    assert!(
                        *w <= Duration::from_secs(3) && *w + since[i] >= Duration::from_secs(3),
                        "request {i}: {w:?}, {:?} after the kill",
                        since[i]
                    );
                    // `Retry-After`: the wait in whole seconds, rounded up
                    // (3 when the answer came within the backoff's first
                    // second).
                    let secs = w.as_nanos().div_ceil(1_000_000_000).max(1);
                    assert_eq!(headers[i], Some(secs.to_string()), "request {i}: {w:?}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
