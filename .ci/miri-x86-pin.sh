#!/usr/bin/env bash
# Runs one half of the Miri stress test (30-miri.sh a|b), crossbeam-epoch's
# own `sanitize` example, or the pin's litmus (.ci/miri-pin-litmus.rs: a
# reader and a writer on crossbeam-epoch alone), on given Miri schedule
# seeds, with crossbeam-epoch's
# pin as Miri builds it or changed, to tell a data-race report of the table
# from one of the collector's pin (DESIGN.md §9).
#
#   bash .ci/miri-x86-pin.sh a|b|sanitize|litmus SEEDS [stock|x86|release]
#
# SEEDS is one seed (`7`) or a range, its end excluded (`0..32`). Modes:
#   stock    crossbeam-epoch as Cargo.lock names it: under Miri its pin is a
#            relaxed store of the local epoch and a SeqCst fence;
#   x86      the pin's x86 branch under Miri too (a SeqCst compare-exchange):
#            another branch, so another schedule on the same seed;
#   release  (the default) Miri's branch kept, only that store made
#            `Release`: the same schedule on a seed but for the store's
#            ordering, so a report it loses is the pin's.
# The script copies the crossbeam-epoch that Cargo.lock names (every mode:
# stock too, so that the modes build the same sources), patches the copy,
# and runs HEAD's sources (a `git archive`, so the checkout and its
# Cargo.lock are untouched; with MIRI_PIN_SOURCE=worktree, the checkout's
# tracked files as they are, as CI runs it) patched to that copy, with
# 30-miri.sh's flags;
# `sanitize` runs the copy's example with 4 rounds instead of 100 (a round is
# 16 threads pinning, swapping and freeing); `litmus` copies
# .ci/miri-pin-litmus.rs into the copy's examples and runs it. Each seed prints one line: `ok`,
# or `REPORT` with the start of Miri's report. The exit status is 1 when any
# seed reported (or a half ran no test: a renamed test).
set -euo pipefail
usage="usage: miri-x86-pin.sh a|b|sanitize|litmus SEEDS [stock|x86|release]"
half=${1:?$usage}
seeds=${2:?$usage}
mode=${3:-release}
case "$half" in
a) test=effective_exchanges_never_exceed_capacity_plus_rate_times_elapsed ;;
b) test=effective_exchanges_fit_the_bound_with_other_seeds ;;
sanitize | litmus) test= ;;
*) echo "$usage" >&2; exit 2 ;;
esac
case "$mode" in
stock | x86 | release) ;;
*) echo "$usage" >&2; exit 2 ;;
esac
case "$seeds" in
*..*) first=${seeds%..*} end=${seeds#*..} ;;
*) first=$seeds end=$((seeds + 1)) ;;
esac
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
# One target directory per mode (the modes build different crossbeam-epochs),
# the sources per half too (runs of two halves in one mode may overlap).
work=${MIRI_X86_PIN_DIR:-${TMPDIR:-/tmp}/pace-miri-x86-pin}/$mode
src=$work/$half
mkdir -p "$src"
rm -rf "$src/pace" "$src/crossbeam-epoch"
mkdir "$src/pace"
if [ "${MIRI_PIN_SOURCE:-HEAD}" = worktree ]; then
    (cd "$root" && git ls-files -z | tar --null --ignore-failed-read -T - -cf -) | tar -x -C "$src/pace"
else
    git -C "$root" archive HEAD | tar -x -C "$src/pace"
fi
manifest=$(cargo metadata --format-version 1 --manifest-path "$root/Cargo.toml" |
    python3 -c 'import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == "crossbeam-epoch"))')
cp -r "$(dirname "$manifest")" "$src/crossbeam-epoch"
python3 - "$src/crossbeam-epoch" "$mode" <<'PY'
import re, sys
crate, mode = sys.argv[1], sys.argv[2]
path = crate + "/src/internal.rs"
src = open(path).read()
if mode == "x86":
    # The pin's branch: `if cfg!(all(any(target_arch = "x86", ...), not(miri)))`.
    src, n = re.subn(r'if cfg!\(all\(\s*any\(target_arch = "x86", target_arch = "x86_64"\),\s*not\(miri\)\s*\)\)',
                     'if cfg!(any(target_arch = "x86", target_arch = "x86_64"))', src)
elif mode == "release":
    # The store of Miri's branch of the pin (the only relaxed store of
    # `self.epoch`), then its SeqCst fence, unchanged.
    src, n = re.subn(r'self\.epoch\.store\(new_epoch, Ordering::Relaxed\);(\s*atomic::fence\(Ordering::SeqCst\);)',
                     r'self.epoch.store(new_epoch, Ordering::Release);\1', src)
else:
    n = 1
if n != 1:
    sys.exit("crossbeam-epoch's pin not found as 0.9 writes it")
open(path, "w").write(src)
example = crate + "/examples/sanitize.rs"
ex = open(example).read()
ex, n = re.subn(r'for _ in 0\.\.100 \{(\s*let collector)', r'for _ in 0..4 {\1', ex)
if n != 1:
    sys.exit("crossbeam-epoch's sanitize example not found as 0.9 writes it")
open(example, "w").write(ex)
PY
cp "$root/.ci/miri-pin-litmus.rs" "$src/crossbeam-epoch/examples/pin_litmus.rs"
printf '\n[[example]]\nname = "pin_litmus"\npath = "examples/pin_litmus.rs"\n' \
    >>"$src/crossbeam-epoch/Cargo.toml"
printf '\n[patch.crates-io]\ncrossbeam-epoch = { path = "%s" }\n' \
    "$src/crossbeam-epoch" >>"$src/pace/Cargo.toml"
flags="-Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-ignore-leaks"
if [ "$half" = sanitize ] || [ "$half" = litmus ]; then
    cd "$src/crossbeam-epoch"
    example=$half
    [ "$half" = sanitize ] || example=pin_litmus
    # The published crate's own lock file names its dev-dependencies.
    run() { cargo +nightly miri run --example "$example"; }
else
    cd "$src/pace"
    run() { cargo +nightly miri test -p pace --no-default-features --test stress -- --exact "$test"; }
fi
export CARGO_TARGET_DIR="$work/target"
reports=0
for ((seed = first; seed < end; seed++)); do
    log=$(mktemp)
    status=0
    MIRIFLAGS="$flags -Zmiri-seed=$seed" run >"$log" 2>&1 || status=$?
    if [ "$status" -eq 0 ] && { [ -z "$test" ] || grep -q "test $test ... ok" "$log"; }; then
        echo "$half $mode seed $seed: ok"
    elif [ "$status" -eq 0 ]; then
        reports=$((reports + 1))
        echo "$half $mode seed $seed: ran no test $test (renamed?)"
    else
        reports=$((reports + 1))
        echo "$half $mode seed $seed: REPORT $(grep -m1 -E '^error' "$log" || tail -1 "$log")"
        { grep -m1 -A24 -E '^error: Undefined Behavior' "$log" || tail -30 "$log"; } | sed 's/^/    /'
    fi
    rm -f "$log"
done
echo "$half $mode seeds $first..$end: $reports of $((end - first)) reported"
[ "$reports" -eq 0 ]
