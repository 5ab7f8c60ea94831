#!/usr/bin/env python3
"""The crate graph of docs/architecture.md, checked: `make check-layers` (part of `make test`).

Each workspace crate may depend only on the crates below it; only ankusa-store depends on
RocksDB itself, and only the crates above the store (the node) reach it through it. Reads `cargo metadata`
(the resolved graph, normal and build dependencies; dev-dependencies are the tests' own).
"""
import json
import subprocess
import sys

# crate -> the workspace crates it may depend on.
ALLOWED = {
    "ankusa-keys": set(),
    "ankusa-tarball": set(),
    "ankusa-crds": set(),
    "ankusa-config": {"ankusa-keys"},
    "ankusa-values": {"ankusa-keys"},
    "ankusa-verify": {"ankusa-config", "ankusa-keys"},
    "ankusa-store": {"ankusa-keys", "ankusa-tarball"},
    "ankusa-queue": {"ankusa-store", "ankusa-keys", "ankusa-values", "ankusa-config",
                     "ankusa-crds"},
    "ankusa-operator": {"ankusa-crds", "ankusa-config", "ankusa-keys"},
    "ankusa-relay": {"ankusa-queue", "ankusa-store", "ankusa-keys", "ankusa-tarball", "ankusa-crds",
                     "ankusa-config", "ankusa-values", "ankusa-verify"},
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

if problems:
    print("check-layers: FAIL", *problems, sep="\n  ")
    sys.exit(1)
print(f"check-layers: ok ({len(members)} crates; RocksDB only in "
      f"{', '.join(sorted(ROCKSDB_DIRECT))}, reached by {', '.join(sorted(MAY_USE_ROCKSDB))})")
