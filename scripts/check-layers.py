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

Rows: the queue crate owns every row change and every family read. ankusa-relay does not
depend on ankusa-store (the crate rule above), so it cannot name the store's row API
(`ankusa_store::Rows`) nor build an op: it holds the store through `ankusa_queue::engine`,
and a row write or read outside the queue does not compile (the compile_fail doctests of
`ankusa_queue::engine` and `ankusa_queue::Change`).
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
    "ankusa-relay": {"ankusa-queue", "ankusa-keyspace", "ankusa-tarball",
                     "ankusa-config", "ankusa-records", "ankusa-verify", "ankusa-api",
                     "ankusa-api-macros"},
}
ROCKSDB = {"rocksdb", "librocksdb-sys"}
# Depends on the rocksdb crate itself.
ROCKSDB_DIRECT = {"ankusa-store"}
# Reaches it, only through ankusa-store (the node through the queue: it does not depend on
# ankusa-store, so it cannot name the store's row API, `ankusa_store::Rows`, nor build an op).
MAY_USE_ROCKSDB = {"ankusa-store", "ankusa-queue", "ankusa-relay"}

def crate_problems(members, direct, reached):
    """What the crate rules find: `direct[name]` are a crate's direct (normal and build)
    dependencies by name, `reached[name]` every package it reaches."""
    out = []
    unknown = members - ALLOWED.keys()
    if unknown:
        out.append(f"crates with no place in the layer graph: {sorted(unknown)}")
    for name in sorted(members):
        upward = (direct[name] & members) - ALLOWED.get(name, set())
        if upward:
            out.append(f"{name} depends on {sorted(upward)}, which it may not")
        rocks = reached[name] & ROCKSDB
        if rocks and name not in MAY_USE_ROCKSDB:
            out.append(f"{name} reaches {sorted(rocks)}: only {sorted(MAY_USE_ROCKSDB)} may")
        direct_rocks = direct[name] & ROCKSDB
        if direct_rocks and name not in ROCKSDB_DIRECT:
            out.append(f"{name} depends on {sorted(direct_rocks)} itself: only "
                       f"{sorted(ROCKSDB_DIRECT)} may (the rest go through its API)")
    return out


def crate_graph():
    """The workspace's crates, and each one's direct dependencies and what it reaches, from
    `cargo metadata` (normal and build dependencies; dev-dependencies are the tests' own)."""
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True, capture_output=True, text=True).stdout)
    name_of = {p["id"]: p["name"] for p in meta["packages"]}
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

    ids = meta["workspace_members"]
    members = {name_of[i] for i in ids}
    direct = {name_of[i]: {name_of[d] for d in deps.get(i, [])} for i in ids}
    reached = {name_of[i]: {name_of[d] for d in reach(i)} for i in ids}
    return members, direct, reached


