//! Shared limits keep the layer's promises (pace-tower README: "Refunds
//! under overlap"), over real loopback HTTP against a real `redis-server`
//! (started here on a free loopback port): two replica processes (this
//! test binary run again on `redis::replica_process`), each an axum server
//! with its own `RedisPace` connection and tokio runtime.
//!
//! * `a_401_flood_on_two_replicas_keeps_the_victim_whole`: `refund_if(401)`
//!   on a `RedisPace` limit (5/s, capacity 10) holds it, so a flood of
//!   wrong secrets naming a victim's client id on both replicas (32
//!   connections; one replica with the `RateLimit` fields, one without)
//!   leaves no trace: once its holds are settled (the key stores no hold),
//!   the victim's bucket holds every token its own requests left, by the
//!   instants this process read their answers, and a burst of that many of
//!   its requests passes. During the flood the victim passes whenever the
//!   flood's checks in flight leave a token: reported, not asserted.
//!
//! No check leans on time: a flood is a count of requests (every one
//! answered as expected), the victim's requests go between the flood's by
//! its progress, and "once the refunds landed" is an event (the key stores
//! no hold), waited for with a bound only a hang exceeds ([`HANG`]).
//! * `a_shared_and_a_local_limit_all_or_nothing_under_a_flood`: the shared
//!   limit first, a local one after it that denies the flood: the shared
//!   limit is held, and each denial refunds it exactly.
//! * `a_waiting_shared_limit_serves_every_request_at_its_slot`: 15
//!   concurrent requests of a fresh client at 5/s, capacity 10, with
//!   `wait_up_to(2 s)`: 15 × 200, the five that queue each at or after its
//!   slot on the server's clock.
//! * `a_quota_per_request_decides_a_shared_limit`: `Limit::quota` on a
//!   `RedisPace` limit decides the request and its fields.
//! * `a_queueing_limit_the_layer_may_refund_is_refused_at_build`.
//! * `credentials_checked_before_the_shared_limit_keep_the_victim_whole`:
//!   the README's order (a per-source limit, a credential-checking
//!   middleware, a per-client `RedisPace` limit) on two replicas: during a
//!   32-connection flood of wrong secrets naming the victim's client id,
//!   the victim's 20 valid requests all pass, the shared limit decides
//!   exactly those 20 (the flood never reaches it), and after it the
//!   victim's bucket refills whole.
//! * `a_handler_checking_credentials_with_leases_keeps_the_victim_whole`:
//!   the handler checks the credentials, the shared limit (5/s, capacity
//!   30: the victim's 20 and the most the other replica's lease pool
//!   holds) refunded on 401 and built with leases, on two replicas: during
//!   the 32-connection flood of wrong secrets the victim's 20 requests all
//!   pass (the flood's holds are the leases', kept or refunded in place),
//!   the bucket comes back whole (the server's reading: 30 tokens, then 20
//!   requests in a row pass), and the kept admissions stay within the
//!   bound over the run. `..._without_leases_keeps_the_victim_whole_after`
//!   runs the same without leases: the victim's count during the flood is
//!   reported, not asserted.
//! * `the_lease_counters_reach_the_metrics_recorder`: the layer's
//!   `pace_lease_*` counters of a `RedisPace` limit with leases are its
//!   `stats()`; a limit without leases has none.
//!
//! Known-wrong variants these tests catch (`PACE_MUTANT=NAME cargo test -p
//! pace-tower --all-features --test shared_holds`, as
//! `.ci/suites/15-mutants.sh` runs them): `tower_redis_plain` (the layer
//! reserves a `RedisPace` plainly and refunds it by the plain rule: the
//! floods drain the victim), `tower_redis_no_turn` (a `RedisPace` limit
//! cannot wait: 10 × 200 and 5 × 429).

mod support;

use std::collections::hash_map::RandomState;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderName, StatusCode};
use axum::routing::get;
use axum::Router;
use pace::{Pace, Quota, Rate};
use pace_tower::{from_fn, BuildError, Header, Limit, Limits, PaceLayer, ResponseHead};
use support::{header, serve, Client};

/// The claimed client id, as a `String` (a `RedisPace` key is the key's
/// `Display` form).
fn client_id() -> pace_tower::FromFn<impl Fn(&pace_tower::RequestHead<'_>) -> Option<String>> {
    from_fn(|h| Some(h.headers.get("x-client-id")?.to_str().ok()?.to_string()))
}

fn api_key() -> Header {
    Header(HeaderName::from_static("x-api-key"))
}

/// 200, or 401 when the request says `x-valid: no`.
async fn handler(req: Request) -> StatusCode {
    if req.headers().get("x-valid").is_some_and(|v| v == "no") {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    }
}

fn app<L: Limits>(layer: PaceLayer<L>) -> Router {
    Router::new().route("/", get(handler)).layer(layer)
}

fn is_401(r: &ResponseHead<'_>) -> bool {
    r.status == StatusCode::UNAUTHORIZED
}

