//! Refunds under overlap (issue 26, requirement 6): a limit the layer may
//! refund is *held* (`AsyncLimit::hold`), so that its refund is exact in
//! any order, and kept (`AsyncLimit::keep`) wherever the layer does not
//! refund it.
//!
//! * Floods over real loopback HTTP (16 connections for about a second on
//!   one claimed id, on a frozen clock so that any trace stays): answered
//!   401 with `refund_if`, the id keeps its 3 of 3 tokens; denied by a
//!   later limit (on each of the layer's paths), the earlier limit stays
//!   whole. `PACE_FLOOD_MS` sets the flood's length (default 1000).
//! * Every admission a holding limit does not refund is kept, on every
//!   path (response passed, inner service failed, response future dropped
//!   after admission or while a later limit is in flight): a held debit
//!   only dropped would count as spent for twice the hold limit.
//!
//! Known-wrong variants these tests catch (`PACE_MUTANT=NAME cargo test -p
//! pace-tower --test holds`, as `.ci/suites/15-mutants.sh` runs them):
//! `tower_plain_reserve` (every limit reserved with the plain one-CAS
//! kind, as before holds: the floods leave traces), `tower_no_keep` (held
//! debits dropped instead of kept), `tower_nested_no_refund` (on the nested
//! path, a reservation a later limit's refusal stops is kept, not
//! refunded).

mod support;

use std::collections::hash_map::RandomState;
use std::future::{pending, ready, Future};
use std::net::{IpAddr, SocketAddr};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::routing::get;
use axum::Router;
use pace::{ManualClock, Pace, Quota, Rate};
use pace_tower::{
    from_fn, AsyncLimit, Header, Limit, Limits, PaceLayer, PeerIp, Refusal, ResponseHead,
};
use support::{serve, Client};
use tower::{Layer, Service};

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

fn clock() -> ManualClock {
    let c = ManualClock::new();
    c.set(Duration::from_secs(100));
    c
}

fn hv(s: &'static str) -> HeaderValue {
    HeaderValue::from_static(s)
}

fn client_header() -> Header {
    Header(HeaderName::from_static("x-client-id"))
}

fn key_header() -> Header {
    Header(HeaderName::from_static("x-api-key"))
}

/// 200, or 401 when the request says `x-valid: no`.
async fn handler(req: Request) -> StatusCode {
    if req.headers().get("x-valid").is_some_and(|v| v == "no") {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    }
}

fn app<L: Limits>(layer: PaceLayer<L>) -> Router {
    Router::new().route("/", get(handler)).layer(layer)
}

