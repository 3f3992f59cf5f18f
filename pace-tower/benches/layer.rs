//! In-process cost of the layer per admitted request: `PaceLayer` against
//! tower_governor's `GovernorLayer`, in the same process, on the same
//! requests and the same inner service.
//!
//! ```sh
//! nice -n 10 cargo bench -p pace-tower --bench layer
//! ```
//!
//! Each request is one call of the service with a prepared request (built
//! outside the timing) and its response future polled to completion
//! (every future here is ready at once). Each criterion sample runs the
//! bare inner service, `PaceLayer` and `GovernorLayer` in alternating
//! slices of 32 requests, so the three meet the same machine load; criterion
//! reports `pace/<case>` and `governor/<case>`, and after each pair the
//! bench prints the sums over all its samples: ns per request of bare, pace
//! and governor, each layer's own cost (minus bare) and their ratio.
//! Every request is admitted, keys rotate over 1024 peer addresses and 1000
//! client ids, and every key's bucket stays partly drained (rows live);
//! `../churn` is the opposite case, where every request finds its key's
//! bucket full again (see `layers` below).
//!
//! Pairs compared (comparable headers):
//! * `pace/1/fields` vs `governor/1/headers`: one limit per peer IP, the
//!   `RateLimit` / `RateLimit-Policy` fields vs tower_governor's
//!   `use_headers()` (`x-ratelimit-limit`, `x-ratelimit-remaining`);
//! * `pace/1/plain` vs `governor/1/plain`: no fields on admitted responses;
//! * `pace/2/..` vs `governor/2/..`: per peer IP and per client id (a
//!   `String` from `x-client-id`), one `PaceLayer` against two
//!   `GovernorLayer`s;
//! * `pace/2/refund/..` vs `governor/2/..`: the same two limits, the
//!   client id's refunded when the answer is 401 (`refund_if`; every answer
//!   here is 200, so every request keeps it): the token endpoint's layer.
//!   tower_governor has no refunds: the pair measures what the refund path
//!   (the state kept until the response, the holds and their keeps) costs
//!   over the same two limits;
//! * `pace/../exact-client` vs `governor/2/..`: as `2/plain` and
//!   `2/refund/fields` with the source limit's exact refunds given up
//!   (`Limit::exact_refunds(false)`: reserved plainly, not held): what the
//!   holds of a limit that is not last cost.
//!
//! On a shared machine the figures move between runs: run it several times
//! and compare ranges (`uptime` before and after).

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use pace::{Builder, IpPrefix, Pace, Rate};
use pace_tower::{from_fn, Limit, PaceLayer, PeerIp};
use tower::{Layer, Service};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, PeerIpKeyExtractor};
use tower_governor::{GovernorError, GovernorLayer};

const PEERS: u64 = 1024;
const CLIENTS: u64 = 1000;

fn request(i: u64) -> Request<Body> {
    let ip = IpAddr::from([10, 0, (i % PEERS / 256) as u8, (i % 256) as u8]);
    let mut r = Request::builder()
        .uri("/token")
        .header("x-client-id", format!("client-{}", i % CLIENTS))
        .body(Body::empty())
        .unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip, 40000)));
    r
}

/// The inner service: an empty 200.
fn inner(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_req: Request<Body>| async { Ok(Response::new(Body::empty())) })
}

/// Calls `svc` once and polls the answer to completion.
fn once<S>(svc: &mut S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    match svc.poll_ready(&mut cx) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => unreachable!("always ready"),
    }
    let mut fut = pin!(svc.call(req));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => unreachable!("ready at once"),
    }
}

fn client_id(h: &axum::http::HeaderMap) -> Option<String> {
    h.get("x-client-id")?.to_str().ok().map(str::to_string)
}

#[derive(Clone)]
struct ClientIdKey;

impl KeyExtractor for ClientIdKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        client_id(req.headers()).ok_or(GovernorError::UnableToExtractKey)
    }
}

type Call<'a> = &'a mut dyn FnMut(Request<Body>) -> Response<Body>;

/// Requests per slice: each slice times this many calls of one variant.
const SLICE: u64 = 32;

