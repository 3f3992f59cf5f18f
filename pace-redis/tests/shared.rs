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

/// The same with quotas per call and turns: replicas mix the configuration's
/// quota (2,000/s, capacity 20), a quota of their own (1,000/s, capacity 30)
/// and `acquire` under either (up to 5 ms of wait). Each admission is let
/// through at its slot (the decision's server time, plus a turn's wait), and
/// over every window of slots the admitted tokens cost, each at its quota's
/// interval, at most the window's span plus the largest horizon among their
/// quotas (the core's contract for quotas and turns, DESIGN.md §3). No turn
/// goes through before its slot by the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_quotas_and_turns_keep_the_contract() {
    let server = common::RedisServer::start();
    let rate = Rate::per_second(2_000).unwrap(); // interval 500 us, tau 10 ms
    let cap = 20;
    let paid = pace::Quota::new(Rate::per_second(1_000).unwrap(), 30).unwrap(); // tau 30 ms
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        clients.push(
            RedisPace::builder(rate)
                .capacity(cap)
                .timeout(Duration::from_secs(2))
                .deny_cache(c == 0)
                .connect(&server.url())
                .await
                .unwrap(),
        );
    }
    let (own_i, own_tau) = (clients[0].interval_ns(), clients[0].interval_ns() * cap);
    let (paid_i, paid_tau) = (1_000_000u64, 30_000_000u64);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..TASKS_PER_CLIENT {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                // (slot, cost ns, horizon ns) per admission; turns' lateness.
                let mut admitted = Vec::new();
                let (mut denied, mut turns, mut worst_early) = (0u64, 0u64, 0i128);
                let mut i = (c * 7 + t) as u64;
                while start.elapsed() < RUN {
                    i += 1;
                    let n = 1 + i % 3;
                    let with_paid = (i / 3).is_multiple_of(2);
                    let (int, tau) = if with_paid {
                        (paid_i, paid_tau)
                    } else {
                        (own_i, own_tau)
                    };
                    let turn = i.is_multiple_of(4);
                    let wait = Duration::from_millis(5);
                    let got = match (turn, with_paid) {
                        (false, false) => client.reserve_n("mixed", n).await,
                        (false, true) => client.reserve_n_with("mixed", n, paid).await,
                        (true, false) => client.acquire_n("mixed", n, wait).await,
                        (true, true) => client.acquire_n_with("mixed", n, paid, wait).await,
                    };
                    match got {
                        Ok(r) => {
                            assert_eq!(r.source(), Source::Server);
                            let now = r.server_now_ns().unwrap();
                            let slot = now + r.wait().as_nanos() as u64;
                            assert!(r.wait() <= wait);
                            assert_eq!(
                                r.wait().as_nanos() as u64,
                                (r.tat_ns() - now).saturating_sub(tau),
                                "the script's wait is not the slot of the call's own quota"
                            );
                            if turn {
                                turns += 1;
                                let seen = client.peek("other").await.unwrap();
                                let seen = seen.server_now_ns().unwrap();
                                worst_early = worst_early.max(slot as i128 - seen as i128);
                            }
                            admitted.push((slot, n * int, tau));
                        }
                        Err(Error::Denied(d)) => {
                            assert!(!d.is_permanent());
                            denied += 1;
                        }
                        Err(e) => panic!("client {c}: {e}"),
                    }
                }
                (admitted, denied, turns, worst_early)
            }));
        }
    }
    let (mut all, mut denied, mut turns, mut worst_early) = (Vec::new(), 0, 0, i128::MIN);
    for t in tasks {
        let (a, d, n, e) = t.await.unwrap();
        all.extend(a);
        denied += d;
        turns += n;
        worst_early = worst_early.max(e);
    }
    assert!(
        worst_early <= 0,
        "a turn went through {worst_early} ns before its slot"
    );
    all.sort_unstable();
    let mut prefix = vec![0u64];
    for &(_, cost, _) in &all {
        prefix.push(prefix.last().unwrap() + cost);
    }
    let mut worst_slack = i128::MAX;
    for i in 0..all.len() {
        let mut horizon = 0;
        for j in i..all.len() {
            horizon = horizon.max(all[j].2);
            let cost = prefix[j + 1] - prefix[i];
            let allowed = all[j].0 - all[i].0 + horizon;
            assert!(
                cost <= allowed,
                "admissions {i}..={j} (slots {} to {}) cost {cost} ns; the contract allows \
                 {allowed} ns",
                all[i].0,
                all[j].0
            );
            worst_slack = worst_slack.min(allowed as i128 - cost as i128);
        }
    }
    let total = prefix[all.len()];
    let span = all[all.len() - 1].0 - all[0].0;
    println!(
        "{CLIENTS} clients x {TASKS_PER_CLIENT} tasks, quotas and turns: {} admissions \
         ({turns} turns), {:.3} s of tokens over {:.3} s of slots, {denied} denials; \
         tightest window slack {:.3} ms",
        all.len(),
        total as f64 / 1e9,
        span as f64 / 1e9,
        worst_slack as f64 / 1e6,
    );
    assert!(denied > 100, "only {denied} denials");
    assert!(turns > 100, "only {turns} turns");
    // Not vacuous: the key was kept near its limit (tokens worth at least
    // 90% of the span).
    assert!(
        total * 10 >= span * 9,
        "{total} ns of tokens over {span} ns"
    );
}
