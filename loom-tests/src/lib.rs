//! loom models of pace live in `tests/`; this crate only hosts them so that
//! the main crate's test suite never needs loom.