/// Runs `iters` requests through each of `svcs`, in slices of [`SLICE`]
/// that alternate between them (the order rotating slice by slice), so
/// that all of them meet the same machine load; returns each one's time.
/// Requests are built, and responses dropped, outside the timed spans.
fn interleaved(iters: u64, svcs: &mut [Call<'_>], next: &mut u64) -> Vec<Duration> {
    let mut spent = vec![Duration::ZERO; svcs.len()];
    let mut done = 0;
    let mut reqs = Vec::with_capacity(SLICE as usize);
    let mut outs = Vec::with_capacity(SLICE as usize);
    let mut turn = 0;
    while done < iters {
        let n = SLICE.min(iters - done);
        for k in 0..svcs.len() {
            let v = (turn + k) % svcs.len();
            reqs.extend((0..n).map(|j| request(*next + j)));
            let t = Instant::now();
            for r in reqs.drain(..) {
                outs.push(black_box((svcs[v])(r)));
            }
            spent[v] += t.elapsed();
            outs.clear();
        }
        *next += n;
        done += n;
        turn += 1;
    }
    spent
}

/// Sums over every sample of a pair: bare, pace, governor.
#[derive(Default)]
struct Totals {
    ns: [u128; 3],
    requests: u64,
}

/// Benchmarks `pace` and `governor` (criterion's figures for
/// `pace/<label>` and `governor/<label>`), each sample timing the bare
/// inner service, pace and governor interleaved; then prints the sums:
/// ns per request of each and of each layer alone (minus bare).
fn pair<A, B>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    label: &str,
    mut pace: A,
    mut gov: B,
) where
    A: Service<Request<Body>, Response = Response<Body>>,
    A::Error: std::fmt::Debug,
    B: Service<Request<Body>, Response = Response<Body>>,
    B::Error: std::fmt::Debug,
{
    let mut bare = inner();
    // Every variant admits and answers 200.
    for i in 0..4 {
        assert_eq!(once(&mut pace, request(i)).status(), StatusCode::OK);
        assert_eq!(once(&mut gov, request(i)).status(), StatusCode::OK);
    }
    let mut next = 0u64;
    let mut totals = Totals::default();
    for (which, name) in [(1, "pace"), (2, "governor")] {
        g.bench_function(format!("{name}/{label}"), |b| {
            b.iter_custom(|iters| {
                let mut f0 = |r| once(&mut bare, r);
                let mut f1 = |r| once(&mut pace, r);
                let mut f2 = |r| once(&mut gov, r);
                let spent = interleaved(iters, &mut [&mut f0, &mut f1, &mut f2], &mut next);
                for (t, s) in totals.ns.iter_mut().zip(&spent) {
                    *t += s.as_nanos();
                }
                totals.requests += iters;
                spent[which]
            })
        });
    }
    if totals.requests == 0 {
        return; // filtered out
    }
    let per = |k: usize| totals.ns[k] as f64 / totals.requests as f64;
    let (b, p, q) = (per(0), per(1), per(2));
    println!(
        "pair {label}: {} requests each, interleaved; ns/request: bare {b:.0}, pace {p:.0}, \
         governor {q:.0}; layer alone: pace {:.0}, governor {:.0}, pace/governor {:.2}",
        totals.requests,
        p - b,
        q - b,
        (p - b) / (q - b)
    );
}

