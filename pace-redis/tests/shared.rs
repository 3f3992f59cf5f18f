//! Several clients, each with its own connection (standing for replicas),
//! hammer one key. By the server's clock, the tokens admitted between any two
//! admissions never exceed `capacity + elapsed / interval`: checked exactly,
//! in integers, over every window of the run; and every denial the server
//! answered was decided on the state the admissions before it left, which
//! lacked the tokens asked for (no denial is spurious).
//!
//! A run lasts until it has shown what it checks (counts of admissions,
//! server denials and turns over all tasks), however fast the machine: no
//! count depends on throughput. A run that does not get there within
//! [`HANG`] hangs.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pace::Rate;
use pace_redis::{Denied, Error, RedisPace, Source};

const CLIENTS: usize = 4;
const TASKS_PER_CLIENT: usize = 3;
/// A bound only a hang exceeds (a loaded machine makes the run slower, and
/// the run stops on its counts, not on time).
const HANG: Duration = Duration::from_secs(300);

/// What a run must have seen before it stops, over all its tasks.
struct Goal {
    admitted: u64,
    denied: u64,
    turns: u64,
}

/// The counts of a run so far, shared by its tasks.
#[derive(Default)]
struct Progress {
    admitted: AtomicU64,
    denied: AtomicU64,
    turns: AtomicU64,
}

impl Progress {
    fn reached(&self, goal: &Goal) -> bool {
        self.admitted.load(Ordering::Relaxed) >= goal.admitted
            && self.denied.load(Ordering::Relaxed) >= goal.denied
            && self.turns.load(Ordering::Relaxed) >= goal.turns
    }
}

/// A server's denial, as the check below needs it: (server time, the key's
/// tat the script decided on, whether the debit failed to fit by the
/// call's own rule). The script answers the wait; the tat follows from it:
/// `wait = tat - now + n x interval - tau` (`tau + max_wait` for a turn).
fn denial(d: &Denied, n: u64, interval: u64, tau: u64, max_wait: u64) -> (u64, u64) {
    assert!(!d.is_permanent());
    let now = d.server_now_ns().unwrap();
    let wait = d.retry_after().as_nanos() as u64;
    assert!(
        wait > max_wait,
        "denied, yet the debit fits: wait {wait} ns"
    );
    (now, now + wait + tau - n * interval)
}

