//! The warm path, as a server sees it: ns per reserve on a warm key and on
//! 1M live keys in random order, 1 and 2 threads, for `Pace<u64>` with its
//! defaults (rows in cells), with `CoarseClock`, with the fast hasher
//! (feature `foldhash`) and with both, holds kept or refunded
//! (`pace-hold-keep`, `pace-hold-refund`: `Pace::hold`), against governor's default keyed
//! limiter and a DashMap-of-atomics limiter, all in one process (a harness,
//! not criterion).
//!
//! ```text
//! cargo bench -p pace-benches --features foldhash --bench warm        # PACE_WARM_ROUNDS=3
//! PACE_WARM_ORDER=pattern cargo bench -p pace-benches --features foldhash --bench warm
//! PACE_WARM_ORDER=seq cargo bench -p pace-benches --features foldhash --bench warm
//! PACE_WARM_ORDER=fenced cargo bench -p pace-benches --features foldhash --bench warm
//! PACE_WARM_CELLS=1 cargo bench -p pace-benches --features foldhash --bench warm   # + `cells`, `cells128`, `pace-entries`
//! PACE_WARM_HUGE=1 cargo bench -p pace-benches --features foldhash --bench warm    # + `pace-huge` (`Builder::huge_pages(true)`)
//! ```
//!
//! Regime `admit` for every contender (1 µs per token, burst 2^32-1, every
//! key primed with 2^31 tokens of debt): every measured reserve is an
//! admission on a row that stays live for the whole run (no row refills, so
//! none is swept and the table keeps its 1M rows).
//!
//! Key order (`PACE_WARM_ORDER`): `hash` (default) draws the key of the
//! `i`-th reserve of thread `t` by a multiplicative hash of `(t, i)`, so the
//! loop touches no memory but the limiter's; `pattern` reads it from a
//! precomputed random index sequence into a key array, as
//! `benches/throughput.rs` does (two more loads per reserve, one of them a
//! cache miss into the 8 MB key array at 1M keys).
//!
//! Every contender of a workload is built and primed first and stays alive;
//! a round then times each (threads) in `PACE_WARM_SLICES` slices that
//! alternate between the contenders in a rotating order, so that every
//! contender meets the same machine load (the box is shared). A round's
//! figure is a contender's mean over its slices; the summary gives, per
//! contender, the range over rounds of ns per reserve (wall time over all
//! threads divided by reserves) and of governor's time over its own (above
//! 1: faster than governor), with the load at the start of each round.
//!
//! `PACE_WARM_ORDER=fenced` is `hash` with an `lfence` before each reserve
//! (x86-64; elsewhere the same as `hash`): no reserve of a thread begins
//! before the one before it has returned. In a tight loop the CPU starts
//! the next reserves while one waits for memory (its hash, even its
//! prefetch, if they fit in the out-of-order window); a server does other
//! work between two reserves, so `fenced` is nearer to what one reserve
//! costs it.
//!
//! `PACE_WARM_ORDER=seq` walks the keys in the order their rows were created
//! (not what a server sees: it shows what creation-order locality is worth).
//! `PACE_WARM_ORDER=replay` is `pattern` restarted at the pattern's start in
//! every slice, as `benches/throughput.rs` restarts it in every criterion
//! sample (so a slice revisits the keys of the previous ones).

mod common;

use std::hint::black_box;
use std::time::Duration;

use common::*;
use pace::internals::BucketMath;
use pace::{Clock, CoarseClock, QuantaClock};
use portable_atomic::AtomicU128;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// Baseline `cells`: the lookup of a table whose rows live in its slots, for
/// u64 keys. One array of 16-byte cells `{key, bucket word}` sized at
/// construction (at most half full), linear probing, rows never removed, so
/// no migration, sweep or reclamation: what one cache miss per lookup costs
/// with `Pace`'s default options (randomly seeded SipHash, `QuantaClock`), an
/// epoch pin as a table with migrations needs, and one CAS with the crate's
/// bucket math. Not a limiter a server could use (its rows never leave).
struct Cells {
    cells: Box<[(AtomicU64, AtomicU64)]>,
    hasher: RandomState,
    clock: QuantaClock,
    math: BucketMath,
}

