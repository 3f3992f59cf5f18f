//! `PaceLayer`: keyed limits in front of a service.

use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderValue, Request, Response, StatusCode};
use metrics::{Counter, Gauge};
use pace::{AllReservation, BoxAxis, Clock, DenyReason, Pace};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::headers;
use crate::key::{KeyExtractor, RequestHead};

/// What the response predicate of [`Limit::refund_if`] sees.
#[derive(Clone, Copy, Debug)]
pub struct ResponseHead<'a> {
    /// The status.
    pub status: StatusCode,
    /// The header fields.
    pub headers: &'a HeaderMap,
    /// The extensions (a handler can mark its response there).
    pub extensions: &'a Extensions,
}

/// What a limit does with a request that has no key for it.
#[derive(Clone, Debug)]
pub enum MissingKey<K> {
    /// Answer with this status (empty body) before reserving anything.
    Reject(StatusCode),
    /// Count every keyless request against this one key.
    Shared(K),
    /// Let the request through without this limit.
    Skip,
}

type CostFn = dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync;
type RefundFn = dyn Fn(&ResponseHead<'_>) -> bool + Send + Sync;

/// One limit of a [`PaceLayer`]: a named `Pace`, the extractor of its key,
/// the cost of a request, what to do without a key and when to refund.
pub struct Limit<E: KeyExtractor, S, C> {
    name: String,
    pace: Arc<Pace<E::Key, S, C>>,
    extractor: E,
    missing: MissingKey<E::Key>,
    cost: Option<Arc<CostFn>>,
    refund: Option<Arc<RefundFn>>,
}

impl<E, S, C> Limit<E, S, C>
where
    E: KeyExtractor,
    S: BuildHasher + Send + Sync + 'static,
    C: Clock + 'static,
{
    /// A limit called `name` (its policy name in the `RateLimit` fields: any
    /// printable ASCII) on `pace`, keyed by `extractor`. By default a request
    /// costs 1 token, a request without a key is answered 400, and nothing is
    /// refunded.
    pub fn new(name: impl Into<String>, pace: Arc<Pace<E::Key, S, C>>, extractor: E) -> Self {
        Limit {
            name: name.into(),
            pace,
            extractor,
            missing: MissingKey::Reject(StatusCode::BAD_REQUEST),
            cost: None,
            refund: None,
        }
    }

    /// What to do with a request that has no key.
    pub fn missing_key(mut self, missing: MissingKey<E::Key>) -> Self {
        self.missing = missing;
        self
    }

    /// The tokens a request costs (`Pace::reserve_n`). A cost of 0 always
    /// passes; a cost above the capacity is a permanent denial.
    pub fn cost(mut self, f: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(f));
        self
    }

    /// Refunds this limit's reservation when `f` is true of the response
    /// (for example the claimed client id when the answer is
    /// `401 invalid_client`). What a refund returns follows the core rule:
    /// everything if nothing else debited the key since, nothing otherwise.
    pub fn refund_if(
        mut self,
        f: impl Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.refund = Some(Arc::new(f));
        self
    }
}

enum Claim {
    Axis(BoxAxis<'static>, u64),
    Reject(StatusCode),
    Skip,
}

trait ErasedLimit: Send + Sync {
    fn claim(&self, head: &RequestHead<'_>) -> Claim;
    fn refunds(&self, resp: &ResponseHead<'_>) -> bool;
    fn capacity(&self) -> u64;
    /// Nanoseconds `tokens` take to refill at the declared rate (rounded up).
    fn refill_ns(&self, tokens: u64) -> u64;
    fn rows(&self) -> usize;
}

impl<E, S, C> ErasedLimit for Limit<E, S, C>
where
    E: KeyExtractor,
    S: BuildHasher + Send + Sync + 'static,
    C: Clock + 'static,
{
    fn claim(&self, head: &RequestHead<'_>) -> Claim {
        let key = match self.extractor.extract(head) {
            Some(k) => k,
            None => match &self.missing {
                MissingKey::Reject(s) => return Claim::Reject(*s),
                MissingKey::Shared(k) => k.clone(),
                MissingKey::Skip => return Claim::Skip,
            },
        };
        let n = self.cost.as_ref().map_or(1, |f| f(head));
        Claim::Axis(Box::new((self.pace.clone(), key)), n)
    }

    fn refunds(&self, resp: &ResponseHead<'_>) -> bool {
        self.refund.as_ref().is_some_and(|f| f(resp))
    }

    fn capacity(&self) -> u64 {
        self.pace.capacity()
    }

    fn refill_ns(&self, tokens: u64) -> u64 {
        let rate = self.pace.rate();
        let ns = (tokens as u128 * rate.per().as_nanos()).div_ceil(rate.count() as u128);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn rows(&self) -> usize {
        self.pace.len()
    }
}

/// A policy name the `RateLimit` fields cannot carry (not printable ASCII).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidPolicyName(pub String);

impl fmt::Display for InvalidPolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "limit name {:?} is not a structured-field string (printable ASCII)",
            self.0
        )
    }
}

impl std::error::Error for InvalidPolicyName {}

struct Counters {
    admitted: Counter,
    refunded: Counter,
    exhausted: Counter,
    exceeds_capacity: Counter,
    time_exhausted: Counter,
    missing_key: Counter,
    rows: Gauge,
}

impl Counters {
    fn new(name: &str) -> Counters {
        let limit = name.to_string();
        let denied = |reason: &'static str| metrics::counter!("pace_denied_total", "limit" => limit.clone(), "reason" => reason);
        Counters {
            admitted: metrics::counter!("pace_admitted_total", "limit" => limit.clone()),
            refunded: metrics::counter!("pace_refunded_total", "limit" => limit.clone()),
            exhausted: denied("exhausted"),
            exceeds_capacity: denied("exceeds_capacity"),
            time_exhausted: denied("time_exhausted"),
            missing_key: denied("missing_key"),
            rows: metrics::gauge!("pace_rows", "limit" => limit.clone()),
        }
    }

