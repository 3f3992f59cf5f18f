#!/usr/bin/env python3
"""Turns criterion's results into docs/bench/results.md and throughput.svg.

Reads target/criterion/**/new/{benchmark,estimates}.json written by
`cargo bench -p pace-benches --bench throughput` (groups `<regime>/<workload>/<key>`,
benchmarks `<contender>/<threads>`), takes the MEDIAN time per reserve of
each benchmark, and writes:

  * a table per group: million reserves/s for each contender and thread
    count, and pace's ratio to each contender;
  * the targets as ratios, met or missed;
  * an SVG with one panel per group: throughput vs threads per contender.

Python 3 standard library only.

    python3 docs/bench/report.py [--criterion target/criterion] [--out docs/bench]
        [--note TEXT] [--machine machine.txt] [--loads loads.txt] [--extra file.md ...]
"""

import argparse
import glob
import json
import os
import sys
from collections import defaultdict

ORDER = [
    "pace",
    "pace-std",
    "pace-coarse",
    "pace-foldhash",
    "pace-foldhash-coarse",
    "governor",
    "dashmap",
    "mutex",
]
COLORS = {
    "pace": "#1f77b4",
    "pace-std": "#6baed6",
    "pace-coarse": "#17becf",
    "pace-foldhash": "#2ca02c",
    "pace-foldhash-coarse": "#98df8a",
    "governor": "#d62728",
    "dashmap": "#ff7f0e",
    "mutex": "#7f7f7f",
}
GROUP_ORDER = ["admit", "real", "churn"]


def load(root):
    """{group: {contender: {threads: reserves_per_second}}}"""
    out = defaultdict(lambda: defaultdict(dict))
    for bpath in glob.glob(os.path.join(root, "**", "new", "benchmark.json"), recursive=True):
        with open(bpath) as f:
            b = json.load(f)
        epath = os.path.join(os.path.dirname(bpath), "estimates.json")
        if not os.path.exists(epath):
            continue
        with open(epath) as f:
            e = json.load(f)
        group = b["group_id"]
        contender = b.get("function_id")
        threads = b.get("value_str")
        if contender is None or threads is None:
            continue
        ns = e["median"]["point_estimate"]
        elems = (b.get("throughput") or {}).get("Elements", 1)
        out[group][contender][int(threads)] = elems * 1e9 / ns
    return out


def group_key(g):
    parts = g.split("/")
    reg = GROUP_ORDER.index(parts[0]) if parts[0] in GROUP_ORDER else 9
    wl = {"hot": 0, "1k": 1, "1M": 2, "new": 3}.get(parts[1] if len(parts) > 1 else "", 9)
    key = parts[2] if len(parts) > 2 else ""
    return (reg, key != "u64", wl, g)


def contenders(gdata):
    names = [c for c in ORDER if c in gdata] + sorted(c for c in gdata if c not in ORDER)
    return names


def fmt(x):
    return "—" if x is None else f"{x / 1e6:.2f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def tables(data):
    lines = []
    for g in sorted(data, key=group_key):
        gd = data[g]
        threads = sorted({t for c in gd.values() for t in c})
        lines.append(f"### `{g}`\n")
        head = "| contender | " + " | ".join(f"{t} thr" for t in threads) + " |"
        lines.append(head)
        lines.append("|---|" + "---:|" * len(threads))
        for c in contenders(gd):
            row = [fmt(gd[c].get(t)) for t in threads]
            lines.append(f"| {c} | " + " | ".join(row) + " |")
        pace = gd.get("pace", {})
        for c in contenders(gd):
            if c == "pace":
                continue
            rs = [ratio(pace.get(t), gd[c].get(t)) for t in threads]
            lines.append(
                f"| *pace / {c}* | "
                + " | ".join("—" if r is None else f"{r:.2f}x" for r in rs)
                + " |"
            )
        lines.append("")
    return lines


def get(data, g, c, t):
    return data.get(g, {}).get(c, {}).get(t)


