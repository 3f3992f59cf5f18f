//! A loop of reserves on `IpAddr` keys for callgrind: pace against
//! governor, one key, the keys a peer-address limit has (pace-tower's
//! `PeerIp`: IPv4 addresses, hashed with the default SipHash and held boxed,
//! as every key that is not word-sized is). A binary of its own so that its
//! `IpAddr` hashing leaves the codegen of `profile_reserve`'s `u64` modes as
//! it is.
//!
//! ```text
//! cargo build --release -p pace-benches --example profile_ip
//! B=target/release/examples/profile_ip
//! # instructions per op = (Ir with N ops - Ir with 0 ops) / N
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.0 $B pace 0 1
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.n $B pace 200000 1
//! ```
//!
//! Modes: `pace`, `pace-prefix` (the keys as `pace::IpPrefix` /32s, held
//! as their own bits, as pace-tower's `PeerIp` keys a `Pace<IpPrefix>`),
//! `governor` (regime `admit`: 1 µs per token, burst
//! 2^32-1, keys primed with 2^31 tokens). Arguments: mode, ops, keys
//! (cycled in order). Leave quanta's one-time calibration out of both totals
//! (`callgrind_annotate --inclusive=yes`, the line
//! `once_cell::imp::OnceCell<T>::initialize`).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use pace::{IpPrefix, Pace, Rate};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: profile_ip MODE OPS KEYS";
    let mode = args.get(1).expect(usage).as_str();
    let ops: u64 = args.get(2).expect(usage).parse().expect(usage);
    let nkeys: u64 = args.get(3).map_or(1, |s| s.parse().expect(usage));
    let keys: Vec<IpAddr> = (0..nkeys)
        .map(|i| IpAddr::V4(Ipv4Addr::from_bits(0x0A00_0000 | i as u32)))
        .collect();
    let key = |i: u64| &keys[(i % nkeys) as usize];
    match mode {
        "pace" => {
            let rate = Rate::new(1, Duration::from_micros(1)).expect("rate");
            let p: Pace<IpAddr> = Pace::builder(rate)
                .capacity(u64::from(u32::MAX))
                .build()
                .expect("limiter");
            for k in &keys {
                let _kept = p.reserve_n(k, 1 << 31).expect("primed");
            }
            for i in 0..ops {
                black_box(p.reserve(key(i)).is_ok());
            }
        }
        "pace-prefix" => {
            let keys: Vec<IpPrefix> = keys
                .iter()
                .map(|k| match k {
                    IpAddr::V4(a) => IpPrefix::from(*a),
                    IpAddr::V6(_) => unreachable!("IPv4 keys"),
                })
                .collect();
            let rate = Rate::new(1, Duration::from_micros(1)).expect("rate");
            let p: Pace<IpPrefix> = Pace::builder(rate)
                .capacity(u64::from(u32::MAX))
                .build()
                .expect("limiter");
            for k in &keys {
                let _kept = p.reserve_n(k, 1 << 31).expect("primed");
            }
            for i in 0..ops {
                black_box(p.reserve(&keys[(i % nkeys) as usize]).is_ok());
            }
        }
        "governor" => {
            let q = governor::Quota::with_period(Duration::from_micros(1))
                .unwrap()
                .allow_burst(NonZeroU32::new(u32::MAX).unwrap());
            let g = governor::RateLimiter::keyed(q);
            for k in &keys {
                let _ = g.check_key_n(k, NonZeroU32::new(1 << 31).unwrap());
            }
            for i in 0..ops {
                black_box(g.check_key(key(i)).is_ok());
            }
        }
        _ => panic!("{usage}"),
    }
}
