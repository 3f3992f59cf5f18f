#!/usr/bin/env bash
# One full benchmark run: throughput (criterion), latency tails, memory;
# then the report (results.md, throughput.svg) with machine, date and load.
# Takes ~15 minutes on 2 cores. Usage: bash docs/bench/run.sh
# (PACE_BENCH_OUT=dir, PACE_BENCH_FILTER=regex, PACE_FLOOD, PACE_TAIL_SECS
# shorten a trial run.)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${PACE_BENCH_OUT:-docs/bench}
mkdir -p "$out"
log=$(mktemp)

{
    echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M')"
    echo "commit: $(git rev-parse --short HEAD)"
    echo "rustc: $(rustc --version)"
    echo "nproc: $(nproc)"
    lscpu | head -n 20
    echo "uptime before: $(uptime)"
} > "$out/machine.txt"

cargo bench -p pace-benches --all-features --no-run 2>&1 | tail -n 1
rm -rf target/criterion # results of this run only
cargo bench -p pace-benches --features foldhash --bench throughput -- ${PACE_BENCH_FILTER:-} 2>&1 | tee "$log" | grep -E '^\[pace-bench\]' | tee "$out/loads.txt"
echo "uptime after throughput: $(uptime)" >> "$out/machine.txt"
cargo bench -p pace-benches --bench tails 2>/dev/null | tee "$out/tails.md"
cargo bench -p pace-benches --bench memory 2>/dev/null | tee "$out/memory.md"
echo "uptime after all: $(uptime)" >> "$out/machine.txt"

readme=()
[ "$out" = docs/bench ] && readme=(--readme docs/bench/README.md)
python3 docs/bench/report.py --out "$out" --machine "$out/machine.txt" --loads "$out/loads.txt" \
    --memory "$out/memory.md" --extra "$out/tails.md" "$out/memory.md" "${readme[@]}"
rm -f "$log"
