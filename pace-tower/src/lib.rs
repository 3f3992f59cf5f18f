#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! * keyed limits: [`PaceLayer`] ([`PaceLayer::builder`], [`Limit`],
//!   [`MissingKey`], [`PaceLayerBuilder::on_reject`]);
//! * the key extractors, module [`key`] ([`PeerIp`], [`ForwardedIp`],
//!   [`Header`], [`from_fn`]);
//! * the `RateLimit` / `RateLimit-Policy` fields, module [`headers`];
//! * [`GateLayer`], module [`gate`].
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
