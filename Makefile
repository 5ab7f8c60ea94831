# The two set-up commands of the README: `make run` and `make test`.
# Both install what they need on a fresh Debian machine (see scripts/install-deps.sh).
SHELL := /bin/bash
CARGO ?= cargo
CONFIG ?= examples/quickstart.yaml

.PHONY: deps run test fmt lint nextest e2e crds bench

deps:
	@bash scripts/install-deps.sh

## Build the relay node and start it on the embedded store with the example config.
run: deps
	$(CARGO) build -p ankusa-relay --bin ankusa-relay
	@echo "ankusa-relay: starting a node with $(CONFIG). Send a first hook with:"
	@echo "  curl -i -X POST http://127.0.0.1:8080/ingest/demo -H 'x-tenant: acme' -H 'content-type: application/json' -d '{\"hello\":\"world\"}'"
	@echo "see it delivered: ./target/debug/ankusa-relay sink --listen 127.0.0.1:9999 --secret whsec_c2luay1zZWNyZXQtZm9yLXRoZS1xdWlja3N0YXJ0"
	@echo "and counted: curl http://127.0.0.1:9090/v1/node"
	GITHUB_WEBHOOK_SECRET=$${GITHUB_WEBHOOK_SECRET:-quickstart-github-secret} ./target/debug/ankusa-relay run --config $(CONFIG)

## Every check and every test, from a clean clone.
test: deps fmt lint nextest e2e

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Unit, property and integration tests. The benches are compiled by `lint` (clippy
# --all-targets) but not run here: they are programs with their own pass rules (`make bench`).
nextest:
	$(CARGO) nextest run --workspace --no-fail-fast

# Tests on a real cluster: they run where KUBECONFIG is set and say so when skipped.
e2e:
	@bash e2e/run.sh

## Regenerate crds/manifests/relay.yaml and the chart's CRD template from crds/src/relay.rs.
crds:
	$(CARGO) run -p ankusa-crds --bin crdgen

## The self-asserting benches (not part of `make test`; see docs/testing.md).
bench: deps
	$(CARGO) bench -p ankusa-relay --bench gauges
	$(CARGO) bench -p ankusa-relay --bench dispatch_tick
	$(CARGO) bench -p ankusa-relay --bench ingest
	$(CARGO) bench -p ankusa-relay --bench delivery
	$(CARGO) bench -p ankusa-relay --bench migration
