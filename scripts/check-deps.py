#!/usr/bin/env python3
"""Every dependency a workspace crate declares is used: `make lint` (part of `make test`).

A `[dependencies]` entry must be named (`name::`, `use name`, `name as`, `extern crate`)
in the crate's `src/` or `build.rs`; one named only by its tests or benches belongs in
`[dev-dependencies]`; a `[dev-dependencies]` entry must be named somewhere in the crate.
A crate may list, in `[package.metadata.check-deps] features-only`, dependencies it
declares only to choose their features for another dependency (reqwest's TLS backend
for object_store's client, say), each with a comment in the manifest saying why.
"""
import os
import re
import sys
import tomllib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def rust_files(path):
    if os.path.isfile(path):
        return [path]
    out = []
    for dirpath, _, filenames in os.walk(path):
        out += [os.path.join(dirpath, f) for f in filenames if f.endswith(".rs")]
    return out


def names(ident, files):
    pattern = re.compile(rf"\b{ident}(::|\s+as\b|\s*;|\s*\}})|\bextern crate {ident}\b")
    return any(pattern.search(open(f, encoding="utf-8").read()) for f in files)


workspace = tomllib.load(open(os.path.join(ROOT, "Cargo.toml"), "rb"))
problems = []
for member in workspace["workspace"]["members"]:
    crate = os.path.join(ROOT, member)
    manifest = tomllib.load(open(os.path.join(crate, "Cargo.toml"), "rb"))
    own = rust_files(os.path.join(crate, "src")) + rust_files(os.path.join(crate, "build.rs"))
    rest = []
    for d in ("tests", "benches", "examples"):
        rest += rust_files(os.path.join(crate, d))
    features_only = (
        manifest["package"].get("metadata", {}).get("check-deps", {}).get("features-only", [])
    )
    for kind in ("dependencies", "dev-dependencies", "build-dependencies"):
        for dep in manifest.get(kind, {}):
            if kind == "dependencies" and dep in features_only:
                continue
            ident = dep.replace("-", "_")
            if ident == manifest["package"]["name"].replace("-", "_"):
                continue  # the crate itself, as a dev-dependency with a feature
            in_own, in_rest = names(ident, own), names(ident, rest)
            if kind == "dev-dependencies":
                if not (in_own or in_rest):
                    problems.append(f"{member}: [dev-dependencies] {dep} is never named")
            elif not in_own:
                where = " (only its tests or benches name it: a dev-dependency)" if in_rest else ""
                problems.append(f"{member}: [{kind}] {dep} is not named in its code{where}")
if problems:
    print("check-deps: FAIL", *problems, sep="\n  ")
    sys.exit(1)
print(f"check-deps: ok ({len(workspace['workspace']['members'])} crates; every dependency named)")
