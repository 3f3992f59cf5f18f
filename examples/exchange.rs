//! A token endpoint, both axes, from several threads.
//!
//! * Axis 1, per CLAIMED client id: an exchange holds a token of the bucket
//!   of the id the presenter names (`Pace::hold`); when the presentation is
//!   rejected (the presenter does not hold that client's key) the hold is
//!   refunded, exactly however many presentations overlap it, so only
//!   accepted presentations spend a client's pace.
//! * Axis 2, per source address: every request that passed the method check
//!   spends, refunded never.
//!
//! Legitimate clients exchange below their pace from their own addresses.
//! A flood, from a handful of addresses, names the legitimate ids and a
//! million fresh ids without holding any key. The printout shows that the
//! legitimate clients keep (nearly) all their exchanges, that the flood is cut
//! at its source axis, and that the rows held stay bounded while it runs.
//!
//! Run: `cargo run --release --example exchange` (about 3 seconds).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pace::{Pace, Rate};

const CLIENTS: u64 = 16;
const CLIENT_RATE: u64 = 10; // per second per claimed id
const SOURCE_RATE: u64 = 50; // per second per source address
const RUN: Duration = Duration::from_secs(3);

#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    denied_source: AtomicU64,
    denied_client: AtomicU64,
    rejected: AtomicU64,
    reserves: AtomicU64,
    reserve_ns: AtomicU64,
}

struct Endpoint {
    per_client: Pace<String>,
    per_source: Pace<u32>,
}

impl Endpoint {
    /// One token request. `holds_key` says whether the presenter can prove
    /// the client id it names.
    fn exchange(&self, source: u32, claimed: &str, holds_key: bool, t: &Tally) {
        let start = Instant::now();
        // Axis 2 first: spent by every request that passed the method check.
        let by_source = self.per_source.reserve(&source);
        let by_client = by_source.is_ok().then(|| self.per_client.hold(claimed));
        t.reserve_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        t.reserves.fetch_add(1, Ordering::Relaxed);
        match (by_source, by_client) {
            (Err(_), _) => {
                t.denied_source.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(_), Some(Err(_))) => {
                t.denied_client.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(_kept), Some(Ok(hold))) => {
                if holds_key {
                    t.admitted.fetch_add(1, Ordering::Relaxed);
                    // The exchange happened: the hold is kept (dropped).
                } else {
                    // Rejected presentation: give the client's pace back.
                    hold.refund();
                    t.rejected.fetch_add(1, Ordering::Relaxed);
                }
            }
            (Ok(_), None) => unreachable!("the client axis runs after an admitted source"),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ep = Arc::new(Endpoint {
        per_client: Pace::new(Rate::per_second(CLIENT_RATE)?),
        per_source: Pace::new(Rate::per_second(SOURCE_RATE)?),
    });
    let legit = Arc::new(Tally::default());
    let flood = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();

    // Legitimate clients: 8 per second each (below their pace of 10), each
    // from its own address, spread over 4 threads.
    for w in 0..4u64 {
        let (ep, t, stop) = (ep.clone(), legit.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let ids: Vec<String> = (0..CLIENTS)
                .filter(|c| c % 4 == w)
                .map(|c| format!("client-{c}"))
                .collect();
            while !stop.load(Ordering::Relaxed) {
                for (i, id) in ids.iter().enumerate() {
                    ep.exchange(1_000 + (w * 100 + i as u64) as u32, id, true, &t);
                }
                std::thread::sleep(Duration::from_millis(125));
            }
        }));
    }
    // The flood: 2 threads, 8 source addresses, naming the legitimate ids
    // and fresh ids as fast as they can, holding no key.
    for w in 0..2u32 {
        let (ep, t, stop) = (ep.clone(), flood.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let source = 7_000 + w * 4 + (i % 4) as u32;
                let claimed = if i.is_multiple_of(2) {
                    format!("client-{}", i / 2 % CLIENTS)
                } else {
                    format!("fresh-{w}-{i}")
                };
                ep.exchange(source, &claimed, false, &t);
                i += 1;
            }
        }));
    }

    println!("  time   rows(client ids)  rows(sources)");
    let start = Instant::now();
    while start.elapsed() < RUN {
        std::thread::sleep(Duration::from_millis(250));
        println!(
            "{:>5.2}s {:>17} {:>14}",
            start.elapsed().as_secs_f64(),
            ep.per_client.len(),
            ep.per_source.len()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker panicked");
    }

    println!();
    println!(
        "{:<8} {:>9} {:>14} {:>14} {:>16} {:>12}",
        "class", "admitted", "denied:source", "denied:client", "rejected+refund", "ns/request"
    );
    for (name, t) in [("legit", &legit), ("flood", &flood)] {
        let n = t.reserves.load(Ordering::Relaxed).max(1);
        println!(
            "{:<8} {:>9} {:>14} {:>14} {:>16} {:>12.0}",
            name,
            t.admitted.load(Ordering::Relaxed),
            t.denied_source.load(Ordering::Relaxed),
            t.denied_client.load(Ordering::Relaxed),
            t.rejected.load(Ordering::Relaxed),
            t.reserve_ns.load(Ordering::Relaxed) as f64 / n as f64,
        );
    }
    println!(
        "\nrows held at the end: {} client ids, {} sources (each at most one horizon old)",
        ep.per_client.len(),
        ep.per_source.len()
    );
    Ok(())
}
