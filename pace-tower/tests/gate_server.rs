//! `GateLayer` against a real server on 127.0.0.1: 503 + Retry-After when
//! saturated (slots or bytes), 413 for a declared length over the cap and
//! for a body that runs past its share, the byte share released with the
//! request body and the slot held until the response body is finished.

mod support;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::Request;
use pace::gate::Gate;
use pace_tower::GateLayer;
use support::{header, serve};
use tokio::sync::{mpsc, Mutex};
use tower_layer::Layer;

fn gate(slots: usize, bytes: u64, cap: u64) -> Gate {
    Gate::builder()
        .slots(slots)
        .bytes(bytes)
        .body_cap(cap)
        .build()
        .unwrap()
}

/// The gated router, mounted the way an axum user would.
fn gated(layer: GateLayer, inner: Router) -> Router {
    Router::new().fallback_service(layer.layer(inner))
}

/// A response body whose frames the test sends, ending when the sender is
/// dropped.
struct Streamed(mpsc::Receiver<Bytes>);

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Handlers wait on the test: `entered` says a handler read its body,
/// `release` lets it answer with a body streamed from `body_tx`.
#[derive(Clone)]
struct Ctl {
    entered: mpsc::Sender<usize>,
    release: Arc<Mutex<mpsc::Receiver<mpsc::Receiver<Bytes>>>>,
}

async fn hold(axum::extract::State(ctl): axum::extract::State<Ctl>, body: Bytes) -> Body {
    ctl.entered.send(body.len()).await.unwrap();
    drop(body);
    let rx = ctl.release.lock().await.recv().await.unwrap();
    Body::new(Streamed(rx))
}

async fn echo(body: Bytes) -> String {
    body.len().to_string()
}

fn post_req(len: Option<usize>, body: Vec<u8>) -> Request<http_body_util::Full<Bytes>> {
    let mut b = Request::builder()
        .method("POST")
        .uri("/")
        .header("host", "127.0.0.1");
    if let Some(l) = len {
        b = b.header("content-length", l);
    }
    b.body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap()
}

#[tokio::test]
async fn saturated_slots_answer_503_and_the_slot_follows_the_response_body() {
    let g = gate(1, 1000, 100);
    let (entered_tx, mut entered) = mpsc::channel(4);
    let (release_tx, release_rx) = mpsc::channel(4);
    let ctl = Ctl {
        entered: entered_tx,
        release: Arc::new(Mutex::new(release_rx)),
    };
    let inner = Router::new().route("/", post(hold)).with_state(ctl);
    let addr = serve(gated(GateLayer::with_retry_after(g.clone(), 2), inner)).await;

    let first = tokio::spawn(async move {
        let mut c = support::Client::connect(addr).await;
        c.send_req(post_req(Some(40), vec![7; 40])).await
    });
    assert_eq!(entered.recv().await, Some(40));
    // The handler has read (and dropped) the body: its share is back; the
    // slot is still held.
    let s = g.stats();
    assert_eq!((s.slots_held, s.bytes_held), (1, 0));

    let mut c = support::Client::connect(addr).await;
    let r = c.send_req(post_req(Some(1), vec![1])).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&r, "retry-after"), Some("2"));

    // Let the handler answer with a body we stream.
    let (body_tx, body_rx) = mpsc::channel(4);
    release_tx.send(body_rx).await.unwrap();
    body_tx.send(Bytes::from_static(b"part")).await.unwrap();
    // While the response body is still open, the slot is held.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(g.stats().slots_held, 1);
    let r = c.send_req(post_req(Some(1), vec![1])).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(body_tx);
    let r = first.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(&r.body()[..], b"part");
    support_wait(|| g.stats().slots_held == 0).await;
    let s = g.stats();
    assert_eq!((s.slots_held, s.bytes_held, s.peak_slots), (0, 0, 1));
}

async fn support_wait(mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    panic!("condition not reached");
}