/// Every server denial `(server time, tat)` was decided on the tat of the
/// admission executed last before it: an admission with that tat exists,
/// decided at or before the denial's server time, and every admission
/// decided strictly before that time has a tat no later (tats rise in the
/// server's execution order). `admitted` is `(tat, server time)`, sorted.
fn check_denials(admitted: &[(u64, u64)], denials: &[(u64, u64)]) {
    let at: HashMap<u64, u64> = admitted.iter().copied().collect();
    // latest[i] = the largest tat among admissions decided at server times
    // up to by_time[i].0.
    let mut by_time: Vec<(u64, u64)> = admitted.iter().map(|&(tat, now)| (now, tat)).collect();
    by_time.sort_unstable();
    let mut latest = Vec::with_capacity(by_time.len());
    for &(_, tat) in &by_time {
        latest.push(latest.last().copied().unwrap_or(0).max(tat));
    }
    for &(now, tat) in denials {
        let decided = at.get(&tat).unwrap_or_else(|| {
            panic!("a denial at {now} was decided on tat {tat}, which no admission left")
        });
        assert!(
            *decided <= now,
            "a denial at {now} saw the tat of an admission decided later ({decided})"
        );
        let before = by_time.partition_point(|&(t, _)| t < now);
        if before > 0 {
            assert!(
                latest[before - 1] <= tat,
                "a denial at {now} was decided on tat {tat}, older than an earlier admission's {}",
                latest[before - 1]
            );
        }
    }
}

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
    // Contended by construction: the run goes on until the server denied
    // 300 calls and admitted 2,000.
    let goal = Arc::new(Goal {
        admitted: 2_000,
        denied: 300,
        turns: 0,
    });
    let progress = Arc::new(Progress::default());
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..TASKS_PER_CLIENT {
            let (client, goal, progress) = (client.clone(), goal.clone(), progress.clone());
            tasks.push(tokio::spawn(async move {
                // (tat, server now, tokens) per admission; (server now, tat
                // decided on) per server denial; cached denials counted.
                let mut admitted = Vec::new();
                let mut denials = Vec::new();
                let mut cached = 0u64;
                let mut i = (c * 7 + t) as u64;
                while !progress.reached(&goal) {
                    i += 1;
                    let n = 1 + i % 3;
                    match client.reserve_n("shared", n).await {
                        Ok(r) => {
                            assert_eq!(r.source(), Source::Server);
                            admitted.push((r.tat_ns(), r.server_now_ns().unwrap(), n));
                            progress.admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Error::Denied(d)) if d.source() == Source::Server => {
                            denials.push(denial(&d, n, interval, cap * interval, 0));
                            progress.denied.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Error::Denied(d)) => {
                            assert_eq!(d.source(), Source::Cache);
                            assert!(!d.is_permanent());
                            cached += 1;
                        }
                        Err(e) => panic!("client {c}: {e}"),
                    }
                }
                (admitted, denials, cached)
            }));
        }
    }
    let mut all = Vec::new();
    let mut denials = Vec::new();
    let mut cached = 0;
    let joined = tokio::time::timeout(HANG, async {
        for t in tasks {
            let (a, d, k) = t.await.unwrap();
            all.extend(a);
            denials.extend(d);
            cached += k;
        }
    });
    joined.await.expect("the run hung");
    let denied = denials.len();
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
         {:.3} s of server time (bound {bound}), {denied} server denials, {cached} cached; \
         tightest window slack {worst_slack} tokens",
        all.len(),
        (last - first) as f64 / 1e9,
    );
    // Not vacuous: the run stopped on its counts, so the key was contended.
    assert!(
        all.len() >= 2_000 && denied >= 300,
        "{} admissions, {denied} denials",
        all.len()
    );
    // No denial is spurious: each was decided on the tat the admissions
    // before it left, and that bucket lacked the tokens.
    let tats: Vec<(u64, u64)> = all.iter().map(|&(tat, now, _)| (tat, now)).collect();
    check_denials(&tats, &denials);
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
    // Contended by construction: the run goes on until the server denied
    // 300 calls and admitted 2,000, 300 of them turns.
    let goal = Arc::new(Goal {
        admitted: 2_000,
        denied: 300,
        turns: 300,
    });
    let progress = Arc::new(Progress::default());
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..TASKS_PER_CLIENT {
            let (client, goal, progress) = (client.clone(), goal.clone(), progress.clone());
            tasks.push(tokio::spawn(async move {
                // (slot, cost ns, horizon ns) per admission; (tat, server
                // now) per admission and (server now, tat decided on) per
                // server denial; turns' lateness.
                let mut admitted = Vec::new();
                let (mut tats, mut denials) = (Vec::new(), Vec::new());
                let (mut cached, mut turns, mut worst_early) = (0u64, 0u64, 0i128);
                let mut i = (c * 7 + t) as u64;
                while !progress.reached(&goal) {
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
                                progress.turns.fetch_add(1, Ordering::Relaxed);
                                let seen = client.peek("other").await.unwrap();
                                let seen = seen.server_now_ns().unwrap();
                                worst_early = worst_early.max(slot as i128 - seen as i128);
                            }
                            admitted.push((slot, n * int, tau));
                            tats.push((r.tat_ns(), now));
                            progress.admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Error::Denied(d)) if d.source() == Source::Server => {
                            let max_wait = if turn { wait.as_nanos() as u64 } else { 0 };
                            denials.push(denial(&d, n, int, tau, max_wait));
                            progress.denied.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Error::Denied(d)) => {
                            assert_eq!(d.source(), Source::Cache);
                            assert!(!d.is_permanent());
                            cached += 1;
                        }
                        Err(e) => panic!("client {c}: {e}"),
                    }
                }
                (admitted, tats, denials, cached, turns, worst_early)
            }));
        }
    }
    let (mut all, mut tats, mut denials) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cached, mut turns, mut worst_early) = (0, 0, i128::MIN);
    let joined = tokio::time::timeout(HANG, async {
        for t in tasks {
            let (a, ts, d, k, n, e) = t.await.unwrap();
            all.extend(a);
            tats.extend(ts);
            denials.extend(d);
            cached += k;
            turns += n;
            worst_early = worst_early.max(e);
        }
    });
    joined.await.expect("the run hung");
    let denied = denials.len();
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
         ({turns} turns), {:.3} s of tokens over {:.3} s of slots, {denied} server denials, \
         {cached} cached; tightest window slack {:.3} ms",
        all.len(),
        total as f64 / 1e9,
        span as f64 / 1e9,
        worst_slack as f64 / 1e6,
    );
    // Not vacuous: the run stopped on its counts, so the key was contended.
    assert!(
        all.len() >= 2_000 && denied >= 300 && turns >= 300,
        "{} admissions, {denied} denials, {turns} turns",
        all.len()
    );
    // No denial is spurious: each was decided on the tat the admissions
    // before it left, and by its own quota (and wait, for a turn) that
    // bucket lacked the tokens.
    tats.sort_unstable();
    check_denials(&tats, &denials);
}
