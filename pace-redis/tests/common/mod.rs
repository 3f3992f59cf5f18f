//! A private redis-server for one test: a free loopback port, no
//! persistence, its own working directory (a replica's received snapshot
//! lands there, never where another server would load it), killed on drop.
//! Missing `redis-server` fails the test.
#![allow(dead_code)]

pub mod mixed;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    restarting: bool,
    /// More arguments for `redis-server` (e.g. `--maxmemory-policy`).
    extra: Vec<String>,
    /// With TLS: its port and certificate files (plain `port` stays open for
    /// readiness checks and administration).
    tls: Option<Tls>,
    /// Working directory, removed on drop.
    dir: std::path::PathBuf,
}

/// A fresh directory under the system's temporary directory.
pub fn temp_dir(what: &str) -> std::path::PathBuf {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "pace-redis-{what}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Certificates made for one server: a private CA and a certificate for
/// `localhost` / `127.0.0.1` signed by it, written to a directory removed on
/// drop. Nothing here is a secret worth keeping.
pub struct Tls {
    pub port: u16,
    pub dir: std::path::PathBuf,
    pub ca_pem: String,
}

impl Tls {
    fn new() -> Tls {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "pace-redis test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, "localhost");
        let leaf_key = KeyPair::generate().unwrap();
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
        let dir = temp_dir("tls");
        std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
        std::fs::write(dir.join("server.crt"), leaf_cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), leaf_key.serialize_pem()).unwrap();
        Tls {
            port: free_port(),
            dir,
            ca_pem: ca_cert.pem(),
        }
    }

    fn args(&self) -> Vec<String> {
        let f = |name: &str| self.dir.join(name).to_string_lossy().into_owned();
        vec![
            "--tls-port".into(),
            self.port.to_string(),
            "--tls-cert-file".into(),
            f("server.crt"),
            "--tls-key-file".into(),
            f("server.key"),
            "--tls-ca-cert-file".into(),
            f("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

impl Drop for Tls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One RESP PING on a fresh connection; true only for the server's `+PONG`.
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_on(free_port())
    }

    /// Starts on `port` if it can; on another free port if `port` is taken.
    pub fn start_on(port: u16) -> RedisServer {
        RedisServer::start_with(port, Vec::new(), false)
    }

    /// Starts with more `redis-server` arguments.
    pub fn start_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_with(
            free_port(),
            extra.iter().map(|s| s.to_string()).collect(),
            false,
        )
    }

    /// Starts with a TLS port too (certificates made for this server).
    pub fn start_tls() -> RedisServer {
        RedisServer::start_with(free_port(), Vec::new(), true)
    }

    fn start_with(port: u16, extra: Vec<String>, tls: bool) -> RedisServer {
        let mut s = RedisServer {
            port,
            child: None,
            restarting: false,
            extra,
            tls: tls.then(Tls::new),
            dir: temp_dir("server"),
        };
        s.spawn();
        s
    }

    /// The TLS port and certificates (servers started with `start_tls`).
    pub fn tls(&self) -> &Tls {
        self.tls.as_ref().expect("a server started with start_tls")
    }

    /// `rediss://host:tls-port/` (`host`: `localhost` or `127.0.0.1`).
    pub fn tls_url(&self, host: &str) -> String {
        format!("rediss://{host}:{}/", self.tls().port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn spawn(&mut self) {
        // A port picked by `free_port` can be taken again before the server
        // binds it (another test's server, or a client's ephemeral port), so
        // a server that exits at start gets a fresh port, except on restart,
        // where the port is part of what the test checks.
        for _ in 0..20 {
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    &self.port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                ])
                .arg(&self.dir)
                .args(&self.extra)
                .args(self.tls.as_ref().map(Tls::args).unwrap_or_default())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start `redis-server` ({e}): these tests need a real server; \
                         install it (`apt-get install -y redis-server`, as .ci/run does)"
                    )
                });
            if self.wait_ready(&mut child) {
                self.child = Some(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            if self.restarting {
                panic!(
                    "redis-server could not listen again on 127.0.0.1:{}",
                    self.port
                );
            }
            self.port = free_port();
            if let Some(tls) = &mut self.tls {
                tls.port = free_port();
            }
        }
        panic!("redis-server did not start on 20 loopback ports");
    }

    /// Waits until this child answers PING with +PONG. A bare TCP connect is
    /// not proof: a connect to a loopback port nobody listens on can connect
    /// to itself (TCP simultaneous open) when the kernel picks that same port
    /// as the source, and a port taken by another server answers for it.
    /// False if the child exited (its port was taken) or 10 s passed.
    fn wait_ready(&self, child: &mut Child) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().ok().flatten().is_some() {
                return false;
            }
            if ping(self.port) {
                // A server that lost the race for the port exits soon after
                // start; the one answering may be someone else's.
                std::thread::sleep(Duration::from_millis(20));
                if child.try_wait().ok().flatten().is_none() {
                    return true;
                }
                return false;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) to the server's process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("a running server").id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Starts it again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.stop();
        self.restarting = true;
        self.spawn();
        self.restarting = false;
    }

    /// A plain connection for administration (flush, pause, inspection).
    pub fn admin(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .expect("admin connection")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    /// `INFO replication` field `name`.
    pub fn info_field(&self, section: &str, name: &str) -> Option<String> {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut self.admin())
            .ok()?;
        let prefix = format!("{name}:");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().to_string())
    }

    /// Makes this server a replica of `primary` and waits (at most 10 s) for
    /// the link to be up.
    pub fn replicate(&self, primary: &RedisServer) {
        self.replicate_via(primary, primary.port);
    }

    /// Makes this server a replica of `primary` reached at loopback `port`
    /// (the primary's own, or a [`Proxy`] in front of it) and waits (at
    /// most 10 s) for the link to be up.
    pub fn replicate_via(&self, primary: &RedisServer, port: u16) {
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(port)
            .query(&mut self.admin())
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .info_field("replication", "master_link_status")
            .as_deref()
            != Some("up")
        {
            assert!(Instant::now() < deadline, "replication link never came up");
            std::thread::sleep(Duration::from_millis(20));
        }
        // ... and for the primary to count it online (a `WAIT` counts only
        // the replicas it sees online).
        let mine = format!("port={},state=online", self.port);
        while !(0..16).any(|i| {
            primary
                .info_field("replication", &format!("slave{i}"))
                .is_some_and(|line| line.contains(&mine))
        }) {
            assert!(
                Instant::now() < deadline,
                "the primary never saw the replica online"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // ... and for a write's `WAIT` to count every replica: for a few
        // hundred ms after a sync, `WAIT` times out (redis-server 7.0).
        // (Not when `primary` is itself a replica, which takes no write:
        // its replicas count once it is promoted.)
        let mut admin = primary.admin();
        while primary.info_field("replication", "role").as_deref() == Some("master") {
            let replicas: i64 = primary
                .info_field("replication", "connected_slaves")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let acked: i64 = redis::pipe()
                .cmd("SET")
                .arg("pace-test:sync")
                .arg(1)
                .ignore()
                .cmd("DEL")
                .arg("pace-test:sync")
                .ignore()
                .cmd("WAIT")
                .arg(replicas)
                .arg(100)
                .query::<(i64,)>(&mut admin)
                .unwrap()
                .0;
            if acked >= replicas {
                break;
            }
            assert!(Instant::now() < deadline, "WAIT never counted the replicas");
        }
    }

    /// `REPLICAOF NO ONE`: a primary again.
    pub fn promote(&self) {
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut self.admin())
            .unwrap();
    }
}

