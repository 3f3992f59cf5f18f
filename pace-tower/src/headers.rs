//! The IETF `RateLimit` / `RateLimit-Policy` fields
//! (draft-ietf-httpapi-ratelimit-headers), serialized with `sfv`.
//!
//! * `RateLimit-Policy`: a List of one Item per limit: the limit's name
//!   (String) with `q` = its capacity (tokens) and `w` = the seconds its
//!   empty bucket takes to refill at the declared rate (rounded up).
//! * `RateLimit`: a List of Items, the name with `r` = whole tokens left and
//!   `t` = seconds until the bucket is full again (rounded up; on a 429, the
//!   `Retry-After` wait, with `r=0`).

use http::{HeaderName, HeaderValue};
use sfv::{KeyRef, ListSerializer, StringRef};

/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The largest structured-field Integer.
const SF_MAX: u64 = 999_999_999_999_999;

fn int(v: u64) -> sfv::Integer {
    sfv::integer(v.min(SF_MAX) as i64)
}

/// `name` if it is a valid structured-field String (printable ASCII).
pub(crate) fn sf_string(name: &str) -> Option<String> {
    StringRef::from_str(name).ok().map(|_| name.to_string())
}

/// Seconds, rounded up, of `ns` nanoseconds.
pub(crate) fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000)
}

/// The `RateLimit-Policy` value for `(name, capacity, refill_ns)` limits,
/// `refill_ns` the time the whole capacity takes to refill.
pub(crate) fn policy<'a>(
    limits: impl IntoIterator<Item = (&'a str, u64, u64)>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (name, q, refill) in limits {
        let name = StringRef::from_str(name).ok()?;
        list.bare_item(name)
            .parameter(KeyRef::constant("q"), int(q))
            .parameter(KeyRef::constant("w"), int(ceil_secs(refill).max(1)));
    }
    HeaderValue::from_str(&list.finish()?).ok()
}

/// The `RateLimit` value for `(name, remaining, reset_secs)` items.
pub(crate) fn ratelimit<'a>(
    items: impl IntoIterator<Item = (&'a str, u64, u64)>,
) -> Option<HeaderValue> {
    let mut list = ListSerializer::new();
    for (name, r, t) in items {
        let name = StringRef::from_str(name).ok()?;
        list.bare_item(name)
            .parameter(KeyRef::constant("r"), int(r))
            .parameter(KeyRef::constant("t"), int(t));
    }
    HeaderValue::from_str(&list.finish()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let p = policy([
            ("per-source", 20, 1_000_000_000),
            ("client", 5, 1_000_000_001),
        ])
        .unwrap();
        assert_eq!(p, "\"per-source\";q=20;w=1, \"client\";q=5;w=2");
        let r = ratelimit([("client", 0, 3)]).unwrap();
        assert_eq!(r, "\"client\";r=0;t=3");
        assert_eq!(ratelimit([]), None);
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1_000_000_000), 1);
        assert_eq!(ceil_secs(1_000_000_001), 2);
        assert_eq!(int(u64::MAX), sfv::integer(SF_MAX as i64));
    }
}
