//! The script's lease call (`pace.lua`, "Leases") and the lease model's
//! server (`pace_models::leases::LeaseServer`) are the same rule: random
//! histories of take/renew calls (first calls, cumulative reports of kept
//! and released tokens, duplicates and stale retries, leases left to
//! expire) and direct decisions run through both at the same readings;
//! every answer, every decision and the key's debt (peeked) must agree.

mod common;

use std::time::Duration;

use pace::Rate;
use pace_models::leases::{Answer, LeaseServer};
use pace_redis::{Error, LeaseAnswer, RedisPace};

/// A realistic Unix time in ns.
const BASE: u64 = 1_764_000_000_123_456_789;

/// A small deterministic generator (splitmix64): one history per seed.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One replica as the history drives it: its lease number and cumulative
/// counts, and its last report (resent as a stale retry).
#[derive(Clone, Default)]
struct Rep {
    number: u64,
    first: bool,
    granted: u64,
    kept: u64,
    released: u64,
    last: Option<(bool, u64, u64)>,
}

fn answer_of(a: LeaseAnswer) -> Answer {
    match a {
        LeaseAnswer::Granted {
            granted,
            remaining,
            born,
            ..
        } => Answer::Granted {
            granted,
            remaining: i128::from(remaining),
            born: i128::from(born) - i128::from(BASE),
        },
        LeaseAnswer::Unknown => Answer::Unknown,
        LeaseAnswer::ClockBack => panic!("clock back"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_call_agrees_with_the_model() {
    let server = common::RedisServer::start();
    let mut leases_seen = (0u64, 0u64, 0u64, 0u64); // grants, unknowns, expiries, releases
    for seed in 0..40u64 {
        let mut g = Gen(seed);
        let interval = 1_000 * (1 + g.below(100)); // 1 to 100 us
        let capacity = [1u64, 2, 3, 5, 10, 40, 200][g.below(7) as usize];
        let rate = Rate::per_second(1_000_000_000 / interval).unwrap();
        let interval = rate.interval().as_nanos() as u64;
        let tau = interval * capacity;
        let lease = (tau / 2).max(interval) * (1 + g.below(8));
        let grace = [0, interval / 3, lease / 4][g.below(3) as usize];
        let limiter = RedisPace::builder(rate)
            .capacity(capacity)
            .time_injection(true)
            .prefix(format!("eq{seed}:"))
            .timeout(Duration::from_secs(5))
            .connect(&server.url())
            .await
            .unwrap();
        let mut model = LeaseServer::new(interval, capacity, lease, grace);
        let replicas = 2 + g.below(3) as usize;
        let mut reps = vec![
            Rep {
                first: true,
                ..Rep::default()
            };
            replicas
        ];
        let mut now: u64 = 0;
        for step in 0..300 {
            // Time moves by up to half a lease, sometimes past one.
            now += if g.below(20) == 0 {
                lease + grace + g.below(lease)
            } else {
                g.below(lease / 2 + 1)
            };
            let at = BASE + now;
            let r = g.below(replicas as u64 + 1) as usize;
            if r == replicas {
                // A direct decision (a call no lease serves).
                let n = 1 + g.below(capacity.min(3));
                let want = model.direct(i128::from(now), n);
                let got = match limiter.reserve_n_at("k", n, at).await {
                    Ok(_) => true,
                    Err(Error::Denied(_)) => false,
                    Err(e) => panic!("{e}"),
                };
                assert_eq!(got, want, "seed {seed} step {step}: direct {n}");
            } else {
                let rep = &mut reps[r];
                // The replica spends and releases part of its pool.
                let pool = rep.granted - rep.kept - rep.released;
                let k = g.below(pool + 1);
                rep.kept += k;
                let x = g.below(pool - k + 1) / 2;
                rep.released += x;
                let (first, kept, released) = match (g.below(8), rep.last) {
                    (0, Some(last)) => last, // a stale retry
                    _ => (rep.first, rep.kept, rep.released),
                };
                rep.last = Some((first, kept, released));
                let want = 1 + g.below(capacity);
                let lid = format!("{:016x}{:08x}", r + 1, rep.number);
                let expected =
                    model.call(i128::from(now), r, rep.number, first, kept, released, want);
                let got = limiter
                    .lease_call_at("k", &lid, first, kept, released, want, lease, grace, at)
                    .await
                    .unwrap();
                let got = answer_of(got);
                assert_eq!(got, expected, "seed {seed} step {step}: replica {r}");
                match got {
                    Answer::Granted { granted, .. } => {
                        leases_seen.0 += granted.saturating_sub(rep.granted);
                        rep.granted = rep.granted.max(granted);
                        rep.first = false;
                    }
                    Answer::Unknown => {
                        leases_seen.1 += 1;
                        *rep = Rep {
                            number: rep.number + 1,
                            first: true,
                            ..Rep::default()
                        };
                    }
                }
            }
            // The key's debt, peeked at the same reading.
            let peek = limiter.peek_at("k", at).await.unwrap();
            let held = i128::from(model.held()) * i128::from(interval);
            let debt = model.tat().max(i128::from(now)) - i128::from(now) + held;
            let got = peek.reset_after().unwrap().as_nanos() as i128;
            assert_eq!(got, debt, "seed {seed} step {step}: debt");
        }
        leases_seen.2 += 1;
        leases_seen.3 += reps.iter().map(|r| r.released).sum::<u64>();
    }
    println!(
        "40 histories: {} tokens granted, {} unknown answers, {} released",
        leases_seen.0, leases_seen.1, leases_seen.3
    );
    // Not vacuous: grants, expiries and releases happened.
    assert!(leases_seen.0 > 1_000);
    assert!(leases_seen.1 > 10);
    assert!(leases_seen.3 > 100);
}
