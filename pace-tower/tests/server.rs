//! `PaceLayer` against a real server on 127.0.0.1: every status, header,
//! extractor and refund rule, on a hand-moved clock.
//!
//! Known-wrong variants these tests catch (`PACE_MUTANT=NAME cargo test -p
//! pace-tower --test server`, as `.ci/suites/15-mutants.sh` runs them):
//! `xff_leftmost` (the forwarding header walked from the left, trusting the
//! client's entries), `v6_full_address` (IPv6 keys not masked to the
//! prefix), `retry_after_truncated` (Retry-After rounded down, 0 for
//! sub-second waits).

mod support;

use std::collections::hash_map::RandomState;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::routing::get;
use axum::Router;
use pace::{IpPrefix, ManualClock, Pace, Rate};
use pace_tower::{
    from_fn, ForwardHeader, ForwardedIp, Header, Limit, Limits, MissingKey, PaceLayer, PeerAddr,
    PeerIp, PeerKey, ResponseHead, MISSING_PEER_ADDR_BODY, TOO_MANY_REQUESTS_BODY,
};
use support::{header, serve, serve_plain, Client};

type P<K> = Pace<K, RandomState, ManualClock>;

fn pace<K>(clock: &ManualClock, rate: Rate, capacity: u64) -> Arc<P<K>> {
    Arc::new(
        Pace::builder(rate)
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

fn per_sec(n: u64) -> Rate {
    Rate::per_second(n).unwrap()
}

/// 200, or 401 when the request says `x-valid: no` (and then marks nothing:
/// the status alone drives the refund predicate).
async fn handler(req: Request) -> (StatusCode, &'static str) {
    if req.headers().get("x-valid").is_some_and(|v| v == "no") {
        (StatusCode::UNAUTHORIZED, "{\"error\":\"invalid_client\"}")
    } else {
        (StatusCode::OK, "ok")
    }
}

fn app<L: Limits, H: pace_tower::Respond<axum::body::Body>>(layer: PaceLayer<L, H>) -> Router {
    Router::new().route("/", get(handler)).layer(layer)
}

fn localhost() -> IpAddr {
    [127, 0, 0, 1].into()
}

#[tokio::test]
async fn admits_then_429_with_retry_after_rounded_up_and_ratelimit_fields() {
    let clock = clock();
    // One token per 2.5 s, capacity 1.
    let p: Arc<P<IpAddr>> = pace(&clock, Rate::new(2, Duration::from_secs(5)).unwrap(), 1);
    let layer = PaceLayer::builder()
        .limit(Limit::new("per-peer", p.clone(), PeerIp::new()))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;

    let r = c.get("/", &[]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"per-peer\";q=1;w=3"));
    // Empty bucket: 2.5 s to full, rounded up.
    assert_eq!(header(&r, "ratelimit"), Some("\"per-peer\";r=0;t=3"));
    assert_eq!(header(&r, "retry-after"), None);
    assert_eq!(p.peek(&localhost()), 0);

    let r = c.get("/", &[]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), Some("3"));
    assert_eq!(header(&r, "ratelimit"), Some("\"per-peer\";r=0;t=3"));
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"per-peer\";q=1;w=3"));
    assert_eq!(r.body().as_ref(), TOO_MANY_REQUESTS_BODY.as_bytes());
    assert_eq!(
        header(&r, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(
        TOO_MANY_REQUESTS_BODY,
        "too many requests; retry after the seconds in Retry-After\n"
    );

    // 100 ms left: rounded up to 1 s, never 0.
    clock.advance(Duration::from_millis(2400));
    let r = c.get("/", &[]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), Some("1"));
    // 1 ns left: still 1.
    clock.advance(Duration::from_nanos(99_999_999));
    let r = c.get("/", &[]).await;
    assert_eq!(header(&r, "retry-after"), Some("1"));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(c.get("/", &[]).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn admitted_responses_carry_remaining_tokens_unless_turned_off() {
    let clock = clock();
    let p: Arc<P<IpAddr>> = pace(&clock, per_sec(4), 4);
    let layer = PaceLayer::builder()
        .limit(Limit::new("peer", p.clone(), PeerIp::new()))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let r = support::get(addr, "/", &[]).await;
    // 3 left; 1 token short of full = 250 ms, rounded up.
    assert_eq!(header(&r, "ratelimit"), Some("\"peer\";r=3;t=1"));
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"peer\";q=4;w=1"));

    let layer = PaceLayer::builder()
        .limit(Limit::new("peer", p.clone(), PeerIp::new()))
        .rate_limit_headers(false)
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let r = support::get(addr, "/", &[]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "ratelimit"), None);
    assert_eq!(header(&r, "ratelimit-policy"), None);
    assert_eq!(p.peek(&localhost()), 2);
}

