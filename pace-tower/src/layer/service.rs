//! The layer, its builder and the admission of a request.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::fields::policy_value;
use super::future::ResponseFuture;
use super::limits::{Limits, Src};
use super::meta::FieldAcc;
use super::reject::{DefaultRespond, ProblemDetails, Rejection, Respond, RespondFn};
use super::shared::Shared;
use super::{BuildError, Limit};
#[cfg(doc)]
use super::{MissingKey, MISSING_PEER_ADDR_BODY, UNAVAILABLE_BODY};
use crate::headers;
use crate::key::{KeyExtractor, RequestHead};
use crate::limit::AsyncLimit;
#[cfg(doc)]
use crate::limit::Refusal;

/// Builds a [`PaceLayer`].
#[must_use = "a builder does nothing until build() is called"]
#[doc(alias = "GovernorConfigBuilder", alias = "GovernorConfig")]
pub struct PaceLayerBuilder<L = (), H = DefaultRespond> {
    limits: L,
    headers: bool,
    permanent: StatusCode,
    grpc_limit_unavailable: bool,
    respond: H,
}

impl<L: Limits, H> PaceLayerBuilder<L, H> {
    /// Adds a limit. Limits are reserved in the order added, all or nothing
    /// (as `pace::all`): put the limits that are never refunded (per source)
    /// before the ones refunded on outcome (per claimed id) only if you want
    /// a denial of the later one to refund the earlier; either order admits
    /// exactly the same requests.
    ///
    /// The layer *holds* every limit it may refund
    /// ([`AsyncLimit::hold`]), so that the refund is exact whatever else
    /// happens on the key: a limit with a [`refund_if`](Limit::refund_if),
    /// and every limit but the last (a limit after it may refuse the
    /// request, which refunds it). A held limit the layer does not refund
    /// is kept ([`AsyncLimit::keep`]: for a `pace::Pace`, a second CAS on
    /// the key's row). In a layer whose limits all decide at once (no
    /// queueing, no [`Limit::quota`]), a limit held only because a later
    /// one may refuse is held with [`AsyncLimit::hold_while`] while the
    /// later ones decide, whether or not a later one refunds on the
    /// response: for a `pace::Pace` ([`pace::Pace::hold_while`]), the
    /// hold, their decisions and the keep or refund in one pin of the
    /// epoch, the keep one CAS on the cell the hold wrote.
    /// The last limit, without a refund predicate, is never refunded and
    /// keeps the plain one-CAS reservation: a layer of one such limit costs
    /// what it did before holds; in a layer of several, put the busiest
    /// limit that is never refunded last, or give up the exact refunds of a
    /// limit whose traces hurt only its own key
    /// ([`Limit::exact_refunds`]`(false)`). A shared `pace_redis::RedisPace`
    /// limit is held the same way, on the server (`RedisPace::hold_n`, kept
    /// with `Hold::keep`: a second script call). A limit without holds
    /// ([`AsyncLimit::holds`] false) is reserved plainly; a queueing one
    /// ([`Limit::wait_up_to`]) the layer may refund is refused
    /// ([`BuildError::QueuedRefund`]).
    pub fn limit<E, A>(self, limit: Limit<E, A>) -> PaceLayerBuilder<(L, Limit<E, A>), H>
    where
        E: KeyExtractor,
        A: AsyncLimit<E::Key>,
    {
        PaceLayerBuilder {
            limits: (self.limits, limit),
            headers: self.headers,
            permanent: self.permanent,
            grpc_limit_unavailable: self.grpc_limit_unavailable,
            respond: self.respond,
        }
    }

    /// Whether admitted responses carry the `RateLimit` / `RateLimit-Policy`
    /// fields (default true; denials always carry them).
    #[doc(alias = "use_headers")]
    pub fn rate_limit_headers(mut self, on: bool) -> Self {
        self.headers = on;
        self
    }

    /// The status of a permanent denial (a cost above the capacity, or a
    /// clock past the limiter's time space): 413 by default. It carries no
    /// `Retry-After`, since waiting does not help.
    pub fn permanent_status(mut self, status: StatusCode) -> Self {
        self.permanent = status;
        self
    }

    /// Answers with RFC 9457 problem details (`application/problem+json`,
    /// [`ProblemDetails`]) instead of a line of text; gRPC calls are
    /// answered in gRPC either way.
    pub fn problem_details(self) -> PaceLayerBuilder<L, ProblemDetails> {
        PaceLayerBuilder {
            limits: self.limits,
            headers: self.headers,
            permanent: self.permanent,
            grpc_limit_unavailable: self.grpc_limit_unavailable,
            respond: ProblemDetails,
        }
    }

    /// Whether a gRPC call an exhausted limit stops is answered
    /// `UNAVAILABLE` (14) instead of `RESOURCE_EXHAUSTED` (8), with the same
    /// wait (false by default). `UNAVAILABLE` is the code gRPC clients'
    /// retry policies retry by default (honouring
    /// `grpc-retry-pushback-ms`): for deployments that want a limited call
    /// retried as HTTP clients retry a `429`. (Module [`grpc`](crate::grpc).)
    pub fn grpc_limit_as_unavailable(mut self, on: bool) -> Self {
        self.grpc_limit_unavailable = on;
        self
    }

