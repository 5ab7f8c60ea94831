#!/usr/bin/env bash
# Prints the path of Toxiproxy's server (e2e/testenv/toxiproxy: its Go module, pinned), the
# proxy the partition suite puts on every link between relay nodes, building it first if
# the cache has none for this source. `make test` builds it before the tests; the suite runs
# it too (a no-op once built).
set -euo pipefail
cd "$(dirname "$0")/.."
src=e2e/testenv/toxiproxy
hash=$(cat "$src"/go.mod "$src"/go.sum "$src"/tools.go | sha256sum | cut -c1-16)
bin=${XDG_CACHE_HOME:-$HOME/.cache}/ankusa/toxiproxy-$hash
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  echo "toxiproxy: building the test proxy from its Go module (a minute, once)" >&2
  (cd "$src" && go build -trimpath -o "$bin.part" github.com/Shopify/toxiproxy/v2/cmd/server) && mv "$bin.part" "$bin"
fi
echo "$bin"
