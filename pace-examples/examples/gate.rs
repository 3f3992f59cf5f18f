//! A worker pool of 4 behind a queue of 8, admitted through a `pace::Gate`
//! of 12 slots and a byte budget.
//!
//! Callers reserve a slot and a byte share before their body is read, hand
//! the job to the queue, and wait for the reply until their own deadline.
//! When a caller gives up, nothing is released: the worker still holds the
//! slot and the buffer, and the gate keeps counting both until the worker
//! drops them.
//!
//! Run: `cargo run --example gate`

use std::io::{self, Read};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use pace::gate::{AdmitError, Body, Gate, SlotPermit};

struct Job {
    id: usize,
    slot: SlotPermit,
    body: Body,
    reply: mpsc::Sender<usize>,
}

const WORKERS: usize = 4;
const QUEUE: usize = 8;
const BODY_CAP: u64 = 64 * 1024;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gate = Gate::builder()
        .slots(WORKERS + QUEUE)
        .bytes(160 * 1024)
        .body_cap(BODY_CAP)
        .build()?;

    let (queue_tx, queue_rx) = mpsc::sync_channel::<Job>(QUEUE);
    let queue_rx = Arc::new(Mutex::new(queue_rx));
    // The workers are slow: each job takes 40 ms, so callers with a 2 ms
    // deadline give up while their job is still queued or running, and the
    // gate fills up.
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let rx = queue_rx.clone();
            thread::spawn(move || loop {
                let Ok(job) = rx
                    .lock()
                    .map_err(|_| ())
                    .and_then(|rx| rx.recv().map_err(|_| ()))
                else {
                    return;
                };
                thread::sleep(Duration::from_millis(40));
                let checksum = job.body.iter().map(|&b| b as usize).sum::<usize>();
                drop(job.body); // last use of the buffer: its bytes go back now
                                // The caller may be gone: then `send` hands the reply back and
                                // it is dropped here, holding nothing.
                let _ = job.reply.send(checksum + job.id);
                drop(job.slot); // end of the job
            })
        })
        .collect();

    for id in 0..30 {
        // Interactive caller: an answer now or a refusal now.
        let declared = if id % 3 == 0 { None } else { Some(16 * 1024) };
        let ticket = match gate.try_admit(declared) {
            Ok(t) => t,
            Err(AdmitError::Saturated { resource }) => {
                println!("job {id:2}: refused at once, {resource} exhausted");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let (slot, bytes) = ticket.split();
        // The body is read under its share; the share shrinks to its size.
        let body = bytes.read_body(io::repeat(1).take(10 * 1024))?;
        let (reply_tx, reply_rx) = mpsc::channel();
        queue_tx.send(Job {
            id,
            slot,
            body,
            reply: reply_tx,
        })?;
        match reply_rx.recv_timeout(Duration::from_millis(2)) {
            Ok(r) => println!("job {id:2}: reply {r}"),
            Err(_) => {
                let s = gate.stats();
                println!(
                    "job {id:2}: caller gave up; gate still holds {} slots, {} bytes",
                    s.slots_held, s.bytes_held
                );
            }
        }
    }

    // Batch caller: waits for capacity until its own deadline, in turn.
    let deadline = Instant::now() + Duration::from_secs(2);
    let t = gate.admit(Some(BODY_CAP), deadline)?;
    println!(
        "batch job admitted with {} bytes reserved",
        t.reserved_bytes()
    );
    drop(t);

    drop(queue_tx);
    for w in workers {
        let _ = w.join();
    }
    let s = gate.stats();
    println!("{s:#?}");
    assert_eq!((s.slots_held, s.bytes_held), (0, 0));
    Ok(())
}
