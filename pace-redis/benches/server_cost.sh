#!/usr/bin/env bash
# The server's own cost per call of pace-redis's script (the configuration of
# benches/redis.rs: 1,000/s, capacity 1,000, one token, random keys among
# 10,000, mostly admitted) beside the plain GCRA script of benches/redis.rs,
# measured two ways:
#
#   bash pace-redis/benches/server_cost.sh usec [ROUNDS]
#       one redis-server with both scripts loaded; per round and script,
#       `redis-benchmark -r 10000 -n 100000 -c 4 -P 8 EVALSHA <sha> 1
#       <script>:__rand_int__` (plus `1000 1000` for the plain script) after a
#       `CONFIG RESETSTAT`, then `usec_per_call` of `INFO commandstats`;
#       rounds alternate the scripts (default 5). Wall time: noisy on a shared
#       machine.
#   bash pace-redis/benches/server_cost.sh instructions [CALLS]
#       per script, a redis-server under valgrind's callgrind runs CALLS
#       EVALSHAs (default 20,000) as above; instructions per call =
#       (its total - that of a server that ran none) / CALLS. Deterministic,
#       independent of the machine's load (needs valgrind).
#   bash pace-redis/benches/server_cost.sh client [CALLS]
#       the client's side: instructions per decision of benches/redis.rs's
#       process (one task, the bench's keys; pace-redis's limiter, the same
#       with leases (no key leased: the cold keys' cost), its script called
#       directly ("raw"), the plain script; `CONTENDERS="pace pace-leases"`
#       for some) under callgrind, from the
#       difference between runs of CALLS and 2 x CALLS decisions (default
#       5,000); the server runs outside valgrind. Builds the bench first.
#   bash pace-redis/benches/server_cost.sh holds [CALLS]
#       pace-redis's script only, instructions as above, for CALLS of each:
#       a reserve, a hold cycle (hold then its refund: two EVALSHAs) and a
#       hold kept (hold then keep), on random keys among 10,000, sent as one
#       stream through `redis-cli --pipe` (the same path for all three).
#   bash pace-redis/benches/server_cost.sh many [HOLDS...]
#       wall time of a peek of one key holding HOLDS holds each (default 1,
#       10, 100, 1000): `usec_per_call` of 2,000 peeks (redis-benchmark -c 1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{ echo "local INTERVAL, CAP = 1000000, 1000"; cat "$here/../src/pace.lua"; } >"$work/pace.lua"
# The plain script, as benches/redis.rs defines it.
sed -n '/^const PLAIN_GCRA: &str = r"$/,/^";$/p' "$here/redis.rs" | sed '1d;$d' >"$work/plain.lua"
[ -s "$work/plain.lua" ] || { echo "PLAIN_GCRA not found in redis.rs" >&2; exit 1; }

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 200); do redis-cli -p "$1" PING >/dev/null 2>&1 && return; sleep 0.1; done; exit 1; }
args() { [ "$1" = plain ] && echo "1000 1000" || true; }

mode=${1:-usec}
case $mode in
usec)
    rounds=${2:-5}
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    pid=$!
    trap 'kill $pid; rm -rf "$work"' EXIT
    wait_up "$port"
    declare -A sha
    for s in pace plain; do sha[$s]=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/$s.lua")"); done
    for r in $(seq "$rounds"); do
        line="round $r:"
        for s in pace plain; do
            redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
            # shellcheck disable=SC2046 # the plain script's two arguments
            redis-benchmark -p "$port" -r 10000 -n 100000 -c 4 -P 8 -q \
                EVALSHA "${sha[$s]}" 1 "$s:__rand_int__" $(args $s) >/dev/null
            u=$(redis-cli -p "$port" INFO commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
            line="$line $s=${u}us"
        done
        echo "$line"
    done
    ;;
instructions)
    calls=${2:-20000}
    total() { # SCRIPT CALLS: instructions of a server that ran CALLS of it
        local port out
        port=$(free_port)
        out="$work/cg.$1.$2"
        valgrind --tool=callgrind --callgrind-out-file="$out" \
            redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
        local vg=$!
        wait_up "$port"
        local sha
        sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/$1.lua")")
        if [ "$2" -gt 0 ]; then
            # shellcheck disable=SC2046
            redis-benchmark -p "$port" -r 10000 -n "$2" -c 4 -P 8 -q \
                EVALSHA "$sha" 1 "$1:__rand_int__" $(args "$1") >/dev/null
        fi
        redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
        wait "$vg" || true
        sed -n 's/^summary: *//p;s/^totals: *//p' "$out" | head -1
    }
    base=$(total plain 0)
    for s in pace plain; do
        t=$(total "$s" "$calls")
        echo "$s: $(((t - base) / calls)) instructions per call ($calls calls)"
    done
    ;;