fn flood_len() -> Duration {
    let ms = std::env::var("PACE_FLOOD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    Duration::from_millis(ms)
}

/// Statuses seen by a flood.
#[derive(Debug, Default)]
struct Seen {
    ok: u64,
    unauthorized: u64,
    too_many: u64,
    other: u64,
}

/// 16 connections sending `headers` as fast as they are answered, for
/// [`flood_len`].
async fn flood(addr: SocketAddr, headers: &'static [(&'static str, &'static str)]) -> Seen {
    const CONNECTIONS: usize = 16;
    let counts: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let end = Instant::now() + flood_len();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let counts = counts.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            while Instant::now() < end {
                let r = c.get("/", headers).await;
                let slot = match r.status() {
                    StatusCode::OK => 0,
                    StatusCode::UNAUTHORIZED => 1,
                    StatusCode::TOO_MANY_REQUESTS => 2,
                    _ => 3,
                };
                counts[slot].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = |k: usize| counts[k].load(Ordering::Relaxed);
    Seen {
        ok: n(0),
        unauthorized: n(1),
        too_many: n(2),
        other: n(3),
    }
}

/// The token endpoint under a flood of wrong secrets for one client id:
/// every presentation is answered 401 (or 429 while the id's 3 tokens are
/// all held by presentations being checked) and refunded, and afterwards
/// the id has its 3 tokens, whatever order the refunds landed in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_wrong_secrets_leaves_the_claimed_id_whole() {
    let clock = clock();
    // Per source: never refunded, and too large to deny in the flood.
    let src: Arc<P<IpAddr>> = pace(&clock, 1, 1_000_000_000);
    let ids: Arc<P<HeaderValue>> = pace(&clock, 3, 3);
    let layer = PaceLayer::builder()
        .limit(Limit::new("source", src.clone(), PeerIp::new()))
        .limit(
            Limit::new("client", ids.clone(), client_header())
                .refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let seen = flood(addr, &[("x-client-id", "victim"), ("x-valid", "no")]).await;
    let left = ids.peek(&hv("victim"));
    eprintln!("wrong secrets: {seen:?}; the victim keeps {left} of 3 tokens");
    assert!(seen.unauthorized > 100, "the flood ran: {seen:?}");
    assert_eq!(seen.ok + seen.other, 0, "{seen:?}");
    assert_eq!(left, 3, "the flood left a trace on the claimed id");
    // Every presentation spent the source; the denied ones were refunded
    // (the source is held, a limit after it may refuse).
    assert_eq!(
        src.peek(&[127, 0, 0, 1].into()),
        1_000_000_000 - seen.unauthorized
    );
    // The victim's own presentations pass.
    let mut c = Client::connect(addr).await;
    for _ in 0..3 {
        let r = c.get("/", &[("x-client-id", "victim")]).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = c.get("/", &[("x-client-id", "victim")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Two limits, all or nothing: a flood of requests the second limit denies
/// (its key was spent beforehand) leaves the first limit whole, on each of
/// the layer's paths: the light one (no refunds, every limit decides at
/// once; with and without the fields), the general one (a quota closure),
/// and with a refund predicate on the second limit (the state kept until
/// the response).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_denied_by_a_later_limit_leave_the_earlier_limit_whole() {
    let mut lefts = Vec::new();
    for path in ["light", "light/fields", "general", "refunds"] {
        let clock = clock();
        let ids: Arc<P<HeaderValue>> = pace(&clock, 3, 3);
        let keys: Arc<P<HeaderValue>> = pace(&clock, 1, 1);
        let mut first = Limit::new("client", ids.clone(), client_header());
        if path == "general" {
            first = first.quota(|_| None);
        }
        let mut second = Limit::new("key", keys.clone(), key_header());
        if path == "refunds" {
            second = second.refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED);
        }
        let layer = PaceLayer::builder()
            .rate_limit_headers(path != "light")
            .limit(first)
            .limit(second)
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        // Spend the second limit's key.
        let mut c = Client::connect(addr).await;
        let r = c
            .get("/", &[("x-client-id", "other"), ("x-api-key", "spent")])
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        let seen = flood(addr, &[("x-client-id", "victim"), ("x-api-key", "spent")]).await;
        let left = ids.peek(&hv("victim"));
        eprintln!("{path}: denied by the second limit: {seen:?}; the first keeps {left} of 3");
        assert!(seen.too_many > 100, "{path}: the flood ran: {seen:?}");
        assert_eq!(
            seen.ok + seen.unauthorized + seen.other,
            0,
            "{path}: {seen:?}"
        );
        lefts.push((path, left, ids.len()));
    }
    // Every path's figure first, then the verdict.
    for (path, left, rows) in lefts {
        assert_eq!(
            left, 3,
            "{path}: the denials left a trace on the first limit"
        );
        assert_eq!(rows, 1, "{path}: only `other` was kept");
    }
}

/// An inner service that answers 200, 401 (`x-valid: no`), fails
/// (`x-fail`) or never answers (`x-hang`).
type Answer =
    Pin<Box<dyn Future<Output = Result<axum::http::Response<String>, &'static str>> + Send>>;

fn inner() -> impl Service<
    axum::http::Request<()>,
    Response = axum::http::Response<String>,
    Error = &'static str,
    Future = Answer,
> + Clone {
    tower::service_fn(|req: axum::http::Request<()>| {
        let h = req.headers();
        let fut: Answer = if h.contains_key("x-hang") {
            Box::pin(pending())
        } else if h.contains_key("x-fail") {
            Box::pin(ready(Err("inner failure")))
        } else {
            let mut r = axum::http::Response::new(String::new());
            if h.get("x-valid").is_some_and(|v| v == "no") {
                *r.status_mut() = StatusCode::UNAUTHORIZED;
            }
            Box::pin(ready(Ok(r)))
        };
        fut
    })
}

fn request(headers: &[(&'static str, &'static str)]) -> axum::http::Request<()> {
    let mut b = axum::http::Request::builder().uri("/");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let mut r = b.body(()).unwrap();
    r.extensions_mut().insert(ConnectInfo(SocketAddr::new(
        IpAddr::from([192, 0, 2, 7]),
        40000,
    )));
    r
}

/// Calls `svc` and polls its answer once: `Some` when it is ready, `None`
/// when it is pending (the future is then dropped).
fn poll_once<S>(svc: &mut S, req: axum::http::Request<()>) -> Option<Result<StatusCode, S::Error>>
where
    S: Service<axum::http::Request<()>, Response = axum::http::Response<String>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let mut fut = pin!(svc.call(req));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(r) => Some(r.map(|r| r.status())),
        Poll::Pending => None,
    }
}

/// A limit that answers one poll late (as a shared one does), backed by a
/// local `Pace`, holding through it.
struct Remote(Arc<P<String>>);

/// Pending on its first poll (waking itself), then its value; pending
/// for good for the key `never`.
struct Later<T> {
    value: Option<T>,
    yielded: bool,
}

impl<T: Unpin> Future for Later<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if self.value.is_none() {
            return Poll::Pending;
        }
        if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.value.take().expect("polled after completion"))
    }
}

