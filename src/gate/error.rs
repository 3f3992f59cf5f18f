//! The gate's errors and the [`Resource`] a refusal names.

use std::fmt;
use std::io;

#[cfg(doc)]
use super::{BytePermit, Gate};

/// Which of the gate's two resources ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// All `N` job slots are held.
    Slots,
    /// The byte budget `B` cannot hold the requested share.
    Bytes,
}

impl Resource {
    pub(super) fn code(self) -> usize {
        match self {
            Resource::Slots => 0,
            Resource::Bytes => 1,
        }
    }

    pub(super) fn from_code(code: usize) -> Resource {
        if code == 1 {
            Resource::Bytes
        } else {
            Resource::Slots
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Slots => "job slots",
            Resource::Bytes => "byte budget",
        })
    }
}

/// A gate configuration that cannot work.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `slots(0)`: nothing could ever be admitted.
    ZeroSlots,
    /// `bytes(0)`: no body could ever be reserved.
    ZeroBytes,
    /// `body_cap(0)`: every body with content would be refused.
    ZeroBodyCap,
    /// A body the cap allows could never fit in the budget, so a waiting
    /// [`Gate::admit`] could wait forever.
    BodyCapOverBudget {
        /// The requested cap on one body.
        body_cap: u64,
        /// The whole byte budget.
        bytes: u64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroSlots => f.write_str("a gate needs at least one job slot"),
            ConfigError::ZeroBytes => f.write_str("a gate needs a byte budget above zero"),
            ConfigError::ZeroBodyCap => f.write_str("a gate needs a body cap above zero"),
            ConfigError::BodyCapOverBudget { body_cap, bytes } => write!(
                f,
                "body cap {body_cap} exceeds the whole byte budget {bytes}"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why an admission was refused. Nothing is held after any of these.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmitError {
    /// [`Gate::try_admit`]: the resource is exhausted now (or is owed to
    /// callers already waiting in [`Gate::admit`], in which case `resource`
    /// is what the first of them lacks).
    Saturated {
        /// What ran out.
        resource: Resource,
    },
    /// [`Gate::admit`]: the deadline passed before capacity was granted.
    TimedOut {
        /// What was still short when the caller gave up (for a caller that
        /// was not first in line: what the first one lacked).
        resource: Resource,
    },
    /// [`Gate::admit_cancellable`]: the caller cancelled while waiting.
    Cancelled {
        /// What was still short when the caller cancelled.
        resource: Resource,
    },
    /// The declared length is over the gate's body cap (and so possibly over
    /// the budget, or `u64::MAX`). Waiting would not help.
    TooLarge {
        /// The declared body length.
        declared: u64,
        /// The gate's cap on one body.
        body_cap: u64,
    },
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmitError::Saturated { resource } => write!(f, "saturated: no free {resource}"),
            AdmitError::TimedOut { resource } => {
                write!(f, "deadline passed while waiting for {resource}")
            }
            AdmitError::Cancelled { resource } => {
                write!(f, "cancelled while waiting for {resource}")
            }
            AdmitError::TooLarge { declared, body_cap } => write!(
                f,
                "declared body length {declared} exceeds the body cap {body_cap}"
            ),
        }
    }
}

impl std::error::Error for AdmitError {}

/// [`BytePermit::shrink_to`] was asked to grow the share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShrinkError {
    /// The size asked for.
    pub requested: u64,
    /// The share currently held (unchanged).
    pub held: u64,
}

impl fmt::Display for ShrinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot shrink a byte share of {} to {} (a permit never grows)",
            self.held, self.requested
        )
    }
}

impl std::error::Error for ShrinkError {}

/// Reading a body under its byte share failed; the share is released.
#[non_exhaustive]
#[derive(Debug)]
pub enum BodyError {
    /// The body went on past the reserved share. Reading stopped at the first
    /// byte over `limit`.
    TooLong {
        /// The reserved share the body exceeded.
        limit: u64,
    },
    /// The reader failed (or the buffer could not be allocated).
    Io(io::Error),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::TooLong { limit } => {
                write!(f, "body longer than its reserved {limit} bytes")
            }
            BodyError::Io(e) => write!(f, "reading the body failed: {e}"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::TooLong { .. } => None,
            BodyError::Io(e) => Some(e),
        }
    }
}
