#!/usr/bin/env bash
# Prints the path of a test tool built from Go modules, building it first if the cache has
# none for this source: `scripts/go-tool.sh NAME SRC PACKAGE` builds PACKAGE (`.` for the
# module's own main) in the module at SRC, cached as ~/.cache/ankusa/NAME-<hash of SRC's
# files>, outside `target/` (a clean clone builds it once per machine).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 src=$2 pkg=$3
hash=$(cat "$src"/go.mod "$src"/go.sum "$src"/*.go | sha256sum | cut -c1-16)
bin=${XDG_CACHE_HOME:-$HOME/.cache}/ankusa/$name-$hash
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  echo "$name: building the test tool from its Go modules (a few minutes, once)" >&2
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin.part" "$pkg") && mv "$bin.part" "$bin"
fi
echo "$bin"