/// A cell no key has claimed (the benchmarks' keys are below it).
const NO_KEY: u64 = u64::MAX;

impl Cells {
    fn new(r: &Regime, keys: u64) -> Cells {
        let n = (keys as usize).saturating_mul(2).next_power_of_two().max(4);
        Cells {
            cells: (0..n)
                .map(|_| (AtomicU64::new(NO_KEY), AtomicU64::new(0)))
                .collect(),
            hasher: RandomState::new(),
            clock: QuantaClock::new(),
            math: r.math(),
        }
    }

    /// The key's cell, claimed if absent; `None` when every cell holds
    /// another key (the sizing rules that out in this benchmark).
    #[inline]
    fn cell(&self, key: u64) -> Option<&AtomicU64> {
        assert_ne!(key, NO_KEY);
        let mask = self.cells.len() - 1;
        let mut i = self.hasher.hash_one(key) as usize & mask;
        for _ in 0..self.cells.len() {
            let (k, word) = &self.cells[i];
            match k.load(Ordering::Acquire) {
                found if found == key => return Some(word),
                NO_KEY => {
                    match k.compare_exchange(NO_KEY, key, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => return Some(word),
                        Err(other) if other == key => return Some(word),
                        Err(_) => {}
                    }
                }
                _ => {}
            }
            i = (i + 1) & mask;
        }
        None
    }

    #[inline]
    fn reserve_n(&self, key: u64, n: u64) -> bool {
        let now = self.clock.now_ns();
        let _guard = crossbeam_epoch::pin();
        let Some(word) = self.cell(key) else {
            return false;
        };
        let mut tat = word.load(Ordering::Acquire);
        loop {
            let Ok(new) = self.math.reserve(tat, now, n) else {
                return false;
            };
            match word.compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(t) => tat = t,
            }
        }
    }
}

impl Contender<u64> for Cells {
    #[inline]
    fn reserve(&self, key: &u64) -> bool {
        self.reserve_n(*key, 1)
    }
    /// Debits only (its rows never leave; this benchmark does not churn).
    fn churn(&self, key: &u64) {
        self.reserve_n(*key, 1);
    }
    fn prime(&self, key: &u64, n: u32) {
        assert!(
            self.reserve_n(*key, u64::from(n.max(1))),
            "priming admitted"
        );
    }
    fn rows(&self) -> usize {
        self.cells
            .iter()
            .filter(|(k, _)| k.load(Ordering::Relaxed) != NO_KEY)
            .count()
    }
}

/// Baseline `cells128`: `cells` with each cell one 128-bit atomic
/// `{key, bucket word}`, read by a 128-bit load and updated by one 128-bit
/// CAS (portable-atomic: `cmpxchg16b`, loads by `vmovdqa` where the CPU has
/// AVX, chosen at run time). A key and its word change together, so a cell
/// can be claimed, frozen, moved or reused by one CAS: what that costs on the
/// lookup, beside `cells`' separate 64-bit key and word.
struct Cells128 {
    cells: Box<[AtomicU128]>,
    hasher: RandomState,
    clock: QuantaClock,
    math: BucketMath,
}

/// `(key, word)` as one 128-bit value: key in the high half.
#[inline]
fn pack(key: u64, word: u64) -> u128 {
    (u128::from(key) << 64) | u128::from(word)
}

impl Cells128 {
    fn new(r: &Regime, keys: u64) -> Cells128 {
        let n = (keys as usize).saturating_mul(2).next_power_of_two().max(4);
        Cells128 {
            cells: (0..n).map(|_| AtomicU128::new(pack(NO_KEY, 0))).collect(),
            hasher: RandomState::new(),
            clock: QuantaClock::new(),
            math: r.math(),
        }
    }