impl AsyncLimit<String> for Remote {
    type Debit = pace::Debit;
    type Reserve = Later<Result<pace::Debit, Refusal>>;

    fn reserve(&self, key: &String, n: u64) -> Self::Reserve {
        if key == "never" {
            return Later {
                value: None,
                yielded: false,
            };
        }
        let value = self.0.reserve_n(key, n).map(pace::Reservation::detach);
        Later {
            value: Some(value.map_err(Refusal::from)),
            yielded: false,
        }
    }

    fn hold(&self, key: &String, n: u64) -> Self::Reserve {
        if key == "never" {
            return Later {
                value: None,
                yielded: false,
            };
        }
        let value = self.0.hold_n(key, n).map(pace::Hold::detach);
        Later {
            value: Some(value.map_err(Refusal::from)),
            yielded: false,
        }
    }

    fn holds(&self) -> bool {
        true
    }

    fn keep(&self, key: &String, debit: pace::Debit) {
        self.0.keep(key, debit);
    }

    fn refund(&self, key: &String, debit: pace::Debit) {
        self.0.refund(key, debit);
    }

    fn remaining(&self, key: &String, _: Option<&pace::Debit>) -> Option<u64> {
        Some(self.0.peek(key))
    }

    fn capacity(&self) -> u64 {
        self.0.capacity()
    }

    fn rate(&self) -> Rate {
        self.0.rate()
    }
}

