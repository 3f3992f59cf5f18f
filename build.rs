//! Known-wrong variants for the verification suites (`.ci/suites/`).
//!
//! `PACE_MUTANT="a,b"` builds the crate with `cfg(pace_mutant = "a")` and
//! `cfg(pace_mutant = "b")`. Unset or empty (every normal build), it emits no
//! cfg at all. Taking the names from an environment variable rather than from
//! RUSTFLAGS rebuilds only this crate when the mutant changes, not every
//! dependency. loom-tests uses this same script.
//!
//! The names are those of the registry, `src/mutants.rs`: they are declared
//! as the only values of `cfg(pace_mutant)`, so a variant in the sources that
//! the registry does not list is an unexpected cfg, and a name in
//! `PACE_MUTANT` that it does not list (another crate's) sets nothing here.
include!("src/mutants.rs");

fn main() {
    println!("cargo::rerun-if-env-changed=PACE_MUTANT");
    // `PACE_HOLD_RECORD=1` writes every held row to a record, never inline
    // (`src/table/held/inline.rs`, `Form`): the suites run the hold tests and
    // models both ways, so both forms stay proven.
    println!("cargo::rerun-if-env-changed=PACE_HOLD_RECORD");
    println!("cargo::rustc-check-cfg=cfg(pace_hold_record)");
    if std::env::var("PACE_HOLD_RECORD").is_ok_and(|v| v == "1") {
        println!("cargo::rustc-cfg=pace_hold_record");
    }
    // `PACE_FIXED_SIP=1` gives every limiter hashing with SipHash one fixed
    // key (`src/hasher.rs`), so that two builds compared instruction by
    // instruction (callgrind) place the same keys in the same cells. A
    // measuring aid only: with a known key, callers could choose keys that
    // collide.
    println!("cargo::rerun-if-env-changed=PACE_FIXED_SIP");
    println!("cargo::rustc-check-cfg=cfg(pace_fixed_sip)");
    if std::env::var("PACE_FIXED_SIP").is_ok_and(|v| v == "1") {
        println!("cargo::rustc-cfg=pace_fixed_sip");
    }
    // The registry beside this script: `src/mutants.rs` of the package that
    // runs it (the core), or of its parent directory (loom-tests, whose
    // `build` points here). A path that does not exist would rerun the
    // script, and rebuild its crate, on every build.
    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let own = dir.join("src/mutants.rs");
    let registry = if own.exists() {
        own
    } else {
        dir.join("../src/mutants.rs")
    };
    println!("cargo::rerun-if-changed={}", registry.display());
    let names: Vec<&str> = MUTANTS.iter().map(|(name, _, _)| *name).collect();
    // `none()`: a bare `cfg(not(pace_mutant))` (any mutant at all) too.
    let values: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    println!(
        "cargo::rustc-check-cfg=cfg(pace_mutant, values(none(), {}))",
        values.join(", ")
    );
    let mutants = std::env::var("PACE_MUTANT").unwrap_or_default();
    for name in mutants
        .split(',')
        .map(str::trim)
        .filter(|m| names.contains(m))
    {
        println!("cargo::rustc-cfg=pace_mutant=\"{name}\"");
    }
}
