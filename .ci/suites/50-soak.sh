#!/usr/bin/env bash
# The soak's 60-second form (pace-soak/README.md): a Sentinel deployment, two
# pace-tower replicas on a shared RedisPace limit, many clients and a fault
# every 10-20 s, on loopback; fails on any excess over the bound away from a
# fault of the primary, more than a capacity per such fault near one, or any
# unexplained answer. The schedule's seed comes from the date and the commit
# (printed: `--seed N` replays its faults).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v redis-server >/dev/null; then
    (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server) || {
        echo "FAILED: redis-server is missing and could not be installed from Debian's packages;" >&2
        echo "        the soak starts its own servers (apt-get install -y redis-server)." >&2
        exit 1
    }
fi
seed=$(printf '%s %s' "$(date -u +%F)" "$(git rev-parse HEAD 2>/dev/null || echo none)" | cksum | cut -d' ' -f1)
# The debug build: it shares the tests' target directory, and the soak
# checks answers and windows, not speed.
cargo run -p pace-soak -- --seconds 60 --fault-every 10-20 --seed "$seed"
