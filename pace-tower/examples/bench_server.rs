//! An axum server behind `PaceLayer` or tower_governor's `GovernorLayer`,
//! for load tests against the same handler (`wrk` rounds that alternate
//! between the two):
//!
//! ```sh
//! cargo build --release -p pace-tower --example bench_server
//! taskset -c 0 target/release/examples/bench_server pace 1 fields 3000 1 &
//! taskset -c 1 wrk -t2 -c64 -d10s -H 'x-client-id: client-7' http://127.0.0.1:3000/
//! ```
//!
//! Arguments: `pace`, `governor` or `bare` (no layer); `1` (per peer IP)
//! or `2` (per peer IP, then per `x-client-id`); `fields` (pace's
//! `RateLimit` fields, tower_governor's `use_headers()`) or `plain`; the
//! port on 127.0.0.1; tokio worker threads. The limits admit every request
//! (10^8 a second, bursts of 10^8), so every answer is the handler's `200`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::Request;
use axum::routing::get;
use axum::Router;
use pace::{IpPrefix, Pace, Rate};
use pace_tower::{from_fn, Limit, PaceLayer, PeerIp};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, PeerIpKeyExtractor};
use tower_governor::{GovernorError, GovernorLayer};

const RATE: u64 = 100_000_000;

async fn handler() -> &'static str {
    "ok"
}

fn client_id(h: &axum::http::HeaderMap) -> Option<String> {
    h.get("x-client-id")?.to_str().ok().map(str::to_string)
}

#[derive(Clone)]
struct ClientIdKey;

impl KeyExtractor for ClientIdKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        client_id(req.headers()).ok_or(GovernorError::UnableToExtractKey)
    }
}

fn limiter<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>() -> Arc<Pace<K>> {
    Arc::new(
        Pace::builder(Rate::per_second(RATE).unwrap())
            .capacity(RATE)
            .build()
            .unwrap(),
    )
}

fn app(which: &str, limits: u32, fields: bool) -> Router {
    let base = Router::new().route("/", get(handler));
    let gov = || {
        let mut b = GovernorConfigBuilder::default();
        b.per_nanosecond(1_000_000_000 / RATE)
            .burst_size(RATE as u32);
        b
    };
    match (which, limits, fields) {
        ("bare", _, _) => base,
        ("pace", 1, _) => base.layer(
            PaceLayer::builder()
                .rate_limit_headers(fields)
                .limit(Limit::new("source", limiter::<IpPrefix>(), PeerIp::new()))
                .build()
                .unwrap(),
        ),
        ("pace", 2, _) => base.layer(
            PaceLayer::builder()
                .rate_limit_headers(fields)
                .limit(Limit::new("source", limiter::<IpPrefix>(), PeerIp::new()))
                .limit(Limit::new(
                    "client",
                    limiter::<String>(),
                    from_fn(|h| client_id(h.headers)),
                ))
                .build()
                .unwrap(),
        ),
        ("governor", 1, false) => base.layer(GovernorLayer::new(
            gov().key_extractor(PeerIpKeyExtractor).finish().unwrap(),
        )),
        ("governor", 1, true) => base.layer(GovernorLayer::new(
            gov()
                .key_extractor(PeerIpKeyExtractor)
                .use_headers()
                .finish()
                .unwrap(),
        )),
        // The outer layer runs first: per peer IP, then per client id.
        ("governor", 2, false) => base
            .layer(GovernorLayer::new(
                gov().key_extractor(ClientIdKey).finish().unwrap(),
            ))
            .layer(GovernorLayer::new(
                gov().key_extractor(PeerIpKeyExtractor).finish().unwrap(),
            )),
        ("governor", 2, true) => base
            .layer(GovernorLayer::new(
                gov()
                    .key_extractor(ClientIdKey)
                    .use_headers()
                    .finish()
                    .unwrap(),
            ))
            .layer(GovernorLayer::new(
                gov()
                    .key_extractor(PeerIpKeyExtractor)
                    .use_headers()
                    .finish()
                    .unwrap(),
            )),
        _ => panic!("usage: bench_server pace|governor|bare 1|2 fields|plain PORT WORKERS"),
    }
}

fn main() -> Result<(), Infallible> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map_or("pace", String::as_str);
    let limits: u32 = args.get(1).map_or(1, |s| s.parse().unwrap());
    let fields = args.get(2).map_or("fields", String::as_str) == "fields";
    let port: u16 = args.get(3).map_or(3000, |s| s.parse().unwrap());
    let workers: usize = args.get(4).map_or(1, |s| s.parse().unwrap());
    let app = app(which, limits, fields);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .unwrap();
            eprintln!("{which} {limits} {fields}: listening on {port}");
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
    Ok(())
}
