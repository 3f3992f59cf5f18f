//! `PaceLayer`: keyed limits in front of a service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderValue, Request, Response, StatusCode};
use metrics::{Counter, Gauge};
use pace::{DenyReason, Quota, Rate};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::headers::{self, FieldWriter};
use crate::key::{KeyExtractor, RequestHead};
use crate::limit::{Acquire, AsyncLimit, Refusal};

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
    /// refund then returns nothing. A limit without holds (the defaults of
    /// [`AsyncLimit`], as `pace_redis::RedisPace`) is refunded by its own
    /// rule (for a plain reservation: everything if nothing else debited
    /// the key since, nothing otherwise).
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
    /// `f` is called once per request, and once more when the layer answers
    /// the request itself (for the `RateLimit-Policy` field of the answer):
    /// make it a function of the request. A limit that cannot take a quota
    /// per call ([`AsyncLimit::takes_quota`] false) ignores it.
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
    /// `max` ahead, then one sleep on `futures-timer` until it; the requests
    /// of a key go through in the order they reserved). A request whose
    /// turn lies further than `max` is answered 429 at once, writing
    /// nothing: `Retry-After` is the exact wait it would need now (in
    /// whole seconds, rounded up; exact in the [`Reason::Exhausted`] the
    /// response hook sees). One that can never pass (a cost above the
    /// capacity) is denied for good, as without queueing.
    ///
    /// A request dropped before its turn (the client went away) gives the
    /// turn back by the refund rule: its tokens return when nothing was
    /// debited from the key since, and are otherwise lost (fewer
    /// admissions, never more). A queueing limit reserves its turn with the
    /// plain kind, also when the layer may refund it (a refund predicate, a
    /// limit after it): those refunds follow the same rule, not the exact
    /// one of holds. The limits before this one stay debited (held) while
    /// it waits; a wait longer than twice their hold limit lets their holds
    /// expire as kept, and a refusal after it then returns nothing of
    /// them. Each request to a queueing limit allocates its wait
    /// (also when its turn is now), and the wait needs a tokio runtime. A
    /// limit that cannot wait ([`AsyncLimit::acquire`] `None`) reserves as
    /// without queueing.
    pub fn wait_up_to(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }

    /// The quota of this request, `None` for the limiter's own.
    #[inline]
    fn request_quota(&self, head: &RequestHead<'_>) -> Option<Quota> {
        match &self.quota {
            Some(f) if self.limiter.takes_quota() => f(head),
            _ => None,
        }
    }

    /// `(capacity, rate)` under `q`, or else the limiter's own quota.
    #[inline]
    fn term(&self, q: Option<Quota>) -> (u64, Rate) {
        match q.or_else(|| self.limiter.own_quota()) {
            Some(q) => (q.capacity(), q.rate()),
            None => (self.limiter.capacity(), self.limiter.rate()),
        }
    }

    /// Reserves now: a hold when the layer may refund this limit, the
    /// plain reservation otherwise.
    #[inline(always)]
    fn reserve_now(
        &self,
        key: &E::Key,
        n: u64,
        q: Option<Quota>,
    ) -> Option<Result<A::Debit, Refusal>> {
        match (q, self.hold) {
            (Some(q), false) => self.limiter.reserve_now_with(key, n, q),
            (None, false) => self.limiter.reserve_now(key, n),
            (Some(q), true) => self.limiter.hold_now_with(key, n, q),
            (None, true) => self.limiter.hold_now(key, n),
        }
    }

    /// Starts reserving (a limit that answers later), held as
    /// [`reserve_now`](Self::reserve_now) is.
    #[inline]
    fn reserve_later(&self, key: &E::Key, n: u64, q: Option<Quota>) -> A::Reserve {
        match (q, self.hold) {
            (Some(q), false) => self.limiter.reserve_with(key, n, q),
            (None, false) => self.limiter.reserve(key, n),
            (Some(q), true) => self.limiter.hold_with(key, n, q),
            (None, true) => self.limiter.hold(key, n),
        }
    }

    /// Settles an admitted `debit` that is not refunded: kept with
    /// [`AsyncLimit::keep`] when this limit holds, dropped (kept already)
    /// otherwise.
    #[inline(always)]
    fn keep_debit(&self, key: &E::Key, debit: A::Debit) {
        // Known-wrong variant for mutation tests: a held debit is dropped
        // (held until it expires) instead of kept.
        #[cfg(pace_mutant = "tower_no_keep")]
        let _ = (key, debit);
        #[cfg(not(pace_mutant = "tower_no_keep"))]
        if self.hold {
            self.limiter.keep(key, debit);
        }
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
    /// limit that is down); the default answer is `503`.
    Unavailable,
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
}

/// The body of the default answer to a request without a peer address.
pub const MISSING_PEER_ADDR_BODY: &str = "pace-tower: this limit keys by the peer address and the \
server recorded none. With axum, serve the router with \
`app.into_make_service_with_connect_info::<std::net::SocketAddr>()`; with another server, \
insert a `pace_tower::PeerAddr` (or `SocketAddr`) request extension before the layer.\n";

/// Builds the response to a [`Rejection`] (see [`PaceLayerBuilder::on_reject`]).
pub trait Respond<B>: Send + Sync + 'static {
    /// The response to `rejection`. `default` is what the layer sends
    /// without a hook: its status and header fields, with an empty body
    /// (the body of [`MISSING_PEER_ADDR_BODY`] for a missing peer address).
    fn respond(&self, rejection: &Rejection<'_>, default: Response<()>) -> Response<B>;
}

/// The default answers: `429` with `Retry-After` (whole seconds, rounded
/// up) and the `RateLimit` / `RateLimit-Policy` fields; a permanent denial
/// with [`permanent_status`](PaceLayerBuilder::permanent_status) (413) and
/// `RateLimit-Policy`; a missing key with the limit's status; a missing
/// peer address `500` with the body [`MISSING_PEER_ADDR_BODY`]. Empty
/// bodies otherwise.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultRespond;

