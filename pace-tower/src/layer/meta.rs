//! What the layer keeps of each limit besides the limit itself ([`Meta`]),
//! and the `RateLimit` value its limits write their items into
//! ([`FieldAcc`], made and finished in `fields`): a leaf of the layer's
//! modules, which `limits`, `fields`, `shared` and the others read.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use metrics::{Counter, Gauge};
use pace::{DenyReason, Rate};

use crate::headers::FieldWriter;

/// A limit's counters and row gauge.
pub(super) struct Counters {
    pub(super) admitted: Counter,
    pub(super) refunded: Counter,
    pub(super) exhausted: Counter,
    exceeds_capacity: Counter,
    time_exhausted: Counter,
    pub(super) missing_key: Counter,
    pub(super) unavailable: Counter,
    pub(super) rows: Gauge,
    /// Set while the limit gives no decision: its first refusal without a
    /// decision is a `WARN` event, the next ones `DEBUG`, until it decides
    /// again (an `INFO` event).
    pub(super) outage: Arc<AtomicBool>,
}

impl Counters {
    pub(super) fn new(name: &str) -> Counters {
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
            outage: Arc::default(),
        }
    }

    pub(super) fn denied(&self, reason: DenyReason) -> &Counter {
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
    pub(super) name: String,
    /// The name as a serialized structured-field String.
    pub(super) sf_name: String,
    pub(super) counters: Counters,
    /// The body of the answer to a request without a key for it.
    pub(super) missing_body: String,
}

/// The `RateLimit` value of a request as its limits add their items, and
/// whether their quotas are the ones the layer was built with.
#[doc(hidden)]
pub struct FieldAcc<'a> {
    pub(super) w: FieldWriter,
    pub(super) same: bool,
    pub(super) metas: &'a [Meta],
    pub(super) built: &'a [(u64, Rate)],
}
