//! Decisions per second and latency percentiles of `pace-redis` beside a
//! plain GCRA script of the redis_rate kind (floating-point, no refunds, no
//! cache), against one local redis-server that this harness starts on a free
//! loopback port; then round trips per decision under a flood of denials.
//!
//! `cargo bench -p pace-redis --bench redis` (needs `redis-server` on PATH).
//! `PACE_REDIS_BENCH_SECS` sets the seconds per measurement (default 2),
//! `PACE_REDIS_BENCH_ROUNDS` the rounds per task count (default 3; the
//! contender that goes first rotates). Per cell: decisions per second,
//! latency percentiles, the server's own time per EVALSHA ("srv us"), the
//! clients' CPU time per decision (this process, user + system from
//! `/proc/self/stat`, "cli us"), and network bytes in and out per EVALSHA;
//! per round, pace-redis's decisions per second over the
//! plain script's, and those of pace-redis's script called directly ("raw",
//! no limiter around it) over the plain script's.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pace::Rate;
use pace_redis::{Error, RedisPace};
use redis::aio::ConnectionManager;
use redis::Script;

/// GCRA as redis_rate-style scripts do it: float seconds from TIME, the
/// emission interval and burst offset as floats, `tat` stored as a float
/// with a TTL. Returns 1 when admitted, 0 when denied.
const PLAIN_GCRA: &str = r"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local emission = 1 / rate
local offset = emission * burst
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + emission
if new_tat - now > offset then
  return 0
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) * 1000))
return 1
";

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> (Server, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("the bench needs `redis-server` on PATH (apt-get install -y redis-server)");
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    (server, format!("redis://127.0.0.1:{port}/"))
}

/// The server's own CPU time per EVALSHA, and its network bytes in and out
/// per EVALSHA, since the last `CONFIG RESETSTAT`.
fn server_per_call(admin: &mut redis::Connection) -> (String, f64, f64) {
    let info: String = redis::cmd("INFO").arg("all").query(admin).unwrap();
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
    let field = |name: &str| -> Option<f64> {
        line?
            .split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    let usec = field("usec_per_call=").map_or("-".to_string(), |u| format!("{u:.2}"));
    let calls = field("calls=").unwrap_or(0.0).max(1.0);
    let stat = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (
        usec,
        stat("total_net_input_bytes:") / calls,
        stat("total_net_output_bytes:") / calls,
    )
}

/// CPU time this process (the clients, not the server) has used, in µs,
/// from `/proc/self/stat` (user + system, in clock ticks of 10 ms).
fn client_cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 * 10_000.0
}

#[derive(Clone)]
enum Contender {
    Pace(RedisPace),
    /// pace-redis's script called directly (no limiter around it): the gap
    /// between it and `Pace` is the client's cost, between it and `Plain`
    /// the script's and its reply's.
    Raw(ConnectionManager, Arc<Script>),
    Plain(ConnectionManager, Arc<Script>),
}

impl Contender {
    async fn decide(&mut self, key: &str) -> bool {
        match self {
            Contender::Pace(p) => match p.reserve(key).await {
                Ok(_) => true,
                Err(Error::Denied(_)) => false,
                Err(e) => panic!("{e}"),
            },
            Contender::Raw(conn, script) => {
                let reply: redis::Value = script
                    .key(format!("raw:{key}"))
                    .invoke_async(conn)
                    .await
                    .unwrap();
                matches!(reply, redis::Value::BulkString(ref b) if !b.starts_with(b"0 "))
            }
            Contender::Plain(conn, script) => {
                let admitted: i64 = script
                    .key(format!("plain:{key}"))
                    .arg(1_000)
                    .arg(1_000)
                    .invoke_async(conn)
                    .await
                    .unwrap();
                admitted == 1
            }
        }
    }
}

