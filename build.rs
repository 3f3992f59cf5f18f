//! Known-wrong variants for the verification suites (`.ci/suites/`).
//!
//! `PACE_MUTANT="a,b"` builds the crate with `cfg(pace_mutant = "a")` and
//! `cfg(pace_mutant = "b")`. Unset or empty (every normal build), it emits no
//! cfg at all. Taking the names from an environment variable rather than from
//! RUSTFLAGS rebuilds only this crate when the mutant changes, not every
//! dependency. loom-tests uses this same script.
fn main() {
    println!("cargo::rerun-if-env-changed=PACE_MUTANT");
    let mutants = std::env::var("PACE_MUTANT").unwrap_or_default();
    for name in mutants.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        println!("cargo::rustc-cfg=pace_mutant=\"{name}\"");
    }
}