/// A loopback TCP forwarder whose target can be switched: new connections go
/// to the current target, open ones stay where they are (as with a DNS name
/// or a virtual address that moves after a failover). It can also stall:
/// from [`Proxy::stall`] on, nothing more crosses it either way (what it
/// reads is held, as by a link that stopped delivering). Stops on drop,
/// dropping what it holds.
pub struct Proxy {
    pub port: u16,
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
    stalled: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// One direction of a forwarded connection: what `from` sends goes to
/// `to`, except while stalled.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Read during a stall: held (never sent).
        if stalled.wait_for(|s| !*s).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    pub async fn start(target: u16) -> Proxy {
        use std::sync::atomic::{AtomicU16, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = std::sync::Arc::new(AtomicU16::new(target));
        let to = target.clone();
        let (stalled, watch) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut open = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                let port = to.load(Ordering::SeqCst);
                let watch = watch.clone();
                open.spawn(async move {
                    if let Ok(out) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        // Small writes (a replica's acknowledgement) cross
                        // at once, as on a direct connection: no Nagle.
                        let _ = inbound.set_nodelay(true);
                        let _ = out.set_nodelay(true);
                        let (in_read, in_write) = inbound.into_split();
                        let (out_read, out_write) = out.into_split();
                        tokio::join!(
                            forward(in_read, out_write, watch.clone()),
                            forward(out_read, in_write, watch)
                        );
                    }
                });
            }
        });
        Proxy {
            port,
            target,
            stalled,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// New connections go to `port` from now on.
    pub fn switch(&self, port: u16) {
        self.target.store(port, std::sync::atomic::Ordering::SeqCst);
    }

    /// Nothing more crosses the open connections, either way.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A Redis Cluster of three primaries on loopback (no replicas), each with
/// its own directory for `nodes.conf`; servers killed and directories
/// removed on drop.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
    dir: std::path::PathBuf,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_with(0, &[])
    }

    /// Three primaries, `replicas` replicas each (`redis-cli --cluster
    /// create --cluster-replicas`), more `redis-server` arguments for every
    /// node (e.g. a short `--cluster-node-timeout`).
    pub fn start_with(replicas: usize, extra: &[&str]) -> Cluster {
        let dir = temp_dir("cluster");
        let mut nodes = Vec::new();
        for i in 0..3 * (1 + replicas) {
            let node_dir = dir.join(i.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            let bus = free_port().to_string();
            let d = node_dir.to_string_lossy().into_owned();
            nodes.push(RedisServer::start_args(
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--dir",
                    &d,
                ]
                .iter()
                .chain(extra)
                .copied()
                .collect::<Vec<_>>(),
            ));
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run `redis-cli` ({e}): install it (apt-get install -y redis-tools)")
            });
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            while n.info_field_cluster().as_deref() != Some("ok") {
                assert!(
                    Instant::now() < deadline,
                    "the cluster never reached state ok"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Cluster { nodes, dir }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    /// `cluster_state` of `CLUSTER INFO`.
    pub fn info_field_cluster(&self) -> Option<String> {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut self.admin())
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("cluster_state:"))
            .map(|v| v.trim().to_string())
    }
}

