//! Load generator for the token endpoint (examples/token_endpoint.rs), on
//! 127.0.0.1 only, bounded in requests and time.
//!
//! `cargo run --release -p pace-tower --example loadgen [-- CONNECTIONS SECONDS]`
//! (defaults 64 connections, 2 s per phase). Server and client share one
//! process and one 2-worker tokio runtime; every phase starts its own server
//! on port 0 and stops it at the end.
//!
//! 1. exactness: CONNECTIONS connections present 20 registered client ids at
//!    random as fast as they can; per id, the 200s must not exceed
//!    capacity + rate × elapsed (integers: 10 + floor(elapsed_ns × 5 / 1e9)).
//! 2. flood: the same connections claim made-up client ids; every answer is
//!    401 invalid_client, the claimed id is refunded, and the per-client
//!    row count is sampled during and after the flood.
//! 3. throughput: the same server with no limiter, with pace-tower (per
//!    source + per client id; with and without the RateLimit fields on
//!    admitted responses) and with tower-governor (two GovernorLayers, per
//!    peer IP + per client id, no header middleware), same limits, generous
//!    enough that every request is admitted: requests/s and latency p50/p99
//!    per variant, ROUNDS rounds of SECONDS each, variants interleaved so
//!    that drift in the machine's load spreads over all of them.

#[path = "token_endpoint.rs"]
#[allow(dead_code)]
mod token_endpoint;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, Request, Response, StatusCode};
use axum::Router;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use token_endpoint::{basic, basic_value, router, Limiters};
use tokio::net::{TcpListener, TcpStream};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, PeerIpKeyExtractor};
use tower_governor::{GovernorError, GovernorLayer};

/// Upper bound on requests per phase, whatever the time.
const MAX_REQUESTS: u64 = 2_000_000;
/// Throughput rounds per variant.
const ROUNDS: usize = 3;

async fn serve(app: Router) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (addr, tx)
}

struct Conn {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    async fn new(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { send }
    }

    async fn post(&mut self, auth: HeaderValue) -> Response<Bytes> {
        let req = Request::builder()
            .method("POST")
            .uri("/token")
            .header("host", "127.0.0.1")
            .header("authorization", auth)
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send.ready().await.unwrap();
        let resp = self.send.send_request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
    }
}

/// Per-phase results.
#[derive(Default)]
struct Outcome {
    by_status: HashMap<u16, u64>,
    ok_by_id: HashMap<String, u64>,
    latency: Option<Histogram<u64>>,
    requests: u64,
    elapsed: Duration,
}

/// Runs `conns` connections against `addr` for `secs`, each request's
/// credentials from `pick(connection, request number)`.
async fn drive(
    addr: SocketAddr,
    conns: usize,
    secs: u64,
    pick: Arc<dyn Fn(usize, u64) -> (String, String) + Send + Sync>,
) -> Outcome {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let out = Arc::new(Mutex::new(Outcome {
        latency: Some(Histogram::new(3).unwrap()),
        ..Default::default()
    }));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (stop, count, out, pick) = (stop.clone(), count.clone(), out.clone(), pick.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(addr).await;
            let mut hist = Histogram::<u64>::new(3).unwrap();
            let mut by_status: HashMap<u16, u64> = HashMap::new();
            let mut ok_by_id: HashMap<String, u64> = HashMap::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed)
                && count.fetch_add(1, Ordering::Relaxed) < MAX_REQUESTS
            {
                let (id, secret) = pick(c, i);
                i += 1;
                let t = Instant::now();
                let r = conn.post(basic_value(&id, &secret)).await;
                hist.record(t.elapsed().as_nanos() as u64).unwrap();
                *by_status.entry(r.status().as_u16()).or_default() += 1;
                if r.status() == StatusCode::OK {
                    *ok_by_id.entry(id).or_default() += 1;
                }
            }
            let mut o = out.lock().unwrap();
            o.latency.as_mut().unwrap().add(&hist).unwrap();
            for (k, v) in by_status {
                *o.by_status.entry(k).or_default() += v;
            }
            for (k, v) in ok_by_id {
                *o.ok_by_id.entry(k).or_default() += v;
            }
            o.requests += i;
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed();
    let mut o = std::mem::take(&mut *out.lock().unwrap());
    o.elapsed = elapsed;
    o
}

/// A cheap deterministic mix (splitmix64).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// tower-governor keyed by the claimed client id.
#[derive(Clone)]
struct ClientIdKey;

impl KeyExtractor for ClientIdKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        basic(req.headers())
            .map(|(id, _)| id)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn statuses(o: &Outcome) -> String {
    let mut v: Vec<_> = o.by_status.iter().collect();
    v.sort();
    v.iter()
        .map(|(k, n)| format!("{k}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: loadgen [CONNECTIONS SECONDS]"))
        .collect();
    let conns = *args.first().unwrap_or(&64) as usize;
    let secs = *args.get(1).unwrap_or(&2);
    assert!(conns > 0 && conns <= 1024 && secs > 0 && secs <= 60);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(conns, secs));
}

