#!/usr/bin/env python3
"""The crate graph and the node's module graph of docs/architecture.md, checked:
`make check-layers` (part of `make test`).

Crates: each workspace crate may depend only on the crates below it; only ankusa-store
depends on RocksDB itself, and only the crates above the store (the node) reach it through
it. Reads `cargo metadata` (the resolved graph, normal and build dependencies;
dev-dependencies are the tests' own).

Modules of ankusa-relay: each top-level module (crates/relay/src/X.rs or crates/relay/src/X/) has a rank
in MODULE_RANK; a module may name (`crate::Y`) only modules of a lower rank. The paths its
`#[cfg(test)]` modules name are the tests' own and are not counted. KNOWN lists the edges
that still go upward, each with what removes it: the check fails on any other, and on a
known edge that is gone (so that the list only shrinks).

Store writes: the queue crate owns every row change. In ankusa-relay only `upgrade` (the
format migrations' own steps) builds store ops (`Op::…`); any other file that does fails.
"""
import json
import os
import re
import subprocess
import sys

# crate -> the workspace crates it may depend on.
ALLOWED = {
    "ankusa-keyspace": set(),
    "ankusa-tarball": set(),
    "ankusa-api": set(),
    "ankusa-api-macros": set(),
    "ankusa-crds": {"ankusa-api"},
    "ankusa-config": {"ankusa-keyspace"},
    "ankusa-records": {"ankusa-keyspace"},
    "ankusa-verify": {"ankusa-config", "ankusa-keyspace"},
    "ankusa-store": {"ankusa-keyspace", "ankusa-tarball"},
    "ankusa-queue": {"ankusa-store", "ankusa-keyspace", "ankusa-records", "ankusa-config"},
    "ankusa-operator": {"ankusa-crds", "ankusa-api", "ankusa-config", "ankusa-keyspace"},
    "ankusa-relay": {"ankusa-queue", "ankusa-store", "ankusa-keyspace", "ankusa-tarball",
                     "ankusa-config", "ankusa-records", "ankusa-verify", "ankusa-api",
                     "ankusa-api-macros"},
}
ROCKSDB = {"rocksdb", "librocksdb-sys"}
# Depends on the rocksdb crate itself.
ROCKSDB_DIRECT = {"ankusa-store"}
# Reaches it, only through ankusa-store.
MAY_USE_ROCKSDB = {"ankusa-store", "ankusa-queue", "ankusa-relay"}

meta = json.loads(subprocess.run(
    ["cargo", "metadata", "--format-version", "1", "--locked"],
    check=True, capture_output=True, text=True).stdout)
name_of = {p["id"]: p["name"] for p in meta["packages"]}
members = {name_of[i] for i in meta["workspace_members"]}
deps = {}
for node in meta["resolve"]["nodes"]:
    deps[node["id"]] = [
        d["pkg"] for d in node["deps"]
        if any(k["kind"] in (None, "build") for k in d["dep_kinds"])
    ]

def reach(pkg_id):
    seen, todo = set(), [pkg_id]
    while todo:
        p = todo.pop()
        for d in deps.get(p, []):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen

problems = []
unknown = members - ALLOWED.keys()
if unknown:
    problems.append(f"crates with no place in the layer graph: {sorted(unknown)}")
for pid in meta["workspace_members"]:
    name = name_of[pid]
    direct = {name_of[d] for d in deps.get(pid, []) if name_of[d] in members}
    upward = direct - ALLOWED.get(name, set())
    if upward:
        problems.append(f"{name} depends on {sorted(upward)}, which it may not")
    rocks = {name_of[d] for d in reach(pid)} & ROCKSDB
    if rocks and name not in MAY_USE_ROCKSDB:
        problems.append(f"{name} reaches {sorted(rocks)}: only {sorted(MAY_USE_ROCKSDB)} may")
    direct_rocks = {name_of[d] for d in deps.get(pid, [])} & ROCKSDB
    if direct_rocks and name not in ROCKSDB_DIRECT:
        problems.append(f"{name} depends on {sorted(direct_rocks)} itself: only "
                        f"{sorted(ROCKSDB_DIRECT)} may (the rest go through its API)")

