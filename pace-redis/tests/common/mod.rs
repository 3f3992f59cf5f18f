//! A private redis-server for one test: a free loopback port, no
//! persistence, killed on drop. Missing `redis-server` fails the test.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
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
        let mut s = RedisServer {
            port: free_port(),
            child: None,
        };
        s.spawn();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
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
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen on 127.0.0.1:{} within 10 s",
                self.port
            );
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
        self.spawn();
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
