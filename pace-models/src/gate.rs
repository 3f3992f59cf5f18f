//! A sequential model of the gate and a checker that drives the real
//! [`Gate`] and the model in lockstep. Shared by the proptest
//! (`tests/gate_model.rs`) and the `gate_model` fuzz target, so both check
//! the same rules.

use std::io::{self, Read};
use std::time::Instant;

use pace::gate::{
    AdmitError, Body, BodyError, BytePermit, ConfigError, Gate, GateStats, Resource, ShrinkError,
    SlotPermit, Ticket,
};

/// A gate configuration as the fuzzer or proptest draws it (may be invalid).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Job slots.
    pub slots: u8,
    /// Byte budget.
    pub bytes: u64,
    /// Body cap; `None` leaves the builder's default (the budget).
    pub body_cap: Option<u64>,
}

/// One step. `idx` picks a live handle modulo their number; a step that
/// does not apply to the picked handle (or finds none) is a no-op in both.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `try_admit(declared)`.
    TryAdmit {
        /// Declared length.
        declared: Option<u64>,
    },
    /// `admit(declared, deadline already passed)`: grants if it fits now,
    /// otherwise times out (sequentially nobody else can release).
    Admit {
        /// Declared length.
        declared: Option<u64>,
    },
    /// Split a ticket into its slot and byte permits.
    Split {
        /// Handle index.
        idx: usize,
    },
    /// Shrink a ticket's or byte permit's share.
    Shrink {
        /// Handle index.
        idx: usize,
        /// New size (may be too big: then a `ShrinkError`).
        to: u64,
    },
    /// Read a body of `len` bytes (taken modulo `share + 2`, so both fitting
    /// and over-long bodies occur) under a byte permit.
    ReadBody {
        /// Handle index.
        idx: usize,
        /// Body length before the modulo.
        len: u64,
    },
    /// Drop a handle.
    Drop {
        /// Handle index.
        idx: usize,
    },
}

/// The model's view of one handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ticket { bytes: u64 },
    Slot,
    Bytes { bytes: u64 },
    Body { bytes: u64 },
}

impl Kind {
    fn slots(self) -> usize {
        match self {
            Kind::Ticket { .. } | Kind::Slot => 1,
            _ => 0,
        }
    }
    fn bytes(self) -> u64 {
        match self {
            Kind::Ticket { bytes } | Kind::Bytes { bytes } | Kind::Body { bytes } => bytes,
            Kind::Slot => 0,
        }
    }
}

/// The real handles; the permits inside are held for their `Drop`.
#[allow(dead_code)]
enum Real {
    Ticket(Ticket),
    Slot(SlotPermit),
    Bytes(BytePermit),
    Body(Body),
}

/// The sequential model: a list of handles and the counters they imply.
#[derive(Debug)]
struct Model {
    slots_cap: usize,
    bytes_cap: u64,
    body_cap: u64,
    handles: Vec<Kind>,
    peak_slots: usize,
    peak_bytes: u64,
    saturated_slots: u64,
    saturated_bytes: u64,
    timed_out: u64,
    too_large: u64,
}

impl Model {
    fn slots_held(&self) -> usize {
        self.handles.iter().map(|k| k.slots()).sum()
    }
    fn bytes_held(&self) -> u64 {
        self.handles.iter().map(|k| k.bytes()).sum()
    }

    fn admit(&mut self, declared: Option<u64>) -> Result<u64, AdmitError> {
        let want = declared.unwrap_or(self.body_cap);
        if want > self.body_cap {
            self.too_large += 1;
            return Err(AdmitError::TooLarge {
                declared: want,
                body_cap: self.body_cap,
            });
        }
        let short = if self.slots_held() >= self.slots_cap {
            Some(Resource::Slots)
        } else if want > self.bytes_cap - self.bytes_held() {
            Some(Resource::Bytes)
        } else {
            None
        };
        match short {
            Some(resource) => {
                match resource {
                    Resource::Slots => self.saturated_slots += 1,
                    Resource::Bytes => self.saturated_bytes += 1,
                }
                Err(AdmitError::Saturated { resource })
            }
            None => {
                self.handles.push(Kind::Ticket { bytes: want });
                self.peak_slots = self.peak_slots.max(self.slots_held());
                self.peak_bytes = self.peak_bytes.max(self.bytes_held());
                Ok(want)
            }
        }
    }

    fn stats(&self) -> GateStats {
        GateStats {
            slots_held: self.slots_held(),
            bytes_held: self.bytes_held(),
            peak_slots: self.peak_slots,
            peak_bytes: self.peak_bytes,
            saturated_slots: self.saturated_slots,
            saturated_bytes: self.saturated_bytes,
            timed_out: self.timed_out,
            cancelled: 0,
            too_large: self.too_large,
            waiting: 0,
        }
    }
}

/// What the builder must answer for `config`.
pub fn expected_config(config: Config) -> Result<(), ConfigError> {
    let cap = config.body_cap.unwrap_or(config.bytes);
    if config.slots == 0 {
        Err(ConfigError::ZeroSlots)
    } else if config.bytes == 0 {
        Err(ConfigError::ZeroBytes)
    } else if cap == 0 {
        Err(ConfigError::ZeroBodyCap)
    } else if cap > config.bytes {
        Err(ConfigError::BodyCapOverBudget {
            body_cap: cap,
            bytes: config.bytes,
        })
    } else {
        Ok(())
    }
}

