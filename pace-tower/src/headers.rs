//! The IETF `RateLimit` / `RateLimit-Policy` fields
//! (draft-ietf-httpapi-ratelimit-headers), serialized with `sfv`.
//!
//! * `RateLimit-Policy`: a List of one Item per limit: the limit's name
//!   (String) with `q` = its capacity (tokens) and `w` = the seconds its
//!   empty bucket takes to refill at its rate (rounded up), under the
//!   request's quota (`Limit::quota`) or else the limit's own.
//! * `RateLimit`: a List of Items, the name with `r` = whole tokens left and
//!   `t` = seconds until the bucket is full again (rounded up; on a 429, the
//!   `Retry-After` wait, with `r=0`).

use std::collections::BTreeSet;
use std::sync::Mutex;

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

/// `name` serialized as a structured-field String (quoted, escaped), if
/// it is one (printable ASCII).
pub(crate) fn sf_string(name: &str) -> Option<String> {
    let name = StringRef::from_str(name).ok()?;
    let mut list = ListSerializer::new();
    list.bare_item(name);
    list.finish()
}

/// Writes a `RateLimit` value without allocating until the value is made:
/// items `<name>;r=<int>;t=<int>` joined by `", "`, the structured-field
/// List serialization (RFC 9651 §4.1.1) of what [`ratelimit`] serializes
/// with `sfv`, from names `sfv` serialized once ([`sf_string`]).
#[doc(hidden)]
pub struct FieldWriter {
    buf: [u8; 192],
    len: usize,
    spill: Option<Vec<u8>>,
}

impl Default for FieldWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl FieldWriter {
    /// An empty value.
    #[inline]
    pub fn new() -> FieldWriter {
        FieldWriter {
            buf: [0; 192],
            len: 0,
            spill: None,
        }
    }

    #[inline]
    fn push(&mut self, bytes: &[u8]) {
        if let Some(v) = &mut self.spill {
            v.extend_from_slice(bytes);
            return;
        }
        let end = self.len + bytes.len();
        if end <= self.buf.len() {
            self.buf[self.len..end].copy_from_slice(bytes);
            self.len = end;
        } else {
            let mut v = Vec::with_capacity(2 * end);
            v.extend_from_slice(&self.buf[..self.len]);
            v.extend_from_slice(bytes);
            self.spill = Some(v);
        }
    }

    /// Appends the item `sf_name;r=r;t=t` (`sf_name` from [`sf_string`]).
    #[inline]
    pub(crate) fn item(&mut self, sf_name: &str, r: u64, t: u64) {
        let mut ri = itoa::Buffer::new();
        let mut ti = itoa::Buffer::new();
        let r = ri.format(r.min(SF_MAX)).as_bytes();
        let t = ti.format(t.min(SF_MAX)).as_bytes();
        let name = sf_name.as_bytes();
        let sep = if self.len > 0 || self.spill.is_some() {
            2
        } else {
            0
        };
        let end = self.len + sep + name.len() + 3 + r.len() + 3 + t.len();
        if self.spill.is_some() || end > self.buf.len() {
            self.item_slow(sep > 0, name, r, t);
            return;
        }
        // In the inline buffer: one bounds check, the fixed parts copied
        // without a call.
        let b = &mut self.buf[self.len..end];
        let (sep_b, b) = b.split_at_mut(sep);
        sep_b.copy_from_slice(&b", "[..sep]);
        let (name_b, b) = b.split_at_mut(name.len());
        name_b.copy_from_slice(name);
        let (eq_r, b) = b.split_at_mut(3);
        eq_r.copy_from_slice(b";r=");
        let (r_b, b) = b.split_at_mut(r.len());
        r_b.copy_from_slice(r);
        let (eq_t, t_b) = b.split_at_mut(3);
        eq_t.copy_from_slice(b";t=");
        t_b.copy_from_slice(t);
        self.len = end;
    }

    /// [`item`](Self::item) past the inline buffer.
    #[cold]
    fn item_slow(&mut self, sep: bool, name: &[u8], r: &[u8], t: &[u8]) {
        if sep {
            self.push(b", ");
        }
        self.push(name);
        self.push(b";r=");
        self.push(r);
        self.push(b";t=");
        self.push(t);
    }

    fn bytes(&self) -> &[u8] {
        match &self.spill {
            Some(v) => v,
            None => &self.buf[..self.len],
        }
    }

    /// The value, `None` when no item was written.
    #[inline]
    pub(crate) fn value(&self) -> Option<HeaderValue> {
        let b = self.bytes();
        if b.is_empty() {
            return None;
        }
        HeaderValue::from_bytes(b).ok()
    }
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

/// `value` as a static one, whose clones share its bytes without a
/// reference count: its bytes are kept for the life of the process, once
/// per distinct value (a layer built again with the same limits reuses
/// them).
pub(crate) fn interned(value: &HeaderValue) -> Option<HeaderValue> {
    static VALUES: Mutex<BTreeSet<&'static [u8]>> = Mutex::new(BTreeSet::new());
    let mut values = VALUES.lock().unwrap_or_else(|e| e.into_inner());
    let bytes: &'static [u8] = match values.get(value.as_bytes()) {
        Some(b) => b,
        None => {
            let b: &'static [u8] = Box::leak(value.as_bytes().into());
            values.insert(b);
            b
        }
    };
    let s = std::str::from_utf8(bytes).ok()?;
    // A valid value already: `from_static` accepts it.
    Some(HeaderValue::from_static(s))
}

/// The `RateLimit` value for `(name, remaining, reset_secs)` items (what
/// [`FieldWriter`] writes, serialized by `sfv` item by item).
#[cfg(test)]
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

    /// The hand-joined value is byte for byte what sfv serializes, and sfv
    /// parses it back to the same items.
    #[test]
    fn writer_matches_sfv() {
        let names = ["per-source", "client", "a\\b\"c", " ", "x"];
        let ints = [
            0u64,
            1,
            9,
            10,
            999,
            1_000_000_007,
            SF_MAX,
            SF_MAX + 1,
            u64::MAX,
        ];
        for k in 1..=names.len() {
            for (i, &r) in ints.iter().enumerate() {
                let t = ints[(i * 7 + k) % ints.len()];
                let items: Vec<(&str, u64, u64)> = names[..k].iter().map(|&n| (n, r, t)).collect();
                let mut w = FieldWriter::new();
                for &(n, r, t) in &items {
                    w.item(&sf_string(n).unwrap(), r, t);
                }
                let want = ratelimit(items.iter().copied()).unwrap();
                assert_eq!(w.value().unwrap(), want);
                let parsed = sfv::Parser::new(want.as_bytes())
                    .parse::<sfv::List>()
                    .unwrap();
                assert_eq!(parsed.len(), k);
            }
        }
        // Past the inline buffer: the same bytes.
        let long = "n".repeat(150);
        let mut w = FieldWriter::new();
        w.item(&sf_string(&long).unwrap(), 5, 6);
        w.item(&sf_string(&long).unwrap(), 7, 8);
        let want = ratelimit([(long.as_str(), 5, 6), (long.as_str(), 7, 8)]).unwrap();
        assert_eq!(w.value().unwrap(), want);
        assert_eq!(FieldWriter::new().value(), None);
        assert_eq!(sf_string("caf\u{e9}"), None);
    }
}
