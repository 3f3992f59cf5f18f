//! What an operator sees: the response hook, `tracing` events, a server
//! without peer addresses, the token endpoint's own answers.

mod support;

#[path = "../examples/token_endpoint.rs"]
#[allow(dead_code)]
mod token_endpoint;

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use pace::{DenyReason, ManualClock, Pace, Rate};
use pace_tower::{Header, Limit, MissingKey, PaceLayer, PeerIp, Reason, Rejection};
use support::{header, serve, serve_plain};
use tower::{Layer, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

type P<K> = Pace<K, RandomState, ManualClock>;

fn pace<K>(capacity: u64) -> Arc<P<K>> {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    Arc::new(
        Pace::builder(Rate::per_second(capacity).unwrap())
            .capacity(capacity)
            .clock(clock)
            .build()
            .unwrap(),
    )
}

type Events = Arc<Mutex<Vec<(Level, String, String)>>>;

thread_local! {
    /// Where the global subscriber puts this thread's events.
    static SINK: std::cell::RefCell<Option<Events>> = const { std::cell::RefCell::new(None) };
}

/// The process-wide subscriber: every event goes to the sink of the thread
/// it happens on (each test runs its server on its own thread, on a
/// current-thread runtime). Scoped subscribers of parallel tests race on
/// tracing's per-callsite interest cache; one global subscriber does not.
struct Global;

/// A test's events: level, target, fields as `name=value ` pairs.
#[derive(Clone, Default)]
struct Capture(Events);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, "{}={} ", field.name(), value);
    }
}

impl Subscriber for Global {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        SINK.with(|s| {
            if let Some(sink) = &*s.borrow() {
                let mut f = Fields(String::new());
                e.record(&mut f);
                sink.lock().unwrap().push((
                    *e.metadata().level(),
                    e.metadata().target().to_string(),
                    f.0,
                ));
            }
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Capture {
    /// Captures this thread's events from now on.
    fn install() -> Capture {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| tracing::subscriber::set_global_default(Global).unwrap());
        let c = Capture::default();
        SINK.with(|s| *s.borrow_mut() = Some(c.0.clone()));
        c
    }

    fn take(&self) -> Vec<(Level, String, String)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

async fn ok(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

async fn body(r: Response<Body>) -> String {
    String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn req(headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder().uri("/");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn without_connect_info_the_answer_says_what_to_fix_and_an_error_is_logged() {
    let capture = Capture::install();
    let p: Arc<P<IpAddr>> = pace(5);
    let layer = PaceLayer::builder()
        .limit(Limit::new("per-peer", p.clone(), PeerIp::new()))
        .build()
        .unwrap();
    // `axum::serve(listener, app)`: no `into_make_service_with_connect_info`.
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let addr = serve_plain(app).await;
    let r = support::get(addr, "/", &[]).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let text = std::str::from_utf8(r.body()).unwrap();
    assert_eq!(text, pace_tower::MISSING_PEER_ADDR_BODY);
    assert!(text.contains("into_make_service_with_connect_info::<std::net::SocketAddr>()"));
    assert!(text.contains("PeerAddr"));
    assert_eq!(p.len(), 0, "nothing reserved");
    let events = capture.take();
    let errors: Vec<_> = events
        .iter()
        .filter(|(l, t, _)| *l == Level::ERROR && t == "pace_tower")
        .collect();
    assert_eq!(errors.len(), 1, "{events:?}");
    assert!(errors[0].2.contains("limit=per-peer"), "{events:?}");
    assert!(
        errors[0].2.contains("into_make_service_with_connect_info"),
        "{events:?}"
    );

    // The same layer behind `into_make_service_with_connect_info` admits.
    let addr = serve(
        Router::new().route("/", get(|| async { "ok" })).layer(
            PaceLayer::builder()
                .limit(Limit::new("per-peer", p.clone(), PeerIp::new()))
                .build()
                .unwrap(),
        ),
    )
    .await;
    assert_eq!(support::get(addr, "/", &[]).await.status(), StatusCode::OK);
    assert!(capture.take().iter().all(|(l, _, _)| *l != Level::ERROR));
}

#[tokio::test]
async fn denials_and_missing_keys_are_tracing_events() {
    let capture = Capture::install();
    let p: Arc<P<HeaderValue>> = pace(1);
    let svc = PaceLayer::builder()
        .limit(
            Limit::new(
                "api-key",
                p.clone(),
                Header(HeaderName::from_static("x-key")),
            )
            .cost(|h| {
                if h.headers.contains_key("x-big") {
                    2
                } else {
                    1
                }
            }),
        )
        .build()
        .unwrap()
        .layer(tower::service_fn(ok));
    let r = svc.clone().oneshot(req(&[("x-key", "a")])).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(capture.take().is_empty(), "an admission logs nothing");

    let r = svc.clone().oneshot(req(&[("x-key", "a")])).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let ev = capture.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].0, ev[0].1.as_str()), (Level::DEBUG, "pace_tower"));
    assert!(ev[0].2.contains("limit=api-key"), "{ev:?}");
    assert!(ev[0].2.contains("retry_after_ms=1000"), "{ev:?}");
    assert!(ev[0].2.contains("message=denied"), "{ev:?}");

    let r = svc
        .clone()
        .oneshot(req(&[("x-key", "b"), ("x-big", "1")]))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let ev = capture.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].2.contains("reason=ExceedsCapacity"), "{ev:?}");

    let r = svc.clone().oneshot(req(&[])).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let ev = capture.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].0, Level::DEBUG);
    assert!(ev[0].2.contains("limit=api-key"), "{ev:?}");
    assert!(ev[0].2.contains("status=400"), "{ev:?}");
    assert!(ev[0].2.contains("without a key"), "{ev:?}");
}

