//! `bytes::Bytes` integration: the byte share lives in the buffer's owner
//! and is released only when the last clone or slice is dropped.
#![cfg(feature = "bytes")]

use std::io::{self, Read};
use std::sync::mpsc;

use pace::gate::Gate;

/// The 200 MiB case of the design document, scaled down to 200 KiB: a short
/// slice keeps the whole buffer alive, so the whole buffer stays counted.
#[test]
fn short_slice_keeps_the_whole_buffer_counted() {
    const BIG: u64 = 200 * 1024;
    let g = Gate::builder()
        .slots(12)
        .bytes(211 * 1024)
        .body_cap(BIG)
        .build()
        .unwrap();
    // Eleven jobs of 1 KiB each, then the big one.
    let small: Vec<_> = (0..11).map(|_| g.try_admit(Some(1024)).unwrap()).collect();
    let (slot, bytes) = g.try_admit(None).unwrap().split();
    let body = bytes.read_body(io::repeat(0x5A).take(BIG)).unwrap();
    assert_eq!(body.charged(), BIG);
    let buf = body.into_bytes();
    assert_eq!(buf.len() as u64, BIG);

    let slice = buf.slice(10..26);
    let clone = buf.clone();
    drop(buf);
    drop(slot); // the job ended; its buffer did not
    assert_eq!(g.stats().bytes_held, 11 * 1024 + BIG, "clone + slice alive");
    drop(clone);
    assert_eq!(
        g.stats().bytes_held,
        11 * 1024 + BIG,
        "a 16-byte slice holds 200 KiB"
    );
    assert_eq!(&slice[..], &[0x5A; 16]);
    // Nothing else fits while the slice lives.
    assert!(g.try_admit(Some(1)).is_err());
    drop(slice);
    assert_eq!(g.stats().bytes_held, 11 * 1024);
    drop(small);
    let s = g.stats();
    assert_eq!((s.slots_held, s.bytes_held), (0, 0));
    assert_eq!(s.peak_bytes, 11 * 1024 + BIG);
}

/// A reply sent after the caller gave up is handed back by `send` and
/// dropped there: the payload is not held anywhere.
#[test]
fn late_reply_is_dropped_without_holding_its_payload() {
    let g = Gate::builder().slots(2).bytes(4096).build().unwrap();
    let (slot, bytes) = g.try_admit(Some(4096)).unwrap().split();
    let payload = bytes
        .read_body(io::repeat(1).take(4096))
        .unwrap()
        .into_bytes();
    let (tx, rx) = mpsc::sync_channel::<bytes::Bytes>(1);
    drop(rx); // the caller timed out
    assert_eq!(g.stats().bytes_held, 4096);
    let err = tx.send(payload).unwrap_err();
    assert_eq!(err.0.len(), 4096, "send hands the reply back to the worker");
    drop(err); // ...which drops it: no queue keeps it
    assert_eq!(g.stats().bytes_held, 0);
    drop(slot);
    assert_eq!(g.stats().slots_held, 0);
}
