#!/usr/bin/env bash
# Not part of CI: runs one half of the Miri stress test (30-miri.sh a|b) on a
# given Miri schedule seed, with crossbeam-epoch pinning as its x86 build
# does, to tell a data-race report of the table from one of the collector's
# pin as Miri builds it (DESIGN.md §9).
#
#   bash .ci/miri-x86-pin.sh a|b SEED [stock]
#
# crossbeam-epoch pins with a SeqCst compare-exchange on x86, but with a
# relaxed store and a SeqCst fence under Miri. This script copies the
# crossbeam-epoch that Cargo.lock names, makes its pin take the x86 branch
# under Miri too, and runs HEAD's sources (a `git archive`, so the checkout
# and its Cargo.lock are untouched) patched to that copy, with 30-miri.sh's
# flags. With `stock` it runs the same copy of HEAD without the patch, for
# the comparison on the same seed.
set -euo pipefail
half=${1:?usage: miri-x86-pin.sh a|b SEED [stock]}
seed=${2:?usage: miri-x86-pin.sh a|b SEED [stock]}
mode=${3:-x86}
case "$half" in
a) test=effective_exchanges_never_exceed_capacity_plus_rate_times_elapsed ;;
b) test=effective_exchanges_fit_the_bound_with_other_seeds ;;
*) echo "usage: $0 a|b SEED [stock]" >&2; exit 2 ;;
esac
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=${MIRI_X86_PIN_DIR:-${TMPDIR:-/tmp}/pace-miri-x86-pin}
mkdir -p "$work"
rm -rf "$work/pace"
mkdir "$work/pace"
git -C "$root" archive HEAD | tar -x -C "$work/pace"
if [ "$mode" != stock ]; then
    manifest=$(cargo metadata --format-version 1 --manifest-path "$root/Cargo.toml" |
        python3 -c 'import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == "crossbeam-epoch"))')
    rm -rf "$work/crossbeam-epoch"
    cp -r "$(dirname "$manifest")" "$work/crossbeam-epoch"
    python3 - "$work/crossbeam-epoch/src/internal.rs" <<'PY'
import re, sys
path = sys.argv[1]
src = open(path).read()
# The pin's branch: `if cfg!(all(any(target_arch = "x86", ...), not(miri)))`.
new, n = re.subn(r'if cfg!\(all\(\s*any\(target_arch = "x86", target_arch = "x86_64"\),\s*not\(miri\)\s*\)\)',
                 'if cfg!(any(target_arch = "x86", target_arch = "x86_64"))', src)
if n != 1:
    sys.exit("crossbeam-epoch's pin branch not found: this script knows 0.9's")
open(path, "w").write(new)
PY
    printf '\n[patch.crates-io]\ncrossbeam-epoch = { path = "%s" }\n' \
        "$work/crossbeam-epoch" >>"$work/pace/Cargo.toml"
fi
cd "$work/pace"
export CARGO_TARGET_DIR="$work/target-$mode"
export MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-ignore-leaks -Zmiri-seed=$seed"
cargo +nightly miri test -p pace --no-default-features --test stress -- --exact "$test"