#[tokio::test]
async fn saturated_bytes_answer_503() {
    let g = gate(4, 100, 100);
    let inner = Router::new().route("/", post(echo));
    let addr = serve(gated(GateLayer::new(g.clone()), inner)).await;
    // Another job holds 80 of the 100 bytes.
    let ticket = g.try_admit(Some(80)).unwrap();
    let mut c = support::Client::connect(addr).await;
    let r = c.send_req(post_req(Some(30), vec![0; 30])).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&r, "retry-after"), Some("1"));
    // Unknown length reserves the cap (100): saturated too.
    let (s, _) = send_chunked(addr, vec![Bytes::from_static(b"x")]).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let r = c.send_req(post_req(Some(20), vec![0; 20])).await;
    assert_eq!(r.status(), StatusCode::OK);
    drop(ticket);
    support_wait(|| g.stats().slots_held == 0).await;
    let st = g.stats();
    assert_eq!((st.bytes_held, st.saturated_bytes), (0, 2));
}

#[tokio::test]
async fn a_declared_length_over_the_cap_is_413() {
    let g = gate(4, 1000, 100);
    let inner = Router::new().route("/", post(echo));
    let addr = serve(gated(GateLayer::new(g.clone()), inner)).await;
    let mut c = support::Client::connect(addr).await;
    let r = c.send_req(post_req(Some(101), vec![0; 101])).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&r, "retry-after"), None);
    let mut c = support::Client::connect(addr).await;
    let r = c.send_req(post_req(Some(100), vec![0; 100])).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(&r.body()[..], b"100");
    assert_eq!(g.stats().too_large, 1);
}

/// A request body of unknown length, sent chunked.
struct Chunks(Vec<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.0.is_empty() {
            Poll::Ready(None)
        } else {
            Poll::Ready(Some(Ok(Frame::data(self.0.remove(0)))))
        }
    }
}

async fn send_chunked(addr: std::net::SocketAddr, chunks: Vec<Bytes>) -> (StatusCode, Bytes) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::builder()
        .method("POST")
        .uri("/")
        .header("host", "127.0.0.1")
        .body(Chunks(chunks))
        .unwrap();
    let r = send.send_request(req).await.unwrap();
    let status = r.status();
    (status, r.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn a_body_running_past_its_share_is_413() {
    let g = gate(4, 1000, 100);
    let inner = Router::new().route("/", post(echo));
    let addr = serve(gated(GateLayer::new(g.clone()), inner)).await;
    // Unknown length: the share is the cap, 100 bytes.
    let ok = vec![Bytes::from(vec![1u8; 60]), Bytes::from(vec![1u8; 40])];
    let (s, body) = send_chunked(addr, ok).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(&body[..], b"100");
    let over = vec![Bytes::from(vec![1u8; 60]), Bytes::from(vec![1u8; 41])];
    let (s, _) = send_chunked(addr, over).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    support_wait(|| g.stats().slots_held == 0).await;
    let st = g.stats();
    assert_eq!((st.slots_held, st.bytes_held), (0, 0));
}

/// The byte share follows the `Bytes` the handler made from the body: kept
/// past the response while the handler's copy lives, released when the last
/// one is dropped.
#[tokio::test]
async fn the_byte_share_follows_the_bytes_made_from_the_body() {
    let g = gate(4, 1000, 500);
    let kept: Arc<std::sync::Mutex<Vec<Bytes>>> = Arc::default();
    let store = kept.clone();
    let inner = Router::new().route(
        "/",
        post(move |body: Bytes| {
            let store = store.clone();
            async move {
                let slice = body.slice(10..20);
                store.lock().unwrap().push(slice);
                "kept"
            }
        }),
    );
    let addr = serve(gated(GateLayer::new(g.clone()), inner)).await;
    let mut c = support::Client::connect(addr).await;
    let r = c.send_req(post_req(Some(300), vec![7; 300])).await;
    assert_eq!(r.status(), StatusCode::OK);
    support_wait(|| g.stats().slots_held == 0).await;
    assert_eq!(
        g.stats().bytes_held,
        300,
        "a slice of the body keeps the whole share"
    );
    assert_eq!(kept.lock().unwrap()[0].as_ref(), &[7u8; 10][..]);
    kept.lock().unwrap().clear();
    assert_eq!(g.stats().bytes_held, 0, "released with the last Bytes");
}