client)
    calls=${2:-5000}
    bin=$(cd "$here/.." && cargo bench -p pace-redis --bench redis --no-run 2>&1 |
        sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | tail -1)
    [ -x "$bin" ] || { echo "the bench did not build" >&2; exit 1; }
    count() { # CONTENDER CALLS: instructions of the bench process
        local out="$work/cc.$1.$2"
        PACE_REDIS_BENCH_CLIENT="$1:$2" valgrind --tool=callgrind \
            --callgrind-out-file="$out" "$bin" --bench >/dev/null 2>&1
        sed -n 's/^summary: *//p;s/^totals: *//p' "$out" | head -1
    }
    for s in ${CONTENDERS:-pace pace-leases raw plain}; do
        one=$(count "$s" "$calls")
        two=$(count "$s" $((2 * calls)))
        echo "$s: $(((two - one) / calls)) client instructions per decision"
    done
    ;;
holds)
    calls=${2:-20000}
    # RESP for CALLS operations of kind $1 with script sha $2.
    stream() {
        python3 - "$1" "$2" "$calls" <<'PY'
import random, sys
kind, sha, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(7)
out = []
def cmd(*a):
    out.append("*%d\r\n" % len(a) + "".join("$%d\r\n%s\r\n" % (len(x), x) for x in a))
for i in range(calls):
    key = "pace:%d" % rng.randrange(10000)
    if kind == "reserve":
        cmd("EVALSHA", sha, "1", key)
    else:
        hid = "%x" % (i + 1)
        cmd("EVALSHA", sha, "1", key, "h", hid, "1", "1000000", "1000", "10000000000")
        cmd("EVALSHA", sha, "1", key, "x" if kind == "hold-refund" else "k", hid)
sys.stdout.write("".join(out))
PY
    }
    run() { # KIND CALLS: instructions of a server that ran CALLS of KIND
        local port out
        port=$(free_port)
        out="$work/cg.$1.$2"
        valgrind --tool=callgrind --callgrind-out-file="$out" \
            redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
        local vg=$!
        wait_up "$port"
        local sha
        sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/pace.lua")")
        if [ "$2" -gt 0 ]; then
            stream "$1" "$sha" | redis-cli -p "$port" --pipe >/dev/null
        fi
        redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
        wait "$vg" || true
        sed -n 's/^summary: *//p;s/^totals: *//p' "$out" | head -1
    }
    base=$(run reserve 0)
    for k in reserve hold-refund hold-keep; do
        t=$(run "$k" "$calls")
        echo "$k: $(((t - base) / calls)) instructions per operation ($calls operations)"
    done
    ;;
many)
    shift
    [ $# -gt 0 ] || set -- 1 10 100 1000
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    pid=$!
    trap 'kill $pid; rm -rf "$work"' EXIT
    wait_up "$port"
    sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$work/pace.lua")")
    for h in "$@"; do
        redis-cli -p "$port" DEL many >/dev/null
        python3 - "$sha" "$h" <<'PY' | redis-cli -p "$port" --pipe >/dev/null
import sys
sha, h = sys.argv[1], int(sys.argv[2])
for i in range(h):
    a = ["EVALSHA", sha, "1", "many", "h", "%x" % (i + 1), "1", "1000000", "1000", "10000000000"]
    sys.stdout.write("*%d\r\n" % len(a) + "".join("$%d\r\n%s\r\n" % (len(x), x) for x in a))
PY
        redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
        redis-benchmark -p "$port" -n 2000 -c 1 -q EVALSHA "$sha" 1 many p >/dev/null
        u=$(redis-cli -p "$port" INFO commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
        echo "$h holds ($(redis-cli -p "$port" STRLEN many) bytes): peek ${u}us"
    done
    ;;
*)
    echo "usage: $0 usec [ROUNDS] | instructions [CALLS] | client [CALLS] | holds [CALLS] | many [HOLDS...]" >&2
    exit 2
    ;;
esac
