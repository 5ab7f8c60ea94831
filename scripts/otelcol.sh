#!/usr/bin/env bash
# Prints the path of the test OpenTelemetry Collector (e2e/testenv/otelcol: the OTLP
# receiver and the debug exporter, from the collector's Go modules), building it first if
# the cache has none for this source. `make test` runs it before the tests; the OTLP test
# runs it too (a no-op once built).
set -euo pipefail
cd "$(dirname "$0")/.."
src=e2e/testenv/otelcol
hash=$(cat "$src"/go.mod "$src"/go.sum "$src"/main.go | sha256sum | cut -c1-16)
bin=${XDG_CACHE_HOME:-$HOME/.cache}/ankusa/otelcol-$hash
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  echo "otelcol: building the test collector from its Go modules (a few minutes, once)" >&2
  (cd "$src" && go build -trimpath -o "$bin.part" .) && mv "$bin.part" "$bin"
fi
echo "$bin"
