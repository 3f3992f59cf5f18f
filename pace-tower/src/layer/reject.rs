//! The layer's own answers: a request stopped before the inner service.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};
use pace::DenyReason;

use super::limits::{Limits, Src, Stop};
use super::meta::{FieldAcc, Meta};
use super::shared::Shared;
#[cfg(doc)]
use super::{MissingKey, PaceLayer, PaceLayerBuilder};
use crate::grpc::{self, Pushback};
use crate::headers;
use crate::key::RequestHead;
use crate::limit::Refusal;

/// Why a [`PaceLayer`] answered a request itself (see [`Rejection`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The limit lacks the tokens now: wait this long (exact; the default
    /// `Retry-After` is it in whole seconds, rounded up).
    Exhausted {
        /// The exact wait.
        retry_after: Duration,
    },
    /// Waiting does not help (`pace::DenyReason::ExceedsCapacity` or
    /// `TimeExhausted`).
    Permanent(DenyReason),
    /// The request has no key for the limit and the limit's
    /// [`MissingKey`] is `Reject`.
    MissingKey,
    /// The limit keys by the peer address and the server recorded none: the
    /// server is not configured to (with axum,
    /// `into_make_service_with_connect_info::<SocketAddr>()`; otherwise a
    /// [`PeerAddr`](crate::PeerAddr) extension).
    MissingPeerAddr,
    /// The limit gave no decision ([`Refusal::Unavailable`]: a shared
    /// limit that is down); the default answer is `503` with `Retry-After`
    /// (this wait in whole seconds, rounded up, at least 1; 1 when `None`)
    /// and the body [`UNAVAILABLE_BODY`].
    Unavailable {
        /// When the limit tries its store again, if it knows.
        retry_after: Option<Duration>,
    },
}

/// A request a [`PaceLayer`] answers itself, as its response hook
/// ([`PaceLayerBuilder::on_reject`]) sees it.
#[derive(Clone, Copy, Debug)]
pub struct Rejection<'a> {
    /// The limit's name.
    pub limit: &'a str,
    /// Its index, in the order the limits were added.
    pub index: usize,
    /// Why.
    pub reason: Reason,
    /// The request.
    pub request: &'a RequestHead<'a>,
    /// The body of the default answer: [`TOO_MANY_REQUESTS_BODY`] for
    /// [`Reason::Exhausted`], for [`Reason::MissingKey`] a line naming the
    /// limit and where its key is read from
    /// ([`KeyExtractor::describe`](crate::KeyExtractor::describe): a
    /// [`Header`](crate::Header) names its header),
    /// [`MISSING_PEER_ADDR_BODY`] for [`Reason::MissingPeerAddr`],
    /// [`UNAVAILABLE_BODY`] for [`Reason::Unavailable`], else empty; empty
    /// for a gRPC call ([`Rejection::is_grpc`]).
    pub default_body: &'a str,
}

impl Rejection<'_> {
    /// Whether the request is a gRPC call (its `content-type` starts with
    /// `application/grpc`): the default answer is then a trailers-only gRPC
    /// answer (module [`grpc`](crate::grpc)), and its body must stay empty.
    pub fn is_grpc(&self) -> bool {
        crate::grpc::is_grpc(self.request.headers)
    }
}

/// The body of the default `429` answer.
pub const TOO_MANY_REQUESTS_BODY: &str =
    "too many requests; retry after the seconds in Retry-After\n";

/// The body of the default answer to a request without a key for the
/// limit `name`, whose key is read from `source` if it says.
pub(super) fn missing_key_body(name: &str, source: Option<String>) -> String {
    match source {
        Some(source) => {
            format!("the request has no key for the limit \"{name}\": {source} is missing\n")
        }
        None => format!("the request has no key for the limit \"{name}\"\n"),
    }
}

/// The body of the default answer to a request without a peer address.
pub const MISSING_PEER_ADDR_BODY: &str = "this limit keys by the peer address and the \
server recorded none. With axum, serve the router with \
`app.into_make_service_with_connect_info::<std::net::SocketAddr>()`; with another server, \
insert a `pace_tower::PeerAddr` (or `SocketAddr`) request extension before the layer.\n";

/// The body of the default answer to a request the limit could not decide
/// ([`Reason::Unavailable`]).
pub const UNAVAILABLE_BODY: &str =
    "the rate limit could not decide (its store is unavailable); retry later\n";

/// Builds the response to a [`Rejection`] (see [`PaceLayerBuilder::on_reject`]).
pub trait Respond<B>: Send + Sync + 'static {
    /// The response to `rejection`. `default` is what the layer sends
    /// without a hook: its status and header fields; its body is
    /// [`Rejection::default_body`].
    fn respond(&self, rejection: &Rejection<'_>, default: Response<()>) -> Response<B>;
}