    #[inline]
    fn reserve_n(&self, key: u64, n: u64) -> bool {
        assert_ne!(key, NO_KEY);
        let now = self.clock.now_ns();
        let _guard = crossbeam_epoch::pin();
        let mask = self.cells.len() - 1;
        let mut i = self.hasher.hash_one(key) as usize & mask;
        let mut probed = 0;
        let mut cur = self.cells[i].load(Ordering::Acquire);
        loop {
            let cell = &self.cells[i];
            let k = (cur >> 64) as u64;
            let next = if k == key {
                let Ok(new) = self.math.reserve(cur as u64, now, n) else {
                    return false;
                };
                pack(key, new)
            } else if k == NO_KEY {
                pack(key, 0)
            } else {
                probed += 1;
                if probed == self.cells.len() {
                    return false;
                }
                i = (i + 1) & mask;
                cur = self.cells[i].load(Ordering::Acquire);
                continue;
            };
            match cell.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if k == key => return true,
                Ok(_) => cur = next,
                Err(c) => cur = c,
            }
        }
    }
}

impl Contender<u64> for Cells128 {
    #[inline]
    fn reserve(&self, key: &u64) -> bool {
        self.reserve_n(*key, 1)
    }
    /// Debits only (its rows never leave; this benchmark does not churn).
    fn churn(&self, key: &u64) {
        self.reserve_n(*key, 1);
    }
    fn prime(&self, key: &u64, n: u32) {
        assert!(
            self.reserve_n(*key, u64::from(n.max(1))),
            "priming admitted"
        );
    }
    fn rows(&self) -> usize {
        self.cells
            .iter()
            .filter(|c| (c.load(Ordering::Relaxed) >> 64) as u64 != NO_KEY)
            .count()
    }
}

const KEYS_1M: u64 = 1_000_000;

#[derive(Clone, Copy, PartialEq)]
enum Order {
    Hash,
    Fenced,
    Pattern,
    Seq,
    Replay,
}