/// Every admission of a holding limit that is not refunded is kept, on
/// every path: a held debit that were only dropped would stay held (spent,
/// and not refilling) for twice the hold limit (20 s by default), so one
/// second later the limit would not be full again.
#[test]
fn every_admission_a_holding_limit_does_not_refund_is_kept() {
    let clock = clock();
    let second = Duration::from_secs(1);
    // The method itself: a held debit dropped stays spent past a refill; a
    // kept one refills.
    {
        let p: Arc<P<String>> = pace(&clock, 3, 3);
        let k = "k".to_string();
        let dropped = p.hold(&k).unwrap().detach();
        drop(dropped);
        clock.advance(second);
        assert_eq!(p.peek(&k), 2, "a dropped hold is still held");
        let kept = p.hold(&"j".to_string()).unwrap().detach();
        assert!(p.keep(&"j".to_string(), kept));
        clock.advance(second);
        assert_eq!(p.peek(&"j".to_string()), 3, "a kept hold refills");
    }
    let full_again = |ids: &P<HeaderValue>, src: &P<IpAddr>, what: &str| {
        clock.advance(second);
        assert_eq!(
            ids.peek(&hv("a")),
            3,
            "{what}: the client id's debit was kept"
        );
        assert_eq!(
            src.peek(&[192, 0, 2, 7].into()),
            3,
            "{what}: the source's debit was kept"
        );
    };
    let a = [("x-client-id", "a")];
    // A refund predicate on the second limit: both hold (the first is
    // followed by a limit that may refuse).
    let ids: Arc<P<HeaderValue>> = pace(&clock, 3, 3);
    let src: Arc<P<IpAddr>> = pace(&clock, 3, 3);
    let mut svc = PaceLayer::builder()
        .limit(Limit::new("source", src.clone(), PeerIp::new()))
        .limit(
            Limit::new("client", ids.clone(), client_header())
                .refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap()
        .layer(inner());
    assert_eq!(poll_once(&mut svc, request(&a)), Some(Ok(StatusCode::OK)));
    full_again(&ids, &src, "response passed");
    assert_eq!(
        poll_once(
            &mut svc,
            request(&[("x-client-id", "a"), ("x-valid", "no")])
        ),
        Some(Ok(StatusCode::UNAUTHORIZED))
    );
    assert_eq!(ids.peek(&hv("a")), 3, "refunded at once");
    full_again(&ids, &src, "refunded");
    assert_eq!(
        poll_once(&mut svc, request(&[("x-client-id", "a"), ("x-fail", "1")])),
        Some(Err("inner failure"))
    );
    full_again(&ids, &src, "inner service failed");
    assert_eq!(
        poll_once(&mut svc, request(&[("x-client-id", "a"), ("x-hang", "1")])),
        None
    );
    full_again(&ids, &src, "response future dropped after admission");

    // No refund predicate: the light path (the first limit holds).
    for fields in [false, true] {
        let mut svc = PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", src.clone(), PeerIp::new()))
            .limit(Limit::new("client", ids.clone(), client_header()))
            .build()
            .unwrap()
            .layer(inner());
        assert_eq!(poll_once(&mut svc, request(&a)), Some(Ok(StatusCode::OK)));
        full_again(&ids, &src, "light path");
        assert_eq!(
            poll_once(&mut svc, request(&[("x-client-id", "a"), ("x-hang", "1")])),
            None
        );
        full_again(&ids, &src, "light path, dropped");
    }
    // The general path (a quota closure), with and without the fields.
    for fields in [false, true] {
        let mut svc = PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", src.clone(), PeerIp::new()).quota(|_| None))
            .limit(
                Limit::new("client", ids.clone(), client_header())
                    .quota(|_| Some(Quota::per_second(3).unwrap())),
            )
            .build()
            .unwrap()
            .layer(inner());
        assert_eq!(poll_once(&mut svc, request(&a)), Some(Ok(StatusCode::OK)));
        full_again(&ids, &src, "general path");
    }

    // A limit that answers later after a holding local one.
    let remote = Arc::new(Remote(pace(&clock, 3, 3)));
    let client_id = || from_fn(|h| Some(h.headers.get("x-client-id")?.to_str().ok()?.to_string()));
    let mut svc = PaceLayer::builder()
        .limit(Limit::new("source", src.clone(), PeerIp::new()))
        .limit(
            Limit::new("remote", remote.clone(), client_id())
                .refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap()
        .layer(inner());
    // Dropped while the remote limit is in flight: the source's hold is
    // kept.
    assert_eq!(
        poll_once(&mut svc, request(&[("x-client-id", "never")])),
        None
    );
    clock.advance(second);
    assert_eq!(
        src.peek(&[192, 0, 2, 7].into()),
        3,
        "dropped while reserving"
    );
    // Admitted after the remote answered: both kept.
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let mut fut = pin!(svc.call(request(&a)));
    let status = loop {
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            break r.unwrap().status();
        }
    };
    assert_eq!(status, StatusCode::OK);
    clock.advance(second);
    assert_eq!(src.peek(&[192, 0, 2, 7].into()), 3, "remote admitted");
    assert_eq!(remote.0.peek(&"a".to_string()), 3, "remote admitted: kept");
}

/// A limit that decides at once and holds, backed by a local `Pace`, with
/// `AsyncLimit`'s own `hold_while` (a hold, the decision, then `keep` or
/// `refund`), counting its resolutions.
struct AtOnce {
    pace: Arc<P<HeaderValue>>,
    kept: AtomicU64,
    refunded: AtomicU64,
}

impl AsyncLimit<HeaderValue> for AtOnce {
    type Debit = pace::Debit;
    type Reserve = std::future::Ready<Result<pace::Debit, Refusal>>;

    fn reserve(&self, key: &HeaderValue, n: u64) -> Self::Reserve {
        ready(self.reserve_now(key, n).expect("decides at once"))
    }

    fn reserve_now(&self, key: &HeaderValue, n: u64) -> Option<Result<pace::Debit, Refusal>> {
        Some(
            self.pace
                .reserve_n(key, n)
                .map(pace::Reservation::detach)
                .map_err(Refusal::from),
        )
    }

    fn hold_now(&self, key: &HeaderValue, n: u64) -> Option<Result<pace::Debit, Refusal>> {
        Some(
            self.pace
                .hold_n(key, n)
                .map(pace::Hold::detach)
                .map_err(Refusal::from),
        )
    }

    fn decides_at_once(&self) -> bool {
        true
    }

    fn holds(&self) -> bool {
        true
    }

    fn keep(&self, key: &HeaderValue, debit: pace::Debit) {
        self.kept.fetch_add(1, Ordering::Relaxed);
        self.pace.keep(key, debit);
    }

    fn refund(&self, key: &HeaderValue, debit: pace::Debit) {
        self.refunded.fetch_add(1, Ordering::Relaxed);
        self.pace.refund(key, debit);
    }

    fn remaining(&self, key: &HeaderValue, _: Option<&pace::Debit>) -> Option<u64> {
        Some(self.pace.peek(key))
    }

    fn capacity(&self) -> u64 {
        self.pace.capacity()
    }

    fn rate(&self) -> Rate {
        self.pace.rate()
    }
}

/// A layer whose limits all decide at once holds a limit while the limits
/// after it decide (`AsyncLimit::hold_while`): on the light path (no
/// refunds) and on the nested one (a refund predicate on the later limit),
/// with a limit of its own (the trait's `hold_while`, here) as with a
/// `Pace` (`Pace::hold_while`). A request the later limit refuses refunds
/// the held token exactly, an admitted one keeps it, so that it refills (a
/// hold left unresolved would stay spent past a second), and a response
/// the predicate refunds returns the later limit's token alone.
#[test]
fn the_light_path_resolves_what_it_holds_by_the_later_limits() {
    let second = Duration::from_secs(1);
    for refund in [false, true] {
        for own in [true, false] {
            for fields in [false, true] {
                let what = format!("refund {refund}, own hold_while {own}, fields {fields}");
                let clock = clock();
                let ids: Arc<P<HeaderValue>> = pace(&clock, 3, 3);
                let keys: Arc<P<HeaderValue>> = pace(&clock, 1, 1);
                let at_once = Arc::new(AtOnce {
                    pace: ids.clone(),
                    kept: AtomicU64::new(0),
                    refunded: AtomicU64::new(0),
                });
                let layer = PaceLayer::builder().rate_limit_headers(fields);
                let mut second_limit = Limit::new("key", keys.clone(), key_header());
                if refund {
                    second_limit = second_limit
                        .refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED);
                }
                let mut svc = if own {
                    let layer = layer
                        .limit(Limit::new("client", at_once.clone(), client_header()))
                        .limit(second_limit)
                        .build()
                        .unwrap();
                    tower::util::BoxCloneService::new(layer.layer(inner()))
                } else {
                    let layer = layer
                        .limit(Limit::new("client", ids.clone(), client_header()))
                        .limit(second_limit)
                        .build()
                        .unwrap();
                    tower::util::BoxCloneService::new(layer.layer(inner()))
                };
                // Spend the second limit's key, then present it again:
                // refused by the second limit, the first is refunded.
                let spend = request(&[("x-client-id", "other"), ("x-api-key", "spent")]);
                assert_eq!(
                    poll_once(&mut svc, spend),
                    Some(Ok(StatusCode::OK)),
                    "{what}"
                );
                for _ in 0..5 {
                    let r = request(&[("x-client-id", "victim"), ("x-api-key", "spent")]);
                    assert_eq!(
                        poll_once(&mut svc, r),
                        Some(Ok(StatusCode::TOO_MANY_REQUESTS)),
                        "{what}"
                    );
                }
                assert_eq!(
                    ids.peek(&hv("victim")),
                    3,
                    "{what}: the refusals left a trace"
                );
                // Admitted by both: the first limit's token is kept.
                let ok = request(&[("x-client-id", "victim"), ("x-api-key", "fresh")]);
                assert_eq!(poll_once(&mut svc, ok), Some(Ok(StatusCode::OK)), "{what}");
                assert_eq!(
                    ids.peek(&hv("victim")),
                    2,
                    "{what}: the admission spent one"
                );
                assert_eq!(keys.peek(&hv("fresh")), 0, "{what}: and the key's");
                let mut kept = 2;
                if refund {
                    // Refunded by the predicate: the key's token returns,
                    // the first limit's is kept.
                    let no = request(&[
                        ("x-client-id", "victim"),
                        ("x-api-key", "again"),
                        ("x-valid", "no"),
                    ]);
                    assert_eq!(
                        poll_once(&mut svc, no),
                        Some(Ok(StatusCode::UNAUTHORIZED)),
                        "{what}"
                    );
                    assert_eq!(keys.peek(&hv("again")), 1, "{what}: refunded");
                    assert_eq!(ids.peek(&hv("victim")), 1, "{what}: kept");
                    kept = 3;
                }
                clock.advance(second);
                assert_eq!(ids.peek(&hv("victim")), 3, "{what}: the kept token refills");
                assert_eq!(ids.peek(&hv("other")), 3, "{what}: the kept token refills");
                assert_eq!(keys.peek(&hv("fresh")), 1, "{what}: the key's refills");
                if own {
                    assert_eq!(at_once.kept.load(Ordering::Relaxed), kept, "{what}: kept");
                    assert_eq!(
                        at_once.refunded.load(Ordering::Relaxed),
                        5,
                        "{what}: refunded"
                    );
                }
            }
        }
    }
}

