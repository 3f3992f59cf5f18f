#!/usr/bin/env python3
"""Modules of a crate that import each other.

Usage: python3 .ci/import_cycles.py [SRC_DIR] (default: src). Reads every
`use crate::...` and `use super::...` outside `mod tests`, at the level of
top-level modules and the submodules of directory modules (src/table/*,
src/pace/*, pace-tower/src/layer/*), and prints each pair of modules that
import each other (a module and its own submodules excepted), then the
counts; exits 1 when any pair imports each other. Brace groups
(`use super::{a, b}`) name items, not modules, and are not followed.
.ci/checks.sh runs it on the crates whose graph has no circle
(pace-tower, pace-models, pace-soak, pace-lab, loom-tests; well under a
second); on the others it is a tool for reviews of the module graph.
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "src"


def name(path):
    parts = os.path.relpath(path, root)[:-3].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts[:2]


def target(parts):
    # a directory module's submodule keeps two components, others one
    if parts and os.path.isdir(os.path.join(root, parts[0])):
        return parts[:2]
    return parts[:1]


edges = set()
for d, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(d, f)
        me = name(path)
        own = os.path.relpath(path, root)[:-3].split("/")
        text = open(path, encoding="utf-8").read().split("mod tests {")[0]
        pat = r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+(crate|super)::([a-z_]+)(?:::([a-z_]+))?"
        for m in re.finditer(pat, text, re.M):
            base, a, b = m.groups()
            if base == "crate":
                tgt = target([a] + ([b] if b else []))
            else:
                parent = own[:-1] if own[-1] != "mod" else own[:-2]
                tgt = target(parent + [a])
            if not tgt or not me:
                continue
            if tgt[: len(me)] == me or me[: len(tgt)] == tgt:
                continue  # a module and its own parent or submodule
            edges.add(("::".join(me), "::".join(tgt)))
mutual = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
for a, b in mutual:
    print(f"{a} <-> {b}")
print(f"{len(edges)} edges, {len(mutual)} pairs importing each other")
sys.exit(1 if mutual else 0)
