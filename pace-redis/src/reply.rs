//! The script's replies, parsed: a reserve's, a peek's, a hold's, a keep's
//! or release's, a refund's.

use pace::Refunded;
use redis::{ErrorKind, RedisError, Value};

use crate::BackendError;

pub(crate) enum ReserveReply {
    Admitted {
        prev: u64,
        tat: u64,
        now: u64,
        held: u64,
        /// A turn's wait from the decision to its slot, as the script
        /// answered it (`rule: slot_of`); 0 when the debit fit at once.
        wait: u64,
    },
    /// `debt`: the settled debt before the call and what the key held,
    /// when the script answered them apart from the wait (a key with
    /// holds, whose expiries the wait counts); otherwise the debt is `wait
    /// + tau - cost`, nothing held.
    Denied {
        wait: u64,
        debt: Option<(u64, u64)>,
        now: u64,
    },
    Never {
        now: u64,
    },
}

fn num(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn bad(v: &Value) -> BackendError {
    BackendError::BadReply(format!("{v:?}"))
}

/// The decimal integers of a script's reply (at most `N`, separated by
/// spaces) and how many there are; a server error as such.
fn reply_numbers<const N: usize>(v: &Value) -> Result<([u64; N], usize), BackendError> {
    if let Value::ServerError(_) = v {
        return Err(BackendError::Redis(
            v.clone()
                .extract_error()
                .err()
                .unwrap_or_else(|| RedisError::from((ErrorKind::ResponseError, "server error"))),
        ));
    }
    let Value::BulkString(text) = v else {
        return Err(bad(v));
    };
    let mut fields = [0u64; N];
    let mut count = 0;
    for part in text.split(|&b| b == b' ') {
        let n = decimal(part).ok_or_else(|| bad(v))?;
        *fields.get_mut(count).ok_or_else(|| bad(v))? = n;
        count += 1;
    }
    Ok((fields, count))
}

/// The value of a decimal integer of 1 to 20 ASCII digits (no sign), if it
/// fits a u64.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut n = 0u64;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(n)
}

/// The server time (ns) in `fields[i]` (seconds) and `fields[i + 1]`
/// (nanoseconds), which must end the reply.
fn reply_time(v: &Value, fields: &[u64], i: usize) -> Result<u64, BackendError> {
    if i + 2 != fields.len() || fields[i + 1] >= 1_000_000_000 {
        return Err(bad(v));
    }
    fields[i]
        .checked_mul(1_000_000_000)
        .and_then(|s| s.checked_add(fields[i + 1]))
        .ok_or_else(|| bad(v))
}

/// A reserve's reply, for a request of `n` tokens decided with `interval`
/// ns per token (what the script used: the client sent it or the script
/// holds it as a constant).
pub(crate) fn parse_reserve(
    v: &Value,
    n: u64,
    interval: u64,
) -> Result<ReserveReply, BackendError> {
    // Up to six decimal integers separated by spaces.
    let (fields, count) = reply_numbers::<6>(v)?;
    let time = |i: usize| reply_time(v, &fields[..count], i);
    // An admission: the stored tat, and the debt before unless it was 0;
    // the debit itself is n x interval.
    let admitted =
        |debt: u64, tat: u64, held: u64, wait: u64| -> Result<ReserveReply, BackendError> {
            let cost = n.checked_mul(interval).ok_or_else(|| bad(v))?;
            let now = tat
                .checked_sub(cost)
                .and_then(|t| t.checked_sub(debt))
                .ok_or_else(|| bad(v))?;
            let prev = if debt == 0 { 0 } else { tat - cost };
            Ok(ReserveReply::Admitted {
                prev,
                tat,
                now,
                held,
                wait,
            })
        };
    match (count, fields[0]) {
        (1, tat) => admitted(0, tat, 0, 0),
        (3, 1) if fields[1] > 0 => admitted(fields[1], fields[2], 0, 0),
        // A key with holds: the debt before (may be 0) and what is held.
        (4, 4) if fields[2] > 0 => admitted(fields[1], fields[3], fields[2], 0),
        // A turn after a wait: its wait, the debt before, what is held.
        (5, 5) if fields[1] > 0 => admitted(fields[2], fields[4], fields[3], fields[1]),
        (_, 0) => Ok(ReserveReply::Denied {
            wait: fields[1],
            debt: None,
            now: time(2)?,
        }),
        (_, 6) => Ok(ReserveReply::Denied {
            wait: fields[1],
            debt: Some((fields[2], fields[3])),
            now: time(4)?,
        }),
        (_, 2) => Ok(ReserveReply::Never { now: time(2)? }),
        (_, 3) => Err(BackendError::ClockOutOfRange),
        _ => Err(bad(v)),
    }
}

