#!/usr/bin/env bash
# Prints the path of `nats-server` (e2e/testenv/nats: its Go module, pinned), the JetStream
# broker the NATS sink's tests and the `nats` bench run on loopback, building it first if
# the cache has none (once per machine; see scripts/go-tool.sh).
exec bash "$(dirname "$0")/go-tool.sh" nats-server e2e/testenv/nats github.com/nats-io/nats-server/v2
