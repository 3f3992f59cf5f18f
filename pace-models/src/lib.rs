//! The exact sequential models `pace` is checked against. Test support, not
//! a public API.
//!
//! The rule: every exact model of the crate lives here, uses `pace` only
//! from the outside (its public API and `pace::internals`), and is
//! built only by what checks against it: the proptests in `tests/` (a
//! dev-dependency of `pace`), the fuzz targets in `fuzz/`, and its own
//! `pace-models/tests/` (the lease protocol's model). Nothing of it
//! is compiled into the `pace` library. (The loom models, which check
//! interleavings rather than outcomes, live in `loom-tests/`.)
//!
//! * [`debt`]: `Pace` as signed 128-bit "debt" per key, written from the
//!   rules in README's semantics table (`tests/model.rs`, fuzz targets
//!   `pace_model` and `table_model`).
//! * [`bound`]: the promise itself, as an exact integer check over every
//!   window of kept admissions (`tests/over_admission.rs`,
//!   `tests/exactness.rs`).
//! * [`gate`]: the gate as plain counters and handles, with a checker that
//!   drives the real `Gate` in lockstep (`tests/gate_model.rs`, fuzz target
//!   `gate_model`).
//! * [`leases`]: the lease protocol of a shared limit as an event model of
//!   one key, several replicas and a server, checked against [`bound`]
//!   over every window (`pace-models/tests/leases.rs`), with its
//!   known-wrong variants.
#![warn(missing_docs)]

pub mod bound;
pub mod debt;
pub mod gate;
pub mod leases;
