//! Known-wrong variants for the verification suites (`.ci/suites/`), as the
//! core crate's build script: `PACE_MUTANT="a,b"` builds this crate with
//! `cfg(pace_mutant = "a")` and `cfg(pace_mutant = "b")`; unset or empty
//! (every normal build), no cfg at all. Only this crate, the core and the
//! tests rebuild when the mutant changes, not every dependency.
//!
//! The script's variants are patch files, `mutants/<name>.patch`: the
//! script the crate embeds is `src/pace.lua` copied to `OUT_DIR`, with the
//! patch of each name in `PACE_MUTANT` that has one applied (by `patch`;
//! a patch that does not apply fails the build, so a variant cannot go
//! stale silently). The working tree is never changed.
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=PACE_MUTANT");
    println!("cargo::rerun-if-changed=src/pace.lua");
    // (A path that does not exist, as in a package without the patches,
    // would rerun this script on every build.)
    if Path::new("mutants").is_dir() {
        println!("cargo::rerun-if-changed=mutants");
    }
    let mutants = std::env::var("PACE_MUTANT").unwrap_or_default();
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let script = Path::new(&out).join("pace.lua");
    std::fs::copy("src/pace.lua", &script).expect("src/pace.lua is readable");
    for name in mutants.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        println!("cargo::rustc-cfg=pace_mutant=\"{name}\"");
        let patch = Path::new("mutants").join(format!("{name}.patch"));
        if patch.exists() {
            let status = Command::new("patch")
                .arg("--silent")
                .arg("--forward")
                .arg(&script)
                .arg(&patch)
                .status()
                .expect("`patch` runs");
            assert!(
                status.success(),
                "{} does not apply to src/pace.lua",
                patch.display()
            );
        }
    }
}
