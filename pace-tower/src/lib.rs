//! # pace-tower
//!
//! tower layers for [`pace`]: keyed rate limits in front of an HTTP service.
//!
//! * [`PaceLayer`]: one or more [`Limit`]s, each a named `Pace` with a
//!   [`KeyExtractor`] (peer address with an IPv6 prefix mask, the rightmost
//!   untrusted hop of `X-Forwarded-For` / `Forwarded` behind trusted proxies,
//!   a header value, a closure), a cost per request, an answer for requests
//!   without a key and a refund predicate on the response. All limits are
//!   reserved all or nothing ([`pace::all`]).
//! * Denials: `429` with `Retry-After` rounded up to whole seconds (never 0
//!   while a wait remains) and the `RateLimit` / `RateLimit-Policy` fields;
//!   a permanent denial (cost above capacity) answers 413 without
//!   `Retry-After`.
//! * Counters through the `metrics` facade: `pace_admitted_total`,
//!   `pace_denied_total{reason}`, `pace_refunded_total`, gauge `pace_rows`,
//!   all labelled `limit`.
//!
//! * [`GateLayer`]: a `pace::Gate` in front of a service: one slot and a
//!   byte share per request, reserved from `Content-Length` (or the body
//!   cap) before the body is read; `503` + `Retry-After` when saturated,
//!   `413` when too large or when the body runs past its share; the share
//!   follows the request body, the slot the response body.
//!
//! The clock is the `Pace`'s own (inject a `pace::ManualClock` in tests).
#![warn(missing_docs)]

pub mod gate;
pub mod headers;
pub mod key;
mod layer;

pub use crate::gate::{BodyOverrun, GateLayer, GateRequestBody, GateResponseBody, GateService};
pub use crate::key::{
    from_fn, ForwardHeader, ForwardedIp, FromFn, Header, KeyExtractor, PeerAddr, PeerIp,
    RequestHead,
};
pub use crate::layer::{
    DefaultRespond, InvalidPolicyName, Limit, Limits, MissingKey, PaceLayer, PaceLayerBuilder,
    PaceService, Reason, Rejection, Respond, RespondFn, ResponseFuture, ResponseHead, Settle,
    MISSING_PEER_ADDR_BODY,
};