    fn denied(&self, reason: DenyReason) -> &Counter {
        match reason {
            DenyReason::Exhausted => &self.exhausted,
            DenyReason::ExceedsCapacity => &self.exceeds_capacity,
            _ => &self.time_exhausted,
        }
    }
}

struct Entry {
    limit: Box<dyn ErasedLimit>,
    /// The limit's name as a serialized structured-field string.
    name: String,
    counters: Counters,
}

struct Shared {
    limits: Vec<Entry>,
    policy: Option<HeaderValue>,
    headers: bool,
    permanent: StatusCode,
}

/// Builds a [`PaceLayer`].
#[must_use = "a builder does nothing until build() is called"]
pub struct PaceLayerBuilder {
    limits: Vec<(String, Box<dyn ErasedLimit>)>,
    headers: bool,
    permanent: StatusCode,
}

impl PaceLayerBuilder {
    /// Adds a limit. Limits are reserved in the order added, all or nothing
    /// (`pace::all`): put the limits that are never refunded (per source)
    /// before the ones refunded on outcome (per claimed id) only if you want
    /// a denial of the later one to refund the earlier; either order admits
    /// exactly the same requests.
    pub fn limit<E, S, C>(mut self, limit: Limit<E, S, C>) -> Self
    where
        E: KeyExtractor,
        S: BuildHasher + Send + Sync + 'static,
        C: Clock + 'static,
    {
        self.limits.push((limit.name.clone(), Box::new(limit)));
        self
    }

    /// Whether admitted responses carry the `RateLimit` / `RateLimit-Policy`
    /// fields (default true; denials always carry them).
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

