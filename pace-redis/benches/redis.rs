//! Decisions per second and latency percentiles of `pace-redis` beside a
//! plain GCRA script of the redis_rate kind (floating-point, no refunds, no
//! cache), against one local redis-server that this harness starts on a free
//! loopback port; then round trips per decision under a flood of denials.
//!
//! `cargo bench -p pace-redis --bench redis` (needs `redis-server` on PATH).
//! `PACE_REDIS_BENCH_SECS` sets the seconds per contender and round
//! (default 2), `PACE_REDIS_BENCH_ROUNDS` the rounds per task count (default
//! 3), `PACE_REDIS_BENCH_SLICES` the slices of a round (default 40): each
//! slice runs every contender for `SECS / SLICES` seconds in turn, the first
//! rotating from slice to slice, so that the contenders share the machine's
//! noise. Per round and contender: decisions per second, latency
//! percentiles, the server's own time per EVALSHA ("srv us"), the clients'
//! CPU time per decision (this process, user + system from
//! `/proc/self/stat`, "cli us"), and network bytes in and out per EVALSHA;
//! per round, pace-redis's decisions per second over the plain script's,
//! and those of pace-redis's script called directly ("raw", no limiter
//! around it) over the plain script's.
//!
//! Then a hot key from several replica processes (`PACE_REDIS_BENCH_PROCS`,
//! default 4, each this binary run again as a child, with 8 tasks on one
//! thread): decisions per second of pace-redis without and with leases
//! (`Builder::leases`), alternating per round, round trips per decision as
//! the library counts them (`Stats::round_trips`), and the median of a
//! leased decision (`Source::Lease`, timed around the call).
//! `PACE_REDIS_BENCH_ONLY=hot` runs only that part.
//!
//! Then fairness (`PACE_REDIS_BENCH_ONLY=fair`): the same processes on one
//! key of a known rate, each asking 2x (then 4x) an equal share of it, open
//! loop, without and with leases: admissions over the ideal (capacity +
//! span / interval, the span on the server's clock) and each process's
//! admissions over an equal share of the ideal.
//!
//! Then cold keys (`PACE_REDIS_BENCH_ONLY=cold`): in this process, 8 tasks
//! each making 4 decisions per key (below a lease's `hot_after`) and going
//! on to a new key, without and with leases in alternating slices: the
//! ratio of decisions per second per round and its median.
//!
//! `PACE_REDIS_BENCH_CLIENT=CONTENDER:CALLS` (`pace`, `pace-leases`, `plain`
//! or `raw`)
//! instead makes CALLS decisions of that contender from one task on one
//! thread and exits: `server_cost.sh client` counts the instructions.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pace::Rate;
use pace_redis::{Error, LeaseConfig, RedisPace, Source};
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