#[test]
fn a_queueing_limit_the_layer_may_refund_is_refused_at_build() {
    fn pace<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>() -> Arc<Pace<K, RandomState>>
    {
        Arc::new(
            Pace::builder(Rate::per_second(5).unwrap())
                .capacity(10)
                .build()
                .unwrap(),
        )
    }
    let wait = Duration::from_secs(2);
    // With a refund predicate.
    let e = PaceLayer::builder()
        .limit(
            Limit::new("client", pace(), client_id())
                .refund_if(is_401)
                .wait_up_to(wait),
        )
        .build()
        .err();
    assert_eq!(
        e,
        Some(BuildError::QueuedRefund {
            limit: "client".into()
        })
    );
    // Before a limit that may refuse.
    let e = PaceLayer::builder()
        .limit(Limit::new("client", pace(), client_id()).wait_up_to(wait))
        .limit(Limit::new("key", pace(), api_key()))
        .build()
        .err();
    assert_eq!(
        e,
        Some(BuildError::QueuedRefund {
            limit: "client".into()
        })
    );
    assert!(e.unwrap().to_string().contains("exact_refunds(false)"));
    // Last, without a refund predicate; or with plain refunds chosen.
    assert!(PaceLayer::builder()
        .limit(Limit::new("key", pace(), api_key()))
        .limit(Limit::new("client", pace(), client_id()).wait_up_to(wait))
        .build()
        .is_ok());
    assert!(PaceLayer::builder()
        .limit(
            Limit::new("client", pace(), client_id())
                .refund_if(is_401)
                .wait_up_to(wait)
                .exact_refunds(false)
        )
        .limit(Limit::new("key", pace(), api_key()))
        .build()
        .is_ok());
}

#[cfg(feature = "redis")]
mod redis {
    use pace_redis::{LeaseConfig, RedisPace};

    use super::*;

    /// A redis-server on a free loopback port, no persistence, killed on
    /// drop.
    struct Server(Child, u16);

