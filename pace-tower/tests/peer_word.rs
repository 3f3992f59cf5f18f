//! A peer-address limit keyed by `pace::IpPrefix` writes a new peer's row
//! without allocating (the key is the row's own bits); keyed by `IpAddr`,
//! each new row allocates its key's box. Counted by a global allocator, on
//! a layer of one plain limit with the fields off (which itself allocates
//! nothing per admitted request, `tests/no_alloc.rs`).

use std::convert::Infallible;
use std::future::ready;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::{Request, Response, StatusCode};
use pace::{IpPrefix, Pace, Rate};
use pace_tower::{Limit, PaceLayer, PeerIp, PeerKey};
use tower::{Layer, Service};

mod counting;

/// A request from peer `ip`.
fn request(ip: IpAddr) -> Request<()> {
    let mut r = Request::builder().uri("/").body(()).unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(ip, 40000)));
    r
}

/// Allocations on this thread while `svc` answers `req` to completion.
fn allocs<S>(svc: &mut S, req: Request<()>) -> u64
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    let (n, resp) = counting::allocs(svc, req);
    assert_eq!(resp.status(), StatusCode::OK);
    n
}

/// Allocations of the first requests of 64 new peers (32 IPv4 addresses,
/// 32 IPv6 /56s), after one request that sets the thread up.
fn new_rows<K: PeerKey>() -> (u64, usize) {
    // Room for every row from the start: no growth (a new array) counted.
    let limiter: Arc<Pace<K>> = Arc::new(
        Pace::builder(Rate::per_second(1000).unwrap())
            .min_slots(1024)
            .build()
            .unwrap(),
    );
    let mut svc = PaceLayer::builder()
        .rate_limit_headers(false)
        .limit(Limit::new("source", limiter.clone(), PeerIp::new()))
        .build()
        .unwrap()
        .layer(tower::service_fn(|_: Request<()>| {
            ready(Ok::<_, Infallible>(Response::new(String::new())))
        }));
    allocs(&mut svc, request(IpAddr::from([198, 51, 100, 1])));
    let mut n = 0;
    for i in 0..32u8 {
        n += allocs(&mut svc, request(IpAddr::from([192, 0, 2, i])));
        let v6 = [0x2001, 0xdb8, 7, u16::from(i) << 8, 0, 0, 0, 1];
        n += allocs(&mut svc, request(IpAddr::from(v6)));
    }
    (n, limiter.len())
}

#[test]
fn a_new_peer_row_allocates_nothing_with_ip_prefix_keys() {
    assert_eq!(new_rows::<IpPrefix>(), (0, 65), "IpPrefix keys");
    // The same with boxed keys: one box per new row.
    assert_eq!(new_rows::<IpAddr>(), (64, 65), "IpAddr keys");
}
