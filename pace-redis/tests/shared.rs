//! Several clients, each with its own connection (standing for replicas),
//! hammer one key. By the server's clock, the tokens admitted between any two
//! admissions never exceed `capacity + elapsed / interval`: checked exactly,
//! in integers, over every window of the run.

mod common;

use std::time::{Duration, Instant};

use pace::Rate;
use pace_redis::{Error, RedisPace, Source};

const CLIENTS: usize = 4;
const TASKS_PER_CLIENT: usize = 3;
const RUN: Duration = Duration::from_millis(2_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_never_admit_more_than_the_bucket_allows() {
    let server = common::RedisServer::start();
    let rate = Rate::per_second(2_000).unwrap(); // interval 500 us
    let cap = 20;
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        clients.push(
            RedisPace::builder(rate)
                .capacity(cap)
                .timeout(Duration::from_secs(2))
                // One client keeps its denial cache: cached denials must not
                // change what the server admits.
                .deny_cache(c == 0)
                .connect(&server.url())
                .await
                .unwrap(),
        );
    }
    let interval = clients[0].interval_ns();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..TASKS_PER_CLIENT {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                // (tat, server now, tokens) per admission; denials counted.
                let mut admitted = Vec::new();
                let mut denied = 0u64;
                let mut i = (c * 7 + t) as u64;
                while start.elapsed() < RUN {
                    i += 1;
                    let n = 1 + i % 3;
                    match client.reserve_n("shared", n).await {
                        Ok(r) => {
                            assert_eq!(r.source(), Source::Server);
                            admitted.push((r.tat_ns(), r.server_now_ns().unwrap(), n));
                        }
                        Err(Error::Denied(d)) => {
                            assert!(!d.is_permanent());
                            denied += 1;
                        }
                        Err(e) => panic!("client {c}: {e}"),
                    }
                }
                (admitted, denied)
            }));
        }
    }
    let mut all = Vec::new();
    let mut denied = 0;
    for t in tasks {
        let (a, d) = t.await.unwrap();
        all.extend(a);
        denied += d;
    }
    // Execution order on the server: every admission raises the key's tat.
    all.sort_unstable();
    for w in all.windows(2) {
        assert!(w[0].0 < w[1].0, "two admissions share a tat: {w:?}");
        assert!(w[0].1 <= w[1].1, "server time went back: {w:?}");
    }
    // prefix[k] = tokens of the first k admissions.
    let mut prefix = vec![0u64];
    for &(_, _, n) in &all {
        prefix.push(prefix.last().unwrap() + n);
    }
    let mut worst_slack = i128::MAX;
    for i in 0..all.len() {
        for j in i..all.len() {
            let tokens = prefix[j + 1] - prefix[i];
            let allowed = cap + (all[j].1 - all[i].1) / interval;
            assert!(
                tokens <= allowed,
                "{tokens} tokens admitted between server times {} and {} \
                 (admissions {i}..={j}); the bucket allows {allowed}",
                all[i].1,
                all[j].1
            );
            worst_slack = worst_slack.min(allowed as i128 - tokens as i128);
        }
    }
    let total = prefix[all.len()];
    let (first, last) = (all[0].1, all[all.len() - 1].1);
    let bound = cap + (last - first) / interval;
    println!(
        "{CLIENTS} clients x {TASKS_PER_CLIENT} tasks: {} admissions, {total} tokens over \
         {:.3} s of server time (bound {bound}), {denied} denials; tightest window slack \
         {worst_slack} tokens",
        all.len(),
        (last - first) as f64 / 1e9,
    );
    // Not vacuous: the run was contended and the limit was reached.
    assert!(denied > 100, "only {denied} denials");
    assert!(
        total * 10 >= bound * 9,
        "admitted {total} of a possible {bound}"
    );
}
