#!/usr/bin/env bash
# Prints the path of Toxiproxy's server (e2e/testenv/toxiproxy: its Go module, pinned), the
# proxy the partition suite puts on every link between relay nodes, building it once.
# `make test` builds it before the tests; the suite runs it too (a no-op once built).
exec bash "$(dirname "$0")/go-tool.sh" toxiproxy e2e/testenv/toxiproxy github.com/Shopify/toxiproxy/v2/cmd/server