async fn run(conns: usize, secs: u64) {
    println!(
        "loadgen: {conns} connections, {secs} s per phase, loadavg {}",
        loadavg()
    );
    let mut failed = false;

    // 1. Exactness: 20 registered ids, per-client 5/s burst 10.
    {
        let limiters = Limiters::new(1_000_000);
        let (addr, stop) = serve(router().layer(limiters.layer())).await;
        let pick: Arc<dyn Fn(usize, u64) -> (String, String) + Send + Sync> = Arc::new(|c, i| {
            let n = mix((c as u64) << 32 | i) % 20;
            (format!("client-{n}"), format!("secret-{n}"))
        });
        let o = drive(addr, conns, secs, pick).await;
        let _ = stop.send(());
        let bound = 10 + (o.elapsed.as_nanos() as u64 * 5) / 1_000_000_000;
        let max = o.ok_by_id.values().copied().max().unwrap_or(0);
        let min = o.ok_by_id.values().copied().min().unwrap_or(0);
        let over: Vec<_> = o.ok_by_id.iter().filter(|(_, &n)| n > bound).collect();
        println!(
            "exactness: {} requests in {:.3} s ({}); 200s per client id: min {min} max {max}, \
             bound capacity + rate x elapsed = {bound}; ids over the bound: {}",
            o.requests,
            o.elapsed.as_secs_f64(),
            statuses(&o),
            over.len()
        );
        if !over.is_empty() || o.ok_by_id.len() != 20 {
            println!("EXACTNESS FAILED: {over:?}");
            failed = true;
        }
    }

    // 2. Claimed-id flood: made-up ids, all 401 invalid_client, all refunded.
    {
        let limiters = Limiters::new(1_000_000);
        let (addr, stop) = serve(router().layer(limiters.layer())).await;
        let per_client = limiters.per_client.clone();
        let sampling = Arc::new(AtomicBool::new(true));
        let peak = Arc::new(AtomicU64::new(0));
        let sampler = {
            let (sampling, peak, per_client) = (sampling.clone(), peak.clone(), per_client.clone());
            tokio::spawn(async move {
                while sampling.load(Ordering::Relaxed) {
                    peak.fetch_max(per_client.len() as u64, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        let pick: Arc<dyn Fn(usize, u64) -> (String, String) + Send + Sync> =
            Arc::new(|c, i| (format!("made-up-{c}-{i}"), "guess".to_string()));
        let o = drive(addr, conns, secs, pick).await;
        sampling.store(false, Ordering::Relaxed);
        sampler.await.unwrap();
        let _ = stop.send(());
        let rows = per_client.len();
        println!(
            "flood: {} requests claiming {} distinct made-up ids in {:.3} s ({}); \
             per-client rows sampled every 10 ms: peak {}, after the flood {rows}",
            o.requests,
            o.requests,
            o.elapsed.as_secs_f64(),
            statuses(&o),
            peak.load(Ordering::Relaxed),
        );
        if o.by_status.get(&401).copied() != Some(o.requests) {
            println!("FLOOD FAILED: every answer should be 401");
            failed = true;
        }
    }

    // 3. Throughput: same server, three variants, limits never binding.
    let pick: Arc<dyn Fn(usize, u64) -> (String, String) + Send + Sync> = Arc::new(|c, i| {
        let n = mix((c as u64) << 32 | i) % 1000;
        (format!("client-{n}"), format!("secret-{n}"))
    });
    println!(
        "throughput (every request admitted; latency measured at the client; \
         {ROUNDS} rounds of {secs} s per variant, variants interleaved):"
    );
    let variants = [
        "none",
        "pace-tower",
        "pace-tower-nofields",
        "tower-governor",
    ];
    let mut servers = Vec::new();
    for variant in variants {
        let app = match variant {
            "none" => router(),
            "pace-tower" => router().layer(Limiters::with(1_000_000, 1_000, 2_000).layer()),
            "pace-tower-nofields" => {
                router().layer(Limiters::with(1_000_000, 1_000, 2_000).layer_with_fields(false))
            }
            _ => {
                // Same limits: 1 per µs per source, burst 2e6; 1 per ms
                // per client id, burst 2000.
                let per_source = GovernorConfigBuilder::default()
                    .per_nanosecond(1000)
                    .burst_size(2_000_000)
                    .key_extractor(PeerIpKeyExtractor)
                    .finish()
                    .unwrap();
                let per_client = GovernorConfigBuilder::default()
                    .per_millisecond(1)
                    .burst_size(2_000)
                    .key_extractor(ClientIdKey)
                    .finish()
                    .unwrap();
                router()
                    .layer(GovernorLayer::new(per_client))
                    .layer(GovernorLayer::new(per_source))
            }
        };
        servers.push(serve(app).await);
    }
    let mut totals: Vec<Outcome> = variants
        .iter()
        .map(|_| Outcome {
            latency: Some(Histogram::new(3).unwrap()),
            ..Default::default()
        })
        .collect();
    for round in 0..ROUNDS {
        for k in 0..variants.len() {
            // Rotate the order each round.
            let v = (k + round) % variants.len();
            let o = drive(servers[v].0, conns, secs, pick.clone()).await;
            let t = &mut totals[v];
            t.requests += o.requests;
            t.elapsed += o.elapsed;
            t.latency
                .as_mut()
                .unwrap()
                .add(o.latency.as_ref().unwrap())
                .unwrap();
            for (s, n) in o.by_status {
                *t.by_status.entry(s).or_default() += n;
            }
        }
    }
    println!("  variant              req/s    p50 us    p99 us   statuses");
    for (variant, o) in variants.iter().zip(&totals) {
        let h = o.latency.as_ref().unwrap();
        println!(
            "  {variant:<19} {:>7.0} {:>9.1} {:>9.1}   {}",
            o.requests as f64 / o.elapsed.as_secs_f64(),
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            statuses(o)
        );
        if o.by_status.get(&200).copied() != Some(o.requests) {
            println!("THROUGHPUT: not every request was admitted");
            failed = true;
        }
    }
    for (_, stop) in servers {
        let _ = stop.send(());
    }
    println!("loadavg at the end: {}", loadavg());
    if failed {
        std::process::exit(1);
    }
}