# --- the node's modules ---------------------------------------------------------------------
# Top: the CLI; the composition root (and the test support that starts nodes); the OpenAPI
# document, read from the handlers; the admin API above ingest and the dispatch
# it operates on; the cluster (ownership, forwarding) beneath them; shared helpers; the
# crates below, as the node names them.
MODULE_RANK = {
    "main": 9, "cli": 8,
    "testkit": 7, "node": 6,
    "openapi": 5, "reload": 5, "console": 5,
    "admin": 4, "pull": 4,
    "ingest": 3, "dispatch": 3,
    "cluster": 2, "objstore": 2,
    "metrics": 1, "http": 1, "upgrade": 1, "telemetry": 1,
    "wire": 0,
}
# Upward edges not removed yet: (from, to) -> what removes them. None is left.
KNOWN = {}
# The only module of the node that builds store ops itself (the migrations' own steps).
MAY_WRITE = {"upgrade"}
STORE_OP = re.compile(r"\bOp::(put|delete|merge|delete_range|Put|Delete|Merge|DeleteRange)\b")
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "relay", "src")
CRATE_PATH = re.compile(r"\bcrate::(\w+)")
TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]\s*\n\s*(pub(\(\w+\))?\s+)?mod\s+\w+\s*\{", re.M)


def without_test_modules(text):
    """`text` without its `#[cfg(test)] mod … { … }` blocks (braces counted)."""
    out, pos = [], 0
    for m in TEST_MOD.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()])
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        pos = i + 1
    out.append(text[pos:])
    return "".join(out)


edges = {}  # (from, to) -> first file naming it
writers = set()  # files outside MAY_WRITE that build store ops
for dirpath, _, filenames in os.walk(SRC):
    for fn in sorted(filenames):
        if not fn.endswith(".rs"):
            continue
        path = os.path.join(dirpath, fn)
        rel = os.path.relpath(path, SRC)
        module = rel.split(os.sep)[0].removesuffix(".rs")
        if module == "lib":
            continue
        if module not in MODULE_RANK:
            problems.append(f"crates/relay/src/{rel}: module {module!r} has no rank in MODULE_RANK")
            continue
        code = without_test_modules(open(path).read())
        for m in CRATE_PATH.finditer(code):
            to = m.group(1)
            if to != module:
                edges.setdefault((module, to), f"crates/relay/src/{rel}")
        if module not in MAY_WRITE and STORE_OP.search(code):
            writers.add(f"crates/relay/src/{rel}")
for (frm, to), where in sorted(edges.items()):
    if to not in MODULE_RANK:
        problems.append(f"{where}: names crate::{to}, which has no rank in MODULE_RANK")
    elif MODULE_RANK[to] >= MODULE_RANK[frm] and (frm, to) not in KNOWN:
        problems.append(f"{where}: {frm} names crate::{to}, which is not below it "
                        f"({frm} {MODULE_RANK[frm]}, {to} {MODULE_RANK[to]})")
for (frm, to), why in KNOWN.items():
    if (frm, to) not in edges:
        problems.append(f"the known upward edge {frm} -> {to} is gone: remove it from KNOWN")
for f in sorted(writers):
    problems.append(f"{f} builds store ops (Op::…): row changes belong to the queue crate")

if problems:
    print("check-layers: FAIL", *problems, sep="\n  ")
    sys.exit(1)
print(f"check-layers: ok ({len(members)} crates; RocksDB only in "
      f"{', '.join(sorted(ROCKSDB_DIRECT))}, reached by {', '.join(sorted(MAY_USE_ROCKSDB))}; "
      f"{len({m for e in edges for m in e})} modules of ankusa-relay, {len(edges)} edges, "
      f"{len(KNOWN)} known upward: {', '.join(f'{a} -> {b}' for a, b in KNOWN)}; "
      f"store ops only in {', '.join(sorted(MAY_WRITE))})")
