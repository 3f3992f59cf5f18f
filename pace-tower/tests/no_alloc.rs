//! What `PaceLayer` allocates per admitted request, counted by a global
//! allocator: nothing with the fields off; with them on, the `RateLimit`
//! value and the response's header map (empty until the layer writes it).
//! A limit the layer may refund (a refund predicate, or a limit after it)
//! is held (`pace::Pace::hold_n`), and a hold may allocate the core's
//! held record of the row: one per hold when no other hold of the key
//! overlaps it, unless the thread's pool of freed records has one (which
//! depends on when the epoch freed earlier records, so those counts are
//! bounds); keeping it makes the row plain again and allocates nothing.

use std::convert::Infallible;
use std::future::ready;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::{HeaderName, Request, Response, StatusCode};
use pace::{Pace, Rate};
use pace_tower::{Header, Limit, PaceLayer, PeerIp, ResponseHead};
use tower::{Layer, Service};

mod counting;

use counting::allocs;

fn request() -> Request<()> {
    let mut r = Request::builder()
        .uri("/")
        // Static, as hyper's are shared: cloning the key allocates nothing
        // (cloning a value made from a `&str` allocates its shared buffer).
        .header("x-client-id", http::HeaderValue::from_static("client-7"))
        .body(())
        .unwrap();
    r.extensions_mut().insert(ConnectInfo(SocketAddr::new(
        IpAddr::from([192, 0, 2, 7]),
        40000,
    )));
    r
}

fn inner(
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_: Request<()>| ready(Ok::<_, Infallible>(Response::new(String::new()))))
}

#[test]
fn an_admitted_request_allocates_nothing_in_the_layer() {
    let source: Arc<Pace<IpAddr>> = Arc::new(Pace::new(Rate::per_second(1000).unwrap()));
    let client: Arc<Pace<http::HeaderValue>> = Arc::new(Pace::new(Rate::per_second(1000).unwrap()));
    let mut bare = inner();
    let (base, r) = allocs(&mut bare, request());
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(base, 0, "the inner service allocates nothing");

    let layer = |fields: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", source.clone(), PeerIp::new()))
            .limit(
                Limit::new(
                    "client",
                    client.clone(),
                    Header(HeaderName::from_static("x-client-id")),
                )
                .refund_if(|r: &ResponseHead<'_>| r.status == StatusCode::UNAUTHORIZED),
            )
            .build()
            .unwrap()
    };
    let mut plain = layer(false).layer(inner());
    let mut fields = layer(true).layer(inner());
    // The first requests write the keys' rows (the core allocates an entry
    // per new row of a key that is not word-sized).
    allocs(&mut plain, request());
    allocs(&mut fields, request());
    // Both limits hold (the second has a refund predicate, the first is
    // followed by a limit that may refuse): one held record each.
    for _ in 0..3 {
        let (n, r) = allocs(&mut plain, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers().len(), 0);
        assert!(n <= 2, "fields off: at most the two held records, not {n}");

        let (n, r) = allocs(&mut fields, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers().len(), 2);
        // The RateLimit value's bytes; the header map's indices and entries.
        assert!(
            (3..=5).contains(&n),
            "fields on: the value, the map and at most the held records, not {n}"
        );
    }
}

/// The same without a refund predicate: nothing of a request is kept after
/// its admission (no state in the response future). The first limit holds
/// (the second may refuse, which refunds it): one held record; a single
/// limit without a refund predicate is reserved plainly and allocates
/// nothing, as does a first limit whose exact refunds are given up
/// (`Limit::exact_refunds(false)`).
#[test]
fn an_admitted_request_without_refunds_allocates_nothing_in_the_layer() {
    let source: Arc<Pace<IpAddr>> = Arc::new(Pace::new(Rate::per_second(1000).unwrap()));
    let client: Arc<Pace<http::HeaderValue>> = Arc::new(Pace::new(Rate::per_second(1000).unwrap()));
    let layer = |fields: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", source.clone(), PeerIp::new()))
            .limit(Limit::new(
                "client",
                client.clone(),
                Header(HeaderName::from_static("x-client-id")),
            ))
            .build()
            .unwrap()
    };
    let mut plain = layer(false).layer(inner());
    let mut fields = layer(true).layer(inner());
    allocs(&mut plain, request());
    allocs(&mut fields, request());
    for _ in 0..3 {
        let (n, r) = allocs(&mut plain, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers().len(), 0);
        assert!(
            n <= 1,
            "fields off: at most the first limit's held record, not {n}"
        );

        let (n, r) = allocs(&mut fields, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers().len(), 2);
        assert!(
            (3..=4).contains(&n),
            "fields on: the value, the map and at most the held record, not {n}"
        );
    }
    // The first limit's exact refunds given up: reserved plainly, nothing
    // allocated.
    let inexact = |fields: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", source.clone(), PeerIp::new()).exact_refunds(false))
            .limit(Limit::new(
                "client",
                client.clone(),
                Header(HeaderName::from_static("x-client-id")),
            ))
            .build()
            .unwrap()
    };
    let mut plain = inexact(false).layer(inner());
    let mut fields = inexact(true).layer(inner());
    for _ in 0..3 {
        let (n, r) = allocs(&mut plain, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(n, 0, "exact_refunds(false), fields off: no allocation");

        let (n, r) = allocs(&mut fields, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            n, 3,
            "exact_refunds(false), fields on: the value and the map"
        );
    }
    let one = |fields: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", source.clone(), PeerIp::new()))
            .build()
            .unwrap()
    };
    let mut plain = one(false).layer(inner());
    let mut fields = one(true).layer(inner());
    for _ in 0..3 {
        let (n, r) = allocs(&mut plain, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(n, 0, "one plain limit, fields off: no allocation");

        let (n, r) = allocs(&mut fields, request());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers().len(), 2);
        assert_eq!(n, 3, "one plain limit, fields on: the value and the map");
    }
}

#[test]
fn a_request_with_its_own_quota_allocates_nothing_more_in_the_layer() {
    let default = Rate::per_second(1000).unwrap();
    let client: Arc<Pace<http::HeaderValue>> = Arc::new(Pace::new(default));
    let same = pace::Quota::of(default).unwrap();
    let paid = pace::Quota::per_second(5000).unwrap();
    // `x-plan: same` is the limiter's default quota given per request;
    // `x-plan: paid` another one; no `x-plan`, the default.
    let plan = move |h: &pace_tower::RequestHead<'_>| match h.headers.get("x-plan")?.as_bytes() {
        b"paid" => Some(paid),
        _ => Some(same),
    };
    let layer = |fields: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(
                Limit::new(
                    "client",
                    client.clone(),
                    Header(HeaderName::from_static("x-client-id")),
                )
                .quota(plan),
            )
            .build()
            .unwrap()
    };
    let with = |plan: &'static str| {
        let mut r = request();
        r.headers_mut()
            .insert("x-plan", http::HeaderValue::from_static(plan));
        r
    };
    let mut plain = layer(false).layer(inner());
    let mut fields = layer(true).layer(inner());
    allocs(&mut plain, request());
    allocs(&mut fields, request());
    for _ in 0..3 {
        for r in [request(), with("same"), with("paid")] {
            let (n, r) = allocs(&mut plain, r);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(n, 0, "fields off: no allocation, whatever the quota");
        }
        for r in [request(), with("same")] {
            let (n, r) = allocs(&mut fields, r);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.headers().len(), 2);
            assert_eq!(n, 3, "fields on, the layer's quota: the value and the map");
        }
    }
}
