//! `PaceLayer`: keyed limits in front of a service.
//!
//! * this module: the public types of a limit ([`Limit`], [`MissingKey`],
//!   [`ResponseHead`], [`InvalidPolicyName`]);
//! * `service`: [`PaceLayerBuilder`], [`PaceLayer`] and the admission of a
//!   request ([`PaceService`]'s `call`);
//! * `limits`: the chain of limits a layer reserves ([`Limits`]) and what a
//!   request's reservation stands at;
//! * `admission`: each limit's part of the chain (keys, reservations,
//!   refunds, its `RateLimit` item);
//! * `fields`: the `RateLimit` / `RateLimit-Policy` values;
//! * `meta`: what the layer keeps of each limit besides the limit, and the
//!   `RateLimit` value a request's limits write their items into (a leaf);
//! * `future`: [`ResponseFuture`], which waits for a limit that answers
//!   later and settles refunds on the response;
//! * `reject`: the layer's own answers ([`Rejection`], [`Respond`]).

mod admission;
mod fields;
mod future;
mod limits;
mod meta;
mod reject;
mod service;
mod shared;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, HeaderMap, StatusCode};
use metrics::{Counter, Gauge};
use pace::Quota;

use crate::key::{KeyExtractor, RequestHead};
use crate::limit::AsyncLimit;

pub use self::future::ResponseFuture;
pub use self::limits::Limits;
pub use self::reject::{
    DefaultRespond, ProblemDetails, Reason, Rejection, Respond, RespondFn, MISSING_PEER_ADDR_BODY,
    TOO_MANY_REQUESTS_BODY, UNAVAILABLE_BODY,
};
pub use self::service::{PaceLayer, PaceLayerBuilder, PaceService};

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

