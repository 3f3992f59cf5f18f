#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! * keyed limits: [`PaceLayer`] ([`PaceLayer::builder`], [`Limit`],
//!   [`MissingKey`], [`PaceLayerBuilder::on_reject`]);
//! * what a limit reserves from, module [`limit`] ([`AsyncLimit`],
//!   implemented by `pace::Pace` and, with feature `redis`,
//!   `pace_redis::RedisPace`);
//! * the key extractors, module [`key`] ([`PeerIp`], [`ForwardedIp`],
//!   [`Header`], [`from_fn`]);
//! * the `RateLimit` / `RateLimit-Policy` fields, module [`headers`];
//! * the answers to gRPC calls, module [`grpc`];
//! * [`GateLayer`], module [`gate`].
#![warn(missing_docs)]
// docs.rs (`--cfg docsrs`): each feature's items marked with the feature
// (`doc_cfg` marks every `#[cfg(feature = ...)]` item by itself).
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod gate;
pub mod grpc;
pub mod headers;
pub mod key;
mod layer;
pub mod limit;

pub use crate::gate::{BodyOverrun, GateLayer, GateRequestBody, GateResponseBody, GateService};
pub use crate::key::{
    from_fn, ForwardHeader, ForwardedIp, FromFn, Header, KeyExtractor, PeerAddr, PeerIp, PeerKey,
    RequestHead,
};
pub use crate::layer::{
    BuildError, DefaultRespond, InvalidPolicyName, Limit, Limits, MissingKey, PaceLayer,
    PaceLayerBuilder, PaceService, ProblemDetails, Reason, Rejection, Respond, RespondFn,
    ResponseFuture, ResponseHead, MISSING_PEER_ADDR_BODY, TOO_MANY_REQUESTS_BODY, UNAVAILABLE_BODY,
};
pub use crate::limit::{Acquire, AsyncLimit, LeaseCounts, Refusal};
