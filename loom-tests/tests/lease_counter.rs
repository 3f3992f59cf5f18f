//! loom models of a lease's local counter (`pace-redis/src/lease_counter.rs`,
//! included here as it is; DESIGN.md §11): reserves racing a renewal that
//! reports, a strand that replaces the lease, and refunds. Each model
//! checks one of the three properties the counter keeps:
//!
//! * `tokens_of_a_new_lease_are_used_after_its_grant`: a reserve's clock
//!   reading follows its load of the word (the variant
//!   `lease_clock_before_word` reads it before);
//! * `no_kept_count_crosses_to_a_new_lease`: a strand leaves nothing fresh
//!   for the new lease's report (`lease_fresh_across_leases`);
//! * `a_reported_token_is_never_refunded_to_the_pool`: a refund after a
//!   report leaves its token kept (`lease_refund_reported`);
//! * `a_released_token_is_never_taken`: a release racing a reserve.
//!
//! Run: RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom \
//!      cargo test -p loom-tests --release --test lease_counter
#![cfg(loom)]
#![allow(dead_code)]

#[path = "../../pace-redis/src/lease_counter.rs"]
mod lease_counter;

use lease_counter::{Counter, Word};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

fn counter(generation: u64, pool: u64, deadline: u64) -> Counter {
    let c = Counter::default();
    c.word.store(
        Word {
            generation,
            pool,
            fresh: 0,
        }
        .pack(),
        Ordering::Relaxed,
    );
    c.deadline.store(deadline, Ordering::Relaxed);
    c
}

/// Lease 1 (generation 0, 2 tokens, deadline 10) is found settled at time
/// 5: the renewer strands it, time moves to 20, and lease 2 is granted 2
/// tokens until 30. A reserve racing it takes a token of lease 1 only
/// with a reading before 10, and one of lease 2 only with a reading at or
/// after its grant (20).
fn new_lease_model() {
    loom::model(|| {
        let c = Arc::new(counter(0, 2, 10));
        let clock = Arc::new(AtomicU64::new(5));
        let renewer = {
            let (c, clock) = (Arc::clone(&c), Arc::clone(&clock));
            thread::spawn(move || {
                c.strand();
                clock.store(20, Ordering::SeqCst);
                c.grant(2, 30);
            })
        };
        let took = c.take(1, || clock.load(Ordering::SeqCst));
        renewer.join().unwrap();
        if let Some((generation, at)) = took {
            if generation == 0 {
                assert!(
                    at < 10,
                    "a token of lease 1 used at {at}, past its deadline"
                );
            } else {
                assert!(
                    at >= 20,
                    "a token of lease 2 used at {at}, before its grant at 20"
                );
            }
        }
    });
}

#[test]
fn tokens_of_a_new_lease_are_used_after_its_grant() {
    new_lease_model();
}

#[test]
fn mutant_lease_clock_before_word() {
    new_lease_model();
}

/// A reserve takes a token of lease 1 while the renewer strands it and
/// reports for lease 2: the report counts nothing of lease 1.
fn cross_model() {
    loom::model(|| {
        let c = Arc::new(counter(0, 2, 10));
        let renewer = {
            let c = Arc::clone(&c);
            thread::spawn(move || {
                c.strand();
                c.report()
            })
        };
        let _ = c.take(1, || 5);
        let reported = renewer.join().unwrap();
        assert_eq!(reported, 0, "lease 2 reported a token of lease 1");
    });
}

#[test]
fn no_kept_count_crosses_to_a_new_lease() {
    cross_model();
}

#[test]
fn mutant_lease_fresh_across_leases() {
    cross_model();
}

/// A reserve of one token refunded while a renewal reports: the token is
/// either reported kept (and stays out of the pool) or back in the pool
/// unreported, never both; nothing is lost.
fn refund_model() {
    loom::model(|| {
        let c = Arc::new(counter(0, 2, 10));
        let renewer = {
            let c = Arc::clone(&c);
            thread::spawn(move || c.report())
        };
        let (generation, _) = c.take(1, || 5).expect("a token in the pool");
        let back = c.give_back(generation, 1);
        let reported = renewer.join().unwrap();
        let w = Word::unpack(c.word.load(Ordering::SeqCst));
        let kept = reported + w.fresh;
        assert_eq!(
            kept + u64::from(back),
            1,
            "the token is kept {kept} times and refunded {back}"
        );
        assert_eq!(w.pool, 1 + u64::from(back), "the pool holds {}", w.pool);
    });
}

#[test]
fn a_reported_token_is_never_refunded_to_the_pool() {
    refund_model();
}

#[test]
fn mutant_lease_refund_reported() {
    refund_model();
}

/// A release (the pool drained, nothing fresh left) racing a reserve: the
/// reserve's token is reported kept, or it took none; a released token is
/// never taken, and none is lost.
#[test]
fn a_released_token_is_never_taken() {
    loom::model(|| {
        let c = Arc::new(counter(0, 2, 10));
        let releaser = {
            let c = Arc::clone(&c);
            thread::spawn(move || c.drain())
        };
        let took = c.take(1, || 5).is_some();
        let (kept, released) = releaser.join().unwrap();
        let w = Word::unpack(c.word.load(Ordering::SeqCst));
        assert_eq!(kept + w.fresh, u64::from(took), "kept {kept} + {}", w.fresh);
        assert_eq!(kept + w.fresh + released + w.pool, 2, "tokens lost");
        assert_eq!(released + w.pool + u64::from(took), 2);
    });
}
