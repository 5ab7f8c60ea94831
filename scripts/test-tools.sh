#!/usr/bin/env bash
# The Go-built tools `make test` needs — the control plane's binaries
# (`scripts/k8s-testenv.sh build`), the OpenTelemetry Collector, Toxiproxy, SeaweedFS and
# nats-server — and the Kafka broker's jars (`scripts/kafka.sh`, from Maven Central) —
# built in the background at a low priority while the Rust side installs and compiles, so
# that a fresh machine spends the CPU the Rust builds leave idle on them. Each is cached
# (~/.cache/ankusa): on a machine that has built them once, both steps return at once.
#
#   scripts/test-tools.sh start   begin the builds
#   scripts/test-tools.sh wait    wait for them; fail with their log if one failed
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  start)
    bash scripts/background.sh start test-tools nice -n 10 bash -c 'bash scripts/otelcol.sh >/dev/null &&
      bash scripts/toxiproxy.sh >/dev/null && bash scripts/seaweedfs.sh >/dev/null &&
      bash scripts/nats-server.sh >/dev/null && bash scripts/kafka.sh >/dev/null &&
      bash scripts/k8s-testenv.sh build'
    echo "test-tools: building the Go tools in the background (log: target/test-tools/log)"
    ;;
  wait) bash scripts/background.sh wait test-tools ;;
  *) echo "usage: $0 start|wait" >&2; exit 2 ;;
esac