def targets(data):
    rows = []

    def add(name, value, need, detail):
        if value is None:
            rows.append(f"| {name} | — | {need} | not measured | {detail} |")
            return
        ok = value >= need
        rows.append(
            f"| {name} | {value:.2f}x | >= {need}x | {'met' if ok else '**missed**'} | {detail} |"
        )

    p = lambda g, t, c="pace": get(data, g, c, t)
    add(
        "warm key, 1 thread, vs governor",
        ratio(p("admit/hot/u64", 1), p("admit/hot/u64", 1, "governor")),
        2,
        f"admit/hot/u64: pace {fmt(p('admit/hot/u64', 1))} vs governor "
        f"{fmt(p('admit/hot/u64', 1, 'governor'))} M/s",
    )
    add(
        "warm 1k keys, 1 thread, vs governor",
        ratio(p("admit/1k/u64", 1), p("admit/1k/u64", 1, "governor")),
        2,
        f"admit/1k/u64: pace {fmt(p('admit/1k/u64', 1))} vs governor "
        f"{fmt(p('admit/1k/u64', 1, 'governor'))} M/s",
    )
    add(
        "1M live keys, 1 thread, vs governor",
        ratio(p("admit/1M/u64", 1), p("admit/1M/u64", 1, "governor")),
        1.5,
        f"admit/1M/u64: pace {fmt(p('admit/1M/u64', 1))} vs governor "
        f"{fmt(p('admit/1M/u64', 1, 'governor'))} M/s",
    )
    for g in ["admit/1k/u64", "admit/1M/u64"]:
        add(
            f"distinct keys ({g.split('/')[1]}), 2 threads vs own 1 thread",
            ratio(p(g, 2), p(g, 1)),
            1.7,
            f"{g}: {fmt(p(g, 2))} vs {fmt(p(g, 1))} M/s; same run, 2-vs-1 of "
            + ", ".join(
                f"{c} {r:.2f}x"
                for c in ["governor", "dashmap", "mutex"]
                if (r := ratio(p(g, 2, c), p(g, 1, c))) is not None
            ),
        )
    for g in ["admit/hot/u64", "real/hot/u64"]:
        one = p(g, 1)
        for t in [2, 4, 8]:
            add(
                f"hot key ({g.split('/')[0]}), {t} threads vs own 1 thread",
                ratio(p(g, t), one),
                0.5,
                f"{g}: {fmt(p(g, t))} vs {fmt(one)} M/s",
            )
            add(
                f"hot key ({g.split('/')[0]}), {t} threads vs governor",
                ratio(p(g, t), p(g, t, "governor")),
                1,
                f"{g}: pace {fmt(p(g, t))} vs governor {fmt(p(g, t, 'governor'))} M/s",
            )
    for k in ["u64", "str"]:
        g = f"churn/new/{k}"
        for t in [1, 2]:
            add(
                f"churn {k}, {t} thread(s), vs governor",
                ratio(p(g, t), p(g, t, "governor")),
                3,
                f"{g}: pace {fmt(p(g, t))} vs governor {fmt(p(g, t, 'governor'))} M/s",
            )
    return [
        "| target | ratio | need | verdict | figures |",
        "|---|---:|---:|---|---|",
    ] + rows


def diagnostics(data):
    """What the hasher and the clock cost: pace variants against governor."""
    rows = [
        "| group, threads | pace | pace-coarse | pace-foldhash | pace-foldhash-coarse | governor |"
        " best variant / governor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for g in ["admit/hot/u64", "admit/1k/u64", "admit/1M/u64", "churn/new/u64"]:
        for t in [1, 2]:
            vals = [get(data, g, c, t) for c in
                    ["pace", "pace-coarse", "pace-foldhash", "pace-foldhash-coarse", "governor"]]
            if vals[0] is None:
                continue
            best = max((v for v in vals[:4] if v is not None), default=None)
            r = ratio(best, vals[4])
            rows.append(
                f"| {g}, {t} | " + " | ".join(fmt(v) for v in vals)
                + f" | {'—' if r is None else f'{r:.2f}x'} |"
            )
    return rows


def svg(data, path):
    groups = sorted(data, key=group_key)
    cols = 3
    pw, ph = 300, 210
    ml, mr, mt, mb = 48, 10, 28, 30
    rows = (len(groups) + cols - 1) // cols
    legend_h = 46
    W, H = cols * pw, rows * ph + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
    ]
    # legend
    x = 10
    for c in ORDER:
        out.append(f'<line x1="{x}" y1="15" x2="{x + 22}" y2="15" stroke="{COLORS[c]}" stroke-width="2.5"/>')
        out.append(f'<text x="{x + 26}" y="19">{c}</text>')
        x += 36 + 6 * len(c)
    out.append(
        '<text x="10" y="38" fill="#555">million reserves/s across all threads '
        "(criterion median) vs threads; 2-core machine</text>"
    )
    xs = [1, 2, 4, 8]
    for i, g in enumerate(groups):
        gx, gy = (i % cols) * pw, legend_h + (i // cols) * ph
        gd = data[g]
        ymax = max((v for c in gd.values() for v in c.values()), default=1) / 1e6
        ymax = nice(ymax)
        x0, x1 = gx + ml, gx + pw - mr
        y0, y1 = gy + ph - mb, gy + mt
        out.append(f'<text x="{(x0 + x1) / 2}" y="{gy + 16}" text-anchor="middle" font-weight="bold">{g}</text>')
        out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" stroke="#ccc"/>')
        for k in range(6):
            v = round(ymax * k / 5, 6)
            yy = y0 - (y0 - y1) * k / 5
            out.append(f'<line x1="{x0}" y1="{yy:.1f}" x2="{x1}" y2="{yy:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{x0 - 4}" y="{yy + 4:.1f}" text-anchor="end" fill="#555">{v:g}</text>')

        def px(t):
            return x0 + (x1 - x0) * (xs.index(t) if t in xs else 0) / (len(xs) - 1)

        for t in xs:
            out.append(f'<text x="{px(t):.1f}" y="{y0 + 14}" text-anchor="middle" fill="#555">{t}</text>')
        for c in contenders(gd):
            pts = sorted(gd[c].items())
            coords = [
                (px(t), y0 - (y0 - y1) * min(v / 1e6 / ymax, 1.0)) for t, v in pts if t in xs
            ]
            if not coords:
                continue
            color = COLORS.get(c, "#000")
            out.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                + " ".join(f"{a:.1f},{b:.1f}" for a, b in coords)
                + '"/>'
            )
            for a, b in coords:
                out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}"/>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def nice(v):
    if v <= 0:
        return 1
    import math

    e = 10 ** math.floor(math.log10(v))
    for m in [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]:
        if m * e >= v:
            return m * e
    return 10 * e


