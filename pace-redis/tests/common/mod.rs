//! A private redis-server for one test: a free loopback port, no
//! persistence, killed on drop. Missing `redis-server` fails the test.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    restarting: bool,
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

fn free_port() -> u16 {
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
        let mut s = RedisServer {
            port,
            child: None,
            restarting: false,
        };
        s.spawn();
        s
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
                ])
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
    }
}