/// A limit refunded on the response, before a limit that refuses: on the
/// nested path (every limit decides at once) the refusal refunds the
/// earlier limit's held token at once, exactly, whatever the order.
#[test]
fn a_refunded_limit_before_a_refusing_one_is_refunded_by_the_refusal() {
    for fields in [false, true] {
        let clock = clock();
        let keys: Arc<P<HeaderValue>> = pace(&clock, 1, 2);
        let ids: Arc<P<HeaderValue>> = pace(&clock, 1, 1);
        let mut svc = PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(
                Limit::new("key", keys.clone(), key_header())
                    .refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED),
            )
            .limit(Limit::new("client", ids.clone(), client_header()))
            .build()
            .unwrap()
            .layer(inner());
        let r = request(&[("x-client-id", "spent"), ("x-api-key", "other")]);
        assert_eq!(poll_once(&mut svc, r), Some(Ok(StatusCode::OK)));
        for _ in 0..4 {
            let r = request(&[("x-client-id", "spent"), ("x-api-key", "victim")]);
            assert_eq!(
                poll_once(&mut svc, r),
                Some(Ok(StatusCode::TOO_MANY_REQUESTS)),
                "fields {fields}"
            );
        }
        assert_eq!(
            keys.peek(&hv("victim")),
            2,
            "fields {fields}: the refusals left a trace"
        );
        assert_eq!(keys.peek(&hv("other")), 1, "fields {fields}: kept");
    }
}
