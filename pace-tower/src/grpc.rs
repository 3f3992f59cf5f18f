//! gRPC answers: what the layers send to a request whose `content-type`
//! starts with `application/grpc`.
//!
//! A gRPC client reads its call's outcome from `grpc-status`, not from the
//! HTTP status, so the layers answer such a request in gRPC: HTTP `200`,
//! *trailers-only* (the status in the header block, an empty body), with
//!
//! * `grpc-status` and `grpc-message` (percent-encoded);
//! * for an answer that says how long to wait, `grpc-retry-pushback-ms`
//!   (the wait in whole milliseconds, rounded up), which gRPC's retry
//!   policies honour, and a `google.rpc.Status` whose details hold a
//!   `google.rpc.RetryInfo` with the exact wait, in
//!   `grpc-status-details-bin` (protobuf, base64 without padding: what
//!   `tonic_types::StatusExt::get_details_retry_info` reads); for an answer
//!   where waiting does not help, `grpc-retry-pushback-ms: -1` (do not
//!   retry);
//! * the other fields of the HTTP answer (`RateLimit`,
//!   `RateLimit-Policy`, `Retry-After`) as metadata.
//!
//! | answer | HTTP | gRPC status |
//! |---|---|---|
//! | a limit is exhausted | `429` | `RESOURCE_EXHAUSTED` (8), with the wait; `UNAVAILABLE` (14) with [`PaceLayerBuilder::grpc_limit_as_unavailable`] |
//! | a cost above the capacity | `413` | `RESOURCE_EXHAUSTED`, pushback `-1` |
//! | no key for a limit | `400` | `INVALID_ARGUMENT` (3) |
//! | no peer address | `500` | `INTERNAL` (13) |
//! | a shared limit's store is down | `503` | `UNAVAILABLE`, with its wait |
//! | the gate is saturated | `503` | `RESOURCE_EXHAUSTED`, with its wait |
//! | a body over the gate's cap | `413` | `RESOURCE_EXHAUSTED`, pushback `-1` |
//!
//! [`ResponseHead::grpc_status`](crate::ResponseHead::grpc_status) gives a
//! refund predicate the status of a trailers-only answer of the inner
//! service (tonic answers a unary call's error so).

use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

#[cfg(doc)]
use crate::PaceLayerBuilder;

/// The `content-type` prefix of a gRPC request.
pub const CONTENT_TYPE_PREFIX: &str = "application/grpc";

/// `grpc-status`.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// `grpc-status-details-bin`.
pub const GRPC_STATUS_DETAILS_BIN: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The gRPC status codes the layers answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// `INVALID_ARGUMENT` (3): a request without a key for a limit.
    InvalidArgument = 3,
    /// `RESOURCE_EXHAUSTED` (8): a limit or the gate is exhausted.
    ResourceExhausted = 8,
    /// `INTERNAL` (13): the server records no peer address.
    Internal = 13,
    /// `UNAVAILABLE` (14): a limit gave no decision (or an exhausted limit
    /// with [`PaceLayerBuilder::grpc_limit_as_unavailable`]).
    Unavailable = 14,
}

impl Code {
    /// The code's number, as `grpc-status` carries it.
    pub fn number(self) -> i32 {
        self as i32
    }
}

/// Whether `headers` are a gRPC request's (`content-type` starts with
/// `application/grpc`).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(CONTENT_TYPE_PREFIX.as_bytes()))
}

/// The status of a trailers-only gRPC answer (`grpc-status` in `headers`),
/// `None` when the header block has none.
pub fn status_of(headers: &HeaderMap) -> Option<i32> {
    headers.get(GRPC_STATUS)?.to_str().ok()?.parse().ok()
}

/// What an answer tells a client about retrying.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pushback {
    /// Nothing: the client's own policy.
    None,
    /// Retry after this wait.
    After(Duration),
    /// Waiting does not help: do not retry.
    Never,
}

/// `grpc-message` escapes: controls, non-ASCII (by the encoder) and `%`.
const MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// `google.rpc.Status` (google/rpc/status.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `google.rpc.RetryInfo` (google/rpc/error_details.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<prost_types::Duration>,
}

const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// Turns the HTTP answer `r` into a trailers-only gRPC answer with `code`,
/// `message` and `pushback`, keeping its other fields as metadata.
pub(crate) fn answer(
    mut r: Response<()>,
    code: Code,
    message: &str,
    pushback: Pushback,
) -> Response<()> {
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_PREFIX),
    );
    h.insert(GRPC_STATUS, HeaderValue::from(code.number()));
    let escaped = utf8_percent_encode(message, MESSAGE).to_string();
    if let Ok(v) = HeaderValue::from_str(&escaped) {
        h.insert(GRPC_MESSAGE, v);
    }
    let mut details = Vec::new();
    match pushback {
        Pushback::None => {}
        Pushback::Never => {
            h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        }
        Pushback::After(wait) => {
            let ms = wait.as_millis() + u128::from(wait.subsec_nanos() % 1_000_000 != 0);
            h.insert(
                GRPC_RETRY_PUSHBACK_MS,
                HeaderValue::from(u64::try_from(ms).unwrap_or(u64::MAX)),
            );
            let delay = prost_types::Duration {
                seconds: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
                nanos: wait.subsec_nanos() as i32,
            };
            details.push(prost_types::Any {
                type_url: RETRY_INFO_TYPE_URL.to_string(),
                value: prost::Message::encode_to_vec(&RetryInfo {
                    retry_delay: Some(delay),
                }),
            });
        }
    }
    let status = RpcStatus {
        code: code.number(),
        message: message.to_string(),
        details,
    };
    let bin = base64::engine::general_purpose::STANDARD_NO_PAD
        .encode(prost::Message::encode_to_vec(&status));
    if let Ok(v) = HeaderValue::from_str(&bin) {
        h.insert(GRPC_STATUS_DETAILS_BIN, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_carries_the_status_the_wait_and_the_details() {
        let r = answer(
            Response::new(()),
            Code::ResourceExhausted,
            "100% used",
            Pushback::After(Duration::from_micros(1_500_001)),
        );
        assert_eq!(r.status(), StatusCode::OK);
        let h = r.headers();
        assert_eq!(h[http::header::CONTENT_TYPE], "application/grpc");
        assert_eq!(h[GRPC_STATUS], "8");
        assert_eq!(h[GRPC_MESSAGE], "100%25 used");
        assert_eq!(h[GRPC_RETRY_PUSHBACK_MS], "1501", "rounded up");
        let bin = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(h[GRPC_STATUS_DETAILS_BIN].as_bytes())
            .unwrap();
        let status: RpcStatus = prost::Message::decode(bin.as_slice()).unwrap();
        assert_eq!(status.code, 8);
        assert_eq!(status.message, "100% used");
        assert_eq!(status.details.len(), 1);
        assert_eq!(status.details[0].type_url, RETRY_INFO_TYPE_URL);
        let info: RetryInfo = prost::Message::decode(status.details[0].value.as_slice()).unwrap();
        assert_eq!(
            info.retry_delay,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_001_000
            })
        );
        assert_eq!(status_of(h), Some(8));
    }

    #[test]
    fn a_permanent_answer_asks_for_no_retry() {
        let r = answer(
            Response::new(()),
            Code::ResourceExhausted,
            "too large",
            Pushback::Never,
        );
        assert_eq!(r.headers()[GRPC_RETRY_PUSHBACK_MS], "-1");
    }

    #[test]
    fn grpc_requests_are_known_by_their_content_type() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        assert!(!is_grpc(&h));
    }
}