    impl Server {
        fn start() -> Server {
            for _ in 0..20 {
                let port = TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                let mut child = Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server (the redis feature's tests need one)");
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    if child.try_wait().ok().flatten().is_some() {
                        break; // the port was taken: another one
                    }
                    if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                        let mut buf = [0u8; 7];
                        if s.write_all(b"PING\r\n").is_ok()
                            && s.read_exact(&mut buf).is_ok()
                            && &buf == b"+PONG\r\n"
                        {
                            return Server(child, port);
                        }
                    }
                    if Instant::now() >= deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            panic!("redis-server did not start");
        }

        fn url(&self) -> String {
            format!("redis://127.0.0.1:{}/", self.1)
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// One replica's connection to the shared limit: 5/s, capacity 10 (a
    /// timeout, and a hold limit, only a hang exceeds: a flood answered 503,
    /// or a hold settled as kept because its refund came late, would test
    /// nothing).
    async fn shared(server: &Server, prefix: &str) -> Arc<RedisPace> {
        connect(&server.url(), prefix).await
    }

    async fn connect(url: &str, prefix: &str) -> Arc<RedisPace> {
        connect_with(url, prefix, 10).await
    }

    /// 5/s with `capacity`.
    async fn connect_with(url: &str, prefix: &str, capacity: u64) -> Arc<RedisPace> {
        connect_leased(url, prefix, capacity, None).await
    }

    /// 5/s with `capacity`, with `leases` if any.
    async fn connect_leased(
        url: &str,
        prefix: &str,
        capacity: u64,
        leases: Option<LeaseConfig>,
    ) -> Arc<RedisPace> {
        let mut b = RedisPace::builder(Rate::per_second(5).unwrap())
            .capacity(capacity)
            .timeout(HANG)
            .hold_limit(HANG)
            .prefix(prefix);
        if let Some(l) = leases {
            b = b.leases(l);
        }
        Arc::new(b.connect(url).await.unwrap())
    }

    /// The leases of the handler-checks replicas: a lease time of 1 s (a
    /// grant is renewed a quarter of it before its deadline, and a key
    /// nobody uses for half of it is released), 5 tokens asked for in a
    /// call, the rest the defaults (a key is hot after 8 server decisions
    /// within a lease time).
    fn test_leases() -> LeaseConfig {
        LeaseConfig {
            lease: Duration::from_secs(1),
            want: Some(5),
            ..LeaseConfig::default()
        }
    }

    /// The secret of each registered client (the credential check).
    fn secret_of(client: &str) -> Option<&'static str> {
        match client {
            "victim" => Some("victim-secret"),
            "other" => Some("other-secret"),
            _ => None,
        }
    }

    /// The credential-checking middleware: `401` unless `x-client-secret`
    /// is the secret of the claimed `x-client-id`, before any limit after
    /// it is asked.
    async fn check_credentials(
        req: Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        // (In a block: a borrow of the request held across the `await`
        // would make the future not `Send`.)
        let valid = {
            let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
            header("x-client-id")
                .and_then(secret_of)
                .is_some_and(|s| header("x-client-secret") == Some(s))
        };
        if !valid {
            return axum::response::IntoResponse::into_response(StatusCode::UNAUTHORIZED);
        }
        next.run(req).await
    }

    /// The credential check in the handler (the replica kind `handler`):
    /// 200, counted in `ok`, when `x-client-secret` is the secret of the
    /// claimed `x-client-id`; 401 otherwise.
    fn checking_handler(ok: Arc<AtomicU64>) -> axum::routing::MethodRouter {
        get(move |req: Request| async move {
            let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
            let valid = header("x-client-id")
                .and_then(secret_of)
                .is_some_and(|s| header("x-client-secret") == Some(s));
            if valid {
                ok.fetch_add(1, Ordering::Relaxed);
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        })
    }

    /// A replica's app, by kind: `401` (the shared limit refunded on 401),
    /// `allor` (the shared limit, then a local one per API key of one
    /// token an hour), `turns` (the shared limit queueing up to 2 s; the
    /// handler answers the server's clock in `x-server-now`), `checked` (a
    /// per-source limit on the `X-Forwarded-For` hop after loopback, the
    /// credential check, then the shared limit per client id; `/stats`
    /// answers the shared limiter's server decisions); `handler` (the
    /// shared limit per client id refunded on 401, the handler checking
    /// the credentials; `/stats` answers the shared limiter's server
    /// decisions, its leased decisions and the handler's 200s); `fields`:
    /// whether admitted responses carry the `RateLimit` fields.
    async fn replica_app(
        kind: &str,
        fields: bool,
        limiter: Arc<RedisPace>,
        probe: Arc<RedisPace>,
    ) -> Router {
        match kind {
            "401" => app(PaceLayer::builder()
                .rate_limit_headers(fields)
                .limit(Limit::new("client", limiter, client_id()).refund_if(is_401))
                .build()
                .unwrap()),
            "allor" => {
                let keys: Arc<Pace<axum::http::HeaderValue>> = Arc::new(
                    Pace::builder(Rate::new(1, Duration::from_secs(3600)).unwrap())
                        .capacity(1)
                        .build()
                        .unwrap(),
                );
                app(PaceLayer::builder()
                    .rate_limit_headers(fields)
                    .limit(Limit::new("client", limiter, client_id()))
                    .limit(Limit::new("key", keys, api_key()))
                    .build()
                    .unwrap())
            }
            "turns" => {
                let layer = PaceLayer::builder()
                    .rate_limit_headers(fields)
                    .limit(
                        Limit::new("client", limiter, client_id())
                            .wait_up_to(Duration::from_secs(2)),
                    )
                    .build()
                    .unwrap();
                Router::new()
                    .route(
                        "/",
                        get(move || async move {
                            let now = probe.peek("clock").await.unwrap().server_now_ns().unwrap();
                            ([("x-server-now", now.to_string())], StatusCode::OK)
                        }),
                    )
                    .layer(layer)
            }
            "checked" => {
                // Per source: 20/s, capacity 40, in this process, never
                // refunded.
                let sources: Arc<Pace<pace::IpPrefix>> = Arc::new(
                    Pace::builder(Rate::per_second(20).unwrap())
                        .capacity(40)
                        .build()
                        .unwrap(),
                );
                let source = Limit::new(
                    "source",
                    sources,
                    pace_tower::ForwardedIp::new(["127.0.0.0/8".parse().unwrap()]),
                );
                let per_source = PaceLayer::builder()
                    .rate_limit_headers(fields)
                    .limit(source)
                    .build()
                    .unwrap();
                let per_client = PaceLayer::builder()
                    .rate_limit_headers(fields)
                    .limit(Limit::new("client", limiter.clone(), client_id()))
                    .build()
                    .unwrap();
                Router::new()
                    .route("/", get(handler))
                    // Outermost last: source, then the check, then client.
                    .layer(per_client)
                    .layer(axum::middleware::from_fn(check_credentials))
                    .layer(per_source)
                    .merge(Router::new().route(
                        "/stats",
                        get(move || async move { limiter.stats().server_decisions.to_string() }),
                    ))
            }
            "handler" => {
                let ok = Arc::new(AtomicU64::new(0));
                let layer = PaceLayer::builder()
                    .rate_limit_headers(fields)
                    .limit(Limit::new("client", limiter.clone(), client_id()).refund_if(is_401))
                    .build()
                    .unwrap();
                Router::new()
                    .route("/", checking_handler(ok.clone()))
                    .layer(layer)
                    .merge(Router::new().route(
                        "/stats",
                        get(move || async move {
                            let s = limiter.stats();
                            format!(
                                "{} {} {}",
                                s.server_decisions,
                                s.leased_decisions,
                                ok.load(Ordering::Relaxed)
                            )
                        }),
                    ))
            }
            other => panic!("no replica kind {other}"),
        }
    }

    /// The body of a replica process: this test binary run again on this
    /// test alone with `PACE_TEST_REPLICA` (its kind), `PACE_TEST_REDIS`
    /// (the server's URL), `PACE_TEST_PREFIX` and `PACE_TEST_FIELDS` (`0`:
    /// without the `RateLimit` fields) set; it serves on a free
    /// loopback port, prints `REPLICA_PORT <port>`, and serves until its
    /// stdin closes. Run without them (as every test is), it does nothing.
    #[test]
    fn replica_process() {
        let Ok(kind) = std::env::var("PACE_TEST_REPLICA") else {
            return;
        };
        let url = std::env::var("PACE_TEST_REDIS").unwrap();
        let prefix = std::env::var("PACE_TEST_PREFIX").unwrap();
        let fields = std::env::var("PACE_TEST_FIELDS").as_deref() != Ok("0");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            // The credential check's victim sends 20 requests: a bucket of
            // 20 holds them all, however they bunch.
            let capacity = match kind.as_str() {
                "checked" => 20,
                // The victim's 20 and the most the other replica's lease
                // pool holds (5 asked for at a time, renewed below 3): a
                // lease's tokens on one replica are not the other's, and
                // the victim alternates replicas.
                "handler" => HANDLER_CAPACITY,
                _ => 10,
            };
            let leases = std::env::var("PACE_TEST_LEASES").as_deref() == Ok("1");
            let limiter = connect_leased(&url, &prefix, capacity, leases.then(test_leases)).await;
            let probe = connect(&url, "probe:").await;
            let addr = serve(replica_app(&kind, fields, limiter, probe).await).await;
            println!("REPLICA_PORT {}", addr.port());
            let _ = tokio::task::spawn_blocking(|| {
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
            })
            .await;
        });
    }

    /// A replica process (see [`replica_process`]), killed on drop.
    struct Replica {
        child: Child,
        addr: SocketAddr,
    }

    impl Replica {
        fn start(kind: &str, server: &Server, prefix: &str, fields: bool) -> Replica {
            Replica::start_leased(kind, server, prefix, fields, false)
        }