/// A Redis Sentinel on loopback monitoring `127.0.0.1:primary` as
/// `service`, with its own writable config file; killed on drop.
pub struct Sentinel {
    pub port: u16,
    child: Child,
    dir: std::path::PathBuf,
}

impl Sentinel {
    pub fn start(service: &str, primary: u16) -> Sentinel {
        let dir = temp_dir("sentinel");
        for _ in 0..20 {
            let port = free_port();
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {service} 127.0.0.1 {primary} 1\n\
                     sentinel down-after-milliseconds {service} 1000\n\
                     sentinel failover-timeout {service} 10000\n",
                    dir.display()
                ),
            )
            .unwrap();
            let mut child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if child.try_wait().ok().flatten().is_some() {
                    break; // the port was taken: another one
                }
                if ping(port) {
                    return Sentinel { port, child, dir };
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("redis-server --sentinel did not start");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn admin(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .expect("sentinel connection")
    }
}

impl Sentinel {
    /// `SENTINEL FAILOVER service`, sent again every 20 ms while the
    /// Sentinel refuses it (it has no replica to promote yet), until
    /// `deadline`.
    pub async fn failover(&self, service: &str, deadline: Instant) {
        let mut admin = self.admin();
        loop {
            let r: redis::RedisResult<()> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(service)
                .query(&mut admin);
            match r {
                Ok(()) => return,
                Err(e) => assert!(Instant::now() < deadline, "SENTINEL FAILOVER: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The lease settings of the failover tests (`leases_processes.rs`,
/// `sentinel_leases.rs`): a lease of 200 ms and a grace of 20 ms, a key
/// hot after 2 server decisions, 12 tokens asked for at a time, a grant
/// used once 1 standby acknowledged it within 10 ms.
pub fn failover_leases() -> pace_redis::LeaseConfig {
    pace_redis::LeaseConfig {
        lease: Duration::from_millis(200),
        grace: Duration::from_millis(20),
        hot_after: 2,
        want: Some(12),
        wait_replicas: 1,
        wait_timeout: Duration::from_millis(10),
        ..pace_redis::LeaseConfig::default()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pair of readings of the monotonic and the real-time clocks, to place
/// a local `Instant` (a leased decision's reading) on the real-time clock
/// that the server's `TIME` reads (ns since the Unix epoch). The two
/// clocks advance at the same rate (NTP slews both alike); the pair's
/// error is half the gap between its readings.
#[derive(Clone, Copy)]
pub struct Clocks {
    at: Instant,
    real: u64,
}

impl Clocks {
    pub fn now() -> Clocks {
        let a = Instant::now();
        let real = real_now();
        let b = Instant::now();
        Clocks {
            at: a + (b - a) / 2,
            real,
        }
    }

    pub fn real(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.at) {
            Some(d) => self.real + d.as_nanos() as u64,
            None => self.real - (self.at - at).as_nanos() as u64,
        }
    }
}

/// The real-time clock, ns since the Unix epoch.
pub fn real_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The refill intervals of the random histories (`equivalence.rs`,
/// `holds.rs`), in ns: 1 ns, 7 ns, 1 µs, a third of a second rounded up,
/// a second and 7 ns, and any up to 5 s.
pub fn interval() -> impl proptest::strategy::Strategy<Value = u64> {
    use proptest::prelude::*;
    prop_oneof![
        Just(1u64),
        Just(7),
        Just(1_000),
        Just(333_333_334),
        Just(1_000_000_007),
        1u64..5_000_000_000
    ]
}
