//! RAII permits: a [`Ticket`] (one slot and a byte share), split into a
//! [`SlotPermit`] and a [`BytePermit`]; each gives back what it holds once.

use std::fmt;
use std::sync::Arc;

use super::state::Inner;
use super::{Gate, ShrinkError};

/// What a ticket or permit holds; dropping it gives that back, once.
pub(super) struct Hold {
    pub(super) gate: Arc<Inner>,
    pub(super) slots: usize,
    pub(super) bytes: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.gate.release(self.slots, self.bytes);
    }
}

impl Hold {
    pub(super) fn shrink_to(&mut self, to: u64) -> Result<u64, ShrinkError> {
        if to > self.bytes {
            return Err(ShrinkError {
                requested: to,
                held: self.bytes,
            });
        }
        let excess = self.bytes - to;
        self.bytes = to;
        self.return_excess(excess);
        Ok(excess)
    }

    #[cfg(not(pace_mutant = "gate_shrink_keeps_excess"))]
    fn return_excess(&self, excess: u64) {
        self.gate.release(0, excess);
    }

    /// Known-wrong variant for the models: the excess is never returned to
    /// the gate (and the permit no longer holds it either).
    #[cfg(pace_mutant = "gate_shrink_keeps_excess")]
    fn return_excess(&self, _excess: u64) {}
}

/// One admitted job: a slot and a byte share, released when dropped (or
/// [`split`](Ticket::split) to release them at different times).
#[must_use = "dropping a ticket releases its slot and bytes at once"]
pub struct Ticket(pub(super) Hold);

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("bytes", &self.0.bytes)
            .finish()
    }
}

impl Ticket {
    /// The byte share held.
    pub fn reserved_bytes(&self) -> u64 {
        self.0.bytes
    }

    /// Shrink the byte share to `to`, returning the excess to the gate now.
    /// Returns how many bytes were released.
    ///
    /// # Errors
    /// [`ShrinkError`] when `to` is above the share (nothing changes).
    pub fn shrink_to(&mut self, to: u64) -> Result<u64, ShrinkError> {
        self.0.shrink_to(to)
    }

    /// The slot (for the job) and the byte share (for the buffer).
    pub fn split(self) -> (SlotPermit, BytePermit) {
        let Ticket(mut slot) = self;
        let bytes = Hold {
            gate: Arc::clone(&slot.gate),
            slots: 0,
            bytes: slot.bytes,
        };
        slot.bytes = 0;
        (SlotPermit { _hold: slot }, BytePermit(bytes))
    }
}

/// One job slot; dropping it releases the slot (once).
#[must_use = "dropping a slot permit releases the slot at once"]
pub struct SlotPermit {
    _hold: Hold,
}

impl fmt::Debug for SlotPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SlotPermit")
    }
}

/// A byte share; dropping it releases what it still holds (once).
#[must_use = "dropping a byte permit releases its bytes at once"]
pub struct BytePermit(pub(super) Hold);

impl fmt::Debug for BytePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytePermit")
            .field("bytes", &self.0.bytes)
            .finish()
    }
}

impl BytePermit {
    /// The share held now.
    pub fn bytes(&self) -> u64 {
        self.0.bytes
    }

    /// Shrink the share to `to` bytes, returning the excess to the gate at
    /// once. Returns how many bytes were released.
    ///
    /// # Errors
    /// [`ShrinkError`] when `to` is above the share (nothing changes).
    pub fn shrink_to(&mut self, to: u64) -> Result<u64, ShrinkError> {
        self.0.shrink_to(to)
    }
}

impl Gate {
    pub(super) fn ticket(&self, bytes: u64) -> Ticket {
        Ticket(Hold {
            gate: Arc::clone(&self.inner),
            slots: 1,
            bytes,
        })
    }
}
