//! The chain of limits a layer reserves, and where a request's
//! reservations stand.

use std::task::{Context, Poll};

use http::StatusCode;
use metrics::Counter;
use pace::{Quota, Rate};

use super::meta::{FieldAcc, Meta};
use super::{BuildError, InvalidPolicyName, ResponseHead};
#[cfg(doc)]
use super::{PaceLayer, PaceLayerBuilder};
use crate::key::RequestHead;
#[cfg(doc)]
use crate::limit::AsyncLimit;
use crate::limit::{Acquire, LeaseCounts, Refusal};

/// A shared limit's lease counters ([`AsyncLimit::leases`]), set to the
/// limit's counts at each of its admissions.
#[derive(Clone)]
pub(super) struct LeaseCounters {
    decisions: Counter,
    granted: Counter,
    released: Counter,
    expiries: Counter,
    stranded: Counter,
}

impl LeaseCounters {
    pub(super) fn new(name: &str) -> LeaseCounters {
        let c = |metric: &'static str| metrics::counter!(metric, "limit" => name.to_string());
        LeaseCounters {
            decisions: c("pace_lease_decisions_total"),
            granted: c("pace_lease_granted_tokens_total"),
            released: c("pace_lease_released_tokens_total"),
            expiries: c("pace_lease_expiries_total"),
            stranded: c("pace_lease_stranded_tokens_total"),
        }
    }

    pub(super) fn set(&self, n: LeaseCounts) {
        self.decisions.absolute(n.decisions);
        self.granted.absolute(n.granted);
        self.released.absolute(n.released);
        self.expiries.absolute(n.expiries);
        self.stranded.absolute(n.stranded);
    }
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
        /// [`start`](Self::start) for limits that are
        /// [`at_once`](Self::at_once), nested as [`light`](Self::light) is:
        /// each limit is reserved, then `then` runs (the limits after it),
        /// and a stop passing back refunds it. A limit held only because a
        /// later one may refuse (a hold, no refund predicate) is held with
        /// [`AsyncLimit::hold_while`] while the later ones decide, and its
        /// step is left `Held` without a debit (kept or refunded already);
        /// a limit with a refund predicate keeps its held debit in its step
        /// for the response. Counts nothing: the admission is counted by
        /// [`admitted`](Self::admitted).
        fn start_nested<F, R>(
            &self,
            head: &RequestHead<'_>,
            then: F,
        ) -> Result<(Self::State, R), Stop>
        where
            F: FnOnce() -> Result<R, Stop>;
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
        /// [`light`](Self::light) with nothing after the limits: without
        /// `fields`, the last limit (never refunded, not held) takes only
        /// its decision ([`AsyncLimit::admit_now`]) and keeps its debit at
        /// once.
        fn light_top(
            &self,
            head: &RequestHead<'_>,
            fields: Option<&mut FieldAcc<'_>>,
        ) -> Result<(), Stop>;
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
        /// limit after it: `later`), which then hold; refuses a queueing
        /// limit among them ([`BuildError::QueuedRefund`]).
        fn mark_holds(&mut self, later: bool) -> Result<(), BuildError>;
        /// Counts the admission.
        fn admitted(&self, st: &Self::State);
        /// Applies the refund predicates to the response, newest first.
        fn settle(&self, st: &mut Self::State, resp: &ResponseHead<'_>, metas: &[Meta]);
        /// Adds one `RateLimit` item per reserved limit, and notes whether
        /// every limit's `(capacity, rate)` for the request is the one the
        /// layer was built with.
        fn fields(&self, st: &Self::State, acc: &mut FieldAcc<'_>);
        /// The `RateLimit` items of an answer of the layer to the request
        /// `head` that the `denied`th limit stopped (exhausted, `secs` to
        /// wait): that limit `r=0;t=secs`, each other limit with a key what
        /// the key has left now.
        fn answer_fields(
            &self,
            head: &RequestHead<'_>,
            denied: usize,
            secs: u64,
            acc: &mut FieldAcc<'_>,
        );
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

pub(super) use sealed::{LimitsImpl, Src, Step, Stop};

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
    #[inline(always)]
    fn start_nested<F, R>(&self, _: &RequestHead<'_>, then: F) -> Result<((), R), Stop>
    where
        F: FnOnce() -> Result<R, Stop>,
    {
        Ok(((), then()?))
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
    #[inline(always)]
    fn light_top(&self, _: &RequestHead<'_>, _: Option<&mut FieldAcc<'_>>) -> Result<(), Stop> {
        Ok(())
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
    fn mark_holds(&mut self, _: bool) -> Result<(), BuildError> {
        Ok(())
    }
    #[inline]
    fn admitted(&self, _: &()) {}
    #[inline]
    fn settle(&self, _: &mut (), _: &ResponseHead<'_>, _: &[Meta]) {}
    #[inline]
    fn fields(&self, _: &(), _: &mut FieldAcc<'_>) {}
    fn answer_fields(&self, _: &RequestHead<'_>, _: usize, _: u64, _: &mut FieldAcc<'_>) {}
    #[inline]
    fn terms(&self, _: Src<'_, '_, ()>, _: &mut dyn FnMut(usize, u64, Rate)) {}
}
