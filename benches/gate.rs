//! ns per `try_admit` + release of a `pace::Gate`, uncontended and with two
//! threads hammering the same gate.
//!
//! Run: `cargo bench -p pace-benches --bench gate -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pace::gate::Gate;

fn gate() -> Gate {
    // Never saturates: every admission succeeds, so this measures the
    // reserve + release path, not the refusal path.
    Gate::builder()
        .slots(1 << 20)
        .bytes(1 << 40)
        .body_cap(1 << 20)
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("gate");

    let g = gate();
    group.bench_function("try_admit+release/1 thread", |b| {
        b.iter(|| drop(black_box(g.try_admit(black_box(Some(4096))).unwrap())))
    });

    group.bench_function("try_admit(saturated)/1 thread", |b| {
        let full = Gate::builder().slots(1).bytes(1).build().unwrap();
        let _hold = full.try_admit(Some(1)).unwrap();
        b.iter(|| black_box(full.try_admit(black_box(Some(1)))).is_err())
    });

    // Two threads on one gate: the measured thread and a partner running the
    // same loop for the whole measurement. Each iteration's time is the
    // measured thread's, under contention on the same two counters.
    let g = gate();
    group.bench_function("try_admit+release/2 threads", |b| {
        b.iter_custom(|iters| {
            let stop = Arc::new(AtomicBool::new(false));
            let start = Arc::new(Barrier::new(2));
            let partner = {
                let (g, stop, start) = (g.clone(), stop.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        drop(black_box(g.try_admit(Some(4096)).unwrap()));
                    }
                })
            };
            start.wait();
            let t0 = Instant::now();
            for _ in 0..iters {
                drop(black_box(g.try_admit(black_box(Some(4096))).unwrap()));
            }
            let elapsed = t0.elapsed();
            stop.store(true, Ordering::Relaxed);
            partner.join().unwrap();
            elapsed
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
