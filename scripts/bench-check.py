#!/usr/bin/env python3
"""Runs the judged benches and compares their ledger figures with docs/bench-ledger.tsv.

Each judged bench prints `ledger <name> <value> <unit>` lines: ratios within one run (the
relay against a twin or an anchor measured in the same sitting), lower is better, so a
busier host moves them little. `make bench-check` fails when a figure is more than 10%
worse than the ledger's, or a bench fails its own rule, or a ledger figure is not printed
any more; the next regression is seen in the change that makes it.

    scripts/bench-check.py                 run the benches, compare, exit 1 on a regression
    scripts/bench-check.py --record        run them and write the figures into the ledger
    scripts/bench-check.py --from FILE     compare the ledger lines of a saved bench output
"""
import argparse
import datetime
import os
import subprocess
import sys

LEDGER = os.path.join(os.path.dirname(__file__), "..", "docs", "bench-ledger.tsv")
BENCHES = ["ingest", "delivery", "sustain"]
WORSE = 1.10


def read_ledger():
    rows = {}
    with open(LEDGER) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, value, unit, commit, day = line.rstrip("\n").split("\t")
            rows[name] = (float(value), unit, commit, day)
    return rows


def figures(text):
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ledger":
            out[parts[1]] = (float(parts[2]), parts[3])
    return out


def run_benches():
    text, failed = "", []
    for b in BENCHES:
        print(f"bench-check: cargo bench -p ankusa-relay --bench {b}", flush=True)
        p = subprocess.run(
            ["cargo", "bench", "-p", "ankusa-relay", "--bench", b],
            stdout=subprocess.PIPE,
            text=True,
        )
        sys.stdout.write(p.stdout)
        text += p.stdout
        if p.returncode != 0:
            failed.append(b)
    return text, failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--from", dest="from_file")
    args = ap.parse_args()
    if args.from_file:
        text, failed = open(args.from_file).read(), []
    else:
        text, failed = run_benches()
    got = figures(text)
    if args.record:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE, text=True
        ).stdout.strip()
        day = datetime.date.today().isoformat()
        rows = read_ledger()
        for name, (value, unit) in got.items():
            rows[name] = (value, unit, commit, day)
        with open(LEDGER, "w") as f:
            f.write("# name\tvalue (lower is better)\tunit\tcommit\tday: written by scripts/bench-check.py --record\n")
            for name in sorted(rows):
                value, unit, c, d = rows[name]
                f.write(f"{name}\t{value:.3f}\t{unit}\t{c}\t{d}\n")
        print(f"bench-check: recorded {len(got)} figures at {commit}")
        return 0
    bad = [f"{b}: its own rule failed" for b in failed]
    print("\n| figure | ledger | now | change |\n|---|---:|---:|---:|")
    for name, (value, unit, commit, _) in sorted(read_ledger().items()):
        if name not in got:
            bad.append(f"{name}: not printed any more")
            continue
        now = got[name][0]
        change = now / value - 1.0
        print(f"| {name} | {value:.3f}{unit} ({commit}) | {now:.3f}{unit} | {change * 100:+.1f}% |")
        if now > value * WORSE:
            bad.append(f"{name}: {now:.3f} is more than 10% worse than the ledger's {value:.3f} ({commit})")
    if bad:
        print("bench-check: FAIL\n  " + "\n  ".join(bad))
        return 1
    print("bench-check: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
