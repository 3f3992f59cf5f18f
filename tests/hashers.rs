//! Which hashers keep word-sized keys in cells, and a hasher that panics on
//! a key whose row is live while the table grows and sweeps: every call
//! returns, and the counts stay exact. A cell keeps no hash, so a migration
//! and a sweep would hash the keys of the cells they hold; a limiter with a
//! hasher the crate does not know keeps its rows in the slot table, which
//! stores each row's hash. Known-wrong variant, caught here:
//! `cells_any_hasher` (cells whatever the hasher).

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pace::internals::PaceInternals;
use pace::{ManualClock, Pace, Rate};

/// The key whose hashing panics (none: `u64::MAX`).
static PANIC_ON: AtomicU64 = AtomicU64::new(u64::MAX);

/// SipHash that panics when it hashes the key in [`PANIC_ON`].
#[derive(Clone, Default)]
struct Touchy;

struct TouchyHasher(DefaultHasher);

impl Hasher for TouchyHasher {
    fn finish(&self) -> u64 {
        self.0.finish()
    }
    fn write(&mut self, bytes: &[u8]) {
        if let Ok(b) = <[u8; 8]>::try_from(bytes) {
            assert!(
                u64::from_ne_bytes(b) != PANIC_ON.load(Ordering::Relaxed),
                "the hasher panics"
            );
        }
        self.0.write(bytes);
    }
    fn write_u64(&mut self, k: u64) {
        self.write(&k.to_ne_bytes());
    }
}

impl BuildHasher for Touchy {
    type Hasher = TouchyHasher;
    fn build_hasher(&self) -> TouchyHasher {
        TouchyHasher(DefaultHasher::new())
    }
}

fn rate() -> Rate {
    Rate::new(1, Duration::from_secs(1)).unwrap()
}

#[test]
#[cfg_attr(miri, ignore)] // Miri has no 128-bit atomics: never cells there
fn own_bits_only_with_hashers_that_cannot_panic() {
    let std_default: Pace<u64> = Pace::new(rate());
    assert!(std_default.inline_keys(), "RandomState (the default)");
    let p = Pace::<u64>::builder(rate())
        .hasher(BuildHasherDefault::<DefaultHasher>::default())
        .build()
        .unwrap();
    assert!(p.inline_keys(), "BuildHasherDefault<DefaultHasher>");
    #[cfg(feature = "foldhash")]
    {
        let p = Pace::<u64>::builder(rate()).fast_hasher().build().unwrap();
        assert!(p.inline_keys(), "fast_hasher()");
    }
    let p = Pace::<u64>::builder(rate()).hasher(Touchy).build().unwrap();
    assert!(!p.inline_keys(), "a hasher of the caller's");
    let p = Pace::<u64>::builder(rate())
        .hasher(foldhash::fast::RandomState::default())
        .build()
        .unwrap();
    assert!(!p.inline_keys(), "foldhash through hasher()");
    let p = Pace::<String>::builder(rate())
        .hasher(RandomState::new())
        .build()
        .unwrap();
    assert!(!p.inline_keys(), "String keys");
}

/// Key 7's row is live when its hashing starts to panic; 20,000 new keys
/// then grow the table through migrations and a sweep after the horizon
/// removes every row. Every call but those naming key 7 returns its
/// answer, none waits for good (a watchdog gives the flood 30 s), and the
/// row count is exact throughout.
#[test]
#[cfg_attr(miri, ignore)] // 20,000 keys
fn a_hasher_that_panics_on_a_live_key_leaves_counts_exact() {
    const KEYS: u64 = 20_000;
    let p = Arc::new(
        Pace::<u64>::builder(rate())
            .capacity(2)
            .hasher(Touchy)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    for k in 0..64 {
        drop(p.reserve_n_at(&k, 1, 0).unwrap());
    }
    PANIC_ON.store(7, Ordering::Relaxed);
    let (done, finished) = mpsc::channel();
    let flood = Arc::clone(&p);
    std::thread::spawn(move || {
        let mut panics = 0;
        for k in 64..KEYS {
            match catch_unwind(AssertUnwindSafe(|| flood.reserve_n_at(&k, 1, 0).is_ok())) {
                Ok(true) => {}
                Ok(false) => panic!("key {k} denied"),
                Err(_) => panics += 1,
            }
        }
        done.send(panics).unwrap();
    });
    let panics = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the flood finished");
    assert_eq!(panics, 0, "no call but key 7's hashes key 7");
    assert_eq!(p.len(), KEYS as usize, "one row per key");
    assert!(catch_unwind(AssertUnwindSafe(|| p.reserve_n_at(&7, 1, 0))).is_err());
    assert_eq!(
        p.len(),
        KEYS as usize,
        "a panicking reserve changes nothing"
    );
    // After the horizon, a sweep removes every row, key 7's too.
    let (done, finished) = mpsc::channel();
    let sweeper = Arc::clone(&p);
    std::thread::spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(|| sweeper.sweep_at(10_000_000_000)));
        done.send(r.is_ok()).unwrap();
    });
    let swept = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the sweep finished");
    assert!(swept, "the sweep hashes no key");
    assert_eq!(p.len(), 0, "every row removed and counted");
    PANIC_ON.store(u64::MAX, Ordering::Relaxed);
    assert_eq!(p.peek_at(&7, 10_000_000_000), 2, "key 7's bucket is full");
}

/// A limiter with std's `RandomState` hashes with SipHash-1-3 under a key
/// of its own (src/hasher.rs), and a copier hashes the keys it moves the
/// same way: 20,000 keys, each drained, grow the table through
/// migrations, and every key is then found where its callers look (each
/// denied, one row each), also with `IpPrefix` keys, and after a sweep
/// removes them all. Known-wrong variant, caught here: `std_hash_for_bits`
/// (copies hash with std's hasher).
#[test]
#[cfg_attr(miri, ignore)] // 20,000 keys
fn a_random_state_limiter_finds_every_key_it_moved() {
    const KEYS: u64 = 20_000;
    let p: Pace<u64, RandomState, ManualClock> = Pace::builder(rate())
        .capacity(1)
        .hasher(RandomState::new())
        .clock(ManualClock::new())
        .build()
        .unwrap();
    assert!(p.inline_keys());
    let slots = p.memory().slots;
    for k in 0..KEYS {
        assert!(p.reserve_n_at(&k, 1, 0).is_ok(), "key {k} admitted");
    }
    assert!(p.memory().slots > slots, "the table grew");
    for k in 0..KEYS {
        assert!(
            p.reserve_n_at(&k, 1, 0).is_err(),
            "key {k} is found after the migrations, drained"
        );
    }
    assert_eq!(p.len(), KEYS as usize, "one row per key");
    p.sweep_at(10_000_000_000);
    assert_eq!(p.len(), 0, "a sweep finds and removes every row");

    let p: Pace<pace::IpPrefix, RandomState, ManualClock> = Pace::builder(rate())
        .capacity(1)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let net = |k: u64| pace::IpPrefix::from(std::net::Ipv4Addr::from(k as u32));
    for k in 0..KEYS {
        assert!(p.reserve_n_at(&net(k), 1, 0).is_ok(), "net {k} admitted");
    }
    for k in 0..KEYS {
        assert!(
            p.reserve_n_at(&net(k), 1, 0).is_err(),
            "net {k} found, drained"
        );
    }
    assert_eq!(p.len(), KEYS as usize, "one row per net");
}