#[tokio::test]
async fn the_response_hook_sets_status_headers_and_body_of_every_rejection() {
    let p: Arc<P<HeaderValue>> = pace(1);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let svc = PaceLayer::builder()
        .limit(
            Limit::new(
                "api-key",
                p.clone(),
                Header(HeaderName::from_static("x-key")),
            )
            .cost(|h| {
                if h.headers.contains_key("x-big") {
                    2
                } else {
                    1
                }
            }),
        )
        .on_reject(move |r: &Rejection<'_>, default: Response<()>| {
            seen2
                .lock()
                .unwrap()
                .push((r.limit.to_string(), r.index, r.reason));
            let (mut head, ()) = default.into_parts();
            let error = match r.reason {
                Reason::Exhausted { .. } => "slow_down",
                Reason::Permanent(_) => {
                    head.status = StatusCode::BAD_REQUEST;
                    "too_big"
                }
                Reason::MissingKey => "no_key",
                _ => "other",
            };
            head.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Response::from_parts(head, Body::from(format!("{{\"error\":\"{error}\"}}")))
        })
        .build()
        .unwrap()
        .layer(tower::service_fn(ok));

    let r = svc.clone().oneshot(req(&[("x-key", "a")])).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(body(r).await, "ok");

    // Exhausted: the default's fields stay, the hook's body and type added.
    let r = svc.clone().oneshot(req(&[("x-key", "a")])).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), Some("1"));
    assert_eq!(header(&r, "ratelimit"), Some("\"api-key\";r=0;t=1"));
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"api-key\";q=1;w=1"));
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert_eq!(body(r).await, "{\"error\":\"slow_down\"}");

    // Permanent: the hook changed the status.
    let r = svc
        .clone()
        .oneshot(req(&[("x-key", "b"), ("x-big", "1")]))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&r, "retry-after"), None);
    assert_eq!(body(r).await, "{\"error\":\"too_big\"}");

    // Missing key.
    let r = svc.clone().oneshot(req(&[])).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert_eq!(body(r).await, "{\"error\":\"no_key\"}");

    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (
                "api-key".to_string(),
                0,
                Reason::Exhausted {
                    retry_after: Duration::from_secs(1)
                }
            ),
            (
                "api-key".to_string(),
                0,
                Reason::Permanent(DenyReason::ExceedsCapacity)
            ),
            ("api-key".to_string(), 0, Reason::MissingKey),
        ]
    );
}

#[tokio::test]
async fn the_hook_sees_a_missing_peer_address_and_which_limit() {
    let a: Arc<P<HeaderValue>> = pace(5);
    let b: Arc<P<IpAddr>> = pace(5);
    let svc = PaceLayer::builder()
        .limit(
            Limit::new(
                "api-key",
                a.clone(),
                Header(HeaderName::from_static("x-key")),
            )
            .missing_key(MissingKey::Skip),
        )
        .limit(Limit::new("per-peer", b, PeerIp::new()).missing_key(MissingKey::Skip))
        .on_reject(|r: &Rejection<'_>, default: Response<()>| {
            assert_eq!((r.limit, r.index), ("per-peer", 1));
            assert_eq!(r.reason, Reason::MissingPeerAddr);
            assert_eq!(default.status(), StatusCode::INTERNAL_SERVER_ERROR);
            default.map(|()| Body::from("misconfigured"))
        })
        .build()
        .unwrap()
        .layer(tower::service_fn(ok));
    let r = svc.oneshot(req(&[("x-key", "k")])).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body(r).await, "misconfigured");
    // All or nothing: the earlier limit's debit was refunded.
    assert_eq!(a.peek(&HeaderValue::from_static("k")), 5);
    assert_eq!(a.len(), 0);
}

