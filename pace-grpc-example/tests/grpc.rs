//! pace-tower's answers as a real tonic client sees them: a tonic server
//! behind a `PaceLayer` (or a `GateLayer`), called over loopback HTTP/2.
//!
//! Each limit runs on a `ManualClock`, so every wait is exact.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use pace::{Gate, ManualClock, Pace, Rate};
use pace_grpc_example::pb::greeter_client::GreeterClient;
use pace_grpc_example::pb::HelloRequest;
use pace_grpc_example::{serve, serve_gated};
use pace_tower::{AsyncLimit, GateLayer, Header, Limit, PaceLayer, Refusal};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

type Limiter = Pace<HeaderValue, std::collections::hash_map::RandomState, ManualClock>;

/// One call a minute per client (`x-client-id`), on a frozen clock.
fn per_minute() -> Arc<Limiter> {
    Arc::new(
        Pace::builder(Rate::per_minute(1).unwrap())
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    )
}

fn client_limit(limiter: Arc<Limiter>) -> Limit<Header, Limiter> {
    Limit::new(
        "client",
        limiter,
        Header(HeaderName::from_static("x-client-id")),
    )
}

async fn client(addr: std::net::SocketAddr) -> GreeterClient<Channel> {
    GreeterClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// Calls `Hello` as `client_id` (none: no `x-client-id`) with `name`.
async fn hello(
    c: &mut GreeterClient<Channel>,
    client_id: Option<&str>,
    name: &str,
) -> Result<String, Status> {
    let mut req = tonic::Request::new(HelloRequest { name: name.into() });
    if let Some(id) = client_id {
        req.metadata_mut()
            .insert("x-client-id", id.parse().unwrap());
    }
    c.hello(req).await.map(|r| r.into_inner().message)
}

/// What the client sees of a failed call: code, message, pushback
/// metadata and the `RetryInfo` of its details.
#[derive(Debug, PartialEq)]
struct Seen {
    code: Code,
    message: String,
    pushback: Option<String>,
    retry_info: Option<Duration>,
}

fn seen(s: &Status) -> Seen {
    let v = Seen {
        code: s.code(),
        message: s.message().to_string(),
        pushback: s
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().unwrap().to_string()),
        retry_info: s.get_details_retry_info().and_then(|r| r.retry_delay),
    };
    eprintln!("the client sees: {v:?}");
    v
}

fn metadata(s: &Status, name: &str) -> Option<String> {
    s.metadata()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test]
