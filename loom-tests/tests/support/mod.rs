//! The harness every loom model file shares: keys that hold a loom `Arc`
//! (a leak or a double free shows), the id hasher that lets a model choose
//! slot positions, a limiter of 4 slots, and `model` with its execution
//! count.
#![allow(dead_code)]

use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::Duration;

use loom::sync::Arc;
use pace::internals::PaceInternals;
use pace::{Pace, Rate, StdClock};

/// One token per `T` ns.
pub const T: u64 = 1_000;

/// A key that the model can see leak: it holds a loom `Arc`.
#[derive(Clone, Debug)]
pub struct Key {
    pub id: u64,
    _alive: Arc<()>,
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.id == other.id
    }
}
impl Eq for Key {}
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.id);
    }
}

pub fn key(id: u64) -> Key {
    Key {
        id,
        _alive: Arc::new(()),
    }
}

/// Hash = key id: slot positions are chosen by the model (ids 0 and 4
/// collide in a 4-slot array) and identical in every execution.
#[derive(Default)]
pub struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub type P = Pace<Key, BuildHasherDefault<IdHasher>, StdClock>;

pub fn pace(capacity: u64) -> Arc<P> {
    pace_of::<Key>(capacity)
}

/// A key of the models: [`Key`] (boxed: it owns a loom `Arc`) or `u64`
/// (held as its own bits). Both hash to their id.
pub trait ModelKey: Clone + Hash + Eq + Send + Sync + std::fmt::Debug + 'static {
    fn of(id: u64) -> Self;
    fn id(&self) -> u64;
}

impl ModelKey for Key {
    fn of(id: u64) -> Key {
        key(id)
    }
    fn id(&self) -> u64 {
        self.id
    }
}

impl ModelKey for u64 {
    fn of(id: u64) -> u64 {
        id
    }
    fn id(&self) -> u64 {
        *self
    }
}

pub type PaceOf<K> = Pace<K, BuildHasherDefault<IdHasher>, StdClock>;

/// A limiter of 4 cells with the id hasher: `u64` keys held as their own
/// bits, [`Key`]s boxed.
pub fn pace_of<K: ModelKey>(capacity: u64) -> Arc<PaceOf<K>> {
    let p = Pace::builder(Rate::new(1, Duration::from_nanos(T)).unwrap())
        .capacity(capacity)
        .min_slots(4)
        .hasher(BuildHasherDefault::<IdHasher>::default())
        .inline_keys_any_hasher() // the id hasher cannot panic
        .clock(StdClock::new())
        .build()
        .unwrap();
    assert_eq!(
        p.inline_keys(),
        std::any::TypeId::of::<K>() == std::any::TypeId::of::<u64>()
    );
    Arc::new(p)
}

/// `loom::model` with room for the spin-waits of a migration: each wait is a
/// branch. The preemption bound comes from LOOM_MAX_PREEMPTIONS.
pub fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    run(loom::model::Builder::new(), f);
}

fn run<F: Fn() + Sync + Send + 'static>(mut builder: loom::model::Builder, f: F) {
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = executions.clone();
    let started = std::time::Instant::now();
    builder.max_branches = std::env::var("LOOM_MAX_BRANCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom: {} executions in {:.1?} (LOOM_MAX_PREEMPTIONS={})",
        executions.load(std::sync::atomic::Ordering::Relaxed),
        started.elapsed(),
        builder
            .preemption_bound
            .map_or("unbounded".into(), |b| b.to_string()),
    );
}

pub fn ids<K: ModelKey>(p: &PaceOf<K>) -> Vec<u64> {
    let mut v: Vec<u64> = p.row_keys().iter().map(|k| k.id()).collect();
    v.sort_unstable();
    v
}