/// The default answers: `429` with `Retry-After` (whole seconds, rounded
/// up), the `RateLimit` / `RateLimit-Policy` fields and the body
/// [`TOO_MANY_REQUESTS_BODY`]; a permanent denial with
/// [`permanent_status`](PaceLayerBuilder::permanent_status) (413) and
/// `RateLimit-Policy`; a missing key with the limit's status (400) and a
/// body naming the limit and, for a [`Header`](crate::Header), the header;
/// a missing peer address `500` with the body [`MISSING_PEER_ADDR_BODY`];
/// no decision `503` with `Retry-After` and the body [`UNAVAILABLE_BODY`].
/// Empty bodies otherwise. (The bodies are [`Rejection::default_body`].)
/// A gRPC request is answered in gRPC, with an empty body (module
/// [`grpc`](crate::grpc)).
///
/// It answers with any body type that is `Default` (tonic's, axum's,
/// hyper's): a body of `String`, `http_body_util::Full<Bytes>` or (feature
/// `axum`) `axum::body::Body` holds the text, with `content-type:
/// text/plain; charset=utf-8`; another type is answered with its default
/// (empty) body and no `content-type` (give it a body with
/// [`PaceLayerBuilder::on_reject`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultRespond;

impl<B: Default + 'static> Respond<B> for DefaultRespond {
    fn respond(&self, rejection: &Rejection<'_>, default: Response<()>) -> Response<B> {
        let text = rejection.default_body;
        if text.is_empty() {
            return default.map(|()| B::default());
        }
        match text_body::<B>(text) {
            Some(body) => {
                let mut r = default.map(|()| body);
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                r
            }
            None => default.map(|()| B::default()),
        }
    }
}

/// RFC 9457 problem details: the default answers (status and fields as
/// [`DefaultRespond`]'s) with an `application/problem+json` body instead of
/// a line of text (see [`PaceLayerBuilder::problem_details`]). Its members:
/// `type` (`"about:blank"`: the status says it all), `title` (the status's
/// reason phrase), `status`, `detail` (the line of text, when the answer
/// has one), `limit` (the limit's name) and, for an answer that says how
/// long to wait, `retry_after` (whole seconds, rounded up, as
/// `Retry-After`) and `retry_after_ms` (milliseconds, rounded up).
///
/// ```
/// # use std::time::Duration;
/// # use pace_tower::{ProblemDetails, Reason, Rejection, RequestHead, Respond};
/// # let head = http::Request::new(());
/// # let head = RequestHead::of(&head);
/// let rejection = Rejection {
///     limit: "client",
///     index: 0,
///     reason: Reason::Exhausted { retry_after: Duration::from_millis(1500) },
///     request: &head,
///     default_body: "too many requests; retry after the seconds in Retry-After\n",
/// };
/// let mut default = http::Response::new(());
/// *default.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
/// let r: http::Response<String> = ProblemDetails.respond(&rejection, default);
/// assert_eq!(r.headers()["content-type"], "application/problem+json");
/// assert_eq!(
///     r.body(),
///     r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"too many requests; retry after the seconds in Retry-After","limit":"client","retry_after":2,"retry_after_ms":1500}"#
/// );
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ProblemDetails;

/// The members of a [`ProblemDetails`] body, in the order written.
#[derive(serde::Serialize)]
struct Problem<'a> {
    r#type: &'static str,
    title: &'static str,
    status: u16,
    #[serde(skip_serializing_if = "str::is_empty")]
    detail: &'a str,
    limit: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

impl<B: Default + 'static> Respond<B> for ProblemDetails {
    fn respond(&self, rejection: &Rejection<'_>, default: Response<()>) -> Response<B> {
        if rejection.is_grpc() {
            return default.map(|()| B::default());
        }
        let status = default.status();
        let wait = match rejection.reason {
            Reason::Exhausted { retry_after } => Some(retry_after),
            Reason::Unavailable { retry_after } => {
                Some(retry_after.unwrap_or(Duration::from_secs(1)))
            }
            _ => None,
        };
        let problem = Problem {
            r#type: "about:blank",
            title: status.canonical_reason().unwrap_or_default(),
            status: status.as_u16(),
            detail: rejection.default_body.trim_end(),
            limit: rejection.limit,
            retry_after: wait.map(retry_after_secs),
            retry_after_ms: wait.map(|w| {
                let ms = w.as_millis() + u128::from(w.subsec_nanos() % 1_000_000 != 0);
                u64::try_from(ms).unwrap_or(u64::MAX)
            }),
        };
        let Ok(text) = serde_json::to_string(&problem) else {
            return default.map(|()| B::default());
        };
        match text_body::<B>(&text) {
            Some(body) => {
                let mut r = default.map(|()| body);
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/problem+json"),
                );
                r
            }
            None => default.map(|()| B::default()),
        }
    }
}