impl ResponseHead<'_> {
    /// The gRPC status of a trailers-only gRPC answer (`grpc-status` in the
    /// header block: how tonic answers a unary call that fails, and how
    /// gRPC servers answer a call that fails before its first message), as
    /// its number (`tonic::Code::from_i32` names it); `None` without one.
    ///
    /// A call that sends messages (any successful call, and a streaming
    /// call that fails after its first message) has its status in the
    /// trailers, after the body; a refund predicate decides on the head,
    /// before the body, so it sees `None` for such a call (whatever status
    /// it ends with). Refund on an error status with
    /// `refund_if(|r| r.grpc_status().is_some_and(|c| c != 0))`.
    pub fn grpc_status(&self) -> Option<i32> {
        crate::grpc::status_of(self.headers)
    }
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
type QuotaFn = dyn Fn(&RequestHead<'_>) -> Option<Quota> + Send + Sync;

/// One limit of a [`PaceLayer`]: a named limit (a local `pace::Pace`, or
/// any [`AsyncLimit`], such as one shared across replicas), the extractor
/// of its key, the cost of a request, what to do without a key and when to
/// refund.
pub struct Limit<E: KeyExtractor, A> {
    name: String,
    limiter: Arc<A>,
    extractor: E,
    missing: MissingKey<E::Key>,
    cost: Option<Box<CostFn>>,
    refund: Option<Box<RefundFn>>,
    quota: Option<Box<QuotaFn>>,
    wait: Option<Duration>,
    /// Its index in the layer (set when the layer is built).
    index: usize,
    /// Whether the layer may refund its reservation (it has a refund
    /// predicate, or a limit after it may refuse) and the limit has holds
    /// ([`AsyncLimit::holds`]): it is then held ([`AsyncLimit::hold`]) and
    /// kept ([`AsyncLimit::keep`]) when not refunded. Set when the layer is
    /// built.
    hold: bool,
    /// False after [`exact_refunds(false)`](Limit::exact_refunds): never
    /// held.
    exact: bool,
    /// Its admission counter and row gauge (set when the layer is built),
    /// kept with it for the admitted path.
    admitted: Counter,
    rows: Gauge,
    /// Set while the limit gives no decision (shared with its `Meta`): an
    /// outage is logged once at its start and once at its end.
    outage: Arc<AtomicBool>,
    /// Its lease counters, for a limit with leases
    /// ([`AsyncLimit::leases`]; set when the layer is built).
    leases: Option<limits::LeaseCounters>,
}

impl<E, A> Limit<E, A>
where
    E: KeyExtractor,
    A: AsyncLimit<E::Key>,
{
    /// A limit called `name` (its policy name in the `RateLimit` fields: any
    /// printable ASCII) on `limiter` (an `Arc<pace::Pace<K>>`, or any
    /// [`AsyncLimit`]), keyed by `extractor`. By default a request costs 1
    /// token, a request without a key is answered 400, and nothing is
    /// refunded.
    pub fn new(name: impl Into<String>, limiter: Arc<A>, extractor: E) -> Self {
        Limit {
            name: name.into(),
            limiter,
            extractor,
            missing: MissingKey::Reject(StatusCode::BAD_REQUEST),
            cost: None,
            refund: None,
            quota: None,
            wait: None,
            index: 0,
            hold: false,
            exact: true,
            admitted: Counter::noop(),
            rows: Gauge::noop(),
            outage: Arc::default(),
            leases: None,
        }
    }

    /// What to do with a request that has no key. (A request without the
    /// peer address a [`PeerIp`](crate::PeerIp) or
    /// [`ForwardedIp`](crate::ForwardedIp) reads is a server
    /// misconfiguration, answered 500 whatever this says: see
    /// [`Reason::MissingPeerAddr`].)
    pub fn missing_key(mut self, missing: MissingKey<E::Key>) -> Self {
        self.missing = missing;
        self
    }

    /// The tokens a request costs (`reserve_n`). A cost of 0 always
    /// passes; a cost above the capacity is a permanent denial.
    pub fn cost(mut self, f: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Box::new(f));
        self
    }

    /// Refunds this limit's reservation when `f` is true of the response
    /// (for example the claimed client id when the answer is
    /// `401 invalid_client`). The limit is then *held*
    /// ([`AsyncLimit::hold`]; for a `pace::Pace`, `Pace::hold_n`): a refund
    /// returns the request's tokens exactly, in any order, however many
    /// other requests of the key overlap it, so a flood of wrong
    /// presentations of a key leaves no trace on it; an answer the
    /// predicate does not refund keeps them ([`AsyncLimit::keep`], a second
    /// CAS on the key's row). A hold the response does not resolve within
    /// twice the limiter's hold limit (`pace::Builder::hold_limit`, 10 s
    /// by default: a handler slower than 20 s) counts as kept, and its
    /// refund then returns nothing. A `pace_redis::RedisPace` limit is held
    /// the same way on the server (`RedisPace::hold_n`: exact across
    /// replicas; a hold not resolved within its hold limit,
    /// `pace_redis::Builder::hold_limit`, 10 s by default, settles as
    /// kept). A limit without holds (the defaults of [`AsyncLimit`]) is
    /// refunded by its own rule (for a plain reservation: everything if
    /// nothing else debited the key since, nothing otherwise). A queueing
    /// limit ([`wait_up_to`](Limit::wait_up_to)) cannot have one (see
    /// there).
    pub fn refund_if(
        mut self,
        f: impl Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.refund = Some(Box::new(f));
        self
    }

    /// Whether the layer holds this limit when it may refund it (true by
    /// default; see [`PaceLayerBuilder::limit`]), so that the refund is
    /// exact whatever else happens on the key. `false` reserves it plainly
    /// whatever the layer does with it: one CAS and no held record per
    /// request, but a refund (a refund predicate, or a later limit's
    /// denial) returns nothing once another request's debit of the key
    /// landed after it. Only for a limit whose traces hurt nobody but the
    /// key itself (per source, before a limit per claimed id: a flood
    /// from one source then spends that source's own budget a little
    /// faster), never for a key someone else can name.
    pub fn exact_refunds(mut self, exact: bool) -> Self {
        self.exact = exact;
        self
    }

    /// The quota a request is decided with (for example the caller's plan,
    /// read from a header or an extension); `None` for the limiter's own
    /// (for a `pace::Pace`, its default quota, which
    /// `Pace::set_quota` changes while it runs). The request's quota is
    /// what its reservation, its `RateLimit` item and its
    /// `RateLimit-Policy` item follow. A key debited under several quotas
    /// keeps its debt across them (see `pace::Pace::reserve_with`).
    ///
    /// `f` is called once per request, and up to twice more when the layer
    /// answers the request itself (for the `RateLimit` and
    /// `RateLimit-Policy` fields of the answer): make it a function of the
    /// request. A `pace::Pace` and a
    /// `pace_redis::RedisPace` take it (`reserve_n_with`, `hold_n_with`,
    /// `acquire_n_with`; for a `RedisPace`, a quota whose capacity x
    /// interval exceeds `pace_redis::MAX_TAU_NS`, about 13 days, gives no
    /// decision: `503`); a limit that cannot take a quota per call
    /// ([`AsyncLimit::takes_quota`] false) ignores it.
    pub fn quota(
        mut self,
        f: impl Fn(&RequestHead<'_>) -> Option<Quota> + Send + Sync + 'static,
    ) -> Self {
        self.quota = Some(Box::new(f));
        self
    }

    /// Queueing: a request this limit cannot admit now waits for its
    /// key's turn, up to `max`, instead of being answered 429 (for a
    /// `pace::Pace`, `Pace::acquire_n`: one reservation of a slot up to
    /// `max` ahead, then one sleep on `futures-timer` until it; for a
    /// `pace_redis::RedisPace`, `RedisPace::acquire_n`: the same with one
    /// script call, the slot on the server's clock, whichever replica the
    /// request came to; the requests of a key go through in the order they
    /// reserved). A request whose
    /// turn lies further than `max` is answered 429 at once, writing
    /// nothing: `Retry-After` is the exact wait it would need now (in
    /// whole seconds, rounded up; exact in the [`Reason::Exhausted`] the
    /// response hook sees). One that can never pass (a cost above the
    /// capacity) is denied for good, as without queueing.
    ///
    /// A request dropped before its turn (the client went away) gives the
    /// turn back by the refund rule: its tokens return when nothing was
    /// debited from the key since, and are otherwise lost (fewer
    /// admissions, never more). A turn is such a plain reservation, not a
    /// hold, so the layer refuses to build ([`BuildError::QueuedRefund`])
    /// a queueing limit it may refund (a refund predicate, or a limit after
    /// it): a flood of refunded turns on a key someone else can name would
    /// drain it. Make the queueing limit the last one without a refund
    /// predicate, or give up its exact refunds
    /// ([`exact_refunds`](Limit::exact_refunds)`(false)`: its refunds then
    /// follow the plain rule). The limits before this one stay debited
    /// (held) while it waits; a wait longer than twice their hold limit
    /// lets their holds expire as kept. Each request to a queueing limit
    /// allocates its wait (also when its turn is now), and the wait needs
    /// a tokio runtime. A limit that cannot wait ([`AsyncLimit::acquire`]
    /// `None`) reserves as without queueing.
    pub fn wait_up_to(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }
}

/// Why [`PaceLayerBuilder::build`] refused its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// A limit's name is not printable ASCII.
    InvalidPolicyName(InvalidPolicyName),
    /// A queueing limit ([`Limit::wait_up_to`]) that the layer may refund
    /// (it has a [`Limit::refund_if`], or a limit after it may refuse the
    /// request) with exact refunds ([`Limit::exact_refunds`], true by
    /// default). A turn is a plain reservation of a slot ahead (the core's
    /// `Pace::acquire_n`, pace-redis's `RedisPace::acquire_n`), not a
    /// hold: its refund would return nothing once another request of the
    /// key was debited after it, so a flood of refunded turns on a key
    /// someone else can name would drain it. Make the queueing limit the
    /// last one without a refund predicate, or give up its exact refunds
    /// (`exact_refunds(false)`: its refunds then follow the plain rule).
    QueuedRefund {
        /// The limit's name.
        limit: String,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::InvalidPolicyName(e) => e.fmt(f),
            BuildError::QueuedRefund { limit } => write!(
                f,
                "limit {limit:?} queues (wait_up_to) and may be refunded (refund_if, or a \
                 limit after it), but a turn cannot be refunded exactly: make it the last \
                 limit without refund_if, or set exact_refunds(false)"
            ),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::InvalidPolicyName(e) => Some(e),
            BuildError::QueuedRefund { .. } => None,
        }
    }
}

impl From<InvalidPolicyName> for BuildError {
    fn from(e: InvalidPolicyName) -> BuildError {
        BuildError::InvalidPolicyName(e)
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
