//! `GateLayer`: a [`pace::Gate`] in front of a service.
//!
//! Each request reserves one job slot and a byte share (its
//! `Content-Length`, or the gate's body cap when the length is unknown)
//! before its body is read:
//!
//! * saturated (no slot or not enough bytes now): `503 Service Unavailable`
//!   with `Retry-After` (configurable, 1 s by default); the layer does not
//!   queue (a queue needs a timer: use `Gate::admit_async` under the
//!   runtime's timeout for that);
//! * `Content-Length` over the body cap: `413 Content Too Large`;
//! * a body that runs past its share (more bytes than declared, or than the
//!   cap): the body yields an error to the handler and the answer is
//!   replaced by `413`.
//!
//! The byte share follows the request body's data: every `Bytes` frame the
//! wrapped body yields holds the share (clones and slices of it too), so the
//! share is released when the body wrapper and the last `Bytes` made from
//! its frames are dropped. (A consumer that concatenates several frames
//! into a new buffer and drops the frames releases the share with them.)
//! The slot follows the response body and is released when the response
//! body has been sent (or dropped).
//!
//! A gRPC call (`content-type: application/grpc*`) is answered in gRPC
//! (module [`grpc`](crate::grpc)): saturated, `RESOURCE_EXHAUSTED` with the
//! `Retry-After` wait as `grpc-retry-pushback-ms` and `RetryInfo`; too
//! large, `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms: -1`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use metrics::{Counter, Gauge};
use pace::gate::{AdmitError, BytePermit, Gate, Resource, SlotPermit};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

struct GateMetrics {
    admitted: Counter,
    saturated_slots: Counter,
    saturated_bytes: Counter,
    too_large: Counter,
    overrun: Counter,
    slots_held: Gauge,
    bytes_held: Gauge,
    peak_slots: Gauge,
    peak_bytes: Gauge,
}

impl GateMetrics {
    fn new() -> GateMetrics {
        let refused =
            |reason: &'static str| metrics::counter!("pace_gate_refused_total", "reason" => reason);
        GateMetrics {
            admitted: metrics::counter!("pace_gate_admitted_total"),
            saturated_slots: refused("saturated_slots"),
            saturated_bytes: refused("saturated_bytes"),
            too_large: refused("too_large"),
            overrun: refused("overrun"),
            slots_held: metrics::gauge!("pace_gate_slots_held"),
            bytes_held: metrics::gauge!("pace_gate_bytes_held"),
            peak_slots: metrics::gauge!("pace_gate_peak_slots"),
            peak_bytes: metrics::gauge!("pace_gate_peak_bytes"),
        }
    }

    fn observe(&self, gate: &Gate) {
        let s = gate.stats();
        self.slots_held.set(s.slots_held as f64);
        self.bytes_held.set(s.bytes_held as f64);
        self.peak_slots.set(s.peak_slots as f64);
        self.peak_bytes.set(s.peak_bytes as f64);
    }
}

struct Shared {
    gate: Gate,
    retry_after: HeaderValue,
    retry_secs: u64,
    metrics: GateMetrics,
}

/// A tower layer admitting requests through a [`Gate`] (see the
/// [module documentation](crate::gate)). `Clone` and cheap (one `Arc`).
///
/// Counters (through `metrics`, registered when the layer is built):
/// `pace_gate_admitted_total`, `pace_gate_refused_total{reason}` (reason
/// `saturated_slots`, `saturated_bytes`, `too_large`, `overrun`), gauges
/// `pace_gate_slots_held`, `pace_gate_bytes_held`, `pace_gate_peak_slots`,
/// `pace_gate_peak_bytes`.
#[derive(Clone)]
pub struct GateLayer {
    shared: Arc<Shared>,
}

impl GateLayer {
    /// A layer over `gate`, answering `Retry-After: 1` when saturated.
    pub fn new(gate: Gate) -> GateLayer {
        GateLayer::with_retry_after(gate, 1)
    }