/// A body of type `B` holding `text`, for the body types that can hold
/// text without knowing more of them; `None` for another type.
fn text_body<B: Default + 'static>(text: &str) -> Option<B> {
    use std::any::Any;
    let mut out: Option<B> = None;
    let slot: &mut dyn Any = &mut out;
    if let Some(s) = slot.downcast_mut::<Option<String>>() {
        *s = Some(text.to_owned());
    } else if let Some(s) = slot.downcast_mut::<Option<http_body_util::Full<bytes::Bytes>>>() {
        *s = Some(http_body_util::Full::new(bytes::Bytes::from(
            text.to_owned(),
        )));
    } else {
        #[cfg(feature = "axum")]
        if let Some(s) = slot.downcast_mut::<Option<axum::body::Body>>() {
            *s = Some(axum::body::Body::from(text.to_owned()));
        }
    }
    out
}

/// A closure as a response hook (see [`PaceLayerBuilder::on_reject`]).
pub struct RespondFn<F>(pub(super) F);

impl<F> fmt::Debug for RespondFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RespondFn")
    }
}

impl<F, B> Respond<B> for RespondFn<F>
where
    F: Fn(&Rejection<'_>, Response<()>) -> Response<B> + Send + Sync + 'static,
{
    fn respond(&self, rejection: &Rejection<'_>, default: Response<()>) -> Response<B> {
        (self.0)(rejection, default)
    }
}

/// `Retry-After` for `wait`: whole seconds, rounded up, at least 1.
fn retry_after_secs(wait: Duration) -> u64 {
    #[cfg(pace_mutant = "retry_after_truncated")]
    return wait.as_secs();
    #[cfg(not(pace_mutant = "retry_after_truncated"))]
    {
        let s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        s.max(1)
    }
}

/// A decision of the limit `m`: ends its outage, if any (an `INFO` event).
fn decided(m: &Meta) {
    let outage = &m.counters.outage;
    if outage.load(Ordering::Relaxed) && outage.swap(false, Ordering::Relaxed) {
        tracing::info!(target: "pace_tower", limit = %m.name, "the limit decides again");
    }
}

/// An empty response with `status`.
fn status(status: StatusCode) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = status;
    r
}

