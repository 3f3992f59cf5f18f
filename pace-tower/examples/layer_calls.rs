//! Drives one layer with ready requests, for instruction counts:
//!
//! ```sh
//! cargo build --release -p pace-tower --example layer_calls
//! valgrind --tool=callgrind target/release/examples/layer_calls pace 1 fields 100000
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```
//!
//! Arguments: `pace`, `governor` or `bare` (the inner service alone); `1`
//! (per peer IP) or `2` (per peer IP + per client id); `fields` (pace's
//! `RateLimit` fields, tower_governor's `use_headers()`) or `plain`; the
//! number of requests (with 2 limits, for `pace` and `mix`, `refund-fields` and
//! `refund-plain` add `refund_if` on the client id's limit, as the bench's
//! `2/refund/..`; `inexact-` before either gives up the source limit's
//! exact refunds, as its `exact-client`); `mix` instead of the layer's name runs the bare
//! service, `PaceLayer` and `GovernorLayer` in alternating slices of 32
//! requests, as `benches/layer.rs` does (`mix-churn`: one limit, no
//! fields, every peer's bucket full again at its next request, as the
//! bench's `1/plain/churn`; `mix-addr`: the same as `mix` with the
//! source limit keyed by `IpAddr`, boxed, rather than `IpPrefix`; with two
//! limits, `inexact-plain` and `inexact-fields` give up the source limit's
//! exact refunds, so that it is reserved plainly rather than held), each
//! through a function of its own that is never inlined (`via_bare`,
//! `via_pace`, `via_governor`; `docs/bench/layer_calls.sh` subtracts them
//! over two runs). The requests are those of
//! `benches/layer.rs` (1024 peer addresses, 1000 client ids, every request
//! admitted); the limits are 1 a second with bursts of 10^6, so that every
//! key's bucket stays partly drained however slowly the program runs (under
//! valgrind), as in the bench. Requests are built in slices of 32 outside
//! the calls; each is one `poll_ready`, one `call` and one poll of the
//! response future, which is ready at once.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, Response, StatusCode};
use pace::{IpPrefix, Pace, Rate};
use pace_tower::{from_fn, Limit, PaceLayer, PeerIp, PeerKey};
use tower::{Layer, Service};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, PeerIpKeyExtractor};
use tower_governor::{GovernorError, GovernorLayer};

const PEERS: u64 = 1024;
const CLIENTS: u64 = 1000;

pub fn request(i: u64) -> Request<Body> {
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

fn inner(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_req: Request<Body>| async { Ok(Response::new(Body::empty())) })
}

pub fn client_id(h: &HeaderMap) -> Option<String> {
    h.get("x-client-id")?.to_str().ok().map(str::to_string)
}

#[derive(Clone)]
pub struct ClientIdKey;

impl KeyExtractor for ClientIdKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        client_id(req.headers()).ok_or(GovernorError::UnableToExtractKey)
    }
}

/// Requests are built in slices of this many, outside the calls.
const SLICE: u64 = 32;

fn run<S>(mut svc: S, n: u64)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut ok = 0u64;
    let mut reqs = Vec::with_capacity(SLICE as usize);
    let mut done = 0;
    while done < n {
        reqs.extend((done..n.min(done + SLICE)).map(request));
        done += reqs.len() as u64;
        for req in reqs.drain(..) {
            ok += u64::from(step(&mut svc, req));
        }
    }
    assert_eq!(ok, n, "every request admitted");
}

/// One request through `svc` (ready at once), its response dropped: true
/// when it is 200. Never inlined, so that callgrind attributes everything
/// a request costs (the call, the poll, the response and its drop) to it
/// (`callgrind_annotate --inclusive=yes`: `layer_calls::step`, minus the
/// inner service's `ServiceFn::call`, minus the same for `bare`).
#[inline(never)]
fn step<S>(svc: &mut S, req: Request<Body>) -> bool
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let resp = once(svc, req);
    let ok = resp.status() == StatusCode::OK;
    black_box(resp);
    ok
}

/// One request through `svc`, ready at once.
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

/// [`once`] through the bare service, `PaceLayer` and `GovernorLayer` in
/// `mix`: three functions never inlined, so that callgrind counts each
/// apart (`callgrind_annotate --inclusive=yes`: `via_pace` minus
/// `via_bare` is what the layer adds to a request).
#[inline(never)]
fn via_bare<S>(svc: &mut S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    once(svc, req)
}

/// See [`via_bare`].
#[inline(never)]
fn via_pace<S>(svc: &mut S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    once(svc, req)
}

/// See [`via_bare`].
#[inline(never)]
fn via_governor<S>(svc: &mut S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    once(svc, req)
}

type Call<'a> = &'a mut dyn FnMut(Request<Body>) -> Response<Body>;

/// `n` requests through each of `svcs`, in slices of [`SLICE`] that
/// alternate between them, as `benches/layer.rs` times them.
fn mix(svcs: &mut [Call<'_>], n: u64) {
    let mut reqs = Vec::with_capacity(SLICE as usize);
    let mut done = 0;
    while done < n {
        let m = SLICE.min(n - done);
        for svc in svcs.iter_mut() {
            reqs.extend((done..done + m).map(request));
            for req in reqs.drain(..) {
                let resp = svc(req);
                assert_eq!(resp.status(), StatusCode::OK);
                black_box(resp);
            }
        }
        done += m;
    }
}

pub fn live<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>() -> Arc<Pace<K>> {
    Arc::new(
        Pace::builder(Rate::per_second(1).unwrap())
            .capacity(1_000_000)
            .build()
            .unwrap(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map_or("pace", String::as_str);
    let limits: u32 = args.get(1).map_or(1, |s| s.parse().unwrap());
    let mode = args.get(2).map_or("fields", String::as_str);
    let fields = mode.ends_with("fields");
    let refund = mode.contains("refund");
    let exact_source = !mode.starts_with("inexact-");
    let n: u64 = args.get(3).map_or(100_000, |s| s.parse().unwrap());
    let gov = || {
        let mut b = GovernorConfigBuilder::default();
        b.per_second(1).burst_size(1_000_000);
        b
    };
    if which == "mix" {
        return mix_all::<IpPrefix>(limits, fields, exact_source, refund, n);
    }
    if which == "mix-addr" {
        return mix_all::<IpAddr>(limits, fields, exact_source, refund, n);
    }
    if which == "mix-churn" {
        return mix_churn(n);
    }
    match (which, limits, fields) {
        ("bare", _, _) => run(inner(), n),
        ("pace", 1, _) => run(
            PaceLayer::builder()
                .rate_limit_headers(fields)
                .limit(Limit::new("source", live::<IpPrefix>(), PeerIp::new()))
                .build()
                .unwrap()
                .layer(inner()),
            n,
        ),
        ("pace", 2, _) if refund => run(
            PaceLayer::builder()
                .rate_limit_headers(fields)
                .limit(
                    Limit::new("source", live::<IpPrefix>(), PeerIp::new())
                        .exact_refunds(exact_source),
                )
                .limit(
                    Limit::new(
                        "client",
                        live::<String>(),
                        from_fn(|h| client_id(h.headers)),
                    )
                    .refund_if(|r| r.status == StatusCode::UNAUTHORIZED),
                )
                .build()
                .unwrap()
                .layer(inner()),
            n,
        ),
        ("pace", 2, _) => run(
            PaceLayer::builder()
                .rate_limit_headers(fields)
                .limit(
                    Limit::new("source", live::<IpPrefix>(), PeerIp::new())
                        .exact_refunds(exact_source),
                )
                .limit(Limit::new(
                    "client",
                    live::<String>(),
                    from_fn(|h| client_id(h.headers)),
                ))
                .build()
                .unwrap()
                .layer(inner()),
            n,
        ),
        ("governor", 1, false) => run(
            GovernorLayer::new(gov().key_extractor(PeerIpKeyExtractor).finish().unwrap())
                .layer(inner()),
            n,
        ),
        ("governor", 1, true) => run(
            GovernorLayer::new(
                gov()
                    .key_extractor(PeerIpKeyExtractor)
                    .use_headers()
                    .finish()
                    .unwrap(),
            )
            .layer(inner()),
            n,
        ),
        ("governor", 2, false) => run(
            GovernorLayer::new(gov().key_extractor(PeerIpKeyExtractor).finish().unwrap()).layer(
                GovernorLayer::new(gov().key_extractor(ClientIdKey).finish().unwrap())
                    .layer(inner()),
            ),
            n,
        ),
        ("governor", 2, true) => run(
            GovernorLayer::new(
                gov()
                    .key_extractor(PeerIpKeyExtractor)
                    .use_headers()
                    .finish()
                    .unwrap(),
            )
            .layer(
                GovernorLayer::new(
                    gov()
                        .key_extractor(ClientIdKey)
                        .use_headers()
                        .finish()
                        .unwrap(),
                )
                .layer(inner()),
            ),
            n,
        ),
        _ => panic!("usage: layer_calls pace|governor|bare 1|2 fields|plain N"),
    }
}

/// `mix-churn`: one limit per peer address, no fields, as `benches/layer.rs`'
/// `1/plain/churn`: 1,000,000 tokens a second, a capacity of 2,000,000, so
/// that a peer's bucket is full again long before its next request (under
/// valgrind too) and pace finds no row, or a full one, each time.
fn mix_churn(n: u64) {
    let mut bare = inner();
    let churn = Arc::new(
        Pace::<IpPrefix>::builder(Rate::per_second(1_000_000).unwrap())
            .capacity(2_000_000)
            .build()
            .unwrap(),
    );
    let mut p = PaceLayer::builder()
        .rate_limit_headers(false)
        .limit(Limit::new("source", churn, PeerIp::new()))
        .build()
        .unwrap()
        .layer(inner());
    let mut g = GovernorLayer::new(
        GovernorConfigBuilder::default()
            .per_nanosecond(1000)
            .burst_size(2_000_000)
            .key_extractor(PeerIpKeyExtractor)
            .finish()
            .unwrap(),
    )
    .layer(inner());
    let mut f0 = |r| via_bare(&mut bare, r);
    let mut f1 = |r| via_pace(&mut p, r);
    let mut f2 = |r| via_governor(&mut g, r);
    mix(&mut [&mut f0, &mut f1, &mut f2], n);
}

/// `mix`: bare, pace and governor interleaved; the source limit's key type
/// is `K` (`IpPrefix` for `mix`, `IpAddr` for `mix-addr`).
fn mix_all<K: PeerKey>(limits: u32, fields: bool, exact_source: bool, refund: bool, n: u64) {
    let gov = || {
        let mut b = GovernorConfigBuilder::default();
        b.per_second(1).burst_size(1_000_000);
        b
    };
    // bare, pace and governor interleaved (`limits` and `fields` as
    // for the others).
    let mut bare = inner();
    let p = PaceLayer::builder()
        .rate_limit_headers(fields)
        .limit(Limit::new("source", live::<K>(), PeerIp::new()).exact_refunds(exact_source));
    let mut f0 = |r| via_bare(&mut bare, r);
    if limits == 1 {
        let mut p = p.build().unwrap().layer(inner());
        let mut f1 = |r| via_pace(&mut p, r);
        if fields {
            let mut g = GovernorLayer::new(
                gov()
                    .key_extractor(PeerIpKeyExtractor)
                    .use_headers()
                    .finish()
                    .unwrap(),
            )
            .layer(inner());
            let mut f2 = |r| via_governor(&mut g, r);
            mix(&mut [&mut f0, &mut f1, &mut f2], n);
        } else {
            let mut g =
                GovernorLayer::new(gov().key_extractor(PeerIpKeyExtractor).finish().unwrap())
                    .layer(inner());
            let mut f2 = |r| via_governor(&mut g, r);
            mix(&mut [&mut f0, &mut f1, &mut f2], n);
        }
    } else {
        let mut p = p
            .limit({
                let client = Limit::new(
                    "client",
                    live::<String>(),
                    from_fn(|h| client_id(h.headers)),
                );
                if refund {
                    client.refund_if(|r| r.status == StatusCode::UNAUTHORIZED)
                } else {
                    client
                }
            })
            .build()
            .unwrap()
            .layer(inner());
        let mut f1 = |r| via_pace(&mut p, r);
        if fields {
            let mut g = GovernorLayer::new(
                gov()
                    .key_extractor(PeerIpKeyExtractor)
                    .use_headers()
                    .finish()
                    .unwrap(),
            )
            .layer(
                GovernorLayer::new(
                    gov()
                        .key_extractor(ClientIdKey)
                        .use_headers()
                        .finish()
                        .unwrap(),
                )
                .layer(inner()),
            );
            let mut f2 = |r| via_governor(&mut g, r);
            mix(&mut [&mut f0, &mut f1, &mut f2], n);
        } else {
            let mut g =
                GovernorLayer::new(gov().key_extractor(PeerIpKeyExtractor).finish().unwrap())
                    .layer(
                        GovernorLayer::new(gov().key_extractor(ClientIdKey).finish().unwrap())
                            .layer(inner()),
                    );
            let mut f2 = |r| via_governor(&mut g, r);
            mix(&mut [&mut f0, &mut f1, &mut f2], n);
        }
    }
}