        /// [`start`](Replica::start), the shared limit with leases
        /// ([`test_leases`]) when `leases`.
        fn start_leased(
            kind: &str,
            server: &Server,
            prefix: &str,
            fields: bool,
            leases: bool,
        ) -> Replica {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "redis::replica_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("PACE_TEST_REPLICA", kind)
                .env("PACE_TEST_REDIS", server.url())
                .env("PACE_TEST_PREFIX", prefix)
                .env("PACE_TEST_FIELDS", if fields { "1" } else { "0" })
                .env("PACE_TEST_LEASES", if leases { "1" } else { "0" })
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("the test binary runs again as a replica");
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let port: u16 = loop {
                let line = lines
                    .next()
                    .expect("the replica exited before serving")
                    .unwrap();
                // (after the harness's `test ... ` on the same line)
                if let Some((_, p)) = line.split_once("REPLICA_PORT ") {
                    break p.trim().parse().unwrap();
                }
            };
            // The rest of its output, read so that it never blocks.
            std::thread::spawn(move || lines.for_each(drop));
            Replica {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            }
        }
    }

    impl Drop for Replica {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Two replica processes of `kind`, the first with the `RateLimit`
    /// fields and the second without (the layer's two ways of settling a
    /// response), and a limiter of the same prefix for this process's own
    /// readings.
    async fn replicas(kind: &str, server: &Server, prefix: &str) -> (Vec<Replica>, Arc<RedisPace>) {
        let started = tokio::task::block_in_place(|| {
            (0..2)
                .map(|i| Replica::start(kind, server, prefix, i == 0))
                .collect()
        });
        (started, shared(server, prefix).await)
    }

    /// Statuses seen by a flood.
    #[derive(Debug, Default)]
    struct Seen {
        ok: u64,
        unauthorized: u64,
        too_many: u64,
        other: u64,
    }

    /// Requests of a flood: 32 connections, [`PER_CONNECTION`] each.
    const CONNECTIONS: u64 = 32;
    const PER_CONNECTION: u64 = 40;
    const FLOOD: u64 = CONNECTIONS * PER_CONNECTION;