impl<B: From<&'static str>> Respond<B> for DefaultRespond {
    fn respond(&self, rejection: &Rejection<'_>, default: Response<()>) -> Response<B> {
        let body = match rejection.reason {
            Reason::MissingPeerAddr => MISSING_PEER_ADDR_BODY,
            _ => "",
        };
        default.map(|()| B::from(body))
    }
}

/// A closure as a response hook (see [`PaceLayerBuilder::on_reject`]).
pub struct RespondFn<F>(F);

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

struct Counters {
    admitted: Counter,
    refunded: Counter,
    exhausted: Counter,
    exceeds_capacity: Counter,
    time_exhausted: Counter,
    missing_key: Counter,
    unavailable: Counter,
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
            unavailable: denied("unavailable"),
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

/// What the layer keeps of each limit besides the limit itself.
#[doc(hidden)]
pub struct Meta {
    name: String,
    /// The name as a serialized structured-field String.
    sf_name: String,
    counters: Counters,
}

mod sealed {
    use super::*;

    /// Why a request stops before the inner service.
    pub enum Stop {
        Missing { index: usize, status: StatusCode },
        NoPeer { index: usize },
        Refused { index: usize, refusal: Refusal },
    }

    /// Where a request's quotas are read from: its state (admitted), or
    /// its head (answered by the layer).
    pub enum Src<'a, 'h, S> {
        State(&'a S),
        Head(&'a RequestHead<'h>),
    }

    impl<S> Clone for Src<'_, '_, S> {
        fn clone(&self) -> Self {
            *self
        }
    }

    impl<S> Copy for Src<'_, '_, S> {}

    /// The limits of a layer: `()` and `(limits, Limit)`, reserved left to
    /// right.
    pub trait LimitsImpl: Send + Sync + 'static {
        /// Per request: where each limit's reservation stands.
        type State: Send + 'static;

