//! The whole stack soaked under faults (README.md): a Sentinel deployment
//! (a primary, a replica, three sentinels), two pace-tower replicas (this
//! binary run again as `app`) on a shared `RedisPace` per-client limit with
//! refunds on 401 and a local per-source limit, many clients, floods of
//! invalid presentations naming a victim, and a fault every 20–40 s. Each
//! replica logs every admission of the shared limit with the Redis server's
//! clock of its decision (the primary and the replica run on this machine:
//! one clock) and every refund; afterwards the kept admissions of each key
//! are checked over every window with `pace_models::bound::worst_excess_ns`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use pace::{Pace, Quota, Rate};
use pace_redis::{RedisPace, Refunded};
use pace_tower::limit::RedisDebit;
use pace_tower::{from_fn, AsyncLimit, Limit, PaceLayer, Refusal, ResponseHead};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The shared per-client limit: 2 a second, capacity 10.
const RATE_PER_S: u64 = 2;
const CAPACITY: u64 = 10;
const INTERVAL_NS: u64 = 1_000_000_000 / RATE_PER_S;
/// The local per-source limit in each replica: 20 a second, capacity 40.
const SOURCE_RATE: u64 = 20;
const SOURCE_CAPACITY: u64 = 40;
const CLIENTS: usize = 40;
const SOURCES: usize = 4;
const SERVICE: &str = "pace";
/// A bound only a hang exceeds (a request, a start, a failover).
const HANG: Duration = Duration::from_secs(60);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("app") {
        return app_main(&args[1..]);
    }
    let mut run = Duration::from_secs(600);
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut every = (20u64, 40u64);
    let mut wait = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().expect("a value").clone();
        match a.as_str() {
            "--minutes" => run = Duration::from_secs(val().parse::<u64>().unwrap() * 60),
            "--seconds" => run = Duration::from_secs(val().parse().unwrap()),
            "--seed" => seed = val().parse().unwrap(),
            "--unreplicated" => wait = false,
            "--fault-every" => {
                let v = val();
                let (a, b) = v.split_once('-').expect("--fault-every MIN-MAX (seconds)");
                every = (a.parse().unwrap(), b.parse().unwrap());
            }
            "-h" | "--help" => {
                println!(
                    "pace-soak [--minutes N | --seconds N] [--seed N] [--fault-every MIN-MAX] \
                     [--unreplicated]"
                );
                return;
            }
            other => panic!("unknown argument {other} (--help)"),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ok = rt.block_on(soak(run, seed, every, wait));
    std::process::exit(if ok { 0 } else { 1 });
}

// ---------------------------------------------------------------- helpers

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A tiny xorshift: the fault schedule from `--seed`.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn admin(port: u16) -> redis::RedisResult<redis::Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let conn = c.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(conn)
}

