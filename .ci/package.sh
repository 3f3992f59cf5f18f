#!/usr/bin/env bash
# The packaging check: what `cargo publish` would upload for the three
# published crates (in publish order: pace, pace-redis, pace-tower), built
# from the packages alone, as crates.io would get them.
#
# 1. Each package holds only what builds from it: its library, build script
#    and documents, no tests, examples, benchmarks, CI scripts or bench data
#    (most tests need the unpublished `pace-models` or `pace::internals`,
#    which a path-only dev-dependency turns on; the package drops both).
# 2. `cargo publish --dry-run` packs all three and builds each from its
#    package, against the others' packages (not the workspace's sources).
#
# Needs crates.io's index (the registry). .ci/checks.sh runs it after the
# docs; its build goes to target/package.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
crates=(pace pace-redis pace-tower)

status=0
for c in "${crates[@]}"; do
    list=$(cargo package --list --allow-dirty -p "$c" 2>/dev/null)
    # Paths relative to the package's root.
    if bad=$(grep -E '^(tests|benches|examples|fuzz|\.ci|docs/bench|proptest-regressions)/|^target/' <<<"$list"); then
        echo "FAILED: the package of $c holds files that do not build from it:" >&2
        echo "$bad" >&2
        status=1
    fi
    if ! grep -qx 'src/lib.rs' <<<"$list"; then
        echo "FAILED: the package of $c has no src/lib.rs" >&2
        status=1
    fi
    printf '%s: %s files\n' "$c" "$(wc -l <<<"$list")"
done
[ "$status" -eq 0 ] || exit 1

# The dry run builds each package against the others' from a local
# registry under target/package, whose crates cargo unpacks into
# CARGO_HOME/registry/src by registry path, name and version. An unpacked
# directory of the same name and version is reused whatever it holds, so a
# clone at the path of an earlier one would build against that run's
# sources: remove every unpacked copy of these crates first (they exist on
# no other registry).
version=$(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["pace"])')
for c in "${crates[@]}"; do
    rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$c-$version"
done

args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
cargo publish --dry-run --allow-dirty "${args[@]}"