async fn an_exhausted_limit_is_resource_exhausted_with_the_wait() {
    let addr = serve(
        PaceLayer::builder()
            .limit(client_limit(per_minute()))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let mut c = client(addr).await;
    assert_eq!(hello(&mut c, Some("a"), "ann").await.unwrap(), "hello, ann");
    let s = hello(&mut c, Some("a"), "ann").await.unwrap_err();
    assert_eq!(
        seen(&s),
        Seen {
            code: Code::ResourceExhausted,
            message: "too many requests for the limit \"client\"; retry after 60000 ms".into(),
            pushback: Some("60000".into()),
            retry_info: Some(Duration::from_secs(60)),
        }
    );
    // The RateLimit fields come as metadata.
    assert_eq!(
        metadata(&s, "ratelimit").as_deref(),
        Some("\"client\";r=0;t=60")
    );
    assert_eq!(
        metadata(&s, "ratelimit-policy").as_deref(),
        Some("\"client\";q=1;w=60")
    );
    // Another client is untouched.
    assert_eq!(hello(&mut c, Some("b"), "bo").await.unwrap(), "hello, bo");
}

#[tokio::test]
async fn one_switch_makes_an_exhausted_limit_unavailable() {
    let addr = serve(
        PaceLayer::builder()
            .limit(client_limit(per_minute()))
            .grpc_limit_as_unavailable(true)
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let mut c = client(addr).await;
    hello(&mut c, Some("a"), "ann").await.unwrap();
    let s = hello(&mut c, Some("a"), "ann").await.unwrap_err();
    assert_eq!(
        seen(&s),
        Seen {
            code: Code::Unavailable,
            message: "too many requests for the limit \"client\"; retry after 60000 ms".into(),
            pushback: Some("60000".into()),
            retry_info: Some(Duration::from_secs(60)),
        }
    );
}

#[tokio::test]
async fn a_call_without_a_key_is_invalid_argument() {
    let addr = serve(
        PaceLayer::builder()
            .limit(client_limit(per_minute()))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let mut c = client(addr).await;
    let s = hello(&mut c, None, "ann").await.unwrap_err();
    assert_eq!(
        seen(&s),
        Seen {
            code: Code::InvalidArgument,
            message: "the request has no key for the limit \"client\": the `x-client-id` header \
                      is missing"
                .into(),
            pushback: None,
            retry_info: None,
        }
    );
}

#[tokio::test]
async fn a_cost_above_the_capacity_is_resource_exhausted_for_good() {
    let addr = serve(
        PaceLayer::builder()
            .limit(client_limit(per_minute()).cost(|_| 2))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let mut c = client(addr).await;
    let s = hello(&mut c, Some("a"), "ann").await.unwrap_err();
    assert_eq!(
        seen(&s),
        Seen {
            code: Code::ResourceExhausted,
            message: "the limit \"client\" can never admit this request".into(),
            pushback: Some("-1".into()),
            retry_info: None,
        }
    );
}

/// A shared limit whose store is down: no decision, retry in 1.5 s.
struct Down;

#[derive(Debug)]
struct StoreDown;

impl std::fmt::Display for StoreDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("store down")
    }
}

impl std::error::Error for StoreDown {}

impl AsyncLimit<HeaderValue> for Down {
    type Debit = ();
    type Reserve = std::future::Ready<Result<(), Refusal>>;

    fn reserve(&self, _: &HeaderValue, _: u64) -> Self::Reserve {
        std::future::ready(Err(Refusal::Unavailable {
            error: Box::new(StoreDown),
            retry_after: Some(Duration::from_millis(1500)),
        }))
    }

    fn refund(&self, _: &HeaderValue, (): ()) {}

    fn remaining(&self, _: &HeaderValue, _: Option<&()>) -> Option<u64> {
        None
    }

    fn capacity(&self) -> u64 {
        1
    }

    fn rate(&self) -> Rate {
        Rate::per_second(1).unwrap()
    }
}

#[tokio::test]
async fn a_shared_limit_that_is_down_is_unavailable_with_its_wait() {
    let down = Limit::new(
        "shared",
        Arc::new(Down),
        Header(HeaderName::from_static("x-client-id")),
    );
    let addr = serve(PaceLayer::builder().limit(down).build().unwrap())
        .await
        .unwrap();
    let mut c = client(addr).await;
    let s = hello(&mut c, Some("a"), "ann").await.unwrap_err();
    assert_eq!(
        seen(&s),
        Seen {
            code: Code::Unavailable,
            message: "the rate limit could not decide (its store is unavailable); retry later"
                .into(),
            pushback: Some("1500".into()),
            retry_info: Some(Duration::from_millis(1500)),
        }
    );
}

#[tokio::test]
async fn a_saturated_gate_is_resource_exhausted_with_its_wait() {
    let gate = Gate::builder().slots(1).bytes(1 << 20).build().unwrap();
    let held = gate.try_admit(Some(0)).unwrap(); // the only slot
    let addr = serve_gated(GateLayer::with_retry_after(gate.clone(), 2))
        .await
        .unwrap();
    let mut c = client(addr).await;
    let s = hello(&mut c, Some("a"), "ann").await.unwrap_err();
    assert_eq!(
        seen(&s),
        Seen {
            code: Code::ResourceExhausted,
            message: "the server is busy; retry later".into(),
            pushback: Some("2000".into()),
            retry_info: Some(Duration::from_secs(2)),
        }
    );
    drop(held);
    assert_eq!(hello(&mut c, Some("a"), "ann").await.unwrap(), "hello, ann");
}

/// A refund predicate decides on the call's gRPC status: a call the
/// service fails with `UNAUTHENTICATED` (a trailers-only answer) gives its
/// token back; a successful one keeps it.
#[tokio::test]
async fn a_refund_predicate_decides_on_the_grpc_status() {
    let limiter = per_minute();
    let limit = client_limit(limiter.clone())
        .refund_if(|r| r.grpc_status() == Some(Code::Unauthenticated as i32));
    let addr = serve(PaceLayer::builder().limit(limit).build().unwrap())
        .await
        .unwrap();
    let mut c = client(addr).await;
    for _ in 0..3 {
        let s = hello(&mut c, Some("a"), "intruder").await.unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "refunded: never limited");
    }
    let key = HeaderValue::from_static("a");
    assert_eq!(limiter.peek(&key), 1, "every failed call was refunded");
    assert_eq!(hello(&mut c, Some("a"), "ann").await.unwrap(), "hello, ann");
    assert_eq!(limiter.peek(&key), 0, "a successful call is kept");
    let s = hello(&mut c, Some("a"), "ann").await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted);
}