    /// A layer over `gate`, answering `Retry-After: secs` (at least 1) when
    /// saturated.
    pub fn with_retry_after(gate: Gate, secs: u64) -> GateLayer {
        GateLayer {
            shared: Arc::new(Shared {
                gate,
                retry_after: HeaderValue::from(secs.max(1)),
                retry_secs: secs.max(1),
                metrics: GateMetrics::new(),
            }),
        }
    }

    /// The gate.
    pub fn gate(&self) -> &Gate {
        &self.shared.gate
    }
}

impl fmt::Debug for GateLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateLayer")
            .field("gate", &self.shared.gate)
            .finish()
    }
}

impl<S> Layer<S> for GateLayer {
    type Service = GateService<S>;

    fn layer(&self, inner: S) -> GateService<S> {
        GateService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of a [`GateLayer`].
#[derive(Clone)]
pub struct GateService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> fmt::Debug for GateService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateService").finish_non_exhaustive()
    }
}

fn status(s: StatusCode) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = s;
    r
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for GateService<S>
where
    S: Service<Request<GateRequestBody<ReqBody>>, Response = Response<ResBody>>,
    ReqBody: Body,
    ResBody: Default,
{
    type Response = Response<GateResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = GateFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let sh = &self.shared;
        let declared = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let ticket = match sh.gate.try_admit(declared) {
            Ok(t) => t,
            Err(e) => {
                let r = match e {
                    AdmitError::TooLarge { .. } => {
                        sh.metrics.too_large.increment(1);
                        status(StatusCode::PAYLOAD_TOO_LARGE)
                    }
                    other => {
                        match other {
                            AdmitError::Saturated {
                                resource: Resource::Bytes,
                            } => sh.metrics.saturated_bytes.increment(1),
                            _ => sh.metrics.saturated_slots.increment(1),
                        }
                        let mut r = status(StatusCode::SERVICE_UNAVAILABLE);
                        r.headers_mut()
                            .insert(http::header::RETRY_AFTER, sh.retry_after.clone());
                        r
                    }
                };
                let r = if crate::grpc::is_grpc(req.headers()) {
                    grpc_answer(r, sh.retry_secs)
                } else {
                    r
                };
                return GateFuture {
                    inner: None,
                    rejected: Some(r),
                    slot: None,
                    overrun: None,
                    grpc: false,
                    shared: sh.clone(),
                };
            }
        };
        sh.metrics.admitted.increment(1);
        sh.metrics.observe(&sh.gate);
        let share = declared.unwrap_or(sh.gate.body_cap());
        let (slot, bytes) = ticket.split();
        let overrun = Arc::new(AtomicBool::new(false));
        let grpc = crate::grpc::is_grpc(req.headers());
        let req = req.map(|body| GateRequestBody {
            inner: body,
            permit: Some(Arc::new(bytes)),
            share,
            seen: 0,
            overrun: overrun.clone(),
        });
        GateFuture {
            inner: Some(self.inner.call(req)),
            rejected: None,
            slot: Some(slot),
            overrun: Some(overrun),
            grpc,
            shared: sh.clone(),
        }
    }
}

/// The gRPC form of the gate's answer `r` (`413` or `503`).
fn grpc_answer(r: Response<()>, retry_secs: u64) -> Response<()> {
    use crate::grpc::{answer, Code, Pushback};
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return answer(
            r,
            Code::ResourceExhausted,
            "the request body is larger than the server takes",
            Pushback::Never,
        );
    }
    answer(
        r,
        Code::ResourceExhausted,
        "the server is busy; retry later",
        Pushback::After(Duration::from_secs(retry_secs)),
    )
}

pin_project! {
    /// The response future of a [`GateService`].
    pub struct GateFuture<F> {
        #[pin]
        inner: Option<F>,
        rejected: Option<Response<()>>,
        slot: Option<SlotPermit>,
        overrun: Option<Arc<AtomicBool>>,
        // A gRPC call: an overrun is answered in gRPC.
        grpc: bool,
        shared: Arc<Shared>,
    }
}