#[tokio::test]
async fn cost_from_a_closure_and_a_permanent_denial_is_413_without_retry_after() {
    let clock = clock();
    let p: Arc<P<IpAddr>> = pace(&clock, per_sec(10), 10);
    let layer = PaceLayer::builder()
        .limit(Limit::new("peer", p.clone(), PeerIp::new()).cost(|h| {
            h.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        }))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let r = support::get(addr, "/", &[("x-cost", "7")]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(p.peek(&localhost()), 3);
    let r = support::get(addr, "/", &[("x-cost", "11")]).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&r, "retry-after"), None);
    assert_eq!(header(&r, "ratelimit"), None);
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"peer\";q=10;w=1"));
    let r = support::get(addr, "/", &[("x-cost", "4")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // 1 token short at 10/s: 100 ms, rounded up.
    assert_eq!(header(&r, "retry-after"), Some("1"));
    let r = support::get(addr, "/", &[("x-cost", "0")]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(p.peek(&localhost()), 3);
}

#[tokio::test]
async fn a_missing_key_of_a_closure_gets_a_body_naming_the_limit() {
    let clock = clock();
    let p: Arc<P<String>> = pace(&clock, per_sec(2), 2);
    let layer = PaceLayer::builder()
        .limit(Limit::new("tenant", p.clone(), from_fn(|_| None::<String>)))
        .build()
        .unwrap();
    let r = support::get(serve(app(layer)).await, "/", &[]).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        r.body().as_ref(),
        b"the request has no key for the limit \"tenant\"\n"
    );
}

/// What each of axum's layering calls charges (README, "A token endpoint
/// with two limits"): `Router::layer` every request, a 404 too;
/// `Router::route_layer` requests whose path matches a route, so a 404
/// spends nothing but a 405 (the path matched, the method did not) spends;
/// `MethodRouter::route_layer` only the methods routed, neither.
#[tokio::test]
async fn route_layer_charges_matched_routes_only() {
    let clock = clock();
    let p: Arc<P<IpAddr>> = pace(&clock, per_sec(10), 10);
    let layer = PaceLayer::builder()
        .limit(Limit::new("source", p.clone(), PeerIp::new()))
        .build()
        .unwrap();
    // (spent by a GET to an unknown path, spent by a POST to "/")
    async fn spent(app: Router, p: &P<IpAddr>) -> (u64, u64) {
        let addr = serve(app).await;
        let mut c = Client::connect(addr).await;
        let before = p.peek(&localhost());
        assert_eq!(c.get("/nowhere", &[]).await.status(), StatusCode::NOT_FOUND);
        let after_404 = p.peek(&localhost());
        let post = axum::http::Request::post("/")
            .header("host", addr.to_string())
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let r = c.send_req(post).await;
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        let after_405 = p.peek(&localhost());
        assert_eq!(c.get("/", &[]).await.status(), StatusCode::OK);
        assert_eq!(
            p.peek(&localhost()),
            after_405 - 1,
            "a routed request spends"
        );
        (before - after_404, after_404 - after_405)
    }
    let router_layer = Router::new().route("/", get(handler)).layer(layer.clone());
    assert_eq!(spent(router_layer, &p).await, (1, 1));
    clock.advance(Duration::from_secs(1));
    let router_route_layer = Router::new()
        .route("/", get(handler))
        .route_layer(layer.clone());
    assert_eq!(spent(router_route_layer, &p).await, (0, 1));
    clock.advance(Duration::from_secs(1));
    let method_route_layer = Router::new().route("/", get(handler).route_layer(layer));
    assert_eq!(spent(method_route_layer, &p).await, (0, 0));
}

#[tokio::test]
async fn missing_keys_get_400_a_shared_key_or_pass() {
    let clock = clock();
    let name = axum::http::HeaderName::from_static("x-api-key");
    let p: Arc<P<HeaderValue>> = pace(&clock, per_sec(2), 2);
    let reject = PaceLayer::builder()
        .limit(Limit::new("key", p.clone(), Header(name.clone())))
        .build()
        .unwrap();
    let shared = PaceLayer::builder()
        .limit(
            Limit::new("key", p.clone(), Header(name.clone()))
                .missing_key(MissingKey::Shared(HeaderValue::from_static("anonymous"))),
        )
        .build()
        .unwrap();
    let skip = PaceLayer::builder()
        .limit(Limit::new("key", p.clone(), Header(name.clone())).missing_key(MissingKey::Skip))
        .build()
        .unwrap();
    let (a, b, c) = (
        serve(app(reject)).await,
        serve(app(shared)).await,
        serve(app(skip)).await,
    );
    let r = support::get(a, "/", &[]).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        r.body().as_ref(),
        b"the request has no key for the limit \"key\": \
          the `x-api-key` header is missing\n"
    );
    assert_eq!(p.len(), 0, "a rejected keyless request reserves nothing");
    let r = support::get(a, "/", &[("x-api-key", "k1")]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(p.peek(&HeaderValue::from_static("k1")), 1);

    for _ in 0..2 {
        assert_eq!(support::get(b, "/", &[]).await.status(), StatusCode::OK);
    }
    assert_eq!(
        support::get(b, "/", &[]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(p.peek(&HeaderValue::from_static("anonymous")), 0);

    for _ in 0..5 {
        assert_eq!(support::get(c, "/", &[]).await.status(), StatusCode::OK);
    }
    assert_eq!(p.len(), 2);
}

/// The token endpoint's rule: per source never refunded, per claimed client
/// id refunded when the answer is 401 (invalid_client).
#[tokio::test]
async fn a_refund_predicate_returns_the_claimed_ids_pace_but_never_the_sources() {
    let clock = clock();
    let src: Arc<P<IpAddr>> = pace(&clock, per_sec(100), 100);
    let ids: Arc<P<HeaderValue>> = pace(&clock, per_sec(3), 3);
    let layer = PaceLayer::builder()
        .limit(Limit::new("source", src.clone(), PeerIp::new()))
        .limit(
            Limit::new(
                "client",
                ids.clone(),
                Header(axum::http::HeaderName::from_static("x-client-id")),
            )
            .refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;
    for k in 0..10 {
        let r = c
            .get("/", &[("x-client-id", "victim"), ("x-valid", "no")])
            .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        // Refunded before the fields are written: the id is full again.
        assert_eq!(
            header(&r, "ratelimit"),
            Some(&*format!("\"source\";r={};t=1, \"client\";r=3;t=0", 99 - k))
        );
    }
    // Invalid presentations did not spend the id; each spent the source.
    assert_eq!(ids.peek(&HeaderValue::from_static("victim")), 3);
    assert_eq!(ids.len(), 0);
    assert_eq!(src.peek(&localhost()), 90);
    // Valid ones spend both.
    for _ in 0..3 {
        let r = c.get("/", &[("x-client-id", "victim")]).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = c.get("/", &[("x-client-id", "victim")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Every limit as it stands after the answer: the source's debit of
    // this request is refunded (87 left, as below), the client is out.
    assert_eq!(
        header(&r, "ratelimit"),
        Some("\"source\";r=87;t=1, \"client\";r=0;t=1")
    );
    assert_eq!(
        header(&r, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"source\";q=100;w=1, \"client\";q=3;w=1")
    );
    // All or nothing: the denied request's source debit was refunded.
    assert_eq!(src.peek(&localhost()), 87);
}

/// Without refund predicates (nothing kept after admission), three limits
/// stay all or nothing: a denial or a missing key at the second or the
/// third refunds the ones before it, and admitted answers carry one field
/// item per limit, in order.
#[tokio::test]
async fn without_refunds_a_later_stop_refunds_the_earlier_limits() {
    for fields in [true, false] {
        let clock = clock();
        let src: Arc<P<IpAddr>> = pace(&clock, per_sec(100), 100);
        let ids: Arc<P<HeaderValue>> = pace(&clock, per_sec(2), 2);
        let keys: Arc<P<HeaderValue>> = pace(&clock, per_sec(1), 1);
        let layer = PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", src.clone(), PeerIp::new()))
            .limit(Limit::new(
                "client",
                ids.clone(),
                Header(axum::http::HeaderName::from_static("x-client-id")),
            ))
            .limit(Limit::new(
                "key",
                keys.clone(),
                Header(axum::http::HeaderName::from_static("x-api-key")),
            ))
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        let mut c = Client::connect(addr).await;
        let both = [("x-client-id", "a"), ("x-api-key", "k")];
        let r = c.get("/", &both).await;
        assert_eq!(r.status(), StatusCode::OK);
        let want = fields.then_some("\"source\";r=99;t=1, \"client\";r=1;t=1, \"key\";r=0;t=1");
        assert_eq!(header(&r, "ratelimit"), want);
        assert_eq!(
            header(&r, "ratelimit-policy"),
            fields.then_some("\"source\";q=100;w=1, \"client\";q=2;w=1, \"key\";q=1;w=1")
        );
        // The third limit denies: the first two are refunded.
        let r = c.get("/", &both).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        // Each limit after the answer: the first two refunded.
        assert_eq!(
            header(&r, "ratelimit"),
            Some("\"source\";r=99;t=1, \"client\";r=1;t=1, \"key\";r=0;t=1")
        );
        assert_eq!(src.peek(&localhost()), 99);
        assert_eq!(ids.peek(&HeaderValue::from_static("a")), 1);
        // The third key is missing: 400, the first two refunded.
        let r = c.get("/", &[("x-client-id", "a")]).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(src.peek(&localhost()), 99);
        assert_eq!(ids.peek(&HeaderValue::from_static("a")), 1);
        // The second denies (after one more admission on another key):
        // the first is refunded, the third untouched.
        let other = [("x-client-id", "a"), ("x-api-key", "k2")];
        assert_eq!(c.get("/", &other).await.status(), StatusCode::OK);
        let third = [("x-client-id", "a"), ("x-api-key", "k3")];
        let r = c.get("/", &third).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        // The third limit's key k3, never reserved, is full.
        assert_eq!(
            header(&r, "ratelimit"),
            Some("\"source\";r=98;t=1, \"client\";r=0;t=1, \"key\";r=1;t=0")
        );
        assert_eq!(src.peek(&localhost()), 98);
        assert_eq!(keys.peek(&HeaderValue::from_static("k3")), 1);
        assert_eq!(keys.len(), 2);
    }
}

#[tokio::test]
async fn a_spoofed_x_forwarded_for_changes_nothing() {
    let clock = clock();
    let p: Arc<P<IpAddr>> = pace(&clock, per_sec(3), 3);
    let trusted = [
        "127.0.0.1/32".parse().unwrap(),
        "10.0.0.0/8".parse().unwrap(),
    ];
    let layer = PaceLayer::builder()
        .limit(Limit::new("client", p.clone(), ForwardedIp::new(trusted)))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;
    // The client writes a fresh leftmost entry each time; our proxies
    // (10.0.0.5, then the peer 127.0.0.1) append what they saw.
    for i in 0..3 {
        let xff = format!("203.0.113.{i}, 198.51.100.7, 10.0.0.5");
        let r = c.get("/", &[("x-forwarded-for", &xff)]).await;
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
    }
    let r = c
        .get(
            "/",
            &[("x-forwarded-for", "203.0.113.99, 198.51.100.7, 10.0.0.5")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let client: IpAddr = [198, 51, 100, 7].into();
    assert_eq!(p.peek(&client), 0);
    assert_eq!(p.len(), 1, "one key: the rightmost untrusted hop");
    // Repeated header lines are one list, in order.
    let mut req_headers = vec![("x-forwarded-for", "198.51.100.8")];
    req_headers.push(("x-forwarded-for", "10.0.0.5"));
    assert_eq!(c.get("/", &req_headers).await.status(), StatusCode::OK);
    assert_eq!(p.peek(&IpAddr::from([198, 51, 100, 8])), 2);
    // A hop that is not an address before any untrusted one: no key (400).
    let r = c.get("/", &[("x-forwarded-for", "1.2.3.4, unknown")]).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Only proxies: the leftmost is the key.
    assert_eq!(
        c.get("/", &[("x-forwarded-for", "10.9.9.9")])
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(p.peek(&IpAddr::from([10, 9, 9, 9])), 2);
}

#[tokio::test]
async fn forwarding_headers_are_ignored_from_an_untrusted_peer() {
    let clock = clock();
    let p: Arc<P<IpAddr>> = pace(&clock, per_sec(3), 3);
    let layer = PaceLayer::builder()
        .limit(Limit::new(
            "client",
            p.clone(),
            ForwardedIp::new(["10.0.0.0/8".parse().unwrap()]),
        ))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for i in 0..4 {
        let xff = format!("198.51.100.{i}");
        let r = support::get(addr, "/", &[("x-forwarded-for", &xff)]).await;
        let want = if i < 3 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(r.status(), want);
    }
    assert_eq!(p.len(), 1);
    assert_eq!(p.peek(&localhost()), 0);
}

#[tokio::test]
async fn the_forwarded_header_is_walked_the_same_way() {
    let clock = clock();
    let p: Arc<P<IpAddr>> = pace(&clock, per_sec(3), 3);
    let layer = PaceLayer::builder()
        .limit(Limit::new(
            "client",
            p.clone(),
            ForwardedIp::new(["127.0.0.0/8".parse().unwrap()])
                .header(ForwardHeader::Forwarded)
                .v6_prefix(56),
        ))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let fwd = "for=203.0.113.9, for=\"[2001:db8:cafe:12ab::17]:4711\";proto=https, for=127.0.0.2";
    assert_eq!(
        support::get(
            addr,
            "/",
            &[("forwarded", fwd), ("x-forwarded-for", "192.0.2.1")]
        )
        .await
        .status(),
        StatusCode::OK
    );
    let key: IpAddr = "2001:db8:cafe:1200::".parse().unwrap();
    assert_eq!(p.peek(&key), 2);
    assert_eq!(p.len(), 1, "X-Forwarded-For is not read");
}

/// A map_request layer standing in for a non-axum accept loop: it puts the
/// peer address named by `x-test-peer` into a `PeerAddr` extension.
async fn fake_peer(mut req: Request) -> Request {
    if let Some(v) = req.headers().get("x-test-peer") {
        let ip: IpAddr = v.to_str().unwrap().parse().unwrap();
        req.extensions_mut()
            .insert(PeerAddr(SocketAddr::new(ip, 40000)));
    }
    req
}

/// Rotating IPv6 addresses within one /56 share a row and a neighbouring
/// /56 has its own, with either key type of `PeerIp` (`key` names a
/// network as the limiter's key).
async fn rotating_within_one_56<K: PeerKey>(key: impl Fn(&str) -> K) {
    let clock = clock();
    let p: Arc<P<K>> = pace(&clock, per_sec(3), 3);
    let layer = PaceLayer::builder()
        .limit(Limit::new("peer", p.clone(), PeerIp::new()))
        .build()
        .unwrap();
    let app = app(layer).layer(axum::middleware::map_request(fake_peer));
    let addr = serve_plain(app).await;
    let rotating = [
        "2001:db8:aa:bb00::1",
        "2001:db8:aa:bb17:1234:5678:9abc:def0",
        "2001:db8:aa:bbff:ffff:ffff:ffff:ffff",
    ];
    for a in rotating {
        let r = support::get(addr, "/", &[("x-test-peer", a)]).await;
        assert_eq!(r.status(), StatusCode::OK, "{a}");
    }
    let r = support::get(addr, "/", &[("x-test-peer", "2001:db8:aa:bb42::9")]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // The neighbouring /56 is another customer.
    let r = support::get(addr, "/", &[("x-test-peer", "2001:db8:aa:bc00::1")]).await;
    assert_eq!(r.status(), StatusCode::OK);
    // IPv4 keeps the full address; an IPv4-mapped IPv6 peer is its IPv4
    // address.
    for a in ["192.0.2.1", "192.0.2.2", "::ffff:192.0.2.2"] {
        let r = support::get(addr, "/", &[("x-test-peer", a)]).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    assert_eq!(p.len(), 4);
    assert_eq!(p.peek(&key("2001:db8:aa:bb00::")), 0);
    assert_eq!(p.peek(&key("2001:db8:aa:bc00::")), 2);
    assert_eq!(p.peek(&key("192.0.2.2")), 1);
    // No peer address at all: the server records none (a configuration
    // error, not the client's), answered 500 with what to fix.
    let r = support::get(addr, "/", &[]).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.body().as_ref(), MISSING_PEER_ADDR_BODY.as_bytes());
}

#[tokio::test]
async fn rotating_ipv6_addresses_within_one_56_share_one_key() {
    rotating_within_one_56(|a| a.parse::<IpAddr>().unwrap()).await;
}

#[tokio::test]
async fn rotating_ipv6_addresses_within_one_56_share_one_word_key() {
    rotating_within_one_56(|a| match a.parse::<IpAddr>().unwrap() {
        IpAddr::V4(v4) => IpPrefix::from(v4),
        IpAddr::V6(v6) => IpPrefix::v6(v6, 56).unwrap(),
    })
    .await;
}

#[tokio::test]
async fn a_closure_extractor_and_clones_share_their_limits() {
    let clock = clock();
    let p: Arc<P<String>> = pace(&clock, per_sec(2), 2);
    let layer = PaceLayer::builder()
        .limit(Limit::new(
            "path",
            p.clone(),
            from_fn(|h| Some(h.uri.path().to_string())),
        ))
        .build()
        .unwrap();
    // Two servers, one layer cloned: one bucket.
    let a = serve(app(layer.clone())).await;
    let b = serve(app(layer)).await;
    assert_eq!(support::get(a, "/", &[]).await.status(), StatusCode::OK);
    assert_eq!(support::get(b, "/", &[]).await.status(), StatusCode::OK);
    assert_eq!(
        support::get(a, "/", &[]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(p.peek("/"), 0);
}

#[tokio::test]
async fn an_invalid_policy_name_is_a_typed_error() {
    let clock = clock();
    let p: Arc<P<IpAddr>> = pace(&clock, per_sec(2), 2);
    let e = PaceLayer::builder()
        .limit(Limit::new("caf\u{e9}", p, PeerIp::new()))
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        pace_tower::BuildError::InvalidPolicyName(pace_tower::InvalidPolicyName(
            "caf\u{e9}".to_string()
        ))
    );
}

#[tokio::test]
async fn counters_reach_the_metrics_recorder() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let clock = clock();
    let src: Arc<P<IpAddr>> = pace(&clock, per_sec(100), 100);
    let ids: Arc<P<HeaderValue>> = pace(&clock, per_sec(1), 1);
    let layer = metrics::with_local_recorder(&recorder, || {
        PaceLayer::builder()
            .limit(Limit::new("source", src.clone(), PeerIp::new()))
            .limit(
                Limit::new(
                    "client",
                    ids.clone(),
                    Header(axum::http::HeaderName::from_static("x-client-id")),
                )
                .refund_if(|r| r.status == StatusCode::UNAUTHORIZED),
            )
            .build()
            .unwrap()
    });
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;
    c.get("/", &[("x-client-id", "a"), ("x-valid", "no")]).await; // admitted, refunded
    c.get("/", &[("x-client-id", "a")]).await; // admitted
    c.get("/", &[("x-client-id", "a")]).await; // denied: exhausted
    c.get("/", &[]).await; // missing key
    let snap = snapshotter.snapshot().into_vec();
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<&DebugValue> {
        snap.iter()
            .find(|(k, _, _, _)| {
                k.key().name() == name
                    && labels.iter().all(|(l, v)| {
                        k.key()
                            .labels()
                            .any(|kl| kl.key() == *l && kl.value() == *v)
                    })
            })
            .map(|(_, _, _, v)| v)
    };
    let counter = |name: &str, labels: &[(&str, &str)]| match value(name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name} {labels:?}: {other:?}"),
    };
    assert_eq!(counter("pace_admitted_total", &[("limit", "source")]), 2);
    assert_eq!(counter("pace_admitted_total", &[("limit", "client")]), 2);
    assert_eq!(counter("pace_refunded_total", &[("limit", "client")]), 1);
    assert_eq!(counter("pace_refunded_total", &[("limit", "source")]), 0);
    assert_eq!(
        counter(
            "pace_denied_total",
            &[("limit", "client"), ("reason", "exhausted")]
        ),
        1
    );
    assert_eq!(
        counter(
            "pace_denied_total",
            &[("limit", "client"), ("reason", "missing_key")]
        ),
        1
    );
    match value("pace_rows", &[("limit", "client")]) {
        Some(DebugValue::Gauge(g)) => assert_eq!(g.into_inner(), 1.0),
        other => panic!("pace_rows: {other:?}"),
    }
}

/// `problem_details()`: the same answers with an RFC 9457 body.
#[tokio::test]
async fn problem_details_answer_in_application_problem_json() {
    let clock = clock();
    // One token per 2.5 s, capacity 1.
    let p: Arc<P<IpAddr>> = pace(&clock, Rate::new(2, Duration::from_secs(5)).unwrap(), 1);
    let layer = PaceLayer::builder()
        .limit(Limit::new(
            "tenant",
            pace(&clock, per_sec(10), 10),
            Header(axum::http::HeaderName::from_static("x-tenant")),
        ))
        .limit(Limit::new("per-peer", p.clone(), PeerIp::new()))
        .problem_details()
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let mut c = Client::connect(addr).await;
    let tenant = [("x-tenant", "t")];
    assert_eq!(c.get("/", &tenant).await.status(), StatusCode::OK);
    let r = c.get("/", &tenant).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    assert_eq!(header(&r, "retry-after"), Some("3"));
    assert_eq!(
        std::str::from_utf8(r.body()).unwrap(),
        r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"too many requests; retry after the seconds in Retry-After","limit":"per-peer","retry_after":3,"retry_after_ms":2500}"#
    );
    // Without a key: 400, the detail names the header.
    let r = c.get("/", &[]).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        std::str::from_utf8(r.body()).unwrap(),
        r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"the request has no key for the limit \"tenant\": the `x-tenant` header is missing","limit":"tenant"}"#
    );
}
