#![cfg(loom)]
use loom::sync::Arc;
use pace::{Pace, Rate, StdClock};

#[test]
fn two_reservers_share_one_token() {
    loom::model(|| {
        let pace: Arc<Pace<u64, std::collections::hash_map::RandomState, StdClock>> = Arc::new(
            Pace::builder(Rate::per_second(1).unwrap())
                .clock(StdClock::new())
                .min_slots(4)
                .build()
                .unwrap(),
        );
        let p2 = pace.clone();
        let t = loom::thread::spawn(move || p2.reserve_n_at(&7, 1, 10).is_ok());
        let a = pace.reserve_n_at(&7, 1, 10).is_ok();
        let b = t.join().unwrap();
        assert_eq!(a as u32 + b as u32, 1);
    });
}
