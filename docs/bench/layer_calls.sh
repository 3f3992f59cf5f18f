#!/usr/bin/env bash
# Instructions a layer adds to a warm, admitted request (callgrind), against
# tower_governor in the same binary and run:
#
#   cargo build --release -p pace-tower --example layer_calls
#   bash docs/bench/layer_calls.sh 1|2 plain|fields
#   bash docs/bench/layer_calls.sh churn        # one limit, no fields, every
#                                               # peer's bucket full again
#   bash docs/bench/layer_calls.sh addr 1 plain # the peer-address limit
#                                               # keyed by IpAddr (boxed)
#   bash docs/bench/layer_calls.sh 2 inexact-plain   # two limits, the first
#                                               # not held (exact_refunds(false))
#   bash docs/bench/layer_calls.sh 2 refund-plain    # two limits, the second
#                                               # with refund_if (refund-fields too)
#
# `layer_calls mix` runs the bare service, PaceLayer and GovernorLayer in
# alternating slices of 32 requests, each through a function of its own
# that is never inlined (`via_bare`, `via_pace`, `via_governor`). A
# layer's cost is the inclusive count of its function minus the bare one's;
# two runs, of N1 and N2 requests, are subtracted, so that what every key's
# first request costs (its row, its dashmap entry) and the program's start
# cancel out: the figure is per warm request. Counts move by up to ~1% from
# one run to the next (the clock's readings steer rare paths).
set -euo pipefail
limits=${1:?usage: layer_calls.sh 1|2 plain|fields, or churn}
mix=mix
if [ "$limits" = churn ]; then
    mix=mix-churn limits=1
    set -- 1 plain
elif [ "$limits" = addr ]; then
    mix=mix-addr
    shift
    limits=${1:?usage: layer_calls.sh addr 1|2 plain|fields}
fi
mode=${2:?usage: layer_calls.sh 1|2 plain|fields, or churn}
bin=${BIN:-target/release/examples/layer_calls}
n1=${N1:-20000}
n2=${N2:-60000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in "$n1" "$n2"; do
    valgrind --tool=callgrind --callgrind-out-file="$tmp/out.$n" \
        "$bin" "$mix" "$limits" "$mode" "$n" >/dev/null 2>&1
    callgrind_annotate --threshold=100 --inclusive=yes "$tmp/out.$n" |
        sed -nE 's/^ *([0-9,]+) .*layer_calls::via_(bare|pace|governor).*/\2 \1/p' |
        tr -d , >"$tmp/sum.$n"
done
python3 - "$tmp/sum.$n1" "$tmp/sum.$n2" "$n1" "$n2" "$mix $limits $mode" <<'PY'
import sys
def load(path):
    return {k: int(v) for k, v in (line.split() for line in open(path))}
a, b = load(sys.argv[1]), load(sys.argv[2])
n = int(sys.argv[4]) - int(sys.argv[3])
per = {k: (b[k] - a[k]) / n for k in b}
p, g = per["pace"] - per["bare"], per["governor"] - per["bare"]
print(f"{sys.argv[5]}: PaceLayer {p:.1f}, GovernorLayer {g:.1f}, "
      f"pace / governor {p / g:.3f} (bare service {per['bare']:.1f})")
PY
