//! The table for word-sized keys: rows live in 16-byte cells of the array
//! (`docs/cells.md`). Work in progress: not yet used by `Pace`.
#![allow(dead_code)]

mod cell;
