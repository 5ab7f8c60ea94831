#!/usr/bin/env python3
"""File and function sizes, checked (`make check-layers`, part of `make test`):

- no source file over 800 lines of code (blank lines, comments and the file's own
  `#[cfg(test)] mod tests` left out), but `crates/keyspace/src/lib.rs`, where every key's
  bytes are kept together on purpose;
- no function over 150 lines, but in tests and the operator's server-side-apply bodies
  (`crates/operator/src/resources/`: one object's body each, read as one document).

Test files (`tests/`, `benches/`, `tests.rs`) are not counted. `--self-test` shows each
rule failing on an injected violation.
"""
import os
import re
import subprocess
import sys

MAX_FILE = 800
MAX_FN = 150
FILE_EXEMPT = {"crates/keyspace/src/lib.rs"}
FN_EXEMPT_DIRS = ("crates/operator/src/resources/",)
FN = re.compile(r"^(\s*)(pub(\([\w:]+\))? )?(async )?(const )?(unsafe )?fn (\w+)")


def code_end(lines):
    """Where the file's own test module begins (or its end)."""
    for i, l in enumerate(lines):
        if l.strip() == "#[cfg(test)]" and i + 1 < len(lines) and \
                re.match(r"\s*(pub(\(\w+\))? )?mod tests", lines[i + 1]):
            return i
    return len(lines)


def lines_of_code(lines):
    return sum(1 for l in lines[:code_end(lines)]
               if l.strip() and not l.strip().startswith("//"))


def long_functions(lines):
    """(name, first line, length) of each function longer than MAX_FN lines."""
    end, out = code_end(lines), []
    for i in range(end):
        m = FN.match(lines[i])
        if not m:
            continue
        k = i
        while k < end and not lines[k].rstrip().endswith(("{", ";")):
            k += 1
        if k >= end or lines[k].rstrip().endswith(";"):
            continue
        j = k + 1
        while j < end and lines[j].rstrip() != m.group(1) + "}":
            j += 1
        if j < end and j - i + 1 > MAX_FN:
            out.append((m.group(7), i + 1, j - i + 1))
    return out


def problems(files):
    """What the rules find in `files` ((path, text) pairs)."""
    out = []
    for path, text in files:
        lines = text.split("\n")
        n = lines_of_code(lines)
        if n > MAX_FILE and path not in FILE_EXEMPT:
            out.append(f"{path}: {n} lines of code (at most {MAX_FILE}): split it by concept")
        if path.startswith(FN_EXEMPT_DIRS):
            continue
        for name, at, length in long_functions(lines):
            out.append(f"{path}:{at}: fn {name} is {length} lines (at most {MAX_FN}): "
                       "make it a composition of named parts")
    return out


def sources():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    names = subprocess.run(["git", "ls-files", "crates/*.rs"], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split()
    return [(p, open(os.path.join(root, p)).read()) for p in names
            if "/tests/" not in p and "/benches/" not in p and not p.endswith("tests.rs")
            and os.path.exists(os.path.join(root, p))]


def self_test():
    body = "fn long() {\n" + "    let x = 1;\n" * MAX_FN + "}\n"
    big = "".join(f"const C{i}: u8 = 0;\n" for i in range(MAX_FILE + 1))
    failed = []
    if not problems([("crates/relay/src/x.rs", body)]):
        failed.append("a long function")
    if not problems([("crates/relay/src/x.rs", "impl X {\n" + "    " + body.replace("\n", "\n    ") + "}\n")]):
        failed.append("a long method")
    if not problems([("crates/relay/src/x.rs", big)]):
        failed.append("a long file")
    half = "".join(f"const D{i}: u8 = 0;\n" for i in range(MAX_FILE // 2))
    tested = half + "#[cfg(test)]\nmod tests {\n" + big + "}\n"
    if problems([("crates/relay/src/x.rs", tested)]):
        failed.append("a false alarm on a file whose test module is long")
    if problems([("crates/operator/src/resources/x.rs", body)]):
        failed.append("a false alarm on an apply body")
    if failed:
        print("check-sizes --self-test: FAIL", *failed, sep="\n  ")
        sys.exit(1)
    print("check-sizes --self-test: ok (3 injected violations found, 2 exemptions hold)")


if "--self-test" in sys.argv:
    self_test()
    sys.exit(0)
files = sources()
found = problems(files)
if found:
    print("check-sizes: FAIL", *found, sep="\n  ")
    sys.exit(1)
print(f"check-sizes: ok ({len(files)} files: none over {MAX_FILE} lines of code but "
      f"{', '.join(sorted(FILE_EXEMPT))}; no function over {MAX_FN} lines outside tests and "
      f"{', '.join(FN_EXEMPT_DIRS)})")