fn ping(port: u16) -> bool {
    admin(port)
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {HANG:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------- redis

/// A redis-server (or sentinel) child with its own directory.
struct Redis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    sentinel: bool,
}

impl Redis {
    fn server(root: &Path, name: &str, replica_of: Option<u16>) -> Redis {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = Redis {
            port: free_port(),
            dir,
            child: None,
            sentinel: false,
        };
        r.spawn(replica_of);
        r
    }

    fn sentinel(root: &Path, name: &str, primary: u16) -> Redis {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        std::fs::write(
            dir.join("sentinel.conf"),
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1500\n\
                 sentinel failover-timeout {SERVICE} 10000\n",
                dir.display()
            ),
        )
        .unwrap();
        let mut r = Redis {
            port,
            dir,
            child: None,
            sentinel: true,
        };
        r.spawn(None);
        r
    }

    fn spawn(&mut self, replica_of: Option<u16>) {
        let mut cmd = Command::new("redis-server");
        if self.sentinel {
            cmd.arg(self.dir.join("sentinel.conf")).arg("--sentinel");
        } else {
            cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--dir"])
                .arg(&self.dir);
            if let Some(p) = replica_of {
                cmd.args(["--replicaof", "127.0.0.1", &p.to_string()]);
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install -y redis-server)");
        self.child = Some(child);
        let port = self.port;
        wait_for("redis-server answers PING", || ping(port));
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The primary the sentinels name (the first that answers).
fn primary_port(sentinels: &[u16]) -> Option<u16> {
    for &s in sentinels {
        if let Ok(mut c) = admin(s) {
            let r: redis::RedisResult<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(SERVICE)
                .query(&mut c);
            if let Ok((_, p)) = r {
                return Some(p);
            }
        }
    }
    None
}

fn role(port: u16) -> Option<String> {
    let mut c = admin(port).ok()?;
    let v: Vec<redis::Value> = redis::cmd("ROLE").query(&mut c).ok()?;
    match v.first()? {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Whether a replica of `primary` is known to every sentinel and its link
/// is up (a failover needs one).
fn replica_ready(sentinels: &[u16], primary: u16) -> bool {
    sentinels.iter().all(|&s| {
        let Ok(mut c) = admin(s) else { return false };
        let r: redis::RedisResult<Vec<HashMap<String, String>>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(SERVICE)
            .query(&mut c);
        r.is_ok_and(|rs| {
            rs.iter().any(|r| {
                r.get("flags").map(String::as_str) == Some("slave")
                    && r.get("master-link-status").map(String::as_str) == Some("ok")
                    && r.get("master-port").map(String::as_str) == Some(&primary.to_string())
            })
        })
    })
}

// ---------------------------------------------------------------- the app

/// The shared limit, recording: every admission (`A id key server_now_ns
/// tokens`) and every refund that returned tokens (`R id`), one `write` per
/// line (a `kill -9` loses no line written).
struct Recorded {
    inner: RedisPace,
    log: Mutex<File>,
    tag: u32,
    next: AtomicU64,
}

impl Recorded {
    fn line(&self, s: String) {
        let _ = self.log.lock().unwrap().write_all(s.as_bytes());
    }
}

type Reserve =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(u64, RedisDebit), Refusal>> + Send>>;

impl Recorded {
    fn wrap(
        self: &Arc<Self>,
        key: &str,
        fut: <RedisPace as AsyncLimit<String>>::Reserve,
    ) -> Reserve {
        let this = self.clone();
        let key = key.to_string();
        Box::pin(async move {
            let d = fut.await?;
            let id = this.next.fetch_add(1, Ordering::Relaxed);
            let (now, n) = match &d {
                RedisDebit::Reserved(r) => (r.server_now_ns(), r.tokens()),
                RedisDebit::Held(h) => (h.server_now_ns(), h.tokens()),
            };
            let now = now.map_or("?".to_string(), |n| n.to_string());
            this.line(format!("A {}-{id} {key} {now} {n}\n", this.tag));
            Ok((id, d))
        })
    }
}

/// `AsyncLimit` by the `RedisPace` inside, with the records.
struct Shared(Arc<Recorded>);

impl AsyncLimit<String> for Shared {
    type Debit = (u64, RedisDebit);
    type Reserve = Reserve;

    fn reserve(&self, key: &String, n: u64) -> Reserve {
        self.0
            .wrap(key, AsyncLimit::<String>::reserve(&self.0.inner, key, n))
    }
    fn takes_quota(&self) -> bool {
        true
    }
    fn reserve_with(&self, key: &String, n: u64, quota: Quota) -> Reserve {
        self.0.wrap(
            key,
            AsyncLimit::<String>::reserve_with(&self.0.inner, key, n, quota),
        )
    }
    fn holds(&self) -> bool {
        true
    }
    fn hold(&self, key: &String, n: u64) -> Reserve {
        self.0
            .wrap(key, AsyncLimit::<String>::hold(&self.0.inner, key, n))
    }
    fn hold_with(&self, key: &String, n: u64, quota: Quota) -> Reserve {
        self.0.wrap(
            key,
            AsyncLimit::<String>::hold_with(&self.0.inner, key, n, quota),
        )
    }
    fn keep(&self, key: &String, debit: (u64, RedisDebit)) {
        AsyncLimit::<String>::keep(&self.0.inner, key, debit.1)
    }
    /// The refund, recorded once it returned tokens (an expired hold, or a
    /// refund that failed, stays kept).
    fn refund(&self, _: &String, (id, debit): (u64, RedisDebit)) {
        let this = self.0.clone();
        tokio::spawn(async move {
            let out = match debit {
                RedisDebit::Reserved(r) => this.inner.refund(r).await,
                RedisDebit::Held(h) => h.refund().await,
            };
            match out {
                Ok(Refunded::Expired) | Err(_) => {}
                Ok(_) => this.line(format!("R {}-{id}\n", this.tag)),
            }
        });
    }
    fn remaining(&self, key: &String, debit: Option<&(u64, RedisDebit)>) -> Option<u64> {
        AsyncLimit::<String>::remaining(&self.0.inner, key, debit.map(|d| &d.1))
    }
    fn capacity(&self) -> u64 {
        self.0.inner.capacity()
    }
    fn rate(&self) -> Rate {
        self.0.inner.rate()
    }
}

/// The shared limit's builder; with `wait`, an admission is used once the
/// replica holds it (`wait_replicas(1, ..)`).
fn shared_builder(wait: bool) -> pace_redis::Builder {
    let b = RedisPace::builder(Rate::per_second(RATE_PER_S).unwrap())
        .capacity(CAPACITY)
        .timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(200))
        .prefix("soak:");
    if wait {
        b.wait_replicas(1, WAIT)
    } else {
        b
    }
}

/// How long an admission may wait for the replica's acknowledgement.
const WAIT: Duration = Duration::from_millis(200);

fn is_401(r: &ResponseHead<'_>) -> bool {
    r.status == StatusCode::UNAUTHORIZED
}

async fn handler(req: Request) -> StatusCode {
    if req.headers().get("x-valid").is_some_and(|v| v == "no") {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    }
}

/// `app --port P --sentinels A,B,C --log FILE`: one replica, until killed.
fn app_main(args: &[String]) {
    let arg = |name: &str| {
        let i = args.iter().position(|a| a == name).expect(name);
        args[i + 1].clone()
    };
    let port: u16 = arg("--port").parse().unwrap();
    let wait = arg("--wait") == "1";
    let sentinels: Vec<String> = arg("--sentinels")
        .split(',')
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(arg("--log"))
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let urls: Vec<&str> = sentinels.iter().map(String::as_str).collect();
        let deadline = Instant::now() + HANG;
        let inner = loop {
            match shared_builder(wait).connect_sentinel(&urls, SERVICE).await {
                Ok(p) => break p,
                Err(e) => assert!(Instant::now() < deadline, "connect_sentinel: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let recorded = Arc::new(Recorded {
            inner,
            log: Mutex::new(log),
            tag: std::process::id(),
            next: AtomicU64::new(0),
        });
        let sources: Arc<Pace<String>> = Arc::new(
            Pace::builder(Rate::per_second(SOURCE_RATE).unwrap())
                .capacity(SOURCE_CAPACITY)
                .build()
                .unwrap(),
        );
        let client = from_fn(|h| Some(h.headers.get("x-client-id")?.to_str().ok()?.to_string()));
        let source = from_fn(|h| Some(h.headers.get("x-source")?.to_str().ok()?.to_string()));
        let layer = PaceLayer::builder()
            .limit(Limit::new("client", Arc::new(Shared(recorded)), client).refund_if(is_401))
            .limit(Limit::new("source", sources, source))
            .build()
            .unwrap();
        let app = Router::new().route("/", get(handler)).layer(layer);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        println!("READY");
        axum::serve(listener, app).await.unwrap();
    });
}

// ---------------------------------------------------------------- clients

/// One HTTP/1.1 keep-alive connection, written by hand: a GET with
/// headers, the status and `Retry-After` of the answer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

struct Answer {
    status: u16,
    retry_after: bool,
}

impl Conn {
    async fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(1024),
        })
    }

    async fn get(&mut self, headers: &[(&str, &str)]) -> std::io::Result<Answer> {
        let mut req = String::from("GET / HTTP/1.1\r\nhost: soak\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.stream.write_all(req.as_bytes()).await?;
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
                let status: u16 = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| std::io::Error::other("no status"))?;
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let retry_after = head.lines().any(|l| l.starts_with("retry-after:"));
                while self.buf.len() < end + 4 + len {
                    self.fill().await?;
                }
                self.buf.drain(..end + 4 + len);
                return Ok(Answer {
                    status,
                    retry_after,
                });
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

/// What the clients saw.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    ok: AtomicU64,
    unauthorized: AtomicU64,
    too_many: AtomicU64,
    too_many_without_retry_after: AtomicU64,
    unavailable: AtomicU64,
    unavailable_without_retry_after: AtomicU64,
    other: AtomicU64,
    /// Connection errors on a connection made before its replica was
    /// killed (the fault's), and the others (unexplained).
    conn_errors_killed: AtomicU64,
    conn_errors_other: AtomicU64,
    hung: AtomicU64,
    /// 100 ms slots (since the start) in which a 503 was seen.
    outage_slots: Mutex<HashSet<u64>>,
}

/// A replica as the clients see it: its address, and its incarnation (one
/// more at each kill).
struct Target {
    addr: SocketAddr,
    epoch: AtomicU64,
}

/// One client: its headers, every how many requests one is invalid (0:
/// none added), its pause between requests, the replica it starts on.
struct Client {
    headers: Vec<(String, String)>,
    invalid_every: u64,
    pause: Duration,
    turn: usize,
}

async fn client_loop(
    targets: Arc<Vec<Target>>,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    start: Instant,
    client: Client,
) {
    let Client {
        headers,
        invalid_every,
        pause,
        mut turn,
    } = client;
    let mut conns: Vec<Option<(Conn, u64)>> = targets.iter().map(|_| None).collect();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        turn = (turn + 1) % targets.len();
        i += 1;
        let t = &targets[turn];
        let epoch = t.epoch.load(Ordering::SeqCst);
        let conn = match conns[turn].take() {
            Some(c) => Some(c),
            None => match Conn::open(t.addr).await {
                Ok(c) => Some((c, epoch)),
                Err(_) => None,
            },
        };
        let Some((mut conn, made)) = conn else {
            // A refused connect: explained while the replica is down
            // (its epoch is odd then).
            if t.epoch.load(Ordering::SeqCst) % 2 == 1 {
                seen.conn_errors_killed.fetch_add(1, Ordering::Relaxed);
            } else {
                seen.conn_errors_other.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(pause).await;
            continue;
        };
        let mut hs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if invalid_every > 0 && i.is_multiple_of(invalid_every) {
            hs.push(("x-valid", "no"));
        }
        seen.requests.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(HANG, conn.get(&hs)).await {
            Err(_) => {
                seen.hung.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(_)) => {
                if made < t.epoch.load(Ordering::SeqCst) || t.epoch.load(Ordering::SeqCst) % 2 == 1
                {
                    seen.conn_errors_killed.fetch_add(1, Ordering::Relaxed);
                } else {
                    seen.conn_errors_other.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Ok(a)) => {
                let c = match a.status {
                    200 => &seen.ok,
                    401 => &seen.unauthorized,
                    429 if a.retry_after => &seen.too_many,
                    429 => &seen.too_many_without_retry_after,
                    503 => {
                        seen.outage_slots
                            .lock()
                            .unwrap()
                            .insert(start.elapsed().as_millis() as u64 / 100);
                        if a.retry_after {
                            &seen.unavailable
                        } else {
                            &seen.unavailable_without_retry_after
                        }
                    }
                    _ => &seen.other,
                };
                c.fetch_add(1, Ordering::Relaxed);
                conns[turn] = Some((conn, made));
            }
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

// ---------------------------------------------------------------- replicas

struct App {
    port: u16,
    child: Option<Child>,
    sentinels: String,
    logs: PathBuf,
    incarnation: u32,
    index: usize,
    rss_start: Option<u64>,
    wait: bool,
}

impl App {
    fn spawn(&mut self) {
        self.incarnation += 1;
        let log = self
            .logs
            .join(format!("app{}-{}.log", self.index, self.incarnation));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "app",
                "--port",
                &self.port.to_string(),
                "--sentinels",
                &self.sentinels,
            ])
            .arg("--log")
            .arg(&log)
            .args(["--wait", if self.wait { "1" } else { "0" }])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "READY", "replica {} did not start", self.index);
        self.child = Some(child);
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.kill9();
    }
}

// ---------------------------------------------------------------- faults

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillPrimary,
    StopPrimary,
    GracefulFailover,
    KillApp,
}

impl Fault {
    fn short(self) -> &'static str {
        match self {
            Fault::KillPrimary => "kill -9 primary",
            Fault::StopPrimary => "SIGSTOP primary",
            Fault::GracefulFailover => "SENTINEL FAILOVER",
            Fault::KillApp => "kill -9 replica",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Fault::KillPrimary => "kill -9 the primary (restarted as a replica)",
            Fault::StopPrimary => "SIGSTOP the primary 3 s, SIGCONT",
            Fault::GracefulFailover => "SENTINEL FAILOVER",
            Fault::KillApp => "kill -9 an app replica, restarted",
        }
    }
}