/// The time `(seconds, nanoseconds)` at `items[i..i + 2]`, in ns.
fn time_at(items: &[Value], i: usize) -> Option<u64> {
    let s = items.get(i).and_then(num)?;
    let ns = items.get(i + 1).and_then(num)?;
    if ns >= 1_000_000_000 {
        return None;
    }
    s.checked_mul(1_000_000_000)?.checked_add(ns)
}

/// A peek's reply: the settled `tat`, the time, and what is held.
pub(crate) fn parse_peek(v: &Value) -> Result<(u64, u64, u64), BackendError> {
    let Value::Array(items) = v else {
        return Err(bad(v));
    };
    let tat = items.first().and_then(num).ok_or_else(|| bad(v))?;
    let now = time_at(items, 1).ok_or_else(|| bad(v))?;
    let held = match items.get(3) {
        None => 0,
        Some(h) => num(h).ok_or_else(|| bad(v))?,
    };
    Ok((tat, now, held))
}

/// A hold's reply.
pub(crate) enum HoldReply {
    Admitted {
        debt: u64,
        held: u64,
        now: u64,
    },
    /// `debt` as in [`ReserveReply::Denied`].
    Denied {
        wait: u64,
        debt: Option<(u64, u64)>,
        now: u64,
    },
    Never {
        now: u64,
    },
}

pub(crate) fn parse_hold(v: &Value) -> Result<HoldReply, BackendError> {
    let (fields, count) = reply_numbers::<6>(v)?;
    let time = |i: usize| reply_time(v, &fields[..count], i);
    match fields[0] {
        1 => Ok(HoldReply::Admitted {
            debt: fields[1],
            held: fields[2],
            now: time(3)?,
        }),
        0 => Ok(HoldReply::Denied {
            wait: fields[1],
            debt: None,
            now: time(2)?,
        }),
        6 => Ok(HoldReply::Denied {
            wait: fields[1],
            debt: Some((fields[2], fields[3])),
            now: time(4)?,
        }),
        2 => Ok(HoldReply::Never { now: time(2)? }),
        3 => Err(BackendError::ClockOutOfRange),
        _ => Err(bad(v)),
    }
}

/// A keep's or release's reply: true when the hold was found.
pub(crate) fn parse_resolve(v: &Value) -> Result<bool, BackendError> {
    let Value::Array(items) = v else {
        return Err(bad(v));
    };
    match items.first().and_then(num) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(bad(v)),
    }
}

pub(crate) fn parse_refund(v: &Value) -> Result<Refunded, BackendError> {
    let Value::Array(items) = v else {
        return Err(bad(v));
    };
    match items.first().and_then(num) {
        Some(1) => Ok(Refunded::Restored),
        Some(2) => Ok(Refunded::Removed),
        Some(0) => Ok(Refunded::Superseded),
        Some(3) => Ok(Refunded::Refilled),
        _ => Err(bad(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::decimal;

    #[test]
    fn decimal_reads_unsigned_digit_strings_that_fit_a_u64() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(
            decimal(b"1796472298083123456"),
            Some(1_796_472_298_083_123_456)
        );
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(decimal(b"18446744073709551616"), None);
        assert_eq!(decimal(b"99999999999999999999"), None);
        assert_eq!(decimal(b""), None);
        assert_eq!(decimal(b"+1"), None);
        assert_eq!(decimal(b"-1"), None);
        assert_eq!(decimal(b"1 "), None);
        assert_eq!(decimal(b"12a"), None);
        assert_eq!(decimal(b"/"), None);
        assert_eq!(decimal(b":"), None);
    }
}