/// Waits until every earlier instruction has completed and starts no later
/// one before (x86-64 `lfence`), so that a reserve begins only after the one
/// before it has returned. Elsewhere it does nothing.
#[inline(always)]
fn one_at_a_time() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` reads and writes no memory, and it needs only SSE2,
    // which every x86-64 CPU has.
    unsafe {
        std::arch::x86_64::_mm_lfence()
    };
}

/// Key index of reserve `i` of thread `t`, uniform over `0..n`.
#[inline(always)]
fn draw(t: u64, i: u64, n: u64) -> u64 {
    let x = (i ^ (t << 48)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let x = x ^ (x >> 29);
    let x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 32) * n) >> 32
}

struct Workload {
    name: &'static str,
    keys: u64,
    ops: u64,
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// ns per reserve over `ops` reserves split across `threads`.
fn measure<L: Contender<u64>>(
    lim: &L,
    w: &Workload,
    threads: usize,
    order: Order,
    base: u64,
    keys: &[u64],
    pattern: &[u32],
) -> f64 {
    let n = w.keys;
    let d: Duration = run_threads(threads, w.ops, &|t, ops| {
        let t = t as u64;
        match order {
            Order::Hash => {
                for i in base..base + ops {
                    let k = u64::make(draw(t, i, n));
                    black_box(lim.reserve(&k));
                }
            }
            Order::Fenced => {
                for i in base..base + ops {
                    let k = u64::make(draw(t, i, n));
                    one_at_a_time();
                    black_box(lim.reserve(&k));
                }
            }
            Order::Seq => {
                // Keys in the order they were primed (rows created).
                let first = base + t * (n / 2 + 7919);
                for i in first..first + ops {
                    let k = u64::make(i % n);
                    black_box(lim.reserve(&k));
                }
            }
            Order::Pattern | Order::Replay => {
                // Replay starts every slice at the pattern's start, as
                // criterion's samples do.
                let base = if order == Order::Replay { 0 } else { base };
                let mask = pattern.len() - 1;
                let mut j = (base as usize)
                    .wrapping_add((t as usize).wrapping_mul(pattern.len() / 2 + 7919));
                for _ in 0..ops {
                    let k = &keys[pattern[j & mask] as usize % keys.len()];
                    black_box(lim.reserve(k));
                    j = j.wrapping_add(1);
                }
            }
        }
    });
    d.as_nanos() as f64 / w.ops as f64
}

/// `lim` with `keys` primed keys.
fn primed<L: Contender<u64> + 'static>(lim: L, r: &Regime, keys: u64) -> L {
    for i in 0..keys {
        lim.prime(&u64::make(i), r.prime);
    }
    assert_eq!(lim.rows() as u64, keys, "every key has a live row");
    lim
}

/// Builds a contender with `n` primed keys.
type Make = fn(&Regime, u64) -> Box<dyn Measure>;

fn contenders() -> Vec<(&'static str, Make)> {
    let mut v: Vec<(&'static str, Make)> = vec![
        ("pace", |r, n| {
            Box::new(primed(PaceC::new(r, QuantaClock::new()), r, n))
        }),
        ("pace-coarse", |r, n| {
            Box::new(primed(PaceC::new(r, CoarseClock::new()), r, n))
        }),
        ("pace-with", |r, n| {
            Box::new(primed(PaceWith::new(r, QuantaClock::new()), r, n))
        }),
        ("pace-hold-keep", |r, n| {
            Box::new(primed(PaceHold::new(r, QuantaClock::new(), true), r, n))
        }),
        ("pace-hold-refund", |r, n| {
            Box::new(primed(PaceHold::new(r, QuantaClock::new(), false), r, n))
        }),
    ];
    #[cfg(feature = "foldhash")]
    {
        v.push(("pace-fast", |r, n| {
            Box::new(primed(pace_fast(r, QuantaClock::new()), r, n))
        }));
        v.push(("pace-fast-coarse", |r, n| {
            Box::new(primed(pace_fast(r, CoarseClock::new()), r, n))
        }));
    }
    v.push(("governor", |r, n| Box::new(primed(Governor::new(r), r, n))));
    v.push(("dashmap", |r, n| Box::new(primed(DashAtomic::new(r), r, n))));
    // Opt-in: one more 32 MiB table alive beside the others changes what
    // they measure at 1M keys (the L3 is shared), so the default run
    // leaves it out.
    // Opt-in for the same reason: `pace` with `Builder::huge_pages(true)`.
    if std::env::var_os("PACE_WARM_HUGE").is_some() {
        v.push(("pace-huge", |r, n| {
            Box::new(primed(pace_huge(r, QuantaClock::new()), r, n))
        }));
    }
    if std::env::var_os("PACE_WARM_CELLS").is_some() {
        v.push(("cells", |r, n| Box::new(primed(Cells::new(r, n), r, n))));
        v.push(("cells128", |r, n| {
            Box::new(primed(Cells128::new(r, n), r, n))
        }));
        v.push(("pace-entries", |r, n| {
            Box::new(primed(pace_entries(r, QuantaClock::new()), r, n))
        }));
    }
    v
}

trait Measure {
    /// ns per reserve of `w.ops` reserves from draw index `base` on.
    fn run(
        &self,
        w: &Workload,
        threads: usize,
        order: Order,
        base: u64,
        keys: &[u64],
        pattern: &[u32],
    ) -> f64;
}

impl<L: Contender<u64>> Measure for L {
    fn run(
        &self,
        w: &Workload,
        threads: usize,
        order: Order,
        base: u64,
        keys: &[u64],
        pattern: &[u32],
    ) -> f64 {
        measure(self, w, threads, order, base, keys, pattern)
    }
}

fn main() {
    // `cargo test --benches` runs bench binaries without `--bench`: stay quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("warm: run with `cargo bench -p pace-benches --features foldhash --bench warm`");
        return;
    }
    let rounds = env("PACE_WARM_ROUNDS", 3) as usize;
    let slices = env("PACE_WARM_SLICES", 8);
    let order = match std::env::var("PACE_WARM_ORDER").as_deref() {
        Ok("pattern") => Order::Pattern,
        Ok("seq") => Order::Seq,
        Ok("replay") => Order::Replay,
        Ok("fenced") => Order::Fenced,
        _ => Order::Hash,
    };
    let workloads = [
        Workload {
            name: "warm key",
            keys: 1,
            ops: env("PACE_WARM_OPS", 16_000_000),
        },
        Workload {
            name: "1M live keys",
            keys: KEYS_1M,
            ops: env("PACE_WARM_OPS_1M", 4_000_000),
        },
    ];
    let r = ADMIT;
    let list = contenders();
    // (workload, threads, contender) -> ns per reserve, per round.
    let mut ns = vec![vec![vec![Vec::new(); list.len()]; 2]; workloads.len()];
    let mut loads = Vec::new();
    println!(
        "order {}, rounds {rounds}, slices {slices}",
        match order {
            Order::Hash => "hash",
            Order::Fenced => "fenced",
            Order::Pattern => "pattern",
            Order::Seq => "seq",
            Order::Replay => "replay",
        }
    );
    for (wi, w) in workloads.iter().enumerate() {
        let keys: Vec<u64> = (0..w.keys).map(u64::make).collect();
        let pattern = access_pattern(w.keys as usize, 1 << 20, 0x5eed ^ w.keys);
        // Every contender alive and primed at once, so that each round's
        // slices alternate between them under the same machine load.
        let lims: Vec<Box<dyn Measure>> = list.iter().map(|(_, b)| b(&r, w.keys)).collect();
        let slice = Workload {
            name: w.name,
            keys: w.keys,
            ops: w.ops / slices,
        };
        for round in 0..rounds {
            let load = loadavg();
            println!("{} round {round} load {load}", w.name);
            loads.push(format!("{} round {round}: {load}", w.name));
            for (ti, threads) in [1usize, 2].into_iter().enumerate() {
                let mut total = vec![0.0; list.len()];
                for s in 0..slices as usize {
                    for k in 0..list.len() {
                        let ci = (k + s + round) % list.len();
                        let base = (round as u64 * slices + s as u64) * slice.ops;
                        total[ci] += lims[ci].run(&slice, threads, order, base, &keys, &pattern);
                    }
                }
                for (ci, (name, _)) in list.iter().enumerate() {
                    let x = total[ci] / slices as f64;
                    println!("  {threads}t {name}: {x:.1} ns");
                    ns[wi][ti][ci].push(x);
                }
            }
        }
    }
    let gi = list.iter().position(|(n, _)| *n == "governor").unwrap();
    println!();
    println!("| workload | threads | contender | ns per reserve | governor / contender |");
    println!("|---|---:|---|---:|---:|");
    for (wi, w) in workloads.iter().enumerate() {
        for (ti, threads) in [1usize, 2].into_iter().enumerate() {
            for (ci, (name, _)) in list.iter().enumerate() {
                let v = &ns[wi][ti][ci];
                let ratios: Vec<f64> = v.iter().zip(&ns[wi][ti][gi]).map(|(c, g)| g / c).collect();
                let (lo, hi) = range(v);
                let (rlo, rhi) = range(&ratios);
                let flip = if rlo < 1.0 && rhi > 1.0 {
                    " (flipping)"
                } else {
                    ""
                };
                println!(
                    "| {} | {threads} | {name} | {lo:.1}–{hi:.1} | {rlo:.2}–{rhi:.2}x{flip} |",
                    w.name
                );
            }
        }
    }
    println!();
    println!("loads (1, 5, 15 min): {}", loads.join("; "));
}

fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}