struct Deployment {
    servers: Vec<Redis>,
    sentinels: Vec<Redis>,
}

impl Deployment {
    fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    fn primary(&self) -> usize {
        let p = primary_port(&self.sentinel_ports()).expect("no sentinel answers");
        self.servers
            .iter()
            .position(|s| s.port == p)
            .expect("an unknown primary")
    }

    /// Until the sentinels name a primary other than `old` that says it is
    /// one, and a replica of it is ready again.
    fn await_new_primary(&self, old: u16) {
        let ports = self.sentinel_ports();
        wait_for("a new primary", || {
            primary_port(&ports).is_some_and(|p| p != old && role(p).as_deref() == Some("master"))
        });
    }

    fn await_ready(&self) {
        let ports = self.sentinel_ports();
        wait_for("a primary with a ready replica", || {
            primary_port(&ports)
                .is_some_and(|p| role(p).as_deref() == Some("master") && replica_ready(&ports, p))
        });
    }
}

// ---------------------------------------------------------------- the soak

/// The worst excess over every window of sorted `(now_ns, tokens)` and a
/// window `[t1, t2]` that reaches it: `bound::worst_excess_ns`'s pass with
/// the window kept (the caller checks that the two agree).
fn worst_window(sorted: &[(u64, u64)]) -> (i128, u64, u64) {
    let t = INTERVAL_NS as i128;
    let (mut best, mut best_start, mut before) = (i128::MIN, i128::MIN, 0i128);
    let (mut start_at, mut window) = (0u64, (0u64, 0u64));
    for &(now, n) in sorted {
        if now as i128 - before * t > best_start {
            best_start = now as i128 - before * t;
            start_at = now;
        }
        before += n as i128;
        let e = before * t - now as i128 + best_start;
        if e > best {
            best = e;
            window = (start_at, now);
        }
    }
    (best - CAPACITY as i128 * t, window.0, window.1)
}

