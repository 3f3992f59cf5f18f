//! Known-wrong variants of the lease model (`src/leases.rs`) for
//! `.ci/suites/15-mutants.sh`, as pace-redis's build script:
//! `PACE_MUTANT="a,b"` builds this crate with `cfg(pace_mutant = "a")` and
//! `cfg(pace_mutant = "b")`; unset or empty (every normal build), no cfg.
fn main() {
    println!("cargo::rerun-if-env-changed=PACE_MUTANT");
    let mutants = std::env::var("PACE_MUTANT").unwrap_or_default();
    for name in mutants.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        println!("cargo::rustc-cfg=pace_mutant=\"{name}\"");
    }
}
