#!/usr/bin/env bash
# Prints the path of the test OpenTelemetry Collector (e2e/testenv/otelcol: the OTLP
# receiver and the debug exporter, from the collector's Go modules), building it once.
# `make test` runs it before the tests; the OTLP test runs it too (a no-op once built).
exec bash "$(dirname "$0")/go-tool.sh" otelcol e2e/testenv/otelcol .
