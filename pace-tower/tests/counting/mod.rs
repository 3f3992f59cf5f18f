//! The counting global allocator shared by the tests that count what a
//! request allocates (`no_alloc.rs`, `peer_word.rs`): allocations and
//! reallocations on the current thread while counting is on.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower::Service;

pub struct Counting;

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

/// Allocations on this thread while `svc` answers `req` (poll_ready, call,
/// the response future to completion); the response is dropped after.
pub fn allocs<S>(svc: &mut S, req: Request<()>) -> (u64, Response<String>)
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
    (ALLOCS.with(Cell::get), resp)
}