impl<F> fmt::Debug for GateFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for GateFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<GateResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(r) = this.rejected.take() {
            return Poll::Ready(Ok(r.map(|()| GateResponseBody {
                inner: B::default(),
                slot: None,
            })));
        }
        let inner = this
            .inner
            .as_pin_mut()
            .expect("GateFuture polled after completion");
        let out = std::task::ready!(inner.poll(cx));
        let slot = this.slot.take();
        let overran = this
            .overrun
            .as_ref()
            .is_some_and(|o| o.load(Ordering::SeqCst));
        Poll::Ready(out.map(|resp| {
            if overran {
                this.shared.metrics.overrun.increment(1);
                drop(slot);
                this.shared.metrics.observe(&this.shared.gate);
                let mut r = status(StatusCode::PAYLOAD_TOO_LARGE);
                if *this.grpc {
                    r = grpc_answer(r, 1);
                }
                return r.map(|()| GateResponseBody {
                    inner: B::default(),
                    slot: None,
                });
            }
            resp.map(|inner| GateResponseBody { inner, slot })
        }))
    }
}

/// The error a [`GateRequestBody`] yields when the body runs past its share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyOverrun {
    /// The share reserved for the body (bytes).
    pub share: u64,
}

impl fmt::Display for BodyOverrun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request body ran past its {} byte share", self.share)
    }
}

impl std::error::Error for BodyOverrun {}

/// A boxed body error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The owner of a data frame's bytes: the frame and a handle on the
/// request's byte share, released when the last handle goes.
struct ShareOwner {
    bytes: Bytes,
    _share: Arc<BytePermit>,
}

impl AsRef<[u8]> for ShareOwner {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

pin_project! {
    /// A request body carrying its byte share: every data frame it yields is
    /// a `Bytes` holding the share, so the share is released when this body
    /// and the last `Bytes` made from its frames are dropped; reading past
    /// the share is an error.
    pub struct GateRequestBody<B> {
        #[pin]
        inner: B,
        permit: Option<Arc<BytePermit>>,
        share: u64,
        seen: u64,
        overrun: Arc<AtomicBool>,
    }
}

impl<B> fmt::Debug for GateRequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateRequestBody")
            .field("share", &self.share)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl<B> Body for GateRequestBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if this.overrun.load(Ordering::Relaxed) {
            return Poll::Ready(Some(Err(Box::new(BodyOverrun { share: *this.share }))));
        }
        match std::task::ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    *this.seen = this.seen.saturating_add(d.remaining() as u64);
                    if *this.seen > *this.share {
                        this.overrun.store(true, Ordering::SeqCst);
                        return Poll::Ready(Some(Err(Box::new(BodyOverrun {
                            share: *this.share,
                        }))));
                    }
                }
                let share = this.permit.as_ref();
                Poll::Ready(Some(Ok(frame.map_data(|mut d| {
                    let bytes = d.copy_to_bytes(d.remaining());
                    match share {
                        Some(s) if !bytes.is_empty() => Bytes::from_owner(ShareOwner {
                            bytes,
                            _share: s.clone(),
                        }),
                        _ => bytes,
                    }
                }))))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// A response body holding the request's job slot until it ends or is
    /// dropped.
    pub struct GateResponseBody<B> {
        #[pin]
        inner: B,
        slot: Option<SlotPermit>,
    }
}

impl<B> fmt::Debug for GateResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateResponseBody")
            .field("holds_slot", &self.slot.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Default> Default for GateResponseBody<B> {
    fn default() -> Self {
        GateResponseBody {
            inner: B::default(),
            slot: None,
        }
    }
}

impl<B: Body> Body for GateResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let r = std::task::ready!(this.inner.poll_frame(cx));
        if r.is_none() {
            // The response is finished: the job is over.
            this.slot.take();
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