#[tokio::test]
async fn the_token_endpoint_answers_json_as_json_and_its_own_invalid_request() {
    let limiters = token_endpoint::Limiters::new(200);
    let addr = serve(token_endpoint::router().layer(limiters.layer())).await;
    let mut c = support::Client::connect(addr).await;
    let post = |auth: Option<HeaderValue>| {
        let mut b = hyper::Request::builder()
            .method("POST")
            .uri("/token")
            .header("host", addr.to_string());
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(http_body_util::Full::new(hyper::body::Bytes::new()))
            .unwrap()
    };
    let r = c
        .send_req(post(Some(token_endpoint::basic_value(
            "client-7", "secret-7",
        ))))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert_eq!(
        r.body().as_ref(),
        b"{\"access_token\":\"at-client-7\",\"token_type\":\"Bearer\",\"expires_in\":300}"
    );
    let r = c
        .send_req(post(Some(token_endpoint::basic_value("client-7", "wrong"))))
        .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert_eq!(r.body().as_ref(), b"{\"error\":\"invalid_client\"}");
    let r = c.send_req(post(None)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert_eq!(r.body().as_ref(), b"{\"error\":\"invalid_request\"}");
    // It spent the source, not a client id: the fields name the limits the
    // request reserved (the limiters run on the real clock, so the tokens
    // left are not asserted here; tests/server.rs does on a manual clock).
    let fields = header(&r, "ratelimit").unwrap();
    let items = sfv::Parser::new(fields).parse::<sfv::List>().unwrap();
    let names: Vec<String> = items
        .iter()
        .map(|m| match m {
            sfv::ListEntry::Item(i) => i.bare_item.as_string().unwrap().as_str().to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["source"]);
    assert_eq!(limiters.per_client.len(), 1, "client-7 only");
}

/// A limit backed by a local `Pace` that gives no decision while `down`,
/// with the wait it states.
struct Flaky {
    pace: Arc<P<HeaderValue>>,
    down: std::sync::atomic::AtomicBool,
    wait: Mutex<Option<Duration>>,
}

#[derive(Debug)]
struct StoreDown;

impl std::fmt::Display for StoreDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("store down")
    }
}

impl std::error::Error for StoreDown {}

impl pace_tower::AsyncLimit<HeaderValue> for Flaky {
    type Debit = pace::Debit;
    type Reserve = std::future::Ready<Result<pace::Debit, pace_tower::Refusal>>;

    fn reserve(&self, key: &HeaderValue, n: u64) -> Self::Reserve {
        std::future::ready(if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            Err(pace_tower::Refusal::Unavailable {
                error: Box::new(StoreDown),
                retry_after: *self.wait.lock().unwrap(),
            })
        } else {
            self.pace
                .reserve_n(key, n)
                .map(pace::Reservation::detach)
                .map_err(pace_tower::Refusal::from)
        })
    }
    fn refund(&self, key: &HeaderValue, debit: pace::Debit) {
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

#[tokio::test]
async fn an_outage_is_one_warning_and_its_503s_say_when_to_retry() {
    let capture = Capture::install();
    let flaky = Arc::new(Flaky {
        pace: pace(1000),
        down: std::sync::atomic::AtomicBool::new(true),
        wait: Mutex::new(Some(Duration::from_millis(1500))),
    });
    let svc = PaceLayer::builder()
        .limit(Limit::new(
            "shared",
            flaky.clone(),
            Header(HeaderName::from_static("x-key")),
        ))
        .build()
        .unwrap()
        .layer(tower::service_fn(ok));
    let warnings = |ev: &[(Level, String, String)]| {
        ev.iter()
            .filter(|e| e.0 == Level::WARN && e.1 == "pace_tower")
            .count()
    };
    let down = Duration::from_millis(1);
    for (wait, expect) in [
        (Some(Duration::from_millis(1500)), "2"),
        (Some(Duration::from_secs(2)), "2"),
        (Some(Duration::from_nanos(2_000_000_001)), "3"),
        (Some(Duration::ZERO), "1"),
        (Some(down), "1"),
        (None, "1"),
    ] {
        *flaky.wait.lock().unwrap() = wait;
        let r = svc.clone().oneshot(req(&[("x-key", "a")])).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&r, "retry-after"), Some(expect), "{wait:?}");
        assert_eq!(body(r).await, pace_tower::UNAVAILABLE_BODY);
    }
    // Six refusals of one outage: one warning (with the wait), the rest DEBUG.
    let ev = capture.take();
    assert_eq!(
        warnings(&ev),
        1,
        "one warning per outage, not one per request: {ev:?}"
    );
    assert_eq!(ev.len(), 6, "{ev:?}");
    assert!(ev[0].2.contains("retry_after_ms=1500"), "{ev:?}");
    assert!(ev[0].2.contains("limit=shared"), "{ev:?}");
    assert!(ev[1..].iter().all(|e| e.0 == Level::DEBUG), "{ev:?}");

    // It decides again: one INFO event, then nothing per admission.
    flaky.down.store(false, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..3 {
        let r = svc.clone().oneshot(req(&[("x-key", "a")])).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let ev = capture.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].0, Level::INFO, "{ev:?}");
    assert!(ev[0].2.contains("decides again"), "{ev:?}");

    // A second outage: a second warning.
    flaky.down.store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..3 {
        let r = svc.clone().oneshot(req(&[("x-key", "a")])).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let ev = capture.take();
    assert_eq!(warnings(&ev), 1, "one warning per outage: {ev:?}");
}
