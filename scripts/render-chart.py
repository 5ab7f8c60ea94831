#!/usr/bin/env python3
"""Render and lint a Helm chart offline with the real Helm engine (helm-python-sdk).

    scripts/render-chart.py CHART [--values-json JSON] [--namespace NS] [--api-versions V,...]

Prints the rendered manifests as one YAML stream (templates in name order) and exits
non-zero when `helm lint --strict` reports an error or a warning, or a template fails to
render. Used by the operator's chart test; no cluster is contacted.
"""
import argparse
import json
import sys

try:
    from helm_python import chart as helm_chart
except ImportError:
    sys.exit("helm-python-sdk is not installed: run scripts/install-deps.sh")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("chart")
    p.add_argument("--values-json", default="{}")
    p.add_argument("--namespace", default="ankusa-system")
    p.add_argument("--release", default="ankusa")
    args = p.parse_args()
    values = json.loads(args.values_json)

    report = helm_chart.lint(args.chart, values, strict=True, namespace=args.namespace)
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    if problems or report.get("errors"):
        for m in problems:
            print(f"lint: {m.get('path')}: {m.get('error')}", file=sys.stderr)
        for e in report.get("errors") or []:
            print(f"lint: {e}", file=sys.stderr)
        return 1

    c = helm_chart.Chart.load(args.chart)
    rendered = c.render(values, name=args.release, namespace=args.namespace, is_install=True)
    for name in sorted(rendered):
        if name.endswith("NOTES.txt"):
            continue
        text = rendered[name].strip()
        if not text:
            continue
        print(f"# Source: {name}")
        if not text.startswith("---"):
            print("---")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
