//! What every request of a layer reads ([`Shared`]): a leaf of the layer's
//! modules, which the service builds and the admission, the fields, the
//! response future and the rejections read.

use http::{HeaderValue, StatusCode};
use pace::Rate;

#[cfg(doc)]
use super::limits::LimitsImpl;
use super::meta::Meta;

/// What every request of a layer reads: its limits, their names and
/// counters, the `RateLimit-Policy` value it was built with, and how it
/// answers.
pub(super) struct Shared<L, H> {
    pub(super) limits: L,
    pub(super) metas: Vec<Meta>,
    /// The `RateLimit-Policy` value under the quotas the layer was built
    /// with, and those quotas' `(capacity, rate)` per limit.
    pub(super) policy: Option<HeaderValue>,
    pub(super) policy_terms: Vec<(u64, Rate)>,
    pub(super) headers: bool,
    /// Whether a limit refunds on the response: an admitted request then
    /// keeps its reservations (and the layer) until the response, and its
    /// fields are written after its refunds; otherwise they are written
    /// when it is admitted and the response future holds only their
    /// values.
    pub(super) refunds: bool,
    /// No refunds, and every limit decides at once with its own quota:
    /// admitted requests go through [`LimitsImpl::light`] and keep
    /// nothing.
    pub(super) light: bool,
    /// Refunds on the response, and every limit decides at once with its
    /// own quota: admitted through [`LimitsImpl::start_nested`].
    pub(super) nested: bool,
    pub(super) permanent: StatusCode,
    /// An exhausted limit is `UNAVAILABLE` to a gRPC call, not
    /// `RESOURCE_EXHAUSTED`.
    pub(super) grpc_limit_unavailable: bool,
    pub(super) respond: H,
}