    /// The response hook: every request the layer answers itself (denied,
    /// denied for good, without a key, without a peer address) is answered
    /// with `f(&rejection, default)`, where `default` is the response the
    /// layer would send (status and header fields; see [`DefaultRespond`]).
    /// Change the status or the fields, and give the body:
    ///
    /// ```
    /// use axum::body::Body;
    /// use axum::http::{header, HeaderValue, Response};
    /// use pace_tower::{PaceLayer, Reason, Rejection};
    ///
    /// let builder = PaceLayer::builder().on_reject(|r: &Rejection<'_>, default: Response<()>| {
    ///     let (mut head, ()) = default.into_parts();
    ///     let error = match r.reason {
    ///         Reason::Exhausted { .. } => "slow_down",
    ///         _ => "invalid_request",
    ///     };
    ///     head.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    ///     Response::from_parts(head, Body::from(format!("{{\"error\":\"{error}\"}}")))
    /// });
    /// ```
    pub fn on_reject<F, B>(self, f: F) -> PaceLayerBuilder<L, RespondFn<F>>
    where
        F: Fn(&Rejection<'_>, Response<()>) -> Response<B> + Send + Sync + 'static,
    {
        PaceLayerBuilder {
            limits: self.limits,
            headers: self.headers,
            permanent: self.permanent,
            grpc_limit_unavailable: self.grpc_limit_unavailable,
            respond: RespondFn(f),
        }
    }

    /// The layer. Counters are registered with the `metrics` recorder
    /// installed now (install it first; without one they cost nothing).
    ///
    /// # Errors
    /// [`BuildError::InvalidPolicyName`] when a limit's name is not
    /// printable ASCII; [`BuildError::QueuedRefund`] for a queueing limit
    /// ([`Limit::wait_up_to`]) the layer may refund exactly (a
    /// [`Limit::refund_if`], or a limit after it).
    pub fn build(mut self) -> Result<PaceLayer<L, H>, BuildError> {
        let mut metas = Vec::new();
        self.limits.prepare(&mut metas)?;
        let mut items = Vec::new();
        self.limits.policy_items(&metas, &mut items);
        let policy_terms = items.iter().map(|&(_, q, rate)| (q, rate)).collect();
        // Static: cloned per response without a reference count.
        let policy = policy_value(items).and_then(|v| headers::interned(&v));
        self.limits.mark_holds(false)?;
        let refunds = self.limits.refunds_on_response();
        let at_once = self.limits.at_once();
        let light = !refunds && at_once;
        let nested = refunds && at_once;
        Ok(PaceLayer {
            shared: Arc::new(Shared {
                limits: self.limits,
                metas,
                policy,
                policy_terms,
                headers: self.headers,
                refunds,
                light,
                nested,
                permanent: self.permanent,
                grpc_limit_unavailable: self.grpc_limit_unavailable,
                respond: self.respond,
            }),
        })
    }
}

/// A tower layer that reserves every configured limit for each request,
/// all or nothing, before the inner service sees it.
///
/// * admitted: the inner service answers; the response carries `RateLimit`
///   and `RateLimit-Policy` (unless turned off); limits whose
///   [`refund_if`](Limit::refund_if) holds for the response are refunded.
/// * exhausted: `429 Too Many Requests`, `Retry-After` in whole seconds
///   rounded up (at least 1), `RateLimit` with `r=0` and `t` the same wait.
/// * permanent (cost above capacity): [`permanent_status`](PaceLayerBuilder::permanent_status)
///   (413 by default), no `Retry-After`.
/// * no key: as the limit's [`MissingKey`] says (400 by default).
/// * no peer address for a limit keyed by it: `500` with a body that says
///   how to configure the server ([`MISSING_PEER_ADDR_BODY`]).
/// * no decision (a shared limit whose store is down, failing closed):
///   `503`, `Retry-After` the limit's wait until it tries its store again
///   ([`Refusal::Unavailable`]'s `retry_after`) in whole seconds, rounded
///   up, at least 1 (1 when the limit does not say), and the body
///   [`UNAVAILABLE_BODY`].
///
/// [`PaceLayerBuilder::on_reject`] replaces these answers. Denials and
/// missing keys are `tracing` events (target `pace_tower`): `DEBUG` for a
/// denial or a missing key, `ERROR` for a missing peer address. An outage
/// of a limit is one `WARN` event at its first `503` (the next ones are
/// `DEBUG`) and one `INFO` event when the limit decides again.
///
/// An admitted request allocates nothing in the layer except, with the
/// fields on, the `RateLimit` value (and the `RateLimit-Policy` value when
/// a limit's quota for the request differs from the one the layer was built
/// with), a request to a queueing limit ([`Limit::wait_up_to`]) its
/// wait, and, in the core, a held row's record where its holds do not
/// fit in the row's word (a lot of more than 3 tokens, or a quota of
/// another interval; records come from the thread's pool of freed ones).
/// Reservations are kept when the inner
/// service fails or the response future is dropped. The layer is `Clone`
/// and cheap to clone (one `Arc`).
#[doc(alias = "GovernorLayer", alias = "RateLimitLayer", alias = "governor")]
pub struct PaceLayer<L = (), H = DefaultRespond> {
    shared: Arc<Shared<L, H>>,
}

impl<L, H> Clone for PaceLayer<L, H> {
    fn clone(&self) -> Self {
        PaceLayer {
            shared: self.shared.clone(),
        }
    }
}

impl PaceLayer {
    /// A builder with no limits.
    pub fn builder() -> PaceLayerBuilder {
        PaceLayerBuilder {
            limits: (),
            headers: true,
            permanent: StatusCode::PAYLOAD_TOO_LARGE,
            grpc_limit_unavailable: false,
            respond: DefaultRespond,
        }
    }
}

impl<L, H> fmt::Debug for PaceLayer<L, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("limits", &self.shared.metas.len())
            .finish()
    }
}

