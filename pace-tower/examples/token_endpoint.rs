//! The token endpoint with both axes, on axum.
//!
//! `POST /token` with `Authorization: Basic base64(client_id:secret)`
//! (client_secret_basic). Registered clients are `client-0` ..
//! `client-999`, secret `secret-<n>`.
//!
//! * per source address (`PeerIp`, IPv6 /56): 200/s, burst 400, never
//!   refunded on the answer: every presentation spends the source's pace
//!   (a request the per-id limit denies is refunded, exactly: the source
//!   is held while the id is decided).
//! * per claimed client id: 5/s, burst 10, refunded when the answer is
//!   `401 invalid_client`: only accepted presentations spend a client's
//!   pace (exactly, however many presentations of the id overlap: the id
//!   is held until the answer), so a flood of made-up or wrong-secret ids
//!   leaves no rows behind and no trace on a real client's pace.
//! * no `Authorization`: the per-client limit is skipped (the source's is
//!   spent) and the endpoint answers its own `400 invalid_request`.
//!
//! Every JSON answer says `content-type: application/json`.
//!
//! Run: `cargo run --release -p pace-tower --example token_endpoint`
//! (listens on 127.0.0.1:3000), then
//! `curl -si -u client-7:secret-7 -X POST http://127.0.0.1:3000/token`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use base64::Engine;
use pace::{Pace, Rate};
use pace_tower::{
    from_fn, Limit, Limits, MissingKey, PaceLayer, PeerIp, RequestHead, ResponseHead,
};

/// Marks a response as the answer to an invalid client presentation.
#[derive(Clone, Copy, Debug)]
pub struct InvalidClient;

/// The claimed client id and secret of an `Authorization: Basic` header.
pub fn basic(headers: &axum::http::HeaderMap) -> Option<(String, String)> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let b64 = v.strip_prefix("Basic ")?;
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (id, secret) = s.split_once(':')?;
    Some((id.to_string(), secret.to_string()))
}

/// `Authorization: Basic` value for `id:secret`.
pub fn basic_value(id: &str, secret: &str) -> HeaderValue {
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
    HeaderValue::from_str(&format!("Basic {b64}")).unwrap()
}

fn registered(id: &str, secret: &str) -> bool {
    match id
        .strip_prefix("client-")
        .and_then(|n| n.parse::<u32>().ok())
    {
        Some(n) if n < 1000 && id == format!("client-{n}") => secret == format!("secret-{n}"),
        _ => false,
    }
}

const JSON: (header::HeaderName, &str) = (header::CONTENT_TYPE, "application/json");

/// The exchange: 200 with a token for a registered client, 401
/// `invalid_client` otherwise, 400 `invalid_request` without credentials;
/// all JSON.
pub async fn token(req: Request) -> Response {
    match basic(req.headers()) {
        Some((id, secret)) if registered(&id, &secret) => (
            [JSON, (header::CACHE_CONTROL, "no-store")],
            format!(
                "{{\"access_token\":\"at-{id}\",\"token_type\":\"Bearer\",\"expires_in\":300}}"
            ),
        )
            .into_response(),
        Some(_) => (
            StatusCode::UNAUTHORIZED,
            [JSON, (header::WWW_AUTHENTICATE, "Basic realm=\"token\"")],
            Extension(InvalidClient),
            "{\"error\":\"invalid_client\"}",
        )
            .into_response(),
        None => (
            StatusCode::BAD_REQUEST,
            [JSON],
            "{\"error\":\"invalid_request\"}",
        )
            .into_response(),
    }
}

/// The two limiters, shared with whoever watches them (the load generator).
pub struct Limiters {
    /// Per source address.
    pub per_source: Arc<Pace<IpAddr>>,
    /// Per claimed client id.
    pub per_client: Arc<Pace<String>>,
}

impl Limiters {
    /// Per source `source_per_s` (burst 2 s of it), per client 5/s burst 10.
    pub fn new(source_per_s: u64) -> Limiters {
        Limiters::with(source_per_s, 5, 10)
    }

    /// Per source `source_per_s` (burst 2 s of it), per client
    /// `client_per_s`, burst `client_burst`.
    pub fn with(source_per_s: u64, client_per_s: u64, client_burst: u64) -> Limiters {
        Limiters {
            per_source: Arc::new(
                Pace::builder(Rate::per_second(source_per_s).unwrap())
                    .capacity(2 * source_per_s)
                    .build()
                    .unwrap(),
            ),
            per_client: Arc::new(
                Pace::builder(Rate::per_second(client_per_s).unwrap())
                    .capacity(client_burst)
                    .build()
                    .unwrap(),
            ),
        }
    }

    /// The layer: per source first (never refunded on the answer), then
    /// per claimed id (refunded on invalid_client; skipped without
    /// credentials, so that the endpoint answers `invalid_request` itself).
    pub fn layer(&self) -> PaceLayer<impl Limits> {
        self.layer_with_fields(true)
    }

    /// The layer, with or without `RateLimit` fields on admitted responses.
    pub fn layer_with_fields(&self, fields: bool) -> PaceLayer<impl Limits> {
        PaceLayer::builder()
            .rate_limit_headers(fields)
            .limit(Limit::new("source", self.per_source.clone(), PeerIp::new()))
            .limit(
                Limit::new(
                    "client",
                    self.per_client.clone(),
                    from_fn(|h: &RequestHead<'_>| basic(h.headers).map(|(id, _)| id)),
                )
                .missing_key(MissingKey::Skip)
                .refund_if(|r: &ResponseHead<'_>| {
                    r.status == StatusCode::UNAUTHORIZED
                        && r.extensions.get::<InvalidClient>().is_some()
                }),
            )
            .build()
            .unwrap()
    }
}

/// The router without a limiter.
pub fn router() -> Router {
    Router::new().route("/token", post(token))
}

#[allow(dead_code)]
#[tokio::main]
async fn main() {
    let limiters = Limiters::new(200);
    // Router::route_layer: a 404 spends no pace (a 405 on /token does).
    let app = router().route_layer(limiters.layer());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("token endpoint on http://127.0.0.1:3000/token (Ctrl-C to stop)");
    println!("try: curl -si -u client-7:secret-7 -X POST http://127.0.0.1:3000/token");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .unwrap();
}