    /// A flood: 32 connections, spread over `replicas`, each sending
    /// `headers` [`PER_CONNECTION`] times, one request after the answer to
    /// the last; `answered` counts the answers as they come.
    async fn flood(
        replicas: &[SocketAddr],
        headers: &'static [(&'static str, &'static str)],
        answered: Arc<AtomicU64>,
    ) -> Seen {
        let counts: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
        let mut tasks = Vec::new();
        for i in 0..CONNECTIONS as usize {
            let (counts, answered) = (counts.clone(), answered.clone());
            let addr = replicas[i % replicas.len()];
            tasks.push(tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                for _ in 0..PER_CONNECTION {
                    let r = c.get("/", headers).await;
                    let slot = match r.status() {
                        StatusCode::OK => 0,
                        StatusCode::UNAUTHORIZED => 1,
                        StatusCode::TOO_MANY_REQUESTS => 2,
                        _ => 3,
                    };
                    counts[slot].fetch_add(1, Ordering::Relaxed);
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let n = |k: usize| counts[k].load(Ordering::Relaxed);
        Seen {
            ok: n(0),
            unauthorized: n(1),
            too_many: n(2),
            other: n(3),
        }
    }

    /// A counted flood of `wrong` beside the victim's 20 `valid` requests
    /// on `clients` (one per replica), the i-th once the flood has had
    /// i/21 of its answers, alternating replicas: what the flood saw and
    /// the victim's statuses.
    async fn flood_beside_victim(
        replicas: &[SocketAddr],
        clients: &mut [Client],
        wrong: &'static [(&'static str, &'static str)],
        valid: &[(&str, &str)],
    ) -> (Seen, Vec<StatusCode>) {
        let answered = Arc::new(AtomicU64::new(0));
        let attack = tokio::spawn({
            let (replicas, answered) = (replicas.to_vec(), answered.clone());
            async move { flood(&replicas, wrong, answered).await }
        });
        let mut got = Vec::new();
        for i in 0..20u64 {
            progress(&answered, FLOOD * (i + 1) / 21).await;
            got.push(clients[i as usize % 2].get("/", valid).await.status());
        }
        let seen = tokio::time::timeout(HANG, attack)
            .await
            .expect("the flood hung")
            .unwrap();
        (seen, got)
    }

    /// A bound only a hang exceeds, for every wait here (a loaded machine
    /// makes the tests slower, never wrong).
    const HANG: Duration = Duration::from_secs(120);

    /// Waits until `answered` reaches `n` (or the flood ended: `done`).
    async fn progress(answered: &AtomicU64, n: u64) {
        let deadline = Instant::now() + HANG;
        while answered.load(Ordering::Relaxed) < n {
            assert!(Instant::now() < deadline, "the flood hung");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The victim's requests during a flood: six, the i-th once the flood
    /// has had i/7 of its answers, alternating replicas, each with
    /// `headers(i)`. Returns their statuses and the instants at which the
    /// admitted ones' answers were read.
    async fn victim(
        replicas: &[SocketAddr],
        headers: impl Fn(usize) -> Vec<(&'static str, String)>,
        answered: &AtomicU64,
    ) -> (Vec<StatusCode>, Vec<Instant>) {
        let mut out = Vec::new();
        let mut admitted = Vec::new();
        let mut clients = Vec::new();
        for &addr in replicas {
            clients.push(Client::connect(addr).await);
        }
        for i in 0..6usize {
            progress(answered, FLOOD * (i as u64 + 1) / 7).await;
            let n = clients.len();
            let h = headers(i);
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = clients[i % n].get("/", &h).await;
            if r.status() == StatusCode::OK {
                admitted.push(Instant::now());
            }
            if let Some(wait) = header(&r, "retry-after") {
                eprintln!("the victim's 429 says Retry-After: {wait}");
            }
            out.push(r.status());
        }
        (out, admitted)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_401_flood_on_two_replicas_keeps_the_victim_whole() {
        let server = Server::start();
        let (procs, limiter) = replicas("401", &server, "flood401:").await;
        let replicas: Vec<SocketAddr> = procs.iter().map(|r| r.addr).collect();
        let wrong: &'static [(&str, &str)] = &[("x-client-id", "victim"), ("x-valid", "no")];
        let answered = Arc::new(AtomicU64::new(0));
        let attack = tokio::spawn({
            let (replicas, answered) = (replicas.clone(), answered.clone());
            async move { flood(&replicas, wrong, answered).await }
        });
        let (got, admitted) = victim(
            &replicas,
            |_| vec![("x-client-id", "victim".to_string())],
            &answered,
        )
        .await;
        let seen = tokio::time::timeout(HANG, attack)
            .await
            .expect("the flood hung")
            .unwrap();
        eprintln!(
            "401 flood on two replicas: {seen:?}; the victim got {} of {} through: {got:?}",
            admitted.len(),
            got.len()
        );
        // Every request of the flood was answered: 401, or 429 while the
        // flood's holds in flight took every token; none passed. The first
        // ten holds found the bucket full (the victim's first request waits
        // for a seventh of the flood): at least ten 401s.
        assert_eq!(seen.unauthorized + seen.too_many, FLOOD, "{seen:?}");
        assert_eq!(seen.ok + seen.other, 0, "{seen:?}");
        assert!(seen.unauthorized >= 10, "the flood ran: {seen:?}");
        // During the flood the victim passes whenever the flood's checks in
        // flight leave a token (reported, not asserted: it depends on the
        // machine's load); afterwards it is whole.
        whole(&replicas, &limiter, &server, &admitted, false).await;
    }

    /// The key's stored value: `None` for no key, `Some(value)` otherwise,
    /// read with a plain `GET` (RESP over a fresh connection).
    fn stored(server: &Server, key: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", server.1)).unwrap();
        let cmd = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
        s.write_all(cmd.as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let len: i64 = line
            .strip_prefix('$')
            .unwrap_or_else(|| panic!("GET {key}: {line:?}"))
            .trim()
            .parse()
            .unwrap();
        if len < 0 {
            return None;
        }
        let mut value = vec![0u8; len as usize + 2];
        r.read_exact(&mut value).unwrap();
        value.truncate(len as usize);
        Some(String::from_utf8(value).unwrap())
    }

    /// After a flood: once the victim's key stores no hold (a key with
    /// holds stores `tat|held|...`, one without a decimal tat: pace-redis's
    /// script), every refund and keep of the flood and of the victim has
    /// landed. The victim's bucket then lacks at most what its own
    /// admissions left: with `admitted` the instants at which this process
    /// read their answers (each decided before it) and `t0` an instant
    /// before the reading, the debt is at most `max_j((n - j) x T - (t0 -
    /// r_j))`, so it holds at least `10 - ceil(that / T)` tokens (by the
    /// server's clock, which runs at the rate of this process's). A burst
    /// of that many of the victim's requests passes, from either replica.
    /// With `keys`, each request presents an API key of its own.
    async fn whole(
        replicas: &[SocketAddr],
        limiter: &RedisPace,
        server: &Server,
        admitted: &[Instant],
        keys: bool,
    ) {
        let key = limiter.redis_key("victim");
        let deadline = Instant::now() + HANG;
        loop {
            let v = tokio::task::block_in_place(|| stored(server, &key));
            if v.as_deref().is_none_or(|v| !v.contains('|')) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the victim's holds never settled: {v:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let t0 = Instant::now();
        let left = limiter.peek("victim").await.unwrap().remaining();
        const T: u128 = 200_000_000; // 5/s
        let n = admitted.len() as u128;
        let debt = admitted
            .iter()
            .enumerate()
            .map(|(j, r)| ((n - j as u128) * T).saturating_sub((t0 - *r).as_nanos()))
            .max()
            .unwrap_or(0);
        let expect = 10 - debt.div_ceil(T) as u64;
        assert!(
            left >= expect,
            "the flood left a trace on the victim: {left} of 10, where its own {n} \
             admissions leave {expect}"
        );
        let mut clients = Vec::new();
        for &addr in replicas {
            clients.push(Client::connect(addr).await);
        }
        for i in 0..expect as usize {
            let n = clients.len();
            let key = format!("after{i}");
            let mut headers = vec![("x-client-id", "victim")];
            if keys {
                headers.push(("x-api-key", &key));
            }
            let r = clients[i % n].get("/", &headers).await;
            assert_eq!(
                r.status(),
                StatusCode::OK,
                "the victim's request {i} after the flood (of {expect})"
            );
        }
    }

    /// The shared limiter's server decisions in each of `replicas`.
    async fn decisions(replicas: &[SocketAddr]) -> u64 {
        let mut sum = 0;
        for &addr in replicas {
            let r = Client::connect(addr).await.get("/stats", &[]).await;
            sum += std::str::from_utf8(r.body())
                .unwrap()
                .parse::<u64>()
                .unwrap();
        }
        sum
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn credentials_checked_before_the_shared_limit_keep_the_victim_whole() {
        let server = Server::start();
        let (procs, limiter) = {
            let started: Vec<Replica> = tokio::task::block_in_place(|| {
                (0..2)
                    .map(|i| Replica::start("checked", &server, "checked:", i == 0))
                    .collect()
            });
            (started, connect_with(&server.url(), "checked:", 20).await)
        };
        let replicas: Vec<SocketAddr> = procs.iter().map(|r| r.addr).collect();
        assert_eq!(decisions(&replicas).await, 0);
        let wrong: &'static [(&str, &str)] = &[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-client-id", "victim"),
            ("x-client-secret", "guess"),
        ];
        let valid: &[(&str, &str)] = &[
            ("x-forwarded-for", "198.51.100.9"),
            ("x-client-id", "victim"),
            ("x-client-secret", "victim-secret"),
        ];
        let mut clients = Vec::new();
        for &addr in &replicas {
            clients.push(Client::connect(addr).await);
        }
        let (seen, got) = flood_beside_victim(&replicas, &mut clients, wrong, valid).await;
        let through = got.iter().filter(|s| **s == StatusCode::OK).count();
        eprintln!(
            "wrong secrets before the per-client limit, two replicas: {seen:?}; the victim got \
             {through} of 20 through"
        );
        // Every request of the flood was answered 401 (the credential
        // check) or 429 (the per-source limit); none passed. Each replica's
        // per-source bucket starts full (40): at least 80 reached the check.
        assert_eq!(seen.unauthorized + seen.too_many, FLOOD, "{seen:?}");
        assert_eq!(seen.ok + seen.other, 0, "{seen:?}");
        assert!(seen.unauthorized >= 80, "the flood ran: {seen:?}");
        assert_eq!(got, vec![StatusCode::OK; 20], "the victim during the flood");
        // The flood never reached the shared limit: it decided the
        // victim's 20 requests, nothing else.
        assert_eq!(
            decisions(&replicas).await,
            20,
            "the shared limit's decisions"
        );
        // Once it refilled, the bucket is whole: 20 in a row pass.
        let wait = limiter.peek("victim").await.unwrap().reset_after();
        tokio::time::sleep(wait.unwrap_or_default()).await;
        assert_eq!(limiter.peek("victim").await.unwrap().remaining(), 20);
        for i in 0..20 {
            let r = clients[i % 2].get("/", valid).await;
            assert_eq!(
                r.status(),
                StatusCode::OK,
                "the victim's request {i} after the flood"
            );
        }
    }

    /// The capacity of the shared limit of the kind `handler`.
    const HANDLER_CAPACITY: u64 = 30;

    /// The `/stats` of replicas of the kind `handler`, summed: server
    /// decisions, leased decisions, the handlers' 200s.
    async fn handler_stats(replicas: &[SocketAddr]) -> [u64; 3] {
        let mut sum = [0; 3];
        for &addr in replicas {
            let r = Client::connect(addr).await.get("/stats", &[]).await;
            let text = std::str::from_utf8(r.body()).unwrap();
            for (s, v) in sum.iter_mut().zip(text.split(' ')) {
                *s += v.parse::<u64>().unwrap();
            }
        }
        sum
    }

    /// The handler checks the credentials (the replica kind `handler`: the
    /// shared limit, 5/s and capacity 30, refunded on 401) on two replica
    /// processes, with leases when `leases`: a 32-connection flood of
    /// wrong secrets naming the victim's client id, and the victim's 20
    /// valid requests during it, the i-th once the flood has had i/21 of
    /// its answers, alternating replicas. Checks that every request of the
    /// flood was answered 401 or 429; that once the flood's holds and the
    /// leases settled (the server's reading of the key says 30 tokens: an
    /// event, waited for with a bound only a hang exceeds), 20 of the
    /// victim's requests in a row pass through one replica; and that the kept
    /// admissions (the handlers' 200s: every 401 is refunded) stay within
    /// the bound over the whole run, `30 + (t1 - t0) / T` on the server's
    /// clock read
    /// before the first request and after the last answer. Returns the
    /// victim's 200s during the flood and the summed `/stats`.
    async fn handler_checks(leases: bool, prefix: &str) -> (usize, [u64; 3]) {
        let server = Server::start();
        let procs: Vec<Replica> = tokio::task::block_in_place(|| {
            (0..2)
                .map(|i| Replica::start_leased("handler", &server, prefix, i == 0, leases))
                .collect()
        });
        let limiter = connect_with(&server.url(), prefix, HANDLER_CAPACITY).await;
        let replicas: Vec<SocketAddr> = procs.iter().map(|r| r.addr).collect();
        let t0 = limiter
            .peek("victim")
            .await
            .unwrap()
            .server_now_ns()
            .unwrap();
        let wrong: &'static [(&str, &str)] =
            &[("x-client-id", "victim"), ("x-client-secret", "guess")];
        let valid: &[(&str, &str)] = &[
            ("x-client-id", "victim"),
            ("x-client-secret", "victim-secret"),
        ];
        let mut clients = Vec::new();
        for &addr in &replicas {
            clients.push(Client::connect(addr).await);
        }
        let (seen, got) = flood_beside_victim(&replicas, &mut clients, wrong, valid).await;
        let through = got.iter().filter(|s| **s == StatusCode::OK).count();
        let during = handler_stats(&replicas).await;
        eprintln!(
            "the handler checks credentials, two replicas, leases {leases}: {seen:?}; the victim \
             got {through} of 20 through: {got:?}; server decisions, leased decisions, 200s: \
             {during:?}"
        );
        assert_eq!(seen.unauthorized + seen.too_many, FLOOD, "{seen:?}");
        assert_eq!(seen.ok + seen.other, 0, "{seen:?}");
        assert_eq!(during[2], through as u64, "the handlers' 200s");
        // Whole: once every hold and lease settled, the server's reading
        // of the key (holds and leases counted as spent) is a full bucket.
        let deadline = Instant::now() + HANG;
        loop {
            let left = limiter.peek("victim").await.unwrap().remaining();
            if left == HANDLER_CAPACITY {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the victim's bucket never came back whole: {left} of {HANDLER_CAPACITY}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // 20 in a row through one replica: tokens one replica's lease pool
        // holds are not the other's (the pools, up to 5 each plus a
        // renewal in flight, could strand more than the 10 left beside 20
        // requests alternating replicas).
        for i in 0..20 {
            let r = clients[0].get("/", valid).await;
            assert_eq!(
                r.status(),
                StatusCode::OK,
                "the victim's request {i} after the flood"
            );
        }
        let t1 = limiter
            .peek("victim")
            .await
            .unwrap()
            .server_now_ns()
            .unwrap();
        let after = handler_stats(&replicas).await;
        const T: u64 = 200_000_000; // 5/s
        let bound = HANDLER_CAPACITY + (t1 - t0) / T;
        assert!(
            after[2] <= bound,
            "{} kept admissions over {} ms: the bound is {bound}",
            after[2],
            (t1 - t0) / 1_000_000
        );
        (through, after)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_handler_checking_credentials_with_leases_keeps_the_victim_whole() {
        let (through, stats) = handler_checks(true, "leased:").await;
        assert!(stats[1] > 0, "no decision of a lease: {stats:?}");
        assert_eq!(through, 20, "the victim during the flood");
    }

    /// The same without leases: every hold of the flood costs a round-trip
    /// pair, and the victim passes whenever the flood's holds in flight
    /// leave a token (reported, not asserted: it depends on the machine's
    /// load).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_handler_checking_credentials_without_leases_keeps_the_victim_whole_after() {
        let (_, stats) = handler_checks(false, "unleased:").await;
        assert_eq!(stats[1], 0, "a decision of a lease without leases");
    }

    /// The layer exports a shared limit's lease counts (`pace_lease_*`,
    /// labelled with the limit's name) as its limiter's `stats()` has them
    /// at the limit's last admission; a limit without leases has none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_lease_counters_reach_the_metrics_recorder() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let server = Server::start();
        let limiter = connect_leased(
            &server.url(),
            "metrics:",
            100,
            Some(LeaseConfig {
                // No renewal falls due, and no quiet release, in the test.
                lease: Duration::from_secs(60),
                want: Some(10),
                hot_after: 2,
                ..LeaseConfig::default()
            }),
        )
        .await;
        let local: Arc<Pace<String>> = Arc::new(
            Pace::builder(Rate::per_second(5).unwrap())
                .capacity(10_000)
                .build()
                .unwrap(),
        );
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let layer = metrics::with_local_recorder(&recorder, || {
            PaceLayer::builder()
                .limit(Limit::new("local", local, client_id()))
                .limit(Limit::new("client", limiter.clone(), client_id()).refund_if(is_401))
                .build()
                .unwrap()
        });
        let addr = serve(app(layer)).await;
        let mut c = Client::connect(addr).await;
        // Holds of the server until the key is hot and its lease decides
        // one (a bound only a hang exceeds).
        let mut sent = 0;
        while limiter.stats().leased_decisions == 0 {
            assert!(sent < 10_000, "no leased decision: {:?}", limiter.stats());
            let r = c.get("/", &[("x-client-id", "hot")]).await;
            assert_eq!(r.status(), StatusCode::OK);
            sent += 1;
        }
        // Refunded requests, each admission setting the counters, until
        // they show the limiter's counts: a grant may land after an
        // admission (a renewal a server decision started), never after the
        // last one here (a bound only a hang exceeds).
        type Snap = [(
            metrics_util::CompositeKey,
            Option<metrics::Unit>,
            Option<metrics::SharedString>,
            DebugValue,
        )];
        fn counter(snap: &Snap, name: &str, limit: &str) -> Option<u64> {
            snap.iter()
                .find(|(k, _, _, _)| {
                    k.key().name() == name
                        && k.key()
                            .labels()
                            .any(|l| l.key() == "limit" && l.value() == limit)
                })
                .map(|(_, _, _, v)| match v {
                    DebugValue::Counter(n) => *n,
                    other => panic!("{name}: {other:?}"),
                })
        }
        let names = [
            "pace_lease_decisions_total",
            "pace_lease_granted_tokens_total",
            "pace_lease_released_tokens_total",
            "pace_lease_expiries_total",
            "pace_lease_stranded_tokens_total",
        ];
        let mut refunded = 0;
        let (s, snap) = loop {
            assert!(refunded < 10_000, "the counters never showed the stats");
            let r = c
                .get("/", &[("x-client-id", "hot"), ("x-valid", "no")])
                .await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            refunded += 1;
            let s = limiter.stats();
            let snap = snapshotter.snapshot().into_vec();
            let counts = [
                s.leased_decisions,
                s.lease_grants,
                s.lease_releases,
                s.lease_expiries,
                s.lease_stranded,
            ];
            if names
                .iter()
                .zip(counts)
                .all(|(n, v)| counter(&snap, n, "client") == Some(v))
            {
                break (s, snap);
            }
        };
        let counter = |name: &str, limit: &str| counter(&snap, name, limit);
        // The leased decisions: the first one and the refunded requests'.
        assert!(s.leased_decisions > refunded, "{s:?}");
        // Grants of the 10 tokens asked for in each call (the bucket has
        // 100, and a replica alone may hold half of them: one call, or one
        // more when a server decision follows the first grant); none
        // released, expired or stranded.
        assert!(
            s.lease_grants > 0 && s.lease_grants % 10 == 0 && s.lease_grants <= 50,
            "{s:?}"
        );
        for name in [
            "pace_lease_released_tokens_total",
            "pace_lease_expiries_total",
            "pace_lease_stranded_tokens_total",
        ] {
            assert_eq!(counter(name, "client"), Some(0), "{name}");
        }
        assert_eq!(counter("pace_lease_decisions_total", "local"), None);
        assert_eq!(
            counter("pace_admitted_total", "client"),
            Some(sent + refunded)
        );
        assert_eq!(counter("pace_refunded_total", "client"), Some(refunded));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_shared_and_a_local_limit_all_or_nothing_under_a_flood() {
        let server = Server::start();
        let (procs, limiter) = replicas("allor", &server, "allor:").await;
        let replicas: Vec<SocketAddr> = procs.iter().map(|r| r.addr).collect();
        for &addr in &replicas {
            // Spend the key the flood presents, on this replica (per API
            // key: one token an hour, in each replica's own process).
            let r = Client::connect(addr)
                .await
                .get("/", &[("x-client-id", "other"), ("x-api-key", "spent")])
                .await;
            assert_eq!(r.status(), StatusCode::OK);
        }
        let denied: &'static [(&str, &str)] = &[("x-client-id", "victim"), ("x-api-key", "spent")];
        let answered = Arc::new(AtomicU64::new(0));
        let attack = tokio::spawn({
            let (replicas, answered) = (replicas.clone(), answered.clone());
            async move { flood(&replicas, denied, answered).await }
        });
        // The victim presents its own key: a new one for each request.
        let (got, admitted) = victim(
            &replicas,
            |i| {
                vec![
                    ("x-client-id", "victim".to_string()),
                    ("x-api-key", format!("k{i}")),
                ]
            },
            &answered,
        )
        .await;
        let seen = tokio::time::timeout(HANG, attack)
            .await
            .expect("the flood hung")
            .unwrap();
        eprintln!(
            "denied by the local limit on two replicas: {seen:?}; the victim got {} of 6: \
             {got:?}",
            admitted.len()
        );
        // Every request of the flood was denied (by the local limit).
        assert_eq!(seen.too_many, FLOOD, "{seen:?}");
        assert_eq!(seen.ok + seen.unauthorized + seen.other, 0, "{seen:?}");
        whole(&replicas, &limiter, &server, &admitted, true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_waiting_shared_limit_serves_every_request_at_its_slot() {
        let server = Server::start();
        let (procs, limiter) = replicas("turns", &server, "turns:").await;
        let replicas: Vec<SocketAddr> = procs.iter().map(|r| r.addr).collect();
        // The server's clock when each request reached the handler.
        let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
        let mut clients = Vec::new();
        for i in 0..15 {
            clients.push(Client::connect(replicas[i % 2]).await);
        }
        // The server's clock before any request: no decision comes earlier.
        let t0 = limiter
            .peek("fresh")
            .await
            .unwrap()
            .server_now_ns()
            .unwrap();
        let mut tasks = Vec::new();
        for mut c in clients {
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                let r = c.get("/", &[("x-client-id", "fresh")]).await;
                if let Some(now) = header(&r, "x-server-now") {
                    seen.lock().unwrap().push(now.parse().unwrap());
                }
                r.status()
            }));
        }
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.unwrap());
        }
        let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        assert_eq!(ok, 15, "every queued request is served: {statuses:?}");
        // The k-th decision (k = 1..15, in the server's order) finds the
        // tat left by the k - 1 before it, at least t0 + (k - 1) x 200 ms
        // (the first is at t0 or later on a full bucket, and each debit adds
        // an interval), so its slot (that tat + 200 ms - 2 s, the capacity's
        // 10 intervals) is at least t0 + (k - 10) x 200 ms, however late
        // the requests came. The k-th earliest handler time lies at or after
        // the k-th earliest slot, so at or after that bound.
        let mut at = seen.lock().unwrap().clone();
        at.sort_unstable();
        assert_eq!(at.len(), 15, "every handler read the server's clock");
        for k in 11..=15u64 {
            let slot = t0 + (k - 10) * 200_000_000;
            let got = at[k as usize - 1];
            assert!(
                got >= slot,
                "request {k} reached the handler {} ns before its slot",
                slot - got
            );
        }
        eprintln!(
            "15 queued requests: handler times after the server's clock before them (ms): {:?}",
            at.iter()
                .map(|t| (t.saturating_sub(t0)) / 1_000_000)
                .collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn a_quota_per_request_decides_a_shared_limit() {
        let server = Server::start();
        let limiter = shared(&server, "quota:").await;
        let small = Quota::new(Rate::per_second(1).unwrap(), 2).unwrap();
        let layer = PaceLayer::builder()
            .limit(
                Limit::new("client", limiter.clone(), client_id())
                    .quota(move |h| h.headers.contains_key("x-free").then_some(small)),
            )
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        let mut c = Client::connect(addr).await;
        let free = [("x-client-id", "f"), ("x-free", "1")];
        for r in [1, 0] {
            let resp = c.get("/", &free).await;
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(
                header(&resp, "ratelimit-policy"),
                Some("\"client\";q=2;w=2")
            );
            let item = format!("\"client\";r={r};");
            assert!(
                header(&resp, "ratelimit").unwrap().starts_with(&item),
                "{:?}",
                header(&resp, "ratelimit")
            );
        }
        let resp = c.get("/", &free).await;
        assert_eq!(
            resp.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "the request's quota was ignored"
        );
        // The limit's own quota (capacity 10) for a request without one.
        let resp = c.get("/", &[("x-client-id", "g")]).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            header(&resp, "ratelimit-policy"),
            Some("\"client\";q=10;w=2")
        );
    }
}
