//! The pin's shape alone, for `.ci/miri-x86-pin.sh litmus` (copied into the
//! crossbeam-epoch copy's examples, so it uses no code of this repository):
//! a reader pins, loads the current box and reads it (a plain read), then
//! unpins, over and over; a writer swaps in a new box, defers the old one's
//! free and flushes (each flush tries to advance the epoch and frees what is
//! two epochs old) as often. Under Miri, the collector orders its free after
//! the reader's read only through what it reads of the reader's epoch: the
//! release store of the unpin, or the relaxed store of the reader's next pin
//! (which carries the reader's clock only up to its last fence). A report
//! between the read and the free is the pin's: nothing else here orders them.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use crossbeam_epoch::{self as epoch, Atomic, Collector, Owned};

const ROUNDS: usize = 3;
const STEPS: usize = 400;

fn main() {
    for _ in 0..ROUNDS {
        let collector = Collector::new();
        let a = Arc::new(Atomic::new([1u64; 4]));
        let reader = {
            let (a, c) = (a.clone(), collector.clone());
            thread::spawn(move || {
                let handle = c.register();
                let mut sum = 0u64;
                for _ in 0..STEPS {
                    let guard = handle.pin();
                    let p = a.load(Ordering::Acquire, &guard);
                    // SAFETY: `p` was loaded under `guard`, which is alive.
                    sum = sum.wrapping_add(unsafe { p.deref() }[0]);
                }
                sum
            })
        };
        let writer = {
            let (a, c) = (a.clone(), collector.clone());
            thread::spawn(move || {
                let handle = c.register();
                for i in 0..STEPS {
                    let guard = handle.pin();
                    let old = a.swap(Owned::new([i as u64; 4]), Ordering::AcqRel, &guard);
                    // SAFETY: `old` is unlinked; readers reached it under a guard.
                    unsafe { guard.defer_destroy(old) };
                    guard.flush();
                }
            })
        };
        reader.join().unwrap();
        writer.join().unwrap();
        // SAFETY: both threads are gone.
        unsafe {
            drop(a.swap(epoch::Shared::null(), Ordering::AcqRel, epoch::unprotected()).into_owned());
        }
    }
}
