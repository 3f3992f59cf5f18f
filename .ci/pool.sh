# shellcheck shell=bash
# A small job pool for .ci/run, sourced by it: `pool_add NAME COMMAND` queues
# a job, `pool_run SLOTS` runs the queue with at most SLOTS jobs at once and
# returns non-zero if any job failed.
#
# Why: most suites are single-core (Miri interprets on one core, a fuzz
# target and a loom model use one core, a mutant's test run is one process
# with --test-threads=1), so on a 2-core machine running them one after the
# other leaves a core idle for most of CI. The pool keeps both cores busy.
#
# Jobs start in queue order (put the longest first) whenever a slot is free.
# Each job is its own `bash -c COMMAND` process, so each suite keeps its own
# `set -euo pipefail` (a function run as `f || status=$?` would silently run
# with `set -e` off). Its output goes to a file of its own; the files are
# printed in queue order, the earliest unfinished job's live (so the first,
# long job streams as it runs), the rest when their turn comes. Each job's
# exit status is written to a file by the job's wrapper and checked here: a
# job without a status file (killed, or never started) counts as failed.

POOL_NAMES=()
POOL_CMDS=()

pool_add() {
    POOL_NAMES+=("$1")
    POOL_CMDS+=("$2")
}

pool_run() {
    local slots=$1 dir i pid rc failed=() start end cpu summary=""
    dir=$(mktemp -d)
    # The scheduler runs in the background and starts the jobs; this shell
    # prints. `set +e`: a failing job must not stop the scheduler itself.
    (
        set +e
        for i in "${!POOL_CMDS[@]}"; do
            while [ "$(jobs -pr | wc -l)" -ge "$slots" ]; do
                wait -n
            done
            date -u +%s >"$dir/$i.start"
            (
                bash -euo pipefail -c "${POOL_CMDS[$i]}" >"$dir/$i.log" 2>&1
                echo $? >"$dir/$i.rc.tmp"
                date -u +%s >"$dir/$i.end"
                # CPU seconds (user + sys) of the job's processes: on a
                # shared machine a clearer measure of its cost than its time.
                # (`times` itself not in a pipeline: a subshell has no children.)
                times >"$dir/$i.times"
                tail -1 "$dir/$i.times" | awk '{ for (i = 1; i <= 2; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] } }
                    END { printf "%d\n", s }' >"$dir/$i.cpu"
                mv "$dir/$i.rc.tmp" "$dir/$i.rc"
            ) &
            echo $! >"$dir/$i.pid.tmp"
            mv "$dir/$i.pid.tmp" "$dir/$i.pid"
        done
        wait
        touch "$dir/all-done"
    ) &
    local scheduler=$!
    for i in "${!POOL_CMDS[@]}"; do
        while [ ! -e "$dir/$i.pid" ]; do
            if [ -e "$dir/all-done" ] || ! kill -0 "$scheduler" 2>/dev/null; then
                break
            fi
            sleep 1
        done
        start=$(cat "$dir/$i.start" 2>/dev/null || echo 0)
        printf '\n=== [job %d] %s (started %s)\n' "$i" "${POOL_NAMES[$i]}" \
            "$(date -u -d "@$start" +%H:%M:%S)"
        if [ -e "$dir/$i.pid" ]; then
            pid=$(cat "$dir/$i.pid")
            # Live while the job runs, then whatever it wrote last.
            tail -n +1 -f --pid="$pid" "$dir/$i.log" 2>/dev/null || cat "$dir/$i.log"
        fi
        rc=$(cat "$dir/$i.rc" 2>/dev/null || echo "none")
        end=$(cat "$dir/$i.end" 2>/dev/null || date -u +%s)
        cpu=$(cat "$dir/$i.cpu" 2>/dev/null || echo "?")
        printf '=== [job %d] %s: exit %s, %ds (%s-%s), %ss of CPU\n' "$i" "${POOL_NAMES[$i]}" "$rc" \
            "$((end - start))" "$(date -u -d "@$start" +%H:%M:%S)" "$(date -u -d "@$end" +%H:%M:%S)" "$cpu"
        summary+=$(printf '%s-%s %5ss %5ss CPU  exit %-4s %s' "$(date -u -d "@$start" +%H:%M:%S)" \
            "$(date -u -d "@$end" +%H:%M:%S)" "$((end - start))" "$cpu" "$rc" "${POOL_NAMES[$i]}")$'\n'
        [ "$rc" = 0 ] || failed+=("${POOL_NAMES[$i]}")
    done
    wait "$scheduler" || true
    printf '\n=== jobs: start-end, time, CPU time, exit status\n%s' "$summary"
    rm -rf "$dir"
    if [ "${#failed[@]}" -ne 0 ]; then
        printf 'FAILED: %s\n' "${failed[@]}" >&2
        return 1
    fi
}