fn layers(c: &mut Criterion) {
    // Per source 100/s, burst 1e6; per client id 100/s, burst 1e6. At the
    // ~1e6 requests/s of this loop each of the 1024 peers (1000 ids) is
    // visited ~1000 times a second, so no bucket refills between visits
    // (every row stays live) and none runs dry within the run: every
    // request is admitted.
    fn live<K>() -> Arc<Pace<K>> {
        let b: Builder<K> = Pace::builder(Rate::per_second(100).unwrap());
        Arc::new(b.capacity(1_000_000).build().unwrap())
    }
    let per_source = live::<IpPrefix>;
    let per_client = live::<String>;
    let gov = || {
        let mut b = GovernorConfigBuilder::default();
        b.per_millisecond(10).burst_size(1_000_000);
        b
    };
    let gov_source = || gov().key_extractor(PeerIpKeyExtractor).finish().unwrap();
    let gov_client = || gov().key_extractor(ClientIdKey).finish().unwrap();
    let gov_source_h = || {
        gov()
            .key_extractor(PeerIpKeyExtractor)
            .use_headers()
            .finish()
            .unwrap()
    };
    let gov_client_h = || {
        gov()
            .key_extractor(ClientIdKey)
            .use_headers()
            .finish()
            .unwrap()
    };
    let pace1 = |fields: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", per_source(), PeerIp::new()))
            .build()
            .unwrap()
    };
    let pace2 = |fields: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", per_source(), PeerIp::new()))
            .limit(Limit::new(
                "client",
                per_client(),
                from_fn(|h| client_id(h.headers)),
            ))
            .build()
            .unwrap()
    };

    let pace2_refund = |fields: bool, exact_source: bool| {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", per_source(), PeerIp::new()).exact_refunds(exact_source))
            .limit(
                Limit::new("client", per_client(), from_fn(|h| client_id(h.headers)))
                    .refund_if(|r| r.status == StatusCode::UNAUTHORIZED),
            )
            .build()
            .unwrap()
    };

    let mut g = c.benchmark_group("layer");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    pair(
        &mut g,
        "1/fields",
        pace1(true).layer(inner()),
        GovernorLayer::new(gov_source_h()).layer(inner()),
    );
    pair(
        &mut g,
        "1/plain",
        pace1(false).layer(inner()),
        GovernorLayer::new(gov_source()).layer(inner()),
    );
    pair(
        &mut g,
        "2/fields",
        pace2(true).layer(inner()),
        GovernorLayer::new(gov_source_h()).layer(GovernorLayer::new(gov_client_h()).layer(inner())),
    );
    pair(
        &mut g,
        "2/plain",
        pace2(false).layer(inner()),
        GovernorLayer::new(gov_source()).layer(GovernorLayer::new(gov_client()).layer(inner())),
    );
    pair(
        &mut g,
        "2/refund/fields",
        pace2_refund(true, true).layer(inner()),
        GovernorLayer::new(gov_source_h()).layer(GovernorLayer::new(gov_client_h()).layer(inner())),
    );
    pair(
        &mut g,
        "2/refund/plain",
        pace2_refund(false, true).layer(inner()),
        GovernorLayer::new(gov_source()).layer(GovernorLayer::new(gov_client()).layer(inner())),
    );
    pair(
        &mut g,
        "2/plain/exact-client",
        PaceLayer::builder()
            .rate_limit_headers(false)
            .limit(Limit::new("source", per_source(), PeerIp::new()).exact_refunds(false))
            .limit(Limit::new(
                "client",
                per_client(),
                from_fn(|h| client_id(h.headers)),
            ))
            .build()
            .unwrap()
            .layer(inner()),
        GovernorLayer::new(gov_source()).layer(GovernorLayer::new(gov_client()).layer(inner())),
    );
    pair(
        &mut g,
        "2/refund/fields/exact-client",
        pace2_refund(true, false).layer(inner()),
        GovernorLayer::new(gov_source_h()).layer(GovernorLayer::new(gov_client_h()).layer(inner())),
    );
    // Churn: 1e6/s per source, burst 2e6 (examples/loadgen.rs's numbers):
    // a peer's bucket is full again long before its next visit, so pace
    // finds no row (or a full one) and writes a new one each time, and its
    // sweeps remove them; governor keeps every key's state.
    let churn = Arc::new(
        Pace::<IpPrefix>::builder(Rate::per_second(1_000_000).unwrap())
            .capacity(2_000_000)
            .build()
            .unwrap(),
    );
    let churn = PaceLayer::builder()
        .rate_limit_headers(false)
        .limit(Limit::new("source", churn, PeerIp::new()))
        .build()
        .unwrap();
    let gov_churn = GovernorConfigBuilder::default()
        .per_nanosecond(1000)
        .burst_size(2_000_000)
        .key_extractor(PeerIpKeyExtractor)
        .finish()
        .unwrap();
    pair(
        &mut g,
        "1/plain/churn",
        churn.layer(inner()),
        GovernorLayer::new(gov_churn).layer(inner()),
    );
    g.finish();
}

criterion_group!(benches, layers);
criterion_main!(benches);
