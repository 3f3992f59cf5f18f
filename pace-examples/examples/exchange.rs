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
//! A flood, from a handful of addresses, names the legitimate ids and fresh
//! ids without holding any key. The run checks three claims and prints a
//! verdict line for each:
//!
//! 1. the legitimate clients keep their exchanges: at least 99% of what
//!    they offer is issued;
//! 2. the flood is cut at its source axis: no flood request gets a token,
//!    and what passes the source axis stays within each source's bound,
//!    capacity + rate x elapsed;
//! 3. the rows held stay bounded while the flood runs: at most one row per
//!    legitimate id plus one per flood thread's hold in flight, however many
//!    fresh ids the flood names.
//!
//! Run: `cargo run --release --example exchange` (about 3 seconds).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pace::{Pace, Rate};

const CLIENTS: u64 = 16;
const CLIENT_RATE: u64 = 10; // per second per claimed id (capacity: 10)
const SOURCE_RATE: u64 = 50; // per second per source address (capacity: 50)
const FLOOD_THREADS: u32 = 2;
const FLOOD_SOURCES: u64 = 8;
const RUN: Duration = Duration::from_secs(3);

#[derive(Default)]
struct Tally {
    offered: AtomicU64,
    issued: AtomicU64,
    denied_source: AtomicU64,
    denied_client: AtomicU64,
    refunded: AtomicU64,
    decision_ns: AtomicU64,
}

impl Tally {
    fn get(&self, c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
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
        t.decision_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        t.offered.fetch_add(1, Ordering::Relaxed);
        match (by_source, by_client) {
            (Err(_), _) => {
                t.denied_source.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(_), Some(Err(_))) => {
                t.denied_client.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(_kept), Some(Ok(hold))) => {
                if holds_key {
                    t.issued.fetch_add(1, Ordering::Relaxed);
                    // The exchange happened: the hold is kept (dropped).
                } else {
                    // Rejected presentation (401): give the client's pace back.
                    hold.refund();
                    t.refunded.fetch_add(1, Ordering::Relaxed);
                }
            }
            (Ok(_), None) => unreachable!("the client axis runs after an admitted source"),
        }
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ep = Arc::new(Endpoint {
        per_client: Pace::new(Rate::per_second(CLIENT_RATE)?),
        per_source: Pace::new(Rate::per_second(SOURCE_RATE)?),
    });
    let legit = Arc::new(Tally::default());
    let flood = Arc::new(Tally::default());
    let fresh_named = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let start = Instant::now();

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
    for w in 0..FLOOD_THREADS {
        let (ep, t, stop, fresh) = (ep.clone(), flood.clone(), stop.clone(), fresh_named.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let source = 7_000 + w * 4 + (i % 4) as u32;
                let claimed = if i.is_multiple_of(2) {
                    format!("client-{}", i / 2 % CLIENTS)
                } else {
                    fresh.fetch_add(1, Ordering::Relaxed);
                    format!("fresh-{w}-{i}")
                };
                ep.exchange(source, &claimed, false, &t);
                i += 1;
            }
        }));
    }

    println!("rows held while the flood runs (sampled every 10 ms, printed every 500 ms):");
    println!("  time  client-id rows  source rows  fresh ids named so far");
    let (mut peak_clients, mut peak_sources) = (0, 0);
    let mut next_print = Duration::from_millis(500);
    while start.elapsed() < RUN {
        std::thread::sleep(Duration::from_millis(10));
        let (c, s) = (ep.per_client.len(), ep.per_source.len());
        peak_clients = peak_clients.max(c);
        peak_sources = peak_sources.max(s);
        if start.elapsed() >= next_print {
            next_print += Duration::from_millis(500);
            println!(
                "{:>5.2}s {:>15} {:>12} {:>23}",
                start.elapsed().as_secs_f64(),
                c,
                s,
                fresh_named.load(Ordering::Relaxed)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker panicked");
    }
    let elapsed = start.elapsed();

    println!();
    println!(
        "{:<6} {:>9} {:>7} {:>15} {:>18} {:>15} {:>13}",
        "class",
        "offered",
        "issued",
        "429 by source",
        "429 by client id",
        "401, refunded",
        "ns/decision"
    );
    for (name, t) in [("legit", &legit), ("flood", &flood)] {
        println!(
            "{:<6} {:>9} {:>7} {:>15} {:>18} {:>15} {:>13.0}",
            name,
            t.get(&t.offered),
            t.get(&t.issued),
            t.get(&t.denied_source),
            t.get(&t.denied_client),
            t.get(&t.refunded),
            t.get(&t.decision_ns) as f64 / t.get(&t.offered).max(1) as f64,
        );
    }

    // The verdicts, one per claim of the header.
    println!();
    let (offered, issued) = (legit.get(&legit.offered), legit.get(&legit.issued));
    println!(
        "{} 1. legitimate clients keep their exchanges: {issued} of {offered} issued \
         ({:.2}%; at least 99% required)",
        verdict(issued * 100 >= offered * 99),
        issued as f64 * 100.0 / offered.max(1) as f64,
    );
    // Each source may pass at most capacity + rate x elapsed (elapsed
    // rounded up to whole ms, so the bound is never too tight).
    let ms = elapsed.as_millis() as u64 + 1;
    let bound = FLOOD_SOURCES * (SOURCE_RATE + (SOURCE_RATE * ms).div_ceil(1000));
    let passed = flood.get(&flood.offered) - flood.get(&flood.denied_source);
    println!(
        "{} 2. the flood is cut at its source axis: {} tokens issued to it; {passed} of {} \
         requests passed the source axis (bound: {FLOOD_SOURCES} sources x (50 + 50/s x {:.3} s), rounded up, \
         = {bound})",
        verdict(flood.get(&flood.issued) == 0 && passed <= bound),
        flood.get(&flood.issued),
        flood.get(&flood.offered),
        ms as f64 / 1000.0,
    );
    let row_bound = CLIENTS as usize + FLOOD_THREADS as usize;
    println!(
        "{} 3. rows stay bounded: client-id rows peaked at {peak_clients} (bound: {CLIENTS} \
         legitimate ids + {FLOOD_THREADS} holds in flight = {row_bound}) while the flood named \
         {} fresh ids; source rows peaked at {peak_sources}",
        verdict(peak_clients <= row_bound),
        fresh_named.load(Ordering::Relaxed),
    );
    println!(
        "\nrows held at the end: {} client ids, {} sources (each at most one horizon old)",
        ep.per_client.len(),
        ep.per_source.len()
    );
    Ok(())
}