        /// Validates names and registers counters, in order.
        fn prepare(&mut self, metas: &mut Vec<Meta>) -> Result<(), InvalidPolicyName>;
        /// `(name, capacity, rate)` of each limit under its own quota.
        fn policy_items<'a>(&'a self, metas: &'a [Meta], out: &mut Vec<(&'a str, u64, Rate)>);
        /// Whether any limit refunds on the response.
        fn refunds_on_response(&self) -> bool;
        /// Every limit's key and cost, in order, reserving each limit that
        /// decides at once ([`AsyncLimit::reserve_now`]) as long as every
        /// limit before it was decided; true when all were (the request is
        /// admitted). On a stop, whatever was reserved is refunded, newest
        /// first, before this returns it.
        fn start(&self, head: &RequestHead<'_>) -> Result<(Self::State, bool), Stop>;
        /// Whether every limit decides at once ([`AsyncLimit::decides_at_once`],
        /// no queueing) and takes its own quota (no [`Limit::quota`]
        /// closure): [`light`](Self::light) then applies.
        fn at_once(&self) -> bool;
        /// Reserves every limit in order, each at once, then runs `then`
        /// (the limits after it; `()` has none): a limit that refuses (or a
        /// request without its key) stops the chain, and each limit before
        /// it refunds its reservation as the stop passes it back (newest
        /// first). Keeps nothing: when `then` passes, each admission is
        /// counted and its debit kept ([`AsyncLimit::keep`] for a held
        /// one). With `fields`, each limit adds
        /// its `RateLimit` item right after its reservation. Only for
        /// limits that are [`at_once`](Self::at_once).
        fn light<F>(
            &self,
            head: &RequestHead<'_>,
            fields: Option<&mut FieldAcc<'_>>,
            then: F,
        ) -> Result<(), Stop>
        where
            F: FnOnce(Option<&mut FieldAcc<'_>>) -> Result<(), Stop>;
        /// Reserves the limits in order (each once the ones before it
        /// admitted). On a refusal, the ones before it are refunded, newest
        /// first, before this returns it.
        fn poll_reserve(
            &self,
            st: &mut Self::State,
            cx: &mut Context<'_>,
        ) -> Poll<Result<(), Stop>>;
        /// Refunds everything `st` holds, newest first.
        fn undo(&self, st: &mut Self::State);
        /// Keeps everything `st` holds that was not refunded (a held debit
        /// with [`AsyncLimit::keep`]): every admitted request's state ends
        /// here or in [`undo`](Self::undo).
        fn keep(&self, st: &mut Self::State);
        /// At admission, when the state goes on to the response: keeps the
        /// debits no refund predicate can return (held only while a later
        /// limit could refuse), so that their rows hold no hold while the
        /// inner service works.
        fn keep_unrefunded(&self, st: &mut Self::State);
        /// Marks the limits the layer may refund (a refund predicate, or a
        /// limit after it: `later`), which then hold.
        fn mark_holds(&mut self, later: bool);
        /// Counts the admission.
        fn admitted(&self, st: &Self::State);
        /// Applies the refund predicates to the response, newest first.
        fn settle(&self, st: &mut Self::State, resp: &ResponseHead<'_>, metas: &[Meta]);
        /// Adds one `RateLimit` item per reserved limit, and notes whether
        /// every limit's `(capacity, rate)` for the request is the one the
        /// layer was built with.
        fn fields(&self, st: &Self::State, acc: &mut FieldAcc<'_>);
        /// `f(index, capacity, rate)` of each limit, in order, under the
        /// request's quotas.
        fn terms(&self, src: Src<'_, '_, Self::State>, f: &mut dyn FnMut(usize, u64, Rate));
    }

    /// One limit's part of a request (`q`: its quota, `None` for the
    /// limit's own).
    pub enum Step<K, D: 'static, R> {
        /// No key, and the limit is skipped.
        Skip,
        /// Its turn has not come.
        Queued { key: K, n: u64, q: Option<Quota> },
        /// Its reservation is in flight.
        Waiting { key: K, q: Option<Quota>, fut: R },
        /// It waits for the key's turn ([`Limit::wait_up_to`]).
        Turning {
            key: K,
            q: Option<Quota>,
            fut: Acquire<D>,
        },
        /// Admitted (`debit` is `None` once refunded).
        Held {
            key: K,
            q: Option<Quota>,
            debit: Option<D>,
        },
        /// Refused, or moved out.
        Gone,
    }

    impl<K, D, R> Step<K, D, R> {
        /// The step's quota.
        #[inline]
        pub fn quota(&self) -> Option<Quota> {
            match self {
                Step::Queued { q, .. }
                | Step::Waiting { q, .. }
                | Step::Turning { q, .. }
                | Step::Held { q, .. } => *q,
                Step::Skip | Step::Gone => None,
            }
        }
    }
}

use sealed::{LimitsImpl, Src, Step, Stop};

/// The limits of a [`PaceLayer`], as [`PaceLayerBuilder::limit`] chains
/// them (implemented for those chains only).
pub trait Limits: LimitsImpl {}

impl<T: LimitsImpl> Limits for T {}

impl LimitsImpl for () {
    type State = ();

    fn prepare(&mut self, _: &mut Vec<Meta>) -> Result<(), InvalidPolicyName> {
        Ok(())
    }
    fn policy_items<'a>(&'a self, _: &'a [Meta], _: &mut Vec<(&'a str, u64, Rate)>) {}
    fn refunds_on_response(&self) -> bool {
        false
    }
    #[inline]
    fn start(&self, _: &RequestHead<'_>) -> Result<((), bool), Stop> {
        Ok(((), true))
    }
    #[inline]
    fn at_once(&self) -> bool {
        true
    }
    #[inline(always)]
    fn light<F>(
        &self,
        _: &RequestHead<'_>,
        fields: Option<&mut FieldAcc<'_>>,
        then: F,
    ) -> Result<(), Stop>
    where
        F: FnOnce(Option<&mut FieldAcc<'_>>) -> Result<(), Stop>,
    {
        then(fields)
    }
    #[inline]
    fn poll_reserve(&self, _: &mut (), _: &mut Context<'_>) -> Poll<Result<(), Stop>> {
        Poll::Ready(Ok(()))
    }
    #[inline]
    fn undo(&self, _: &mut ()) {}
    #[inline]
    fn keep(&self, _: &mut ()) {}
    #[inline]
    fn keep_unrefunded(&self, _: &mut ()) {}
    fn mark_holds(&mut self, _: bool) {}
    #[inline]
    fn admitted(&self, _: &()) {}
    #[inline]
    fn settle(&self, _: &mut (), _: &ResponseHead<'_>, _: &[Meta]) {}
    #[inline]
    fn fields(&self, _: &(), _: &mut FieldAcc<'_>) {}
    #[inline]
    fn terms(&self, _: Src<'_, '_, ()>, _: &mut dyn FnMut(usize, u64, Rate)) {}
}

/// The `RateLimit-Policy` value for `(name, capacity, rate)` items.
fn policy_value(items: Vec<(&str, u64, Rate)>) -> Option<HeaderValue> {
    headers::policy(
        items
            .into_iter()
            .map(|(name, q, rate)| (name, q, refill_ns(rate, q))),
    )
}

/// The ns `tokens` take to refill at `rate`, rounded up (`u64::MAX` past
/// it).
#[inline]
fn refill_ns(rate: pace::Rate, tokens: u64) -> u64 {
    let per = rate.per().as_nanos();
    // In 64 bits when the product fits (any bucket of under 584 years).
    if let Ok(per) = u64::try_from(per) {
        if let Some(p) = tokens.checked_mul(per) {
            return p.div_ceil(rate.count());
        }
    }
    let ns = (tokens as u128 * per).div_ceil(rate.count() as u128);
    u64::try_from(ns).unwrap_or(u64::MAX)
}

type StepOf<E, A> = Step<
    <E as KeyExtractor>::Key,
    <A as AsyncLimit<<E as KeyExtractor>::Key>>::Debit,
    <A as AsyncLimit<<E as KeyExtractor>::Key>>::Reserve,
>;

impl<E, A> Limit<E, A>
where
    E: KeyExtractor,
    A: AsyncLimit<E::Key>,
{
    #[inline(always)]
    fn start_one(&self, head: &RequestHead<'_>) -> Result<StepOf<E, A>, Stop> {
        let Some(key) = self.key(head)? else {
            return Ok(Step::Skip);
        };
        let n = self.cost.as_ref().map_or(1, |f| f(head));
        let q = self.request_quota(head);
        Ok(Step::Queued { key, n, q })
    }

    /// The request's key for this limit; `None` when it has none and the
    /// limit is skipped.
    #[inline(always)]
    fn key(&self, head: &RequestHead<'_>) -> Result<Option<E::Key>, Stop> {
        match self.extractor.extract(head) {
            Some(k) => Ok(Some(k)),
            None => self.no_key(head),
        }
    }

    #[cold]
    fn no_key(&self, head: &RequestHead<'_>) -> Result<Option<E::Key>, Stop> {
        if self.extractor.needs_peer_addr() && crate::key::peer_addr(head.extensions).is_none() {
            return Err(Stop::NoPeer { index: self.index });
        }
        match &self.missing {
            MissingKey::Reject(s) => Err(Stop::Missing {
                index: self.index,
                status: *s,
            }),
            MissingKey::Shared(k) => Ok(Some(k.clone())),
            MissingKey::Skip => Ok(None),
        }
    }

    /// Drives this limit's step; `Ready(Err)` is its refusal.
    #[inline]
    fn poll_one(&self, step: &mut StepOf<E, A>, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        loop {
            match step {
                Step::Queued { .. } => {
                    let Step::Queued { key, n, q } = std::mem::replace(step, Step::Gone) else {
                        unreachable!()
                    };
                    if let Some(max) = self.wait {
                        if let Some(fut) = self.limiter.clone().acquire(&key, n, q, max) {
                            *step = Step::Turning { key, q, fut };
                            continue;
                        }
                    }
                    match self.reserve_now(&key, n, q) {
                        Some(Ok(d)) => {
                            *step = Step::Held {
                                key,
                                q,
                                debit: Some(d),
                            };
                            return Poll::Ready(Ok(()));
                        }
                        Some(Err(refusal)) => return Poll::Ready(Err(refusal)),
                        None => {
                            let fut = self.reserve_later(&key, n, q);
                            *step = Step::Waiting { key, q, fut };
                        }
                    }
                }
                Step::Waiting { fut, .. } => {
                    let out = std::task::ready!(Pin::new(fut).poll(cx));
                    let Step::Waiting { key, q, .. } = std::mem::replace(step, Step::Gone) else {
                        unreachable!()
                    };
                    return Poll::Ready(out.map(|d| {
                        *step = Step::Held {
                            key,
                            q,
                            debit: Some(d),
                        };
                    }));
                }
                Step::Turning { fut, .. } => {
                    let out = std::task::ready!(fut.as_mut().poll(cx));
                    let Step::Turning { key, q, .. } = std::mem::replace(step, Step::Gone) else {
                        unreachable!()
                    };
                    return Poll::Ready(out.map(|d| {
                        *step = Step::Held {
                            key,
                            q,
                            debit: Some(d),
                        };
                    }));
                }
                Step::Skip | Step::Held { .. } | Step::Gone => return Poll::Ready(Ok(())),
            }
        }
    }

    /// Counts an admission by this limit.
    #[inline(always)]
    fn count_admitted(&self) {
        self.admitted.increment(1);
        if let Some(rows) = self.limiter.rows() {
            self.rows.set(rows as f64);
        }
    }

    /// This limit's part of [`LimitsImpl::light`]: reserves it at once,
    /// adds its field, runs `then` (the limits after it), and refunds its
    /// reservation if `then` stops.
    #[inline(always)]
    fn light_one<F>(
        &self,
        head: &RequestHead<'_>,
        fields: Option<&mut FieldAcc<'_>>,
        then: F,
    ) -> Result<(), Stop>
    where
        F: FnOnce(Option<&mut FieldAcc<'_>>) -> Result<(), Stop>,
    {
        // The extractor's key on the hot path, without the `Result` of
        // [`key`](Self::key) around it.
        let key = match self.extractor.extract(head) {
            Some(k) => Some(k),
            None => self.no_key(head)?,
        };
        let Some(key) = key else {
            // Skipped (no key, `MissingKey::Skip`): no item; the policy
            // still lists its quota.
            let mut fields = fields;
            if let Some(acc) = fields.as_deref_mut() {
                acc.same &= acc.built.get(self.index) == Some(&self.term(None));
            }
            return then(fields);
        };
        let n = self.cost.as_ref().map_or(1, |f| f(head));
        let debit = match self.reserve_now(&key, n, None) {
            Some(Ok(d)) => d,
            Some(Err(refusal)) => {
                return Err(Stop::Refused {
                    index: self.index,
                    refusal,
                })
            }
            // `decides_at_once` promised a decision.
            None => {
                return Err(Stop::Refused {
                    index: self.index,
                    refusal: Refusal::Unavailable("the limit did not decide at once".into()),
                })
            }
        };
        let mut fields = fields;
        if let Some(acc) = fields.as_deref_mut() {
            self.field(&key, Some(&debit), None, acc);
        }
        match then(fields) {
            Ok(()) => {
                self.keep_debit(&key, debit);
                self.count_admitted();
                Ok(())
            }
            Err(stop) => {
                self.limiter.refund(&key, debit);
                Err(stop)
            }
        }
    }

    /// Adds this limit's `RateLimit` item for `key` (under `q`, or the
    /// limit's own quota, read once so that the tokens and the times follow
    /// the same one); notes whether its `(capacity, rate)` is the one the
    /// layer was built with.
    #[inline]
    fn field(
        &self,
        key: &E::Key,
        debit: Option<&A::Debit>,
        q: Option<Quota>,
        acc: &mut FieldAcc<'_>,
    ) {
        let quota = q.or_else(|| self.limiter.own_quota());
        let (cap, rate) = match quota {
            Some(q) => (q.capacity(), q.rate()),
            None => (self.limiter.capacity(), self.limiter.rate()),
        };
        let remaining = match quota {
            Some(q) => self.limiter.remaining_with(key, debit, q),
            None => self.limiter.remaining(key, debit),
        };
        if let Some(r) = remaining {
            let t = headers::ceil_secs(refill_ns(rate, cap.saturating_sub(r)));
            acc.w.item(&acc.metas[self.index].sf_name, r, t);
        }
        acc.same &= acc.built.get(self.index) == Some(&(cap, rate));
    }

    /// Keeps what `step` holds (not refunded). A limit that does not hold
    /// keeps its debit in the step (for its `RateLimit` item): dropping it
    /// keeps it.
    #[inline]
    fn keep_one(&self, step: &mut StepOf<E, A>) {
        if !self.hold {
            return;
        }
        if let Step::Held { key, debit, .. } = step {
            if let Some(d) = debit.take() {
                self.keep_debit(key, d);
            }
        }
    }

    #[inline]
    fn undo_one(&self, step: &mut StepOf<E, A>) {
        if let Step::Held { key, debit, .. } = step {
            if let Some(d) = debit.take() {
                self.limiter.refund(key, d);
            }
        }
    }
}

impl<L, E, A> LimitsImpl for (L, Limit<E, A>)
where
    L: LimitsImpl,
    E: KeyExtractor,
    A: AsyncLimit<E::Key>,
{
    type State = (L::State, StepOf<E, A>);

    fn prepare(&mut self, metas: &mut Vec<Meta>) -> Result<(), InvalidPolicyName> {
        self.0.prepare(metas)?;
        let m = &mut self.1;
        let sf_name =
            headers::sf_string(&m.name).ok_or_else(|| InvalidPolicyName(m.name.clone()))?;
        m.index = metas.len();
        let counters = Counters::new(&m.name);
        m.admitted = counters.admitted.clone();
        m.rows = counters.rows.clone();
        metas.push(Meta {
            counters,
            name: m.name.clone(),
            sf_name,
        });
        Ok(())
    }

    fn policy_items<'a>(&'a self, metas: &'a [Meta], out: &mut Vec<(&'a str, u64, Rate)>) {
        self.0.policy_items(metas, out);
        let m = &self.1;
        let (q, rate) = m.term(None);
        out.push((metas[m.index].name.as_str(), q, rate));
    }

    fn refunds_on_response(&self) -> bool {
        self.1.refund.is_some() || self.0.refunds_on_response()
    }

    #[inline(always)]
    fn start(&self, head: &RequestHead<'_>) -> Result<(Self::State, bool), Stop> {
        let (mut left, decided) = self.0.start(head)?;
        let (key, n, q) = match self.1.start_one(head) {
            Ok(Step::Queued { key, n, q }) => (key, n, q),
            Ok(step) => return Ok(((left, step), decided)),
            Err(stop) => {
                self.0.undo(&mut left);
                return Err(stop);
            }
        };
        if !decided || self.1.wait.is_some() {
            // Undecided before it, or a limit that may wait: reserved in
            // `poll_reserve`.
            return Ok(((left, Step::Queued { key, n, q }), false));
        }
        match self.1.reserve_now(&key, n, q) {
            Some(Ok(d)) => Ok((
                (
                    left,
                    Step::Held {
                        key,
                        q,
                        debit: Some(d),
                    },
                ),
                true,
            )),
            Some(Err(refusal)) => {
                self.0.undo(&mut left);
                Err(Stop::Refused {
                    index: self.1.index,
                    refusal,
                })
            }
            None => Ok(((left, Step::Queued { key, n, q }), false)),
        }
    }

    fn at_once(&self) -> bool {
        self.1.wait.is_none()
            && self.1.quota.is_none()
            && self.1.limiter.decides_at_once()
            && self.0.at_once()
    }

    #[inline(always)]
    fn light<F>(
        &self,
        head: &RequestHead<'_>,
        fields: Option<&mut FieldAcc<'_>>,
        then: F,
    ) -> Result<(), Stop>
    where
        F: FnOnce(Option<&mut FieldAcc<'_>>) -> Result<(), Stop>,
    {
        self.0
            .light(head, fields, |fields| self.1.light_one(head, fields, then))
    }

    #[inline]
    fn poll_reserve(&self, st: &mut Self::State, cx: &mut Context<'_>) -> Poll<Result<(), Stop>> {
        std::task::ready!(self.0.poll_reserve(&mut st.0, cx))?;
        match std::task::ready!(self.1.poll_one(&mut st.1, cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(refusal) => {
                self.0.undo(&mut st.0);
                Poll::Ready(Err(Stop::Refused {
                    index: self.1.index,
                    refusal,
                }))
            }
        }
    }

    #[inline]
    fn undo(&self, st: &mut Self::State) {
        self.1.undo_one(&mut st.1);
        self.0.undo(&mut st.0);
    }

    #[inline]
    fn keep(&self, st: &mut Self::State) {
        self.0.keep(&mut st.0);
        self.1.keep_one(&mut st.1);
    }

    #[inline]
    fn keep_unrefunded(&self, st: &mut Self::State) {
        self.0.keep_unrefunded(&mut st.0);
        if self.1.refund.is_none() {
            self.1.keep_one(&mut st.1);
        }
    }

    fn mark_holds(&mut self, later: bool) {
        self.1.hold = (later || self.1.refund.is_some()) && self.1.exact && self.1.limiter.holds();
        // Known-wrong variant for mutation tests: every limit reserved
        // with the plain kind, as before holds (refunds by the old rule).
        #[cfg(pace_mutant = "tower_plain_reserve")]
        {
            self.1.hold = false;
        }
        self.0.mark_holds(true);
    }

    #[inline(always)]
    fn admitted(&self, st: &Self::State) {
        self.0.admitted(&st.0);
        if let Step::Held { .. } = st.1 {
            self.1.count_admitted();
        }
    }

    #[inline]
    fn settle(&self, st: &mut Self::State, resp: &ResponseHead<'_>, metas: &[Meta]) {
        if let (Some(f), Step::Held { key, debit, .. }) = (&self.1.refund, &mut st.1) {
            if debit.is_some() && f(resp) {
                if let Some(d) = debit.take() {
                    self.1.limiter.refund(key, d);
                    let c = &metas[self.1.index].counters;
                    c.refunded.increment(1);
                    if let Some(rows) = self.1.limiter.rows() {
                        c.rows.set(rows as f64);
                    }
                }
            }
        }
        self.0.settle(&mut st.0, resp, metas);
    }

    #[inline]
    fn fields(&self, st: &Self::State, acc: &mut FieldAcc<'_>) {
        self.0.fields(&st.0, acc);
        let m = &self.1;
        match &st.1 {
            Step::Held { key, q, debit } => m.field(key, debit.as_ref(), *q, acc),
            // No item; the policy follows the step's quota.
            step => {
                let (cap, rate) = m.term(step.quota());
                acc.same &= acc.built.get(m.index) == Some(&(cap, rate));
            }
        }
    }

    #[inline]
    fn terms(&self, src: Src<'_, '_, Self::State>, f: &mut dyn FnMut(usize, u64, Rate)) {
        let (left, q) = match src {
            Src::State(st) => (Src::State(&st.0), st.1.quota()),
            Src::Head(h) => (Src::Head(h), self.1.request_quota(h)),
        };
        self.0.terms(left, f);
        let (cap, rate) = self.1.term(q);
        f(self.1.index, cap, rate);
    }
}

struct Shared<L, H> {
    limits: L,
    metas: Vec<Meta>,
    /// The `RateLimit-Policy` value under the quotas the layer was built
    /// with, and those quotas' `(capacity, rate)` per limit.
    policy: Option<HeaderValue>,
    policy_terms: Vec<(u64, Rate)>,
    headers: bool,
    /// Whether a limit refunds on the response: an admitted request then
    /// keeps its reservations (and the layer) until the response, and its
    /// fields are written after its refunds; otherwise they are written
    /// when it is admitted and the response future holds only their
    /// values.
    refunds: bool,
    /// No refunds, and every limit decides at once with its own quota:
    /// admitted requests go through [`LimitsImpl::light`] and keep
    /// nothing.
    light: bool,
    permanent: StatusCode,
    respond: H,
}

/// Builds a [`PaceLayer`].
#[must_use = "a builder does nothing until build() is called"]
pub struct PaceLayerBuilder<L = (), H = DefaultRespond> {
    limits: L,
    headers: bool,
    permanent: StatusCode,
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
    /// the key's row, and the core's held record per request, taken from
    /// the thread's pool of freed records or else allocated).
    /// The last limit, without a refund predicate, is never refunded and
    /// keeps the plain one-CAS reservation: a layer of one such limit costs
    /// what it did before holds; in a layer of several, put the busiest
    /// limit that is never refunded last, or give up the exact refunds of a
    /// limit whose traces hurt only its own key
    /// ([`Limit::exact_refunds`]`(false)`). A limit without holds
    /// ([`AsyncLimit::holds`] false, as a shared Redis limit) and a
    /// queueing one ([`Limit::wait_up_to`]) are reserved plainly.
    pub fn limit<E, A>(self, limit: Limit<E, A>) -> PaceLayerBuilder<(L, Limit<E, A>), H>
    where
        E: KeyExtractor,
        A: AsyncLimit<E::Key>,
    {
        PaceLayerBuilder {
            limits: (self.limits, limit),
            headers: self.headers,
            permanent: self.permanent,
            respond: self.respond,
        }
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
            respond: RespondFn(f),
        }
    }

    /// The layer. Counters are registered with the `metrics` recorder
    /// installed now (install it first; without one they cost nothing).
    ///
    /// # Errors
    /// [`InvalidPolicyName`] when a limit's name is not printable ASCII.
    pub fn build(mut self) -> Result<PaceLayer<L, H>, InvalidPolicyName> {
        let mut metas = Vec::new();
        self.limits.prepare(&mut metas)?;
        let mut items = Vec::new();
        self.limits.policy_items(&metas, &mut items);
        let policy_terms = items.iter().map(|&(_, q, rate)| (q, rate)).collect();
        // Static: cloned per response without a reference count.
        let policy = policy_value(items).and_then(|v| headers::interned(&v));
        self.limits.mark_holds(false);
        let refunds = self.limits.refunds_on_response();
        let light = !refunds && self.limits.at_once();
        Ok(PaceLayer {
            shared: Arc::new(Shared {
                limits: self.limits,
                metas,
                policy,
                policy_terms,
                headers: self.headers,
                refunds,
                light,
                permanent: self.permanent,
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
///
/// [`PaceLayerBuilder::on_reject`] replaces these answers. Denials and
/// missing keys are `tracing` events (target `pace_tower`): `DEBUG` for a
/// denial or a missing key, `ERROR` for a missing peer address.
///
/// An admitted request allocates nothing in the layer except, with the
/// fields on, the `RateLimit` value (and the `RateLimit-Policy` value when
/// a limit's quota for the request differs from the one the layer was built
/// with), a request to a queueing limit ([`Limit::wait_up_to`]) its
/// wait, and, in the core, each held limit's record (see
/// [`PaceLayerBuilder::limit`]). Reservations are kept when the inner
/// service fails or the response future is dropped. The layer is `Clone`
/// and cheap to clone (one `Arc`).
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

fn retry_after_secs(wait: Duration) -> u64 {
    #[cfg(pace_mutant = "retry_after_truncated")]
    return wait.as_secs();
    #[cfg(not(pace_mutant = "retry_after_truncated"))]
    {
        let s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        s.max(1)
    }
}

fn status(status: StatusCode) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = status;
    r
}

impl<L: Limits, H> Shared<L, H> {
    /// The answer to a request stopped before the inner service.
    #[cold]
    fn reject<B>(&self, stop: Stop, head: &RequestHead<'_>) -> Response<B>
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
                let m = &self.metas[index];
                match refusal {
                    Refusal::Exhausted { retry_after: wait } => {
                        m.counters.exhausted.increment(1);
                        let secs = retry_after_secs(wait);
                        tracing::debug!(
                            target: "pace_tower",
                            limit = %m.name,
                            retry_after_ms = wait.as_millis() as u64,
                            "denied"
                        );
                        let mut r = status(StatusCode::TOO_MANY_REQUESTS);
                        r.headers_mut()
                            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
                        let mut w = FieldWriter::new();
                        w.item(&m.sf_name, 0, secs);
                        if let Some(v) = w.value() {
                            r.headers_mut().insert(headers::RATELIMIT.clone(), v);
                        }
                        self.policy_field(&mut r, head);
                        (index, Reason::Exhausted { retry_after: wait }, r)
                    }
                    Refusal::Permanent(reason) => {
                        m.counters.denied(reason).increment(1);
                        tracing::debug!(
                            target: "pace_tower",
                            limit = %m.name,
                            reason = ?reason,
                            "denied for good"
                        );
                        let mut r = status(self.permanent);
                        self.policy_field(&mut r, head);
                        (index, Reason::Permanent(reason), r)
                    }
                    Refusal::Unavailable(error) => {
                        m.counters.unavailable.increment(1);
                        tracing::warn!(
                            target: "pace_tower",
                            limit = %m.name,
                            error = %error,
                            "no decision from the limit"
                        );
                        (
                            index,
                            Reason::Unavailable,
                            status(StatusCode::SERVICE_UNAVAILABLE),
                        )
                    }
                }
            }
        };
        let rejection = Rejection {
            limit: &self.metas[index].name,
            index,
            reason,
            request: head,
        };
        self.respond.respond(&rejection, r)
    }

    fn policy_field<B>(&self, r: &mut Response<B>, head: &RequestHead<'_>) {
        if let Some(p) = self.policy_for(Src::Head(head)) {
            r.headers_mut().insert(headers::RATELIMIT_POLICY.clone(), p);
        }
    }

    /// The `RateLimit-Policy` value under a request's quotas (read from
    /// the head, the quota closures run once more): the one made when the
    /// layer was built when they are the same, otherwise a new one.
    fn policy_for(&self, src: Src<'_, '_, L::State>) -> Option<HeaderValue> {
        let mut items = Vec::with_capacity(self.metas.len());
        self.limits.terms(src, &mut |index, q, rate| {
            items.push((self.metas[index].name.as_str(), q, rate));
        });
        if items
            .iter()
            .map(|&(_, q, rate)| (q, rate))
            .eq(self.policy_terms.iter().copied())
        {
            return self.policy.clone();
        }
        policy_value(items)
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

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let head = RequestHead::of(&req);
        if shared.light {
            // Every limit decides at once and nothing is kept after the
            // admission: no state, no reference to the layer in the future.
            if shared.headers {
                let mut acc = FieldAcc::new(shared);
                if let Err(stop) = shared.limits.light(&head, Some(&mut acc), |_| Ok(())) {
                    return ResponseFuture::rejected(shared.reject(stop, &head));
                }
                let fields = acc.finish(shared, Src::Head(&head));
                return ResponseFuture {
                    kind: Kind::Fields {
                        future: self.inner.call(req),
                        fields: Some(fields),
                    },
                };
            }
            if let Err(stop) = shared.limits.light(&head, None, |_| Ok(())) {
                return ResponseFuture::rejected(shared.reject(stop, &head));
            }
            return ResponseFuture {
                kind: Kind::Passthrough {
                    future: self.inner.call(req),
                },
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
                return ResponseFuture {
                    kind: Kind::Reserving {
                        wait: Box::new(Reserving {
                            st: Some(st),
                            req: Some(req),
                            svc: Some(svc),
                            shared: self.shared.clone(),
                        }),
                    },
                };
            }
        }
        ResponseFuture::admitted(&mut self.inner, req, st, &self.shared)
    }
}

/// What an admitted request does once its response is known: refunds and
/// the `RateLimit` fields. Whatever it holds that is not refunded is kept
/// when it is dropped: after the fields are written, or without a
/// response (the inner service failed, or the response future was
/// dropped).
struct Settle<L: Limits, H> {
    st: L::State,
    shared: Arc<Shared<L, H>>,
}

impl<L: Limits, H> Drop for Settle<L, H> {
    fn drop(&mut self) {
        self.shared.limits.keep(&mut self.st);
    }
}

impl<L: Limits, H> Settle<L, H> {
    /// Applies the refund predicates to `resp`, then writes its fields
    /// (in place: the response is not taken apart and put back). What is
    /// not refunded is kept when the settle is dropped, after this.
    fn settle<B>(&mut self, resp: &mut Response<B>) {
        let shared = &*self.shared;
        {
            let head = ResponseHead {
                status: resp.status(),
                headers: resp.headers(),
                extensions: resp.extensions(),
            };
            shared.limits.settle(&mut self.st, &head, &shared.metas);
        }
        if shared.headers {
            Fields::of(shared, &self.st).write(resp.headers_mut());
        }
    }
}

/// The `RateLimit` value of a request as its limits add their items, and
/// whether their quotas are the ones the layer was built with.
#[doc(hidden)]
pub struct FieldAcc<'a> {
    w: FieldWriter,
    same: bool,
    metas: &'a [Meta],
    built: &'a [(u64, Rate)],
}

impl<'a> FieldAcc<'a> {
    #[inline]
    fn new<L, H>(shared: &'a Shared<L, H>) -> FieldAcc<'a> {
        FieldAcc {
            w: FieldWriter::new(),
            same: true,
            metas: &shared.metas,
            built: &shared.policy_terms,
        }
    }

    /// The values: `RateLimit` as written, and `RateLimit-Policy` made when
    /// the layer was built (static: no allocation, no reference count)
    /// while the quotas are the same, otherwise from `src`'s quotas.
    #[inline]
    fn finish<L: Limits, H>(&self, shared: &Shared<L, H>, src: Src<'_, '_, L::State>) -> Fields {
        Fields {
            ratelimit: self.w.value(),
            policy: if self.same {
                shared.policy.clone()
            } else {
                shared.policy_for(src)
            },
        }
    }
}

/// The `RateLimit` and `RateLimit-Policy` values of an admitted request.
struct Fields {
    ratelimit: Option<HeaderValue>,
    policy: Option<HeaderValue>,
}

impl Fields {
    /// The values for the reservations `st` holds now.
    #[inline]
    fn of<L: Limits, H>(shared: &Shared<L, H>, st: &L::State) -> Fields {
        let mut acc = FieldAcc::new(shared);
        shared.limits.fields(st, &mut acc);
        acc.finish(shared, Src::State(st))
    }

    #[inline]
    fn write(self, headers: &mut HeaderMap) {
        if let Some(v) = self.ratelimit {
            headers.insert(headers::RATELIMIT.clone(), v);
        }
        if let Some(p) = self.policy {
            headers.insert(headers::RATELIMIT_POLICY.clone(), p);
        }
    }
}

pin_project! {
    /// The response future of a [`PaceService`].
    pub struct ResponseFuture<S, ReqBody, L, H>
    where
        S: Service<Request<ReqBody>>,
        L: Limits,
    {
        #[pin]
        kind: Kind<S, ReqBody, L, H>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, L, H>
    where
        S: Service<Request<ReqBody>>,
        L: Limits,
    {
        // Answered by the layer.
        Rejected { response: Option<S::Response> },
        // A shared limit is in flight (boxed: the admitted paths keep the
        // future small).
        Reserving { wait: Box<Reserving<S, ReqBody, L, H>> },
        // Admitted, nothing to do after the response.
        Passthrough { #[pin] future: S::Future },
        // Admitted, no refunds: the fields, written when it was admitted.
        Fields { #[pin] future: S::Future, fields: Option<Fields> },
        // Admitted: refunds and fields once the response is known.
        Settle { #[pin] future: S::Future, settle: Option<Settle<L, H>> },
    }
}

/// A request waiting for a limit that answers later. Dropped while it
/// waits, it keeps what the limits before it admitted.
struct Reserving<S, ReqBody, L: Limits, H> {
    st: Option<L::State>,
    req: Option<Request<ReqBody>>,
    svc: Option<S>,
    shared: Arc<Shared<L, H>>,
}

impl<S, ReqBody, L: Limits, H> Drop for Reserving<S, ReqBody, L, H> {
    fn drop(&mut self) {
        if let Some(st) = &mut self.st {
            self.shared.limits.keep(st);
        }
    }
}

impl<S, ReqBody, L, H> fmt::Debug for ResponseFuture<S, ReqBody, L, H>
where
    S: Service<Request<ReqBody>>,
    L: Limits,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqBody, L, H> ResponseFuture<S, ReqBody, L, H>
where
    S: Service<Request<ReqBody>>,
    L: Limits,
{
    fn rejected(response: S::Response) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                response: Some(response),
            },
        }
    }

    /// Counts the admission and calls `svc` (ready).
    #[inline(always)]
    fn admitted(
        svc: &mut S,
        req: Request<ReqBody>,
        mut st: L::State,
        shared: &Arc<Shared<L, H>>,
    ) -> Self {
        shared.limits.admitted(&st);
        if shared.refunds {
            // Admitted: only the refund predicates can return something
            // now; the other limits' holds are kept before the inner call.
            shared.limits.keep_unrefunded(&mut st);
            let future = svc.call(req);
            return ResponseFuture {
                kind: Kind::Settle {
                    future,
                    settle: Some(Settle {
                        st,
                        shared: shared.clone(),
                    }),
                },
            };
        }
        if shared.headers {
            // Written now, while the rows are in cache: nothing of the layer
            // waits for the response.
            let fields = Fields::of(shared, &st);
            shared.limits.keep(&mut st);
            let future = svc.call(req);
            return ResponseFuture {
                kind: Kind::Fields {
                    future,
                    fields: Some(fields),
                },
            };
        }
        shared.limits.keep(&mut st);
        ResponseFuture {
            kind: Kind::Passthrough {
                future: svc.call(req),
            },
        }
    }
}

impl<S, ReqBody, ResBody, L, H> Future for ResponseFuture<S, ReqBody, L, H>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    L: Limits,
    H: Respond<ResBody>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().kind.project() {
                KindProj::Passthrough { future } => return future.poll(cx),
                KindProj::Fields { future, fields } => {
                    let out = std::task::ready!(future.poll(cx));
                    return Poll::Ready(out.map(|mut resp| {
                        if let Some(f) = fields.take() {
                            f.write(resp.headers_mut());
                        }
                        resp
                    }));
                }
                KindProj::Rejected { response } => {
                    return Poll::Ready(Ok(response
                        .take()
                        .expect("ResponseFuture polled after completion")))
                }
                KindProj::Settle { future, settle } => {
                    let mut out = std::task::ready!(future.poll(cx));
                    // Settled in place (not moved out of the future), then
                    // dropped, which keeps what was not refunded; without a
                    // response (the inner service failed), that is all.
                    if let (Ok(resp), Some(s)) = (&mut out, settle.as_mut()) {
                        s.settle(resp);
                    }
                    *settle = None;
                    return Poll::Ready(out);
                }
                KindProj::Reserving { wait } => {
                    let Reserving {
                        st,
                        req,
                        svc,
                        shared,
                    } = &mut **wait;
                    let state = st.as_mut().expect("ResponseFuture polled after completion");
                    let done = std::task::ready!(shared.limits.poll_reserve(state, cx));
                    let req = req.take().expect("ResponseFuture polled after completion");
                    match done {
                        Ok(()) => {
                            let mut svc = svc.take().expect("a ready service");
                            let state = st.take().expect("the state");
                            ResponseFuture::admitted(&mut svc, req, state, shared)
                        }
                        Err(stop) => {
                            ResponseFuture::rejected(shared.reject(stop, &RequestHead::of(&req)))
                        }
                    }
                }
            };
            self.set(next);
        }
    }
}