def memory_targets(path):
    """Rows for 'bytes per live u64 row <= governor's' (issue 10's goal,
    counted without forcing epoch collection) from memory.md."""
    rows = []
    if not path or not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            # key | rows | pace B/row, no forced collection | pace B/row |
            # governor B/row | ratio | pace glibc-est | governor glibc-est |
            # glibc-est ratio | pace table
            if len(cells) >= 10 and cells[0] in ("u64", "str") and cells[1].isdigit():
                key, n, ours, _, theirs, _, _, _, rg = cells[:9]
                if key != "u64":
                    continue
                r = float(ours) / float(theirs)
                verdict = "met" if r <= 1.0 else "**missed**"
                rows.append(
                    f"| bytes per live u64 row, {int(n):,} rows (<= governor, no forced "
                    f"collection) | {r:.2f}x | <= 1x | {verdict} | pace {ours} vs governor "
                    f"{theirs} B/row requested; glibc chunk estimate {rg}x |"
                )
    return rows


def update_readme(path, data, machine, memory=None):
    """Replaces the block between the results markers with this run's targets."""
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    with open(path) as f:
        text = f.read()
    if begin not in text or end not in text:
        sys.exit(f"{path} has no {begin} ... {end} block")
    head = ""
    if machine:
        with open(machine) as f:
            m = dict(
                line.split(":", 1) for line in f.read().splitlines() if ":" in line
            )
        head = (
            f"Run of {m.get('date (UTC)', '?').strip()} UTC, commit "
            f"{m.get('commit', '?').strip()}, {m.get('nproc', '?').strip()} cores "
            f"({m.get('Model name', '?').strip()}, {m.get('Hypervisor vendor', '').strip()}); "
            f"{m.get('uptime before', '').strip()}\n\n"
        )
    block = "\n".join(
        [begin, "", head + "Targets as ratios from this one run:", ""]
        + targets(data)
        + memory_targets(memory)
        + ["", "What the hasher and the clock cost (same run):", ""]
        + diagnostics(data)
        + ["", end]
    )
    pre, rest = text.split(begin, 1)
    post = rest.split(end, 1)[1]
    with open(path, "w") as f:
        f.write(pre + block + post)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--criterion", default="target/criterion")
    ap.add_argument("--out", default="docs/bench")
    ap.add_argument("--note", default="")
    ap.add_argument("--extra", nargs="*", default=[])
    ap.add_argument("--machine", help="file with date, nproc, lscpu, uptime")
    ap.add_argument("--loads", help="file with the load average at each group's start")
    ap.add_argument("--readme", help="README whose <!-- results --> block gets the targets")
    ap.add_argument("--memory", help="memory.md from benches/memory.rs (bytes-per-row target)")
    a = ap.parse_args()
    data = load(a.criterion)
    if not data:
        sys.exit(f"no criterion results under {a.criterion}")
    lines = ["# Benchmark results", ""]
    if a.note:
        lines += [a.note, ""]
    if a.machine:
        with open(a.machine) as f:
            lines += ["Machine and run:", "", "```text", f.read().rstrip(), "```", ""]
    lines += [
        "Million reserves per second across all threads (criterion median;",
        "higher is better). Generated by `python3 docs/bench/report.py` from",
        "`cargo bench -p pace-benches --bench throughput`. Plot: [throughput.svg](throughput.svg).",
        "",
        "## Targets, as ratios from this one run",
        "",
    ]
    lines += targets(data) + memory_targets(a.memory)
    lines += [
        "",
        "## Diagnostics: the hasher's and the clock's share",
        "",
        "Same run. `pace-foldhash` swaps SipHash for foldhash's seeded fast hasher;",
        "`pace-coarse` reads a 1 ms cached clock instead of the TSC.",
        "",
    ]
    lines += diagnostics(data)
    lines += ["", "## Throughput per group", ""]
    lines += tables(data)
    if a.loads:
        with open(a.loads) as f:
            lines += [
                "Load average (1, 5, 15 min) when each group started:",
                "",
                "```text",
                f.read().rstrip(),
                "```",
                "",
            ]
    for extra in a.extra:
        with open(extra) as f:
            lines += ["", f.read().rstrip(), ""]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    svg(data, os.path.join(a.out, "throughput.svg"))
    if a.readme:
        update_readme(a.readme, data, a.machine, a.memory)
    print(f"wrote {a.out}/results.md and {a.out}/throughput.svg ({len(data)} groups)")


if __name__ == "__main__":
    main()
