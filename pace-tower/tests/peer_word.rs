//! A peer-address limit keyed by `pace::IpPrefix` writes a new peer's row
//! without allocating (the key is the row's own bits); keyed by `IpAddr`,
//! each new row allocates its key's box. Counted by a global allocator, on
//! a layer of one plain limit with the fields off (which itself allocates
//! nothing per admitted request, `tests/no_alloc.rs`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::{ready, Future};
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::extract::ConnectInfo;
use http::{Request, Response, StatusCode};
use pace::{IpPrefix, Pace, Rate};
use pace_tower::{Limit, PaceLayer, PeerIp, PeerKey};
use tower::{Layer, Service};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    let mut cx = Context::from_waker(Waker::noop());
    ALLOCS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let resp = {
        let mut fut = pin!(svc.call(req));
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(r) => r.unwrap(),
            Poll::Pending => unreachable!(),
        }
    };
    COUNTING.with(|c| c.set(false));
    assert_eq!(resp.status(), StatusCode::OK);
    ALLOCS.with(Cell::get)
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