impl<L: Limits, H> Shared<L, H> {
    /// The answer to a request stopped before the inner service.
    #[cold]
    pub(super) fn reject<B>(&self, stop: Stop, head: &RequestHead<'_>) -> Response<B>
    where
        H: Respond<B>,
    {
        let (index, reason, r) = match stop {
            Stop::Missing { index, status: s } => {
                self.metas[index].counters.missing_key.increment(1);
                tracing::debug!(
                    target: "pace_tower",
                    limit = %self.metas[index].name,
                    status = s.as_u16(),
                    "request without a key for the limit"
                );
                (index, Reason::MissingKey, status(s))
            }
            Stop::NoPeer { index } => {
                self.metas[index].counters.missing_key.increment(1);
                tracing::error!(
                    target: "pace_tower",
                    limit = %self.metas[index].name,
                    "no peer address: serve axum with \
                     into_make_service_with_connect_info::<SocketAddr>() \
                     (or insert a pace_tower::PeerAddr extension)"
                );
                (
                    index,
                    Reason::MissingPeerAddr,
                    status(StatusCode::INTERNAL_SERVER_ERROR),
                )
            }
            Stop::Refused { index, refusal } => {
                let (reason, r) = self.refused(index, refusal, head);
                (index, reason, r)
            }
        };
        let mut default_body = match reason {
            Reason::Exhausted { .. } => TOO_MANY_REQUESTS_BODY,
            Reason::MissingKey => &self.metas[index].missing_body,
            Reason::MissingPeerAddr => MISSING_PEER_ADDR_BODY,
            Reason::Unavailable { .. } => UNAVAILABLE_BODY,
            _ => "",
        };
        let mut r = r;
        if grpc::is_grpc(head.headers) {
            r = self.grpc_answer(&self.metas[index].name, reason, default_body, r);
            default_body = "";
        }
        let rejection = Rejection {
            limit: &self.metas[index].name,
            index,
            reason,
            request: head,
            default_body,
        };
        self.respond.respond(&rejection, r)
    }

    /// The gRPC form of the HTTP answer `r` to the limit `name`'s
    /// `reason` (module [`grpc`](crate::grpc)); `text` is the HTTP body.
    fn grpc_answer(&self, name: &str, reason: Reason, text: &str, r: Response<()>) -> Response<()> {
        let text = text.trim_end();
        match reason {
            Reason::Exhausted { retry_after } => {
                let code = if self.grpc_limit_unavailable {
                    grpc::Code::Unavailable
                } else {
                    grpc::Code::ResourceExhausted
                };
                let message = format!(
                    "too many requests for the limit \"{name}\"; retry after {} ms",
                    retry_after.as_millis()
                        + u128::from(retry_after.subsec_nanos() % 1_000_000 != 0)
                );
                grpc::answer(r, code, &message, Pushback::After(retry_after))
            }
            Reason::Permanent(_) => {
                let message = format!("the limit \"{name}\" can never admit this request");
                grpc::answer(r, grpc::Code::ResourceExhausted, &message, Pushback::Never)
            }
            Reason::MissingKey => {
                grpc::answer(r, grpc::Code::InvalidArgument, text, Pushback::None)
            }
            Reason::MissingPeerAddr => grpc::answer(r, grpc::Code::Internal, text, Pushback::None),
            Reason::Unavailable { retry_after } => grpc::answer(
                r,
                grpc::Code::Unavailable,
                text,
                Pushback::After(retry_after.unwrap_or(Duration::from_secs(1))),
            ),
        }
    }

    /// The reason and default answer of a limit's refusal (`m`: the
    /// limit's name and counters).
    fn refused(
        &self,
        index: usize,
        refusal: Refusal,
        head: &RequestHead<'_>,
    ) -> (Reason, Response<()>) {
        let m = &self.metas[index];
        match refusal {
            Refusal::Exhausted { retry_after: wait } => {
                m.counters.exhausted.increment(1);
                decided(m);
                tracing::debug!(
                    target: "pace_tower",
                    limit = %m.name,
                    retry_after_ms = wait.as_millis() as u64,
                    "denied"
                );
                (
                    Reason::Exhausted { retry_after: wait },
                    self.exhausted(index, wait, head),
                )
            }
            Refusal::Permanent(reason) => {
                m.counters.denied(reason).increment(1);
                decided(m);
                tracing::debug!(
                    target: "pace_tower",
                    limit = %m.name,
                    reason = ?reason,
                    "denied for good"
                );
                let mut r = status(self.permanent);
                self.policy_field(&mut r, head);
                (Reason::Permanent(reason), r)
            }
            Refusal::Unavailable { error, retry_after } => {
                m.counters.unavailable.increment(1);
                let wait = retry_after.unwrap_or(Duration::from_secs(1));
                // One warning per outage: at its first refusal (until the
                // limit decides again).
                #[cfg(not(pace_mutant = "tower_warn_every_outage_request"))]
                let first = !m.counters.outage.swap(true, Ordering::Relaxed);
                #[cfg(pace_mutant = "tower_warn_every_outage_request")]
                let first = true;
                if first {
                    tracing::warn!(
                        target: "pace_tower",
                        limit = %m.name,
                        error = %error,
                        retry_after_ms = wait.as_millis() as u64,
                        "no decision from the limit: answering 503 until it decides again"
                    );
                } else {
                    tracing::debug!(
                        target: "pace_tower",
                        limit = %m.name,
                        error = %error,
                        "no decision from the limit"
                    );
                }
                let mut r = status(StatusCode::SERVICE_UNAVAILABLE);
                r.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    HeaderValue::from(retry_after_secs(wait)),
                );
                (Reason::Unavailable { retry_after }, r)
            }
        }
    }

    /// The default answer to an exhausted limit (the `index`th) that frees
    /// its tokens after `wait`: `429`, `Retry-After`, `RateLimit` (an item
    /// per limit of the layer as it stands after the answer: the
    /// exhausted one `r=0` with the wait, the others what their keys have
    /// left, every reservation of the request refunded) and
    /// `RateLimit-Policy`.
    fn exhausted(&self, index: usize, wait: Duration, head: &RequestHead<'_>) -> Response<()> {
        let secs = retry_after_secs(wait);
        let mut r = status(StatusCode::TOO_MANY_REQUESTS);
        r.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        let mut acc = FieldAcc::new(self);
        self.limits.answer_fields(head, index, secs, &mut acc);
        acc.finish(self, Src::Head(head)).write(r.headers_mut());
        r
    }

    fn policy_field<B>(&self, r: &mut Response<B>, head: &RequestHead<'_>) {
        if let Some(p) = self.policy_for(Src::Head(head)) {
            r.headers_mut().insert(headers::RATELIMIT_POLICY.clone(), p);
        }
    }
}