/// Build a gate from `config`, run `ops` against it and the model, and
/// compare every outcome and every counter after every step; finally drop
/// everything and check that the counters return to zero.
///
/// # Errors
/// A description of the first divergence.
pub fn check(config: Config, ops: &[Op]) -> Result<(), String> {
    let mut b = Gate::builder()
        .slots(usize::from(config.slots))
        .bytes(config.bytes);
    if let Some(cap) = config.body_cap {
        b = b.body_cap(cap);
    }
    let built = b.build();
    let gate = match (built, expected_config(config)) {
        (Ok(g), Ok(())) => g,
        (Err(e), Err(m)) if e == m => return Ok(()),
        (got, want) => {
            return Err(format!(
                "config {config:?}: built {:?}, model {want:?}",
                got.map(|_| ())
            ))
        }
    };
    let mut m = Model {
        slots_cap: gate.slots(),
        bytes_cap: gate.bytes(),
        body_cap: gate.body_cap(),
        handles: Vec::new(),
        peak_slots: 0,
        peak_bytes: 0,
        saturated_slots: 0,
        saturated_bytes: 0,
        timed_out: 0,
        too_large: 0,
    };
    let mut real: Vec<Real> = Vec::new();
    for (step, &op) in ops.iter().enumerate() {
        apply(&gate, &mut m, &mut real, op).map_err(|e| format!("step {step} {op:?}: {e}"))?;
        let (got, want) = (gate.stats(), m.stats());
        if got != want {
            return Err(format!("step {step} {op:?}: stats {got:?}, model {want:?}"));
        }
        if got.slots_held > m.slots_cap || got.bytes_held > m.bytes_cap {
            return Err(format!("step {step}: over capacity {got:?}"));
        }
    }
    drop(real);
    let end = gate.stats();
    if end.slots_held != 0 || end.bytes_held != 0 || end.waiting != 0 {
        return Err(format!("leak after dropping every handle: {end:?}"));
    }
    Ok(())
}

fn apply(gate: &Gate, m: &mut Model, real: &mut Vec<Real>, op: Op) -> Result<(), String> {
    let pick = |idx: usize, n: usize| if n == 0 { None } else { Some(idx % n) };
    match op {
        Op::TryAdmit { declared } | Op::Admit { declared } => {
            let got = match op {
                Op::TryAdmit { .. } => gate.try_admit(declared),
                _ => gate.admit(declared, Instant::now()),
            };
            let mut want = m.admit(declared);
            if let (Op::Admit { .. }, Err(AdmitError::Saturated { resource })) = (op, want) {
                m.timed_out += 1;
                want = Err(AdmitError::TimedOut { resource });
            }
            match (got, want) {
                (Ok(t), Ok(bytes)) if t.reserved_bytes() == bytes => real.push(Real::Ticket(t)),
                (Err(e), Err(w)) if e == w => {}
                (got, want) => return Err(format!("got {got:?}, model {want:?}")),
            }
        }
        Op::Split { idx } => {
            let Some(i) = pick(idx, real.len()) else {
                return Ok(());
            };
            if let Kind::Ticket { bytes } = m.handles[i] {
                let Real::Ticket(t) = real.swap_remove(i) else {
                    return Err("handle kinds diverged".into());
                };
                m.handles.swap_remove(i);
                let (s, b) = t.split();
                real.push(Real::Slot(s));
                real.push(Real::Bytes(b));
                m.handles.push(Kind::Slot);
                m.handles.push(Kind::Bytes { bytes });
            }
        }
        Op::Shrink { idx, to } => {
            let Some(i) = pick(idx, real.len()) else {
                return Ok(());
            };
            let got = match &mut real[i] {
                Real::Ticket(t) => t.shrink_to(to),
                Real::Bytes(p) => p.shrink_to(to),
                _ => return Ok(()),
            };
            let held = m.handles[i].bytes();
            let want = if to > held {
                Err(ShrinkError {
                    requested: to,
                    held,
                })
            } else {
                m.handles[i] = match m.handles[i] {
                    Kind::Ticket { .. } => Kind::Ticket { bytes: to },
                    _ => Kind::Bytes { bytes: to },
                };
                Ok(held - to)
            };
            if got != want {
                return Err(format!("got {got:?}, model {want:?}"));
            }
        }
        Op::ReadBody { idx, len } => {
            let Some(i) = pick(idx, real.len()) else {
                return Ok(());
            };
            let Kind::Bytes { bytes } = m.handles[i] else {
                return Ok(());
            };
            // Bodies stay small: the share itself can be huge (fuzzed).
            let len = len % (bytes.min(4096) + 2);
            let Real::Bytes(p) = real.swap_remove(i) else {
                return Err("handle kinds diverged".into());
            };
            m.handles.swap_remove(i);
            let got = p.read_body(io::repeat(0xA5).take(len));
            match got {
                Ok(body) if len <= bytes => {
                    if body.len() as u64 != len || body.charged() != len {
                        return Err(format!(
                            "body of {len}: read {} charged {}",
                            body.len(),
                            body.charged()
                        ));
                    }
                    if body.iter().any(|&x| x != 0xA5) {
                        return Err("body content corrupted".into());
                    }
                    real.push(Real::Body(body));
                    m.handles.push(Kind::Body { bytes: len });
                }
                Err(BodyError::TooLong { limit }) if len > bytes && limit == bytes => {}
                other => return Err(format!("body of {len} under {bytes}: {other:?}")),
            }
        }
        Op::Drop { idx } => {
            if let Some(i) = pick(idx, real.len()) {
                drop(real.swap_remove(i));
                m.handles.swap_remove(i);
            }
        }
    }
    Ok(())
}