async fn soak(run: Duration, seed: u64, every: (u64, u64), wait: bool) -> bool {
    let root = std::env::temp_dir().join(format!("pace-soak-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    println!(
        "pace-soak: {run:?}, seed {seed}, a fault every {}-{} s, {}, files in {}",
        every.0,
        every.1,
        if wait {
            "admissions used once the replica holds them (wait_replicas)"
        } else {
            "admissions used unreplicated (--unreplicated)"
        },
        root.display()
    );
    let dep = {
        let root = root.clone();
        tokio::task::spawn_blocking(move || {
            let primary = Redis::server(&root, "redis-a", None);
            let replica = Redis::server(&root, "redis-b", Some(primary.port));
            let sentinels: Vec<Redis> = (0..3)
                .map(|i| Redis::sentinel(&root, &format!("sentinel-{i}"), primary.port))
                .collect();
            let dep = Deployment {
                servers: vec![primary, replica],
                sentinels,
            };
            dep.await_ready();
            dep
        })
        .await
        .unwrap()
    };
    let dep = Arc::new(Mutex::new(dep));
    let sentinel_list = dep
        .lock()
        .unwrap()
        .sentinel_ports()
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let apps: Vec<App> = (0..2)
        .map(|index| {
            let mut a = App {
                port: free_port(),
                child: None,
                sentinels: sentinel_list.clone(),
                logs: root.clone(),
                incarnation: 0,
                index,
                rss_start: None,
                wait,
            };
            a.spawn();
            a
        })
        .collect();
    let targets: Arc<Vec<Target>> = Arc::new(
        apps.iter()
            .map(|a| Target {
                addr: SocketAddr::from(([127, 0, 0, 1], a.port)),
                epoch: AtomicU64::new(0),
            })
            .collect(),
    );
    let apps = Arc::new(Mutex::new(apps));
    // An observer of the shared limit (the victim's budget).
    let urls: Vec<String> = sentinel_list
        .split(',')
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let observer = shared_builder(false)
        .connect_sentinel(
            &urls.iter().map(String::as_str).collect::<Vec<_>>(),
            SERVICE,
        )
        .await
        .unwrap();

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let start_ns = now_ns();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let headers = vec![
            ("x-client-id".to_string(), format!("c{c}")),
            ("x-source".to_string(), format!("s{}", c % SOURCES)),
        ];
        // 5 requests a second each (the limit is 2), one in ten invalid.
        tasks.push(tokio::spawn(client_loop(
            targets.clone(),
            seen.clone(),
            stop.clone(),
            start,
            Client {
                headers,
                invalid_every: 10,
                pause: Duration::from_millis(200),
                turn: c,
            },
        )));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for a in apps.lock().unwrap().iter_mut() {
        a.rss_start = rss_kib(a.pid());
    }

    // Floods: every 15 s from 10 s, 3 s of 16 connections of invalid
    // presentations naming the victim; its budget 1 s after each.
    let floods = {
        let (targets, seen, stop) = (targets.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            let mut budgets = Vec::new();
            let mut at = Duration::from_secs(10);
            while start.elapsed() + Duration::from_secs(5) < run {
                tokio::time::sleep_until((start + at).into()).await;
                let flood_stop = Arc::new(AtomicBool::new(false));
                let mut fl = Vec::new();
                for i in 0..16 {
                    let headers = vec![
                        ("x-client-id".to_string(), "victim".to_string()),
                        ("x-source".to_string(), "flood".to_string()),
                        ("x-valid".to_string(), "no".to_string()),
                    ];
                    fl.push(tokio::spawn(client_loop(
                        targets.clone(),
                        seen.clone(),
                        flood_stop.clone(),
                        start,
                        Client {
                            headers,
                            invalid_every: 0,
                            pause: Duration::ZERO,
                            turn: i,
                        },
                    )));
                }
                tokio::time::sleep(Duration::from_secs(3)).await;
                flood_stop.store(true, Ordering::Relaxed);
                for f in fl {
                    let _ = f.await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                // Read again while a fault keeps the server away (within
                // `HANG`, a bound only a hang exceeds).
                let deadline = Instant::now() + HANG;
                let left = loop {
                    match observer.peek("victim").await {
                        Ok(p) => break p.remaining().to_string(),
                        Err(e) if Instant::now() >= deadline => break format!("({e})"),
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                };
                budgets.push((at.as_secs(), left));
                at += Duration::from_secs(15);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            budgets
        })
    };

    // Faults.
    let faults = {
        let (dep, apps, targets) = (dep.clone(), apps.clone(), targets.clone());
        tokio::task::spawn_blocking(move || {
            let mut rng = Rng(seed | 1);
            let mut done: Vec<(Fault, u64, u64)> = Vec::new();
            let mut next = start + Duration::from_secs(rng.range(every.0, every.1));
            while next + Duration::from_secs(5) < start + run {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                let kind = match rng.range(0, 3) {
                    0 => Fault::KillPrimary,
                    1 => Fault::StopPrimary,
                    2 => Fault::GracefulFailover,
                    _ => Fault::KillApp,
                };
                let from = now_ns();
                let dep = &mut *dep.lock().unwrap();
                match kind {
                    Fault::KillPrimary => {
                        let i = dep.primary();
                        let old = dep.servers[i].port;
                        dep.servers[i].kill9();
                        dep.await_new_primary(old);
                        let new = primary_port(&dep.sentinel_ports()).unwrap();
                        dep.servers[i].spawn(Some(new));
                    }
                    Fault::StopPrimary => {
                        let i = dep.primary();
                        let pid = dep.servers[i].pid();
                        signal(pid, "STOP");
                        std::thread::sleep(Duration::from_secs(3));
                        signal(pid, "CONT");
                    }
                    Fault::GracefulFailover => {
                        let old = dep.servers[dep.primary()].port;
                        let ports = dep.sentinel_ports();
                        wait_for("SENTINEL FAILOVER accepted", || {
                            ports.iter().any(|&s| {
                                admin(s).is_ok_and(|mut c| {
                                    redis::cmd("SENTINEL")
                                        .arg("FAILOVER")
                                        .arg(SERVICE)
                                        .query::<()>(&mut c)
                                        .is_ok()
                                })
                            })
                        });
                        dep.await_new_primary(old);
                    }
                    Fault::KillApp => {
                        let i = rng.range(0, 1) as usize;
                        let apps = &mut *apps.lock().unwrap();
                        targets[i].epoch.fetch_add(1, Ordering::SeqCst); // odd: down
                        apps[i].kill9();
                        std::thread::sleep(Duration::from_millis(500));
                        apps[i].spawn();
                        targets[i].epoch.fetch_add(1, Ordering::SeqCst); // even: up
                    }
                }
                if kind != Fault::KillApp {
                    dep.await_ready();
                }
                let to = now_ns();
                println!(
                    "fault at {:.1} s: {} ({:.1} s until the deployment was whole)",
                    (from - start_ns) as f64 / 1e9,
                    kind.name(),
                    (to - from) as f64 / 1e9
                );
                done.push((kind, from, to));
                next = Instant::now() + Duration::from_secs(rng.range(every.0, every.1));
            }
            done
        })
    };

    tokio::time::sleep_until((start + run).into()).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let budgets = floods.await.unwrap();
    let faults = faults.await.unwrap();
    // The refunds in flight land (or fail) within their timeout.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss: Vec<(usize, Option<u64>, Option<u64>, u32)> = apps
        .lock()
        .unwrap()
        .iter()
        .map(|a| (a.index, a.rss_start, rss_kib(a.pid()), a.incarnation))
        .collect();
    for a in apps.lock().unwrap().iter_mut() {
        a.kill9();
    }
    let elapsed = start.elapsed();

    // ------------------------------------------------------------ check
    let mut admitted: HashMap<String, (String, u64, u64)> = HashMap::new();
    let mut refunded: HashSet<String> = HashSet::new();
    let mut unknown_clock = 0u64;
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let f: Vec<&str> = line.split(' ').collect();
                match f.as_slice() {
                    ["A", id, key, now, n] => match now.parse::<u64>() {
                        Ok(now) => {
                            admitted
                                .insert(id.to_string(), (key.to_string(), now, n.parse().unwrap()));
                        }
                        Err(_) => unknown_clock += 1,
                    },
                    ["R", id] => {
                        refunded.insert(id.to_string());
                    }
                    _ => {} // a line cut by a kill -9 (none: one write each)
                }
            }
        }
    }
    let mut kept: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (id, (key, now, n)) in &admitted {
        if !refunded.contains(id) {
            kept.entry(key.clone()).or_default().push((*now, *n));
        }
    }
    // Windows near a fault of the primary (from 1 s before it to 10 s after
    // the deployment was whole again) may hold a lost write's admissions;
    // the others may not.
    let disturbed: Vec<(u64, u64)> = faults
        .iter()
        .filter(|f| f.0 != Fault::KillApp)
        .map(|&(_, from, to)| (from.saturating_sub(1_000_000_000), to + 10_000_000_000))
        .collect();
    let lossy = disturbed.len() as u64;
    let to_tokens = |ns: i128| {
        if ns <= 0 {
            0
        } else {
            (ns as u64).div_ceil(INTERVAL_NS)
        }
    };
    // Where the worst excess lies: its window, and the faults in it.
    let near = |list: &[(u64, u64)], excess: i128| -> String {
        let (e, t1, t2) = worst_window(list);
        assert_eq!(e, excess, "the window search disagrees with pace-models");
        let inside: Vec<String> = faults
            .iter()
            .filter(|f| f.1 <= t2 && f.2 >= t1.saturating_sub(1_000_000_000))
            .map(|f| format!("{} at {:.1} s", f.0.short(), (f.1 - start_ns) as f64 / 1e9))
            .collect();
        format!(
            "its window {:.1}..{:.1} s holds {}",
            (t1 - start_ns) as f64 / 1e9,
            (t2 - start_ns) as f64 / 1e9,
            if inside.is_empty() {
                "no fault".to_string()
            } else {
                inside.join(", ")
            }
        )
    };
    let (mut worst, mut worst_key, mut quiet_worst, mut quiet_key) =
        (i128::MIN, String::new(), i128::MIN, String::new());
    for (key, list) in &mut kept {
        let e = pace_models::bound::worst_excess_ns(list, CAPACITY, INTERVAL_NS);
        if e > worst {
            (worst, worst_key) = (e, key.clone());
        }
        // The quiet runs: the admissions between two disturbed spans (each
        // span ends a run, whether or not the key has admissions in it).
        let mut runs: Vec<Vec<(u64, u64)>> = vec![Vec::new(); disturbed.len() + 1];
        for &(t, n) in list.iter() {
            if !disturbed.iter().any(|&(a, b)| a <= t && t <= b) {
                runs[disturbed.iter().filter(|&&(_, b)| b < t).count()].push((t, n));
            }
        }
        for mut r in runs {
            let e = pace_models::bound::worst_excess_ns(&mut r, CAPACITY, INTERVAL_NS);
            if e > quiet_worst {
                (quiet_worst, quiet_key) = (e, key.clone());
            }
        }
    }
    let worst_tokens = to_tokens(worst);
    let worst_near = if worst > 0 {
        near(&kept[&worst_key], worst)
    } else {
        "none".to_string()
    };
    let quiet_tokens = to_tokens(quiet_worst);
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let outage_s = seen.outage_slots.lock().unwrap().len() as f64 / 10.0;
    let mut by_kind: BTreeMap<Fault, usize> = BTreeMap::new();
    for f in &faults {
        *by_kind.entry(f.0).or_default() += 1;
    }

    println!();
    println!("| what | value |");
    println!("|---|---|");
    println!("| run | {:.0} s, seed {seed}, {CLIENTS} clients at 5/s (1 in 10 invalid), a victim flood (16 connections, 3 s) every 15 s |", elapsed.as_secs_f64());
    println!("| shared limit | per client {RATE_PER_S}/s, capacity {CAPACITY} (`RedisPace` over Sentinel, refund on 401); per source {SOURCE_RATE}/s, capacity {SOURCE_CAPACITY} (local) |");
    println!("| requests | {} |", n(&seen.requests));
    for k in [
        Fault::KillPrimary,
        Fault::StopPrimary,
        Fault::GracefulFailover,
        Fault::KillApp,
    ] {
        println!(
            "| faults: {} | {} |",
            k.name(),
            by_kind.get(&k).copied().unwrap_or(0)
        );
    }
    println!("| outage time (100 ms slots with a 503) | {outage_s:.1} s |");
    println!(
        "| 200 / 401 / 429 with Retry-After | {} / {} / {} |",
        n(&seen.ok),
        n(&seen.unauthorized),
        n(&seen.too_many)
    );
    println!("| 503 with Retry-After | {} |", n(&seen.unavailable));
    println!(
        "| connection errors on a killed replica | {} |",
        n(&seen.conn_errors_killed)
    );
    let other = n(&seen.other)
        + n(&seen.too_many_without_retry_after)
        + n(&seen.unavailable_without_retry_after)
        + n(&seen.conn_errors_other)
        + n(&seen.hung);
    println!(
        "| any other answer | {other} (other status {}, 429 without Retry-After {}, 503 without {}, other connection errors {}, hung {}) |",
        n(&seen.other),
        n(&seen.too_many_without_retry_after),
        n(&seen.unavailable_without_retry_after),
        n(&seen.conn_errors_other),
        n(&seen.hung)
    );
    println!(
        "| admissions recorded / refunded / kept | {} / {} / {} ({} keys; {} without the server's clock) |",
        admitted.len(),
        refunded.len(),
        kept.values().map(Vec::len).sum::<usize>(),
        kept.len(),
        unknown_clock
    );
    println!(
        "| worst excess over every window | {worst_tokens} tokens (key {worst_key}, {} ns of refill; {worst_near}) |",
        worst.max(0)
    );
    println!(
        "| worst excess in windows away from a primary fault | {quiet_tokens} tokens (key {quiet_key}) |"
    );
    // A fault from the flood's start to the reading can leave the flood's
    // holds unrefunded (they settle as kept after the hold limit).
    let budgets_s: Vec<String> = budgets
        .iter()
        .map(|(at, b)| {
            let (from, to) = (
                start_ns + at * 1_000_000_000,
                start_ns + (at + 4) * 1_000_000_000,
            );
            let hit: Vec<&str> = faults
                .iter()
                .filter(|f| f.1 <= to && f.2 >= from)
                .map(|f| f.0.short())
                .collect();
            if hit.is_empty() {
                format!("{b}/{CAPACITY} at {at} s")
            } else {
                format!("{b}/{CAPACITY} at {at} s ({})", hit.join(", "))
            }
        })
        .collect();
    println!(
        "| the victim's budget 1 s after each flood | {} |",
        budgets_s.join(", ")
    );
    for (i, start, end, inc) in &rss {
        println!(
            "| RSS of replica {i}: its first process 2 s in / its last at the end | {} / {} KiB ({inc} processes) |",
            start.map_or("?".into(), |v| v.to_string()),
            end.map_or("?".into(), |v| v.to_string())
        );
    }
    println!();
    // The verdict: no excess away from a primary fault; near one, none with
    // `wait_replicas` (an admission is used once the replica holds it: a
    // failover loses none), else at most a capacity per fault (a write the
    // old primary had not replicated: pace-redis README, "Lost keys"); no
    // unexplained answer; a whole victim after each flood but one a fault
    // overlapped.
    let mut ok = true;
    if wait && worst_tokens > 0 {
        println!("FAIL: {worst_tokens} tokens over the bound with wait_replicas (key {worst_key})");
        ok = false;
    }
    if quiet_tokens > 0 {
        println!("FAIL: {quiet_tokens} tokens over the bound away from any primary fault (key {quiet_key})");
        ok = false;
    }
    if worst_tokens > CAPACITY * lossy {
        println!("FAIL: {worst_tokens} tokens over the bound, more than a capacity for each of {lossy} primary faults");
        ok = false;
    }
    if other > 0 || unknown_clock > 0 {
        println!("FAIL: {other} unexplained answers, {unknown_clock} admissions without the server's clock");
        ok = false;
    }
    if admitted.is_empty() {
        println!("FAIL: nothing admitted");
        ok = false;
    }
    println!("{}", if ok { "PASS" } else { "FAIL" });
    drop(dep);
    if ok {
        let _ = std::fs::remove_dir_all(&root);
    }
    ok
}