impl<S, L, H> Layer<S> for PaceLayer<L, H> {
    type Service = PaceService<S, L, H>;

    fn layer(&self, inner: S) -> PaceService<S, L, H> {
        PaceService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of a [`PaceLayer`].
pub struct PaceService<S, L = (), H = DefaultRespond> {
    inner: S,
    shared: Arc<Shared<L, H>>,
}

impl<S: Clone, L, H> Clone for PaceService<S, L, H> {
    fn clone(&self) -> Self {
        PaceService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, L, H> fmt::Debug for PaceService<S, L, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceService").finish_non_exhaustive()
    }
}

impl<S, L, H, ReqBody, ResBody> Service<Request<ReqBody>> for PaceService<S, L, H>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    L: Limits,
    H: Respond<ResBody>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, L, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if self.shared.light {
            return self.call_light(req);
        }
        // (`req` is moved, not borrowed, on this path: it goes to
        // `call_held` without a copy.)
        self.call_held(req)
    }
}

impl<S, L, H> PaceService<S, L, H> {
    /// [`call`](Service::call) of a layer whose limits all decide at once
    /// and keep nothing after the admission: no state, no reference to
    /// the layer in the future. Inlined where the service is called.
    #[inline(always)]
    fn call_light<ReqBody, ResBody>(
        &mut self,
        req: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, L, H>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
        L: Limits,
        H: Respond<ResBody>,
    {
        let shared = &*self.shared;
        if shared.headers {
            let head = RequestHead::of(&req);
            let mut acc = FieldAcc::new(shared);
            if let Err(stop) = shared.limits.light_top(&head, Some(&mut acc)) {
                return self.denied(stop, &req);
            }
            let fields = acc.finish(shared, Src::Head(&head));
            return ResponseFuture::fields(self.inner.call(req), fields);
        }
        if let Err(stop) = shared.limits.light_top(&RequestHead::of(&req), None) {
            return self.denied(stop, &req);
        }
        ResponseFuture::passthrough(self.inner.call(req))
    }

    /// The answer to a request a limit stopped on the light path (cold,
    /// out of line).
    #[cold]
    #[inline(never)]
    fn denied<ReqBody, ResBody>(
        &self,
        stop: super::limits::Stop,
        req: &Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, L, H>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
        L: Limits,
        H: Respond<ResBody>,
    {
        ResponseFuture::rejected(self.shared.reject(stop, &RequestHead::of(req)))
    }

    /// [`call`](Service::call) of a layer whose limits keep state past
    /// the admission (a hold, a refund predicate, a limit that answers
    /// later): out of line, so that the light paths inlined where the
    /// service is called stay small.
    #[inline(never)]
    fn call_held<ReqBody, ResBody>(
        &mut self,
        req: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, L, H>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
        L: Limits,
        H: Respond<ResBody>,
    {
        let shared = &*self.shared;
        let head = RequestHead::of(&req);
        if shared.nested {
            // Every limit decides at once: the ones held only for the later
            // ones are settled before this returns.
            return match shared.limits.start_nested(&head, || Ok(())) {
                Ok((st, ())) => ResponseFuture::admitted(&mut self.inner, req, st, &self.shared),
                Err(stop) => ResponseFuture::rejected(shared.reject(stop, &head)),
            };
        }
        let mut st = match shared.limits.start(&head) {
            Ok((st, true)) => {
                // Every limit decided at once (local limits): admitted.
                return ResponseFuture::admitted(&mut self.inner, req, st, &self.shared);
            }
            Ok((st, false)) => st,
            Err(stop) => return ResponseFuture::rejected(shared.reject(stop, &head)),
        };
        // A limit that answers later: try once (it may answer at once).
        let mut cx = Context::from_waker(Waker::noop());
        match shared.limits.poll_reserve(&mut st, &mut cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(stop)) => return ResponseFuture::rejected(shared.reject(stop, &head)),
            Poll::Pending => {
                // A shared limit is in flight: the request waits for it, and
                // the inner service that was made ready goes with it.
                let ready = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, ready);
                return ResponseFuture::reserving(st, req, svc, self.shared.clone());
            }
        }
        ResponseFuture::admitted(&mut self.inner, req, st, &self.shared)
    }
}