# --- the node's modules ---------------------------------------------------------------------
# Top: the CLI; the composition root (and the test support that starts nodes); the OpenAPI
# document, read from the handlers; the admin API above ingest and the dispatch
# it operates on; the cluster (ownership, forwarding) beneath them; shared helpers; the
# crates below, as the node names them.
MODULE_RANK = {
    "main": 10, "cli": 9,
    "testkit": 8, "node": 7,
    "openapi": 6, "reload": 6, "console": 6,
    "admin": 5,
    "erase": 4, "pull": 4,
    "ingest": 3, "dispatch": 3,
    "cluster": 2, "objstore": 2, "endpoints": 2,
    "metrics": 1, "http": 1, "upgrade": 1, "telemetry": 1,
    "wire": 0,
}
# Folders with layers of their own: each sub-module (a file or a folder under it) may name
# only the sub-modules ranked below it. The folder's `mod.rs` (its entrance, which declares
# them) is above them all.
SUBMODULE_RANK = {
    "admin": {
        "auth": 0, "api": 1, "sources": 2, "erase": 2,
        "archive": 4, "audit": 4, "backups": 4, "dlq": 4, "endpoints": 4, "limits": 4, "node": 4,
        "portal": 4, "quarantine": 4, "tenants": 4, "hooks": 5,
        "routing": 5, "relay_wide": 6, "cluster_api": 6,
    },
    "cli": {"client": 0, "store": 0, "objstore": 1, "backup": 2, "admin": 3, "pull": 1, "endpoints": 1,
            "run": 3, "sink": 0, "listing": 1, "times": 1},
    "console": {"html": 0, "history": 0, "session": 0, "pages": 1},
    "dispatch": {"parked": 0, "paused": 0, "replays": 0, "pace": 0, "line": 1, "control": 2, "replayer": 1,
                 "nats": 2, "kafka": 3, "delivery": 4, "outcome": 5, "pipeline": 6},
}
# Upward edges not removed yet: (from, to) -> what removes them. The check fails on any
# other, and on a known edge that is gone (so that the list only shrinks).
KNOWN = {}
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "relay", "src")
TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]\s*\n\s*(pub(\(\w+\))?\s+)?mod\s+\w+\s*\{", re.M)
USE = re.compile(r"\buse\s+([^;]+);")
PATH = re.compile(r"\b((?:crate|super|self)(?:::(?:super|\w+))+)")


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


def without_comments(text):
    """`text` without `//` and `/* */` comments (doc comments included), strings kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def use_paths(tree):
    """The paths of one `use` tree: `a::{b, c::{d, self}}` -> a::b, a::c::d, a::c."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def expand(t):
        if "{" not in t:
            return [t]
        head, rest = t.split("{", 1)
        inner = rest[: rest.rfind("}")]
        parts, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        out = []
        for p in parts:
            if not p:
                continue
            for e in expand(p):
                out.append(head.rstrip(":") if e == "self" else head + e)
        return out

    return expand(tree)


def resolve(path, here):
    """The absolute module path (a list) of `path` named in module `here` (a list), or None
    for a path outside the crate."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        return segs[1:]
    if segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs.pop(0) == "super":
                if not base:
                    return None
                base.pop()
        return base + segs
    return None


def named_modules(code, here):
    """Every module path `code` (of module `here`) names: its `use` trees (groups,
    `super::`, `self::`, re-exports) and the paths in its code."""
    found = []
    for m in USE.finditer(code):
        for p in use_paths(m.group(1)):
            r = resolve(p, here)
            if r is not None:
                found.append(r)
    rest = USE.sub("", code)
    for m in PATH.finditer(rest):
        r = resolve(m.group(1), here)
        if r is not None:
            found.append(r)
    return found


def module_of(rel):
    """The module path of a file under the crate's `src/`: `admin/dlq.rs` -> [admin, dlq],
    `admin/mod.rs` -> [admin], `node.rs` -> [node]."""
    parts = rel.removesuffix(".rs").split(os.sep)
    if parts[-1] == "mod":
        parts.pop()
    return parts


def edges_of(files):
    """(from, to) edges between ranked modules, each with the first file naming it:
    top-level modules as `x`, sub-modules of a layered folder as `x::y`."""
    edges = {}
    for rel, text in files:
        here = module_of(rel)
        if here == ["lib"]:
            continue
        code = without_comments(without_test_modules(text))
        for to in named_modules(code, here):
            if not to:
                continue
            if to[0] != here[0]:
                edges.setdefault((here[0], to[0]), rel)
            elif here[0] in SUBMODULE_RANK and len(here) > 1 and len(to) > 1 and to[1] != here[1]:
                edges.setdefault((f"{here[0]}::{here[1]}", f"{to[0]}::{to[1]}"), rel)
    return edges


def rank_of(m):
    if "::" in m:
        top, sub = m.split("::")
        return SUBMODULE_RANK[top].get(sub)
    return MODULE_RANK.get(m)


def layer_problems(files, known):
    """What the module rules find in `files` ((path under src/, text) pairs)."""
    problems = []
    for rel, _ in files:
        here = module_of(rel)
        if here == ["lib"]:
            continue
        if here[0] not in MODULE_RANK:
            problems.append(f"crates/relay/src/{rel}: module {here[0]!r} has no rank in MODULE_RANK")
        elif here[0] in SUBMODULE_RANK and len(here) > 1 and here[1] not in SUBMODULE_RANK[here[0]]:
            problems.append(f"crates/relay/src/{rel}: {here[0]}::{here[1]} has no rank in "
                            f"SUBMODULE_RANK[{here[0]!r}]")
    edges = edges_of(files)
    for (frm, to), where in sorted(edges.items()):
        rf, rt = rank_of(frm), rank_of(to)
        if rt is None and "::" not in to:
            problems.append(f"crates/relay/src/{where}: names crate::{to}, which has no rank in MODULE_RANK")
        elif rf is None or rt is None:
            continue
        elif rt >= rf and (frm, to) not in known:
            problems.append(f"crates/relay/src/{where}: {frm} names {to}, which is not below it "
                            f"({frm} {rf}, {to} {rt})")
    for (frm, to) in known:
        if (frm, to) not in edges:
            problems.append(f"the known upward edge {frm} -> {to} is gone: remove it from KNOWN")
    return problems, edges


def self_test():
    """Each rule fails on an injected violation, in every form a path can take."""
    def violates(rel, text, extra=()):
        files = [(rel, text), *extra]
        probs, _ = layer_problems(files, {})
        return [p for p in probs if "not below" in p]
    cases = {
        "a path": ("http.rs", "fn f() { crate::admin::x(); }"),
        "a use": ("http.rs", "use crate::admin::api::Api;"),
        "a use group": ("http.rs", "use crate::{telemetry::T, admin::api::Api};"),
        "a nested group": ("http.rs", "use crate::{a::{b}, ingest::{quota::{Quotas}}};"),
        "a re-export": ("http.rs", "pub use crate::dispatch::Thing;"),
        "a renamed use": ("http.rs", "use crate::admin::api::Api as A;"),
        "super:: from a top-level file": ("http.rs", "use super::node::Node;"),
        "super::super:: from a sub-module": ("http/serve.rs", "use super::super::cluster::C;"),
        "a sub-module upward": ("admin/auth.rs", "use super::tenants::x;"),
        "a sub-module upward in a group": ("admin/api.rs", "use super::{auth::A, dlq::D};"),
        "self:: into a sub-module upward": ("admin/mod.rs", "") ,
    }
    failed = []
    for name, (rel, text) in cases.items():
        if name.startswith("self::"):
            # `self::` in a sub-module's own sub-module: admin/auth.rs naming admin::dlq.
            rel, text = "admin/auth.rs", "use crate::admin::dlq::{self};"
        if not violates(rel, text):
            failed.append(name)
    ok = [("admin/dlq.rs", "use super::api::Api; use crate::http::error;"),
          ("node.rs", "use crate::{admin::api::Api, dispatch::x};"),
          ("http.rs", "// use crate::admin::Api;\n/// [`crate::node`]\nfn f() {}")]
    for rel, text in ok:
        if violates(rel, text):
            failed.append(f"a false alarm on {text!r}")
    # The operator's modules: an upward name is found; a part naming its folder's entrance
    # (`planner::adopt` using `super::probe_of`) is not one.
    if not operator_problems([("observed.rs", "use crate::planner::Rollout;")])[0]:
        failed.append("an upward edge of the operator")
    if not operator_problems([("names.rs", "fn f() { crate::resources::x(); }")])[0]:
        failed.append("an upward path in the operator's code")
    if operator_problems([("planner/adopt.rs", "use super::{continue_upgrade, probe_of};")])[0]:
        failed.append("a false alarm on planner::adopt naming its entrance")
    # The crates: the node depending on the store itself (and so on its row API), a crate
    # below depending upward, a crate but the store on RocksDB itself.
    members = {"ankusa-relay", "ankusa-queue", "ankusa-store", "ankusa-keyspace"}
    clean = {"ankusa-relay": {"ankusa-queue", "tokio"}, "ankusa-queue": {"ankusa-store"},
             "ankusa-store": {"rocksdb", "ankusa-keyspace"}, "ankusa-keyspace": set()}
    reached = {"ankusa-relay": {"ankusa-queue", "ankusa-store", "rocksdb"},
               "ankusa-queue": {"ankusa-store", "rocksdb"}, "ankusa-store": {"rocksdb"},
               "ankusa-keyspace": set()}
    if crate_problems(members, clean, reached):
        failed.append("a false alarm on a clean crate graph")
    for what, name, dep in [("the node depending on the store", "ankusa-relay", "ankusa-store"),
                            ("a crate depending upward", "ankusa-keyspace", "ankusa-queue"),
                            ("the queue on RocksDB itself", "ankusa-queue", "rocksdb")]:
        injected = {k: set(v) | ({dep} if k == name else set()) for k, v in clean.items()}
        if not crate_problems(members, injected, reached):
            failed.append(what)
    if failed:
        print("check-layers --self-test: FAIL", *failed, sep="\n  ")
        sys.exit(1)
    print(f"check-layers --self-test: ok ({len(cases) + 5} injected violations found, "
          f"{len(ok) + 2} clean sources pass)")


# --- the operator's modules ------------------------------------------------------------------
# The controller on top; the status and the backups' schedule it writes; the planner (and its
# part `planner::adopt`) and the objects it wants; the restore and drain steps; the plan's
# types, the object store's rules; names and observations at the bottom.
OPERATOR_RANK = {
    "controller": 8,
    "status": 7,
    "backups": 6,
    "planner": 5,
    "resources": 4,
    "restore": 3, "drain": 3,
    "plan": 2, "objstore": 2,
    "names": 1, "nodes": 1, "metrics": 1, "leader": 1,
    "observed": 0, "health": 0, "schedule": 0, "telemetry": 0, "rbac": 0,
}
OPERATOR_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "operator", "src")


def operator_files():
    files = []
    for dirpath, _, filenames in os.walk(OPERATOR_SRC):
        for fn in sorted(filenames):
            if fn.endswith(".rs"):
                path = os.path.join(dirpath, fn)
                files.append((os.path.relpath(path, OPERATOR_SRC), open(path).read()))
    return files


def operator_problems(files):
    """The operator's modules: ranked, so acyclic; each names only those below it."""
    out, n_edges = [], 0
    for rel, text in files:
        if True:
            here = module_of(rel)
            if here[0] in ("lib", "main"):
                continue
            if here[0] not in OPERATOR_RANK:
                out.append(f"crates/operator/src/{rel}: module {here[0]!r} has no rank in OPERATOR_RANK")
                continue
            code = without_comments(without_test_modules(text))
            seen = set()
            for to in named_modules(code, here):
                if not to or to[0] == here[0] or to[0] in seen:
                    continue
                seen.add(to[0])
                n_edges += 1
                rt = OPERATOR_RANK.get(to[0])
                if rt is None:
                    out.append(f"crates/operator/src/{rel}: names crate::{to[0]}, which has no rank")
                elif rt >= OPERATOR_RANK[here[0]]:
                    out.append(f"crates/operator/src/{rel}: {here[0]} names {to[0]}, which is not "
                               f"below it ({OPERATOR_RANK[here[0]]}, {rt})")
    return out, n_edges


if "--self-test" in sys.argv:
    self_test()
    sys.exit(0)

members, direct, reached = crate_graph()
problems = crate_problems(members, direct, reached)
files = []
for dirpath, _, filenames in os.walk(SRC):
    for fn in sorted(filenames):
        if fn.endswith(".rs"):
            path = os.path.join(dirpath, fn)
            files.append((os.path.relpath(path, SRC), open(path).read()))
mod_problems, edges = layer_problems(files, KNOWN)
problems += mod_problems
op_problems, op_edges = operator_problems(operator_files())
problems += op_problems

if problems:
    print("check-layers: FAIL", *problems, sep="\n  ")
    sys.exit(1)
print(f"check-layers: ok ({len(members)} crates; RocksDB only in "
      f"{', '.join(sorted(ROCKSDB_DIRECT))}, reached by {', '.join(sorted(MAY_USE_ROCKSDB))}; "
      f"{len({m for e in edges for m in e})} modules of ankusa-relay, {len(edges)} edges "
      f"(every use form, sub-modules of {', '.join(SUBMODULE_RANK)}), "
      f"{len(KNOWN)} known upward: {'; '.join(f'{a} -> {b}' for a, b in KNOWN)}; "
      f"rows only through the queue (the node does not depend on ankusa-store); "
      f"{len(OPERATOR_RANK)} modules of ankusa-operator, {op_edges} edges, acyclic)")