    /// The layer. Counters are registered with the `metrics` recorder
    /// installed now (install it first; without one they cost nothing).
    ///
    /// # Errors
    /// [`InvalidPolicyName`] when a limit's name is not printable ASCII.
    pub fn build(self) -> Result<PaceLayer, InvalidPolicyName> {
        let mut limits = Vec::with_capacity(self.limits.len());
        for (name, limit) in self.limits {
            let sf = headers::sf_string(&name).ok_or_else(|| InvalidPolicyName(name.clone()))?;
            limits.push(Entry {
                counters: Counters::new(&name),
                limit,
                name: sf,
            });
        }
        let policy = headers::policy(limits.iter().map(|e| {
            (
                e.name.as_str(),
                e.limit.capacity(),
                e.limit.refill_ns(e.limit.capacity()),
            )
        }));
        Ok(PaceLayer {
            shared: Arc::new(Shared {
                limits,
                policy,
                headers: self.headers,
                permanent: self.permanent,
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
///
/// Reservations are kept when the inner service fails or the response
/// future is dropped. The layer is `Clone` and cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct PaceLayer {
    shared: Arc<Shared>,
}

impl PaceLayer {
    /// A builder with no limits.
    pub fn builder() -> PaceLayerBuilder {
        PaceLayerBuilder {
            limits: Vec::new(),
            headers: true,
            permanent: StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

impl fmt::Debug for PaceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("limits", &self.shared.limits.len())
            .finish()
    }
}

impl<S> Layer<S> for PaceLayer {
    type Service = PaceService<S>;

    fn layer(&self, inner: S) -> PaceService<S> {
        PaceService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of a [`PaceLayer`].
#[derive(Clone)]
pub struct PaceService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> fmt::Debug for PaceService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceService").finish_non_exhaustive()
    }
}

fn retry_after_secs(wait: Duration) -> u64 {
    #[cfg(pace_mutant = "retry_after_truncated")]
    return wait.as_secs();
    #[cfg(not(pace_mutant = "retry_after_truncated"))]
    {
        let s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        s.max(1)
    }
}

impl<S> PaceService<S> {
    fn reject(&self, status: StatusCode) -> Response<()> {
        let mut r = Response::new(());
        *r.status_mut() = status;
        r
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for PaceService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let head = RequestHead::of(&req);
        let mut all = pace::all();
        let mut which = Vec::with_capacity(shared.limits.len());
        for (i, e) in shared.limits.iter().enumerate() {
            match e.limit.claim(&head) {
                Claim::Axis(axis, n) => {
                    all = all.axis(axis, n);
                    which.push(i);
                }
                Claim::Skip => {}
                Claim::Reject(status) => {
                    e.counters.missing_key.increment(1);
                    return ResponseFuture::rejected(self.reject(status));
                }
            }
        }
        let held = match all.reserve() {
            Ok(held) => held,
            Err(d) => {
                let e = &shared.limits[which[d.index]];
                e.counters.denied(d.denied.reason()).increment(1);
                let mut r;
                if d.denied.is_permanent() {
                    r = self.reject(shared.permanent);
                } else {
                    r = self.reject(StatusCode::TOO_MANY_REQUESTS);
                    let secs = retry_after_secs(d.denied.retry_after());
                    r.headers_mut()
                        .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
                    if let Some(v) = headers::ratelimit([(e.name.as_str(), 0, secs)]) {
                        r.headers_mut().insert(headers::RATELIMIT.clone(), v);
                    }
                }
                if let Some(p) = &shared.policy {
                    r.headers_mut()
                        .insert(headers::RATELIMIT_POLICY.clone(), p.clone());
                }
                return ResponseFuture::rejected(r);
            }
        };
        for &i in &which {
            shared.limits[i].counters.admitted.increment(1);
        }
        ResponseFuture {
            inner: Some(self.inner.call(req)),
            rejected: None,
            held: Some(Held {
                held,
                which,
                shared: shared.clone(),
            }),
        }
    }
}

struct Held {
    held: AllReservation<'static>,
    which: Vec<usize>,
    shared: Arc<Shared>,
}

impl Held {
    fn settle(mut self, status: StatusCode, headers: &mut HeaderMap, extensions: &Extensions) {
        let shared = &self.shared;
        {
            let head = ResponseHead {
                status,
                headers,
                extensions,
            };
            for (j, &i) in self.which.iter().enumerate() {
                let e = &shared.limits[i];
                if e.limit.refunds(&head) && self.held.refund(j) {
                    e.counters.refunded.increment(1);
                }
            }
        }
        if shared.headers {
            let fields = self.which.iter().enumerate().map(|(j, &i)| {
                let e = &shared.limits[i];
                let r = self.held.peek(j).unwrap_or(0);
                let missing = e.limit.capacity().saturating_sub(r);
                let t = headers::ceil_secs(e.limit.refill_ns(missing));
                (e.name.as_str(), r, t)
            });
            if let Some(v) = headers::ratelimit(fields) {
                headers.insert(headers::RATELIMIT.clone(), v);
            }
            if let Some(p) = &shared.policy {
                headers.insert(headers::RATELIMIT_POLICY.clone(), p.clone());
            }
        }
        for &i in &self.which {
            let e = &shared.limits[i];
            e.counters.rows.set(e.limit.rows() as f64);
        }
    }
}

pin_project! {
    /// The response future of a [`PaceService`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
        rejected: Option<Response<()>>,
        held: Option<Held>,
    }
}

impl<F> ResponseFuture<F> {
    fn rejected(r: Response<()>) -> Self {
        ResponseFuture {
            inner: None,
            rejected: Some(r),
            held: None,
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(r) = this.rejected.take() {
            return Poll::Ready(Ok(r.map(|()| B::default())));
        }
        let inner = match this.inner.as_pin_mut() {
            Some(f) => f,
            None => panic!("ResponseFuture polled after completion"),
        };
        let out = std::task::ready!(inner.poll(cx));
        let out = out.map(|mut resp| {
            if let Some(held) = this.held.take() {
                let status = resp.status();
                let (mut parts, body) = resp.into_parts();
                held.settle(status, &mut parts.headers, &parts.extensions);
                resp = Response::from_parts(parts, body);
            }
            resp
        });
        Poll::Ready(out)
    }
}
