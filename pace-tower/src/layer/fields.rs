//! The `RateLimit` and `RateLimit-Policy` values of a request.

use http::{HeaderMap, HeaderValue};
use pace::Rate;

use super::limits::{Limits, Src};
use super::meta::FieldAcc;
use super::shared::Shared;
use crate::headers::{self, FieldWriter};

/// The `RateLimit-Policy` value for `(name, capacity, rate)` items.
pub(super) fn policy_value(items: Vec<(&str, u64, Rate)>) -> Option<HeaderValue> {
    headers::policy(
        items
            .into_iter()
            .map(|(name, q, rate)| (name, q, refill_ns(rate, q))),
    )
}

/// The ns `tokens` take to refill at `rate`, rounded up (`u64::MAX` past
/// it).
#[inline]
pub(super) fn refill_ns(rate: pace::Rate, tokens: u64) -> u64 {
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

impl<'a> FieldAcc<'a> {
    #[inline]
    pub(super) fn new<L, H>(shared: &'a Shared<L, H>) -> FieldAcc<'a> {
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
    pub(super) fn finish<L: Limits, H>(
        &self,
        shared: &Shared<L, H>,
        src: Src<'_, '_, L::State>,
    ) -> Fields {
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
pub(super) struct Fields {
    ratelimit: Option<HeaderValue>,
    policy: Option<HeaderValue>,
}

impl Fields {
    /// The values for the reservations `st` holds now.
    #[inline]
    pub(super) fn of<L: Limits, H>(shared: &Shared<L, H>, st: &L::State) -> Fields {
        let mut acc = FieldAcc::new(shared);
        shared.limits.fields(st, &mut acc);
        acc.finish(shared, Src::State(st))
    }

    #[inline]
    pub(super) fn write(self, headers: &mut HeaderMap) {
        if let Some(v) = self.ratelimit {
            headers.insert(headers::RATELIMIT.clone(), v);
        }
        if let Some(p) = self.policy {
            headers.insert(headers::RATELIMIT_POLICY.clone(), p);
        }
    }
}

impl<L: Limits, H> Shared<L, H> {
    /// The `RateLimit-Policy` value under a request's quotas (read from
    /// the head, the quota closures run once more): the one made when the
    /// layer was built when they are the same, otherwise a new one.
    pub(super) fn policy_for(&self, src: Src<'_, '_, L::State>) -> Option<HeaderValue> {
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
