//! A flood of presentations that are checked and refunded: what it leaves of
//! the victim key's budget.
//!
//! ```text
//! cargo bench -p pace-benches --bench flood
//! ```
//!
//! `Pace<String>` at 1 token per 10 s with a capacity of 3. For 300 ms,
//! N threads (1, 2, 4, 8, 16) loop: `reserve("victim")`, 50 µs of
//! "checking" (a spin), `refund()`. When the flood stops, every reservation
//! has been refunded, and the key's whole budget (3 tokens) would be back if
//! refunds were exact in any order. The refund rule returns a reservation
//! only while it is the key's newest debit, so overlapping cycles lose
//! tokens until the bucket refills (10 s a token here). The same flood with
//! `hold("victim")` → `refund()` (exact refunds, `Pace::hold`) leaves the
//! whole budget. Kinds `all-plain` and `all`: each cycle reserves "victim"
//! and then a second limit whose key is drained, which denies, so the first
//! is refunded at once: `all-plain` with a reserve and the refund rule (what
//! `pace::all` did before holds), `all` through `pace::all` (which holds
//! every pair). Five runs per thread count and kind; the tokens left after
//! each run are printed.

use std::time::{Duration, Instant};

use pace::{Pace, Rate, Refunded};

fn run(threads: usize, kind: &str) -> (u64, u64, u64) {
    let p: Pace<String> = Pace::builder(Rate::new(1, Duration::from_secs(10)).unwrap())
        .capacity(3)
        .build()
        .unwrap();
    let second: Pace<String> = Pace::builder(Rate::new(1, Duration::from_secs(10)).unwrap())
        .capacity(1)
        .build()
        .unwrap();
    let _drained = second.reserve("blocked").unwrap().detach();
    let end = Instant::now() + Duration::from_millis(300);
    let (returned, lost) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (p, second) = (&p, &second);
                s.spawn(move || {
                    let (mut returned, mut lost) = (0u64, 0u64);
                    while Instant::now() < end {
                        let check = || {
                            let t = Instant::now();
                            while t.elapsed() < Duration::from_micros(50) {
                                std::hint::spin_loop();
                            }
                        };
                        let refunded = match kind {
                            "hold" => p.hold("victim").ok().map(|h| {
                                check();
                                h.refund()
                            }),
                            "reserve" => p.reserve("victim").ok().map(|r| {
                                check();
                                r.refund()
                            }),
                            "all-plain" => p.reserve("victim").ok().map(|r| {
                                assert!(second.reserve("blocked").is_err());
                                r.refund()
                            }),
                            _ => match pace::all()
                                .with(p, "victim")
                                .with(second, "blocked")
                                .reserve()
                            {
                                Err(d) if d.index == 1 => Some(Refunded::Restored),
                                Err(_) => None,
                                Ok(_) => unreachable!("the second limit is drained"),
                            },
                        };
                        match refunded {
                            Some(Refunded::Restored | Refunded::Removed) => returned += 1,
                            Some(_) => lost += 1,
                            None => std::thread::yield_now(),
                        }
                    }
                    (returned, lost)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    (p.peek("victim"), returned, lost)
}

fn main() {
    println!("kind      | threads | tokens left of 3 after the flood, 5 runs | refunds returned / returned nothing (run 1)");
    for kind in ["reserve", "hold", "all-plain", "all"] {
        for threads in [1, 2, 4, 8, 16] {
            let runs: Vec<(u64, u64, u64)> = (0..5).map(|_| run(threads, kind)).collect();
            let left: Vec<String> = runs.iter().map(|r| r.0.to_string()).collect();
            println!(
                "{kind:9} | {threads:7} | {} | {} / {}",
                left.join(","),
                runs[0].1,
                runs[0].2
            );
        }
    }
}