/// EVALSHAs, the server's own CPU time for them (µs), and its network bytes
/// in and out, since the last `CONFIG RESETSTAT`.
fn server_totals(admin: &mut redis::Connection) -> [f64; 4] {
    let info: String = redis::cmd("INFO").arg("all").query(admin).unwrap();
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
    let field = |name: &str| -> f64 {
        line.and_then(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0.0)
    };
    let stat = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    [
        field("calls="),
        field("usec="),
        stat("total_net_input_bytes:"),
        stat("total_net_output_bytes:"),
    ]
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

/// `tasks` tasks deciding for `secs` seconds on keys drawn from `keys`
/// (a sequence per task and `seed`).
async fn run(
    c: &Contender,
    tasks: usize,
    secs: f64,
    keys: u64,
    seed: u64,
) -> (u64, f64, Histogram<u64>) {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut c = c.clone();
        handles.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).unwrap();
            let mut admitted = 0u64;
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64) ^ (seed << 32);
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

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test --benches` runs bench targets without `--bench`
    }
    if let Ok(spec) = std::env::var("PACE_REDIS_BENCH_FAIR") {
        // A replica process of the fairness part: one thread.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(fair_child(&spec));
        return;
    }
    if let Ok(spec) = std::env::var("PACE_REDIS_BENCH_HOT") {
        // A replica process of the hot-key part: one thread.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(hot_child(&spec));
        return;
    }
    // The client-cost mode runs on one thread: a deterministic count of
    // instructions (no idle worker spinning); the bench on two workers.
    let client = std::env::var("PACE_REDIS_BENCH_CLIENT").ok();
    let mut runtime = if client.is_some() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    };
    runtime
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench(client));
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

async fn bench(client_mode: Option<String>) {
    let secs: f64 = env_or("PACE_REDIS_BENCH_SECS", 2.0);
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

    // One task, a fixed number of decisions of one contender, then exit:
    // the client's instructions per decision under callgrind
    // (`server_cost.sh client`).
    if let Some(spec) = client_mode {
        let (name, calls) = spec.split_once(':').expect("CONTENDER:CALLS");
        let calls: u64 = calls.parse().expect("CONTENDER:CALLS");
        let mut c = match name {
            "pace" => ours,
            // The same limiter with leases: on these keys (few decisions
            // each) none is leased; the heat count's cost.
            "pace-leases" => Contender::Pace(
                RedisPace::builder(Rate::per_second(1_000).unwrap())
                    .capacity(1_000)
                    .timeout(Duration::from_secs(5))
                    .prefix("pace-leases:")
                    .leases(LeaseConfig::default())
                    .connect(&url)
                    .await
                    .unwrap(),
            ),
            "plain" => plain,
            "raw" => raw,
            _ => panic!("contender: pace, pace-leases, plain or raw"),
        };
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut admitted = 0u64;
        for _ in 0..calls {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            admitted += u64::from(c.decide(&format!("k{}", x % 10_000)).await);
        }
        println!("{name}: {calls} decisions, {admitted} admitted");
        return;
    }

    let rounds: usize = env_or("PACE_REDIS_BENCH_ROUNDS", 3);
    match std::env::var("PACE_REDIS_BENCH_ONLY").as_deref() {
        Ok("hot") => return hot(&url, secs, rounds),
        Ok("fair") => return fair(&url, secs, rounds),
        Ok("cold") => return cold(&url, secs, rounds).await,
        _ => {}
    }
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let slices: usize = env_or("PACE_REDIS_BENCH_SLICES", 40).max(1);
    let slice = secs / slices as f64;
    println!(
        "== decisions on 10,000 keys (mostly admitted), {secs} s per contender and round, \
         in {slices} slices of {:.0} ms that alternate the contenders (the first rotates)",
        slice * 1e3
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
    let names = ["pace-redis", "plain", "raw"];
    let contenders = [&ours, &plain, &raw];
    let mut slice_no = 0u64;
    for tasks in [1, 8, 64] {
        for round in 0..rounds {
            // Per contender: decisions, seconds, client CPU µs, the server's
            // [calls, µs, bytes in, bytes out], latencies.
            let mut decisions = [0u64; 3];
            let mut seconds = [0.0f64; 3];
            let mut cpu = [0.0f64; 3];
            let mut server = [[0.0f64; 4]; 3];
            let mut hist: Vec<Histogram<u64>> = (0..3)
                .map(|_| Histogram::new_with_bounds(1, 10_000_000, 3).unwrap())
                .collect();
            for _ in 0..slices {
                // Every slice runs each contender once; who goes first
                // rotates from slice to slice.
                let mut order = [0usize, 1, 2];
                order.rotate_left((slice_no % 3) as usize);
                slice_no += 1;
                for i in order {
                    let _: () = redis::cmd("CONFIG")
                        .arg("RESETSTAT")
                        .query(&mut admin)
                        .unwrap();
                    let cpu0 = client_cpu_us();
                    let (_, rate, h) = run(contenders[i], tasks, slice, 10_000, slice_no).await;
                    cpu[i] += client_cpu_us() - cpu0;
                    decisions[i] += h.len();
                    seconds[i] += h.len() as f64 / rate.max(f64::MIN_POSITIVE);
                    for (sum, v) in server[i].iter_mut().zip(server_totals(&mut admin)) {
                        *sum += v;
                    }
                    hist[i].add(h).unwrap();
                }
            }
            let rates: Vec<f64> = (0..3).map(|i| decisions[i] as f64 / seconds[i]).collect();
            for i in 0..3 {
                let [calls, usec, bytes_in, bytes_out] = server[i];
                let calls = calls.max(1.0);
                println!(
                    "{:<10} {:>5} {:>5} {:>12.0} {:>9} {:>9} {:>9} {:>9.2} {:>9.2} {:>9.1} {:>9.1}",
                    names[i],
                    tasks,
                    round + 1,
                    rates[i],
                    hist[i].value_at_quantile(0.5),
                    hist[i].value_at_quantile(0.99),
                    hist[i].value_at_quantile(0.999),
                    usec / calls,
                    cpu[i] / decisions[i].max(1) as f64,
                    bytes_in / calls,
                    bytes_out / calls
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
        let (admitted, rate, h) = run(&Contender::Pace(p.clone()), 64, secs, 1, 0).await;
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
    hot(&url, secs, rounds);
    fair(&url, secs, rounds);
    cold(&url, secs, rounds).await;
}

/// The hot key's limit: 20,000,000 per second, capacity 200,000 (10 ms):
/// above what the replicas ask, so that every decision is an admission and
/// the figure is the cost of one.
fn hot_limiter(leases: bool) -> pace_redis::Builder {
    let b = RedisPace::builder(Rate::per_second(20_000_000).unwrap())
        .capacity(200_000)
        .timeout(Duration::from_secs(5));
    if leases {
        b.leases(LeaseConfig::default())
    } else {
        b
    }
}

/// A replica process: `url|leases|secs|start` (start: Unix ms at which to
/// begin); 8 tasks reserve on the key `hot` for `secs`; prints `HOT
/// decisions admitted round_trips leased median_leased_ns`.
async fn hot_child(spec: &str) {
    let f: Vec<&str> = spec.split('|').collect();
    let (url, leases, secs, start) = (f[0], f[1] == "1", f[2], f[3]);
    let secs: f64 = secs.parse().unwrap();
    let start: u64 = start.parse().unwrap();
    let p = hot_limiter(leases).connect(url).await.unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(now_ms))).await;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut handles = Vec::new();
    for _ in 0..8 {
        let p = p.clone();
        handles.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
            let (mut decisions, mut admitted) = (0u64, 0u64);
            while Instant::now() < end {
                for _ in 0..64 {
                    let s = Instant::now();
                    let r = p.reserve("hot").await;
                    let d = s.elapsed();
                    decisions += 1;
                    match r {
                        Ok(r) => {
                            admitted += 1;
                            if r.source() == Source::Lease {
                                h.record(d.as_nanos().max(1) as u64).unwrap();
                            }
                        }
                        Err(Error::Denied(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                // Let the other tasks (and a renewal) run.
                tokio::task::yield_now().await;
            }
            (decisions, admitted, h)
        }));
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
    let (mut decisions, mut admitted) = (0u64, 0u64);
    for h in handles {
        let (d, a, h) = h.await.unwrap();
        decisions += d;
        admitted += a;
        all.add(h).unwrap();
    }
    let s = p.stats();
    println!(
        "HOT {decisions} {admitted} {} {} {}",
        s.round_trips,
        s.leased_decisions,
        all.value_at_quantile(0.5)
    );
}

/// The hot-key part: `PACE_REDIS_BENCH_PROCS` processes, without and with
/// leases, `rounds` rounds of `secs` each, the order alternating.
fn hot(url: &str, secs: f64, rounds: usize) {
    let procs: usize = env_or("PACE_REDIS_BENCH_PROCS", 4);
    println!(
        "== a hot key from {procs} processes x 8 tasks (limit 20,000,000/s, capacity 200,000: \
         all admitted), {secs} s per contender and round"
    );
    println!(
        "{:<18} {:>5} {:>12} {:>12} {:>13} {:>9} {:>16}",
        "limiter",
        "round",
        "decisions/s",
        "round trips",
        "trips/decision",
        "leased",
        "leased p50 ns"
    );
    let exe = std::env::current_exe().unwrap();
    for round in 0..rounds {
        let mut rates = [0.0f64; 2];
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for leases in order {
            let start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                + 1_000;
            let children: Vec<_> = (0..procs)
                .map(|_| {
                    Command::new(&exe)
                        .arg("--bench")
                        .env(
                            "PACE_REDIS_BENCH_HOT",
                            format!("{url}|{leases}|{secs}|{start}"),
                        )
                        .stdout(Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            let (mut decisions, mut trips, mut leased) = (0u64, 0u64, 0u64);
            let mut medians = Vec::new();
            for c in children {
                let out = c.wait_with_output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text
                    .lines()
                    .find(|l| l.starts_with("HOT "))
                    .expect("HOT line");
                let f: Vec<u64> = line[4..].split(' ').map(|x| x.parse().unwrap()).collect();
                decisions += f[0];
                trips += f[2];
                leased += f[3];
                medians.push(f[4]);
            }
            rates[leases] = decisions as f64 / secs;
            medians.sort_unstable();
            println!(
                "{:<18} {:>5} {:>12.0} {:>12} {:>13.5} {:>9} {:>16}",
                if leases == 1 {
                    "pace-redis, leases"
                } else {
                    "pace-redis"
                },
                round + 1,
                rates[leases],
                trips,
                trips as f64 / decisions.max(1) as f64,
                leased,
                if leases == 1 {
                    format!("{}..{}", medians[0], medians[medians.len() - 1])
                } else {
                    "-".to_owned()
                }
            );
        }
        println!(
            "{:<18} {:>5} {:>12.2}x",
            "ratio",
            round + 1,
            rates[1] / rates[0]
        );
    }
}

/// The fairness part's limit: 5,000 per second (an interval of 200 µs),
/// capacity 500 (100 ms, a lease time).
const FAIR_RATE: u64 = 5_000;
const FAIR_CAP: u64 = 500;

/// Unix ms now.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The server's clock (`TIME`), ns.
async fn server_ns(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1_000_000_000 + us * 1_000
}

/// A replica process of the fairness part: `url|leases|secs|start|asks|prefix`
/// (start: Unix ms at which to begin; asks: reserves per second this process
/// makes, open loop, over 8 tasks); prints `FAIR asked admitted leased
/// round_trips first last`, first and last the server's clock (ns) read
/// before the first reserve and after the last.
async fn fair_child(spec: &str) {
    let f: Vec<&str> = spec.split('|').collect();
    let (url, leases) = (f[0], f[1] == "1");
    let secs: f64 = f[2].parse().unwrap();
    let start: u64 = f[3].parse().unwrap();
    let asks: f64 = f[4].parse().unwrap();
    let b = RedisPace::builder(Rate::per_second(FAIR_RATE).unwrap())
        .capacity(FAIR_CAP)
        .timeout(Duration::from_secs(5))
        .prefix(f[5]);
    let b = if leases {
        b.leases(LeaseConfig::default())
    } else {
        b
    };
    let p = b.connect(url).await.unwrap();
    let mut clock = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(unix_ms()))).await;
    let first = server_ns(&mut clock).await;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let per_task = asks / 8.0;
    let mut handles = Vec::new();
    for _ in 0..8 {
        let p = p.clone();
        handles.push(tokio::spawn(async move {
            let (mut asked, mut admitted) = (0u64, 0u64);
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                // Open loop: the reserves due by now, then a millisecond's
                // sleep.
                let due = ((now - t0).as_secs_f64() * per_task) as u64 + 1;
                while asked < due && Instant::now() < end {
                    asked += 1;
                    match p.reserve("fair").await {
                        Ok(_) => admitted += 1,
                        Err(Error::Denied(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (asked, admitted)
        }));
    }
    let (mut asked, mut admitted) = (0u64, 0u64);
    for h in handles {
        let (a, b) = h.await.unwrap();
        asked += a;
        admitted += b;
    }
    let last = server_ns(&mut clock).await;
    let s = p.stats();
    println!(
        "FAIR {asked} {admitted} {} {} {first} {last}",
        s.leased_decisions, s.round_trips
    );
}

/// The fairness part: `PACE_REDIS_BENCH_PROCS` processes on one key of
/// 5,000/s and capacity 500, each asking 2x (then 4x) an equal share of
/// the rate, open loop, for `secs`; without and with leases, alternating.
/// Admissions over the ideal, capacity + span / interval, the span on the
/// server's clock (`TIME`) from the earliest reading a process took before
/// its first reserve to the latest it took after its last (every admission
/// lies inside it: above 1 would break the bound); and each process's
/// admissions over an equal share of the ideal.
fn fair(url: &str, secs: f64, rounds: usize) {
    let procs: u64 = env_or("PACE_REDIS_BENCH_PROCS", 4);
    println!(
        "== fairness: {procs} processes x 8 tasks on one key (limit {FAIR_RATE}/s, capacity \
         {FAIR_CAP}), each asking 2x then 4x an equal share, {secs} s per contender and round"
    );
    println!(
        "{:<18} {:>6} {:>5} {:>9} {:>9} {:>9} {:>8} {:>13} {:>9} {:>11}",
        "limiter",
        "demand",
        "round",
        "asked",
        "admitted",
        "ideal",
        "/ideal",
        "share min-max",
        "leased",
        "trips"
    );
    let exe = std::env::current_exe().unwrap();
    for times in [2u64, 4] {
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for leases in order {
                let start = unix_ms() + 1_000;
                let asks = times * FAIR_RATE / procs;
                let prefix = format!("fair{times}r{round}l{leases}:{start}:");
                let children: Vec<_> = (0..procs)
                    .map(|_| {
                        Command::new(&exe)
                            .arg("--bench")
                            .env(
                                "PACE_REDIS_BENCH_FAIR",
                                format!("{url}|{leases}|{secs}|{start}|{asks}|{prefix}"),
                            )
                            .stdout(Stdio::piped())
                            .spawn()
                            .unwrap()
                    })
                    .collect();
                let (mut t0, mut t1) = (u64::MAX, 0u64);
                let (mut asked, mut admitted, mut leased, mut trips) = (0u64, 0u64, 0u64, 0u64);
                let mut each = Vec::new();
                for c in children {
                    let out = c.wait_with_output().unwrap();
                    let text = String::from_utf8_lossy(&out.stdout);
                    let line = text
                        .lines()
                        .find(|l| l.starts_with("FAIR "))
                        .expect("FAIR line");
                    let f: Vec<u64> = line[5..].split(' ').map(|x| x.parse().unwrap()).collect();
                    asked += f[0];
                    admitted += f[1];
                    leased += f[2];
                    trips += f[3];
                    t0 = t0.min(f[4]);
                    t1 = t1.max(f[5]);
                    each.push(f[1]);
                }
                // The interval is 200,000 ns exactly.
                let ideal = FAIR_CAP + (t1 - t0) / (1_000_000_000 / FAIR_RATE);
                let share = |a: u64| a as f64 * procs as f64 / ideal as f64;
                let (lo, hi) = (
                    each.iter().copied().min().unwrap_or(0),
                    each.iter().copied().max().unwrap_or(0),
                );
                println!(
                    "{:<18} {:>5}x {:>5} {:>9} {:>9} {:>9} {:>8.4} {:>6.3}-{:<6.3} {:>9} {:>11}",
                    if leases == 1 {
                        "pace-redis, leases"
                    } else {
                        "pace-redis"
                    },
                    times,
                    round + 1,
                    asked,
                    admitted,
                    ideal,
                    admitted as f64 / ideal as f64,
                    share(lo),
                    share(hi),
                    leased,
                    trips
                );
            }
        }
    }
}

/// The cold-key part, in this process: 8 tasks, each deciding 4 times on a
/// key and then going on to a new one (below a lease's `hot_after` of 8),
/// on a limit of 1,000/s with capacity 1,000 (every decision admitted),
/// pace-redis without and with leases (`LeaseConfig::default()`). A round
/// is `PACE_REDIS_BENCH_SLICES` slices, each running both for `secs /
/// slices`, the first alternating from slice to slice; the ratio per round
/// and its median, and this process's CPU time per decision ("cli us",
/// user + system; the server's is not in it), less sensitive to a loaded
/// machine than decisions per second.
async fn cold(url: &str, secs: f64, rounds: usize) {
    let limiter = |leases: bool| {
        let b = RedisPace::builder(Rate::per_second(1_000).unwrap())
            .capacity(1_000)
            .timeout(Duration::from_secs(5))
            .prefix(format!("cold{}:{}:", u8::from(leases), unix_ms()));
        if leases {
            b.leases(LeaseConfig::default())
        } else {
            b
        }
    };
    let limiters = [
        limiter(false).connect(url).await.unwrap(),
        limiter(true).connect(url).await.unwrap(),
    ];
    let slices: usize = env_or("PACE_REDIS_BENCH_SLICES", 40).max(1);
    let slice = Duration::from_secs_f64(secs / slices as f64);
    println!(
        "== cold keys: 8 tasks, 4 decisions per key and then a new key, {secs} s per \
         contender and round in {slices} alternating slices"
    );
    println!(
        "{:<18} {:>5} {:>12} {:>13} {:>9} {:>8}",
        "limiter", "round", "decisions/s", "trips/decision", "leased", "cli us"
    );
    let mut ratios = Vec::new();
    let mut cpu_ratios = Vec::new();
    let mut next_key = 0u64;
    for round in 0..rounds {
        let mut decisions = [0u64; 2];
        let mut seconds = [0.0f64; 2];
        let mut cpu = [0.0f64; 2];
        let before = [limiters[0].stats(), limiters[1].stats()];
        for s in 0..slices {
            let order = if s % 2 == 0 { [0, 1] } else { [1, 0] };
            for leases in order {
                let cpu0 = client_cpu_us();
                let end = Instant::now() + slice;
                let t0 = Instant::now();
                let mut handles = Vec::new();
                for t in 0..8u64 {
                    let p = limiters[leases].clone();
                    let base = next_key + (t << 40);
                    handles.push(tokio::spawn(async move {
                        let mut n = 0u64;
                        let mut i = base;
                        while Instant::now() < end {
                            let key = format!("k{i}");
                            for _ in 0..4 {
                                match p.reserve(&key).await {
                                    Ok(_) | Err(Error::Denied(_)) => n += 1,
                                    Err(e) => panic!("{e}"),
                                }
                            }
                            i += 1;
                        }
                        (n, i - base)
                    }));
                }
                let mut keys = 0;
                for h in handles {
                    let (n, k) = h.await.unwrap();
                    decisions[leases] += n;
                    keys = keys.max(k);
                }
                seconds[leases] += t0.elapsed().as_secs_f64();
                cpu[leases] += client_cpu_us() - cpu0;
                next_key += keys;
            }
        }
        let rates = [
            decisions[0] as f64 / seconds[0],
            decisions[1] as f64 / seconds[1],
        ];
        for leases in 0..2 {
            let after = limiters[leases].stats();
            println!(
                "{:<18} {:>5} {:>12.0} {:>13.5} {:>9} {:>8.2}",
                if leases == 1 {
                    "pace-redis, leases"
                } else {
                    "pace-redis"
                },
                round + 1,
                rates[leases],
                (after.round_trips - before[leases].round_trips) as f64
                    / decisions[leases].max(1) as f64,
                after.leased_decisions - before[leases].leased_decisions,
                cpu[leases] / decisions[leases].max(1) as f64
            );
        }
        let cpu_ratio = (cpu[1] / decisions[1].max(1) as f64)
            / (cpu[0] / decisions[0].max(1) as f64).max(f64::MIN_POSITIVE);
        ratios.push(rates[1] / rates[0]);
        cpu_ratios.push(cpu_ratio);
        println!(
            "{:<18} {:>5} {:>12.3}x {:>32.3}x",
            "ratio (leases/not)",
            round + 1,
            rates[1] / rates[0],
            cpu_ratio
        );
    }
    ratios.sort_by(f64::total_cmp);
    cpu_ratios.sort_by(f64::total_cmp);
    if let (Some(m), Some(c)) = (ratios.get(rounds / 2), cpu_ratios.get(rounds / 2)) {
        println!(
            "cold keys: median ratio (leases / without) {m:.3}x decisions/s, {c:.3}x client \
             CPU per decision, over {rounds} rounds"
        );
    }
}