/// `tasks` tasks deciding for `secs` seconds on keys drawn from `keys`.
async fn run(c: &Contender, tasks: usize, secs: f64, keys: u64) -> (u64, f64, Histogram<u64>) {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut c = c.clone();
        handles.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).unwrap();
            let mut admitted = 0u64;
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
            while Instant::now() < end {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = format!("k{}", x % keys);
                let s = Instant::now();
                admitted += u64::from(c.decide(&key).await);
                h.record(s.elapsed().as_micros().max(1) as u64).unwrap();
            }
            (h, admitted)
        }));
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).unwrap();
    let mut admitted = 0;
    for h in handles {
        let (h, a) = h.await.unwrap();
        all.add(h).unwrap();
        admitted += a;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    (admitted, all.len() as f64 / elapsed, all)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test --benches` runs bench targets without `--bench`
    }
    let secs: f64 = std::env::var("PACE_REDIS_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let (_server, url) = start_server();
    let pace = RedisPace::builder(Rate::per_second(1_000).unwrap())
        .capacity(1_000)
        .timeout(Duration::from_secs(5))
        .connect(&url)
        .await
        .unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let conn = ConnectionManager::new(client).await.unwrap();
    let plain = Contender::Plain(conn, Arc::new(Script::new(PLAIN_GCRA)));
    let ours = Contender::Pace(pace.clone());
    // The script as pace-redis loads it for this rate and capacity.
    let raw_script = format!(
        "local INTERVAL, CAP = {}, {}\n{}",
        pace.interval_ns(),
        pace.capacity(),
        include_str!("../src/pace.lua")
    );
    let raw = Contender::Raw(
        ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
            .await
            .unwrap(),
        Arc::new(Script::new(&raw_script)),
    );

    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let rounds: usize = std::env::var("PACE_REDIS_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    println!(
        "== decisions on 10,000 keys (mostly admitted), {secs} s each, {rounds} rounds \
         rotating which contender goes first"
    );
    println!(
        "{:<10} {:>5} {:>5} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "script",
        "tasks",
        "round",
        "decisions/s",
        "p50 us",
        "p99 us",
        "p999 us",
        "srv us",
        "cli us",
        "B in",
        "B out"
    );
    for tasks in [1, 8, 64] {
        for round in 0..rounds {
            // Who goes first rotates from round to round.
            let mut order = [("pace-redis", &ours), ("plain", &plain), ("raw", &raw)];
            order.rotate_left(round % 3);
            let mut rates = [0.0f64; 3];
            for (name, c) in order {
                let _: () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query(&mut admin)
                    .unwrap();
                let cpu0 = client_cpu_us();
                let (_, rate, h) = run(c, tasks, secs, 10_000).await;
                let cli = (client_cpu_us() - cpu0) / h.len().max(1) as f64;
                let (usec, bytes_in, bytes_out) = server_per_call(&mut admin);
                rates[match name {
                    "pace-redis" => 0,
                    "plain" => 1,
                    _ => 2,
                }] = rate;
                println!(
                    "{:<10} {:>5} {:>5} {:>12.0} {:>9} {:>9} {:>9} {:>9} {:>9.2} {:>9.1} {:>9.1}",
                    name,
                    tasks,
                    round + 1,
                    rate,
                    h.value_at_quantile(0.5),
                    h.value_at_quantile(0.99),
                    h.value_at_quantile(0.999),
                    usec,
                    cli,
                    bytes_in,
                    bytes_out
                );
            }
            println!(
                "{:<10} {:>5} {:>5} {:>12.2}x   (raw script / plain {:.2}x)",
                "ratio",
                tasks,
                round + 1,
                rates[0] / rates[1],
                rates[2] / rates[1]
            );
        }
    }

    println!("== a flood of denials: 64 tasks on one key at 10/s, capacity 1, {secs} s each");
    println!(
        "{:<18} {:>10} {:>9} {:>12} {:>13}",
        "limiter", "decisions", "admitted", "round trips", "trips/decision"
    );
    for cache in [true, false] {
        let p = RedisPace::builder(Rate::per_second(10).unwrap())
            .capacity(1)
            .deny_cache(cache)
            .prefix(format!("flood{cache}:"))
            .connect(&url)
            .await
            .unwrap();
        let (admitted, rate, h) = run(&Contender::Pace(p.clone()), 64, secs, 1).await;
        let s = p.stats();
        let decisions = h.len();
        println!(
            "{:<18} {:>10} {:>9} {:>12} {:>13.4}   ({rate:.0} decisions/s)",
            if cache {
                "pace-redis, cache"
            } else {
                "pace-redis, none"
            },
            decisions,
            admitted,
            s.round_trips,
            s.round_trips as f64 / decisions as f64
        );
    }
}
