#!/usr/bin/env bash
# Mutation testing of the pure rules (the long form, run by hand or
# nightly, not by .ci/run: each mutant rebuilds the crate's unit tests, about
# 20-40 s on 2 cores, 85 mutants in all). cargo-mutants changes one
# operator, comparison, guard or return value of a function of src/rule.rs
# and src/bucket.rs at a time and runs the unit tests of the rules
# (`rule::tests`, `bucket::tests`); any mutant those tests miss fails the
# script. Its last result is in docs/testing.md ("Mutation testing of the
# rule").
#
#   bash .ci/mutants-rule.sh            # both files
#   bash .ci/mutants-rule.sh src/rule.rs
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-mutants >/dev/null; then
    cargo install cargo-mutants --locked
fi
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(src/rule.rs src/bucket.rs)
args=()
for f in "${files[@]}"; do args+=(-f "$f"); done
out=${MUTANTS_OUT:-target/mutants-rule}
mkdir -p "$out"
# `Limits::mixed` is built only for the known-wrong variant
# `quota_read_twice` (`cfg(pace_mutant)`): its two mutants change nothing a
# test build has, so they are missed and allowed (cargo-mutants'
# `--exclude-re` does not take out its field-deletion mutant).
status=0
cargo mutants "${args[@]}" -j 1 -o "$out" -- --lib -- rule:: bucket:: || status=$?
res="$out/mutants.out"
missed=$(grep -v 'in Limits::mixed\|Limits::mixed ->' "$res/missed.txt" || true)
timeouts=$(cat "$res/timeout.txt" 2>/dev/null || true)
if [ -n "$missed" ] || [ -n "$timeouts" ]; then
    echo "FAILED: mutants the rules' tests miss (or that time out):" >&2
    printf '%s\n' "$missed" "$timeouts" >&2
    exit 1
fi
echo "every mutant of ${files[*]} caught or unviable (cargo mutants exit $status, Limits::mixed's allowed)"
