# The two set-up commands of the README: `make run` and `make test`.
# Both install what they need on a fresh Debian machine (see scripts/install-deps.sh).
SHELL := /bin/bash
CARGO ?= cargo
CONFIG ?= examples/quickstart.yaml

.PHONY: deps deps-system deps-run run test fmt lint check-layers nextest e2e testenv crds bench bench-check fuzz fuzz-smoke image image-archives otelcol toxiproxy seaweedfs chaos

# Everything `make test` needs (build tools, test runners, the real node's packages, a
# nightly toolchain for the fuzz smoke).
deps:
	@bash scripts/install-deps.sh

# The Debian packages `make test` needs, alone (what the Go tools' builds wait for).
deps-system:
	@bash scripts/install-deps.sh system

# Only what building and starting a node needs: a first hook waits on nothing else.
deps-run:
	@bash scripts/install-deps.sh run

## Build the relay node and start it on the embedded store with the example config.
run: deps-run
	$(CARGO) build -p ankusa-relay --bin ankusa-relay
	@echo "ankusa-relay: starting a node with $(CONFIG). Send a first hook with:"
	@echo "  curl -i -X POST http://127.0.0.1:8080/ingest/demo -H 'x-tenant: acme' -H 'content-type: application/json' -d '{\"hello\":\"world\"}'"
	@echo "see it delivered: ./target/debug/ankusa-relay sink --listen 127.0.0.1:9999 --secret whsec_c2luay1zZWNyZXQtZm9yLXRoZS1xdWlja3N0YXJ0"
	@echo "and counted: curl -H 'authorization: Bearer quickstart-admin-token' http://127.0.0.1:9090/v1/node"
	./target/debug/ankusa-relay run --config $(CONFIG)

## Every check and every test, from a clean clone. The tests run against a real
## Kubernetes control plane that scripts/k8s-testenv.sh builds (once, from the Go modules
## pinned in e2e/testenv/go.mod) and starts on 127.0.0.1, and stops when they end.
## The Go-built tools (the control plane, the collector, Toxiproxy, SeaweedFS) build in the
## background, at a low priority, from the moment the system packages are in, and are
## waited for before the control plane starts (scripts/test-tools.sh); the fuzz smoke runs
## in the background at the lowest priority from the toolchains' install to the tests' end
## (scripts/fuzz-smoke.sh).
test: deps-system
	@bash scripts/test-tools.sh start
	@$(MAKE) --no-print-directory deps
	@bash scripts/fuzz-smoke.sh start
	@$(MAKE) --no-print-directory fmt lint check-layers
	@bash scripts/test-tools.sh wait
	bash scripts/k8s-testenv.sh run -- $(MAKE) --no-print-directory nextest e2e
	@bash scripts/fuzz-smoke.sh wait

## Every fuzz target (fuzz/, cargo fuzz on nightly) for FUZZ_SECONDS each (default 10 min).
FUZZ_SECONDS ?= 600
fuzz:
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# The smoke `make test` runs (in the background: scripts/fuzz-smoke.sh): each target for
# 20 s; a crash fails the build.
fuzz-smoke:
	bash scripts/fuzz.sh 20

fmt:
	$(CARGO) fmt --all -- --check

# clippy with the workspace's lints, and every declared dependency used (scripts/check-deps.py).
lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	python3 scripts/check-deps.py

# The crate graph of docs/architecture.md: no crate depends upward, only the node reaches RocksDB;
# and the sizes: no file over 800 lines of code, no function over 150 lines.
check-layers:
	python3 scripts/check-layers.py --self-test
	python3 scripts/check-layers.py
	python3 scripts/check-sizes.py --self-test
	python3 scripts/check-sizes.py

# The test OpenTelemetry Collector (built once from its Go modules, then cached).
otelcol:
	@bash scripts/otelcol.sh >/dev/null

# Toxiproxy's server, for the partition suite (built once from its Go module, then cached).
toxiproxy:
	@bash scripts/toxiproxy.sh >/dev/null

# SeaweedFS (its S3 gateway), for the object-storage backup tests (built once from its Go
# module, then cached).
seaweedfs:
	@bash scripts/seaweedfs.sh >/dev/null

## Random schedules of network faults against a Relay of three nodes in network namespaces
## (CHAOS_SCHEDULES, default 20; CHAOS_SEED, default the clock). Needs root, as `make test`.
CHAOS_SCHEDULES ?= 20
chaos: deps toxiproxy
	ANKUSA_CHAOS_SCHEDULES=$(CHAOS_SCHEDULES) ANKUSA_CHAOS_SEED=$(CHAOS_SEED) \
	  $(CARGO) nextest run -p ankusa-relay --run-ignored only -E 'test(=partition::chaos)' --no-capture

# Unit, property and integration tests. The benches are compiled by `lint` (clippy
# --all-targets) but not run here: they are programs with their own pass rules (`make bench`).
# nextest runs no doctests: the compile-fail examples (the `#[answers]` macro's, the queue's
# rows that do not compile outside it) run with `cargo test --doc`, over the whole workspace:
# with `-p` its crates' features would differ from the test build's, and RocksDB would
# compile a second time (13 min on two cores, measured in CI).
nextest:
	$(CARGO) nextest run --workspace --no-fail-fast
	$(CARGO) test -q --workspace --doc

# The newcomer's path (`make run` and the README's quickstart block, e2e/quickstart.sh);
# the operator, the chart and real relay nodes on the control plane `make test` started
# (or any the environment of `scripts/k8s-testenv.sh start DIR` points at).
# e2e/node.sh runs the images on the real node, built from the debug binaries the other
# e2e scripts use (a release build would compile RocksDB once more).
# The relay is built alone, as `make run` builds it (e2e/quickstart.sh runs `make run`); the
# operator is the test build's own, which `cargo nextest run` has just built (a no-op here
# then): built alone, its dependencies would take other features and compile a second time
# (2 min 56 s measured on two cores).
e2e:
	$(CARGO) test --workspace --no-run -q
	$(CARGO) build -p ankusa-relay --bin ankusa-relay
	@bash e2e/quickstart.sh
	@bash e2e/run.sh
	@bash e2e/upgrade.sh
	@$(MAKE) --no-print-directory image-archives IMAGE_PROFILE=dev IMAGE_BUILD=
	@bash e2e/node.sh

## The images of the relay and the operator; none is published (docs/deployment.md). On
## Debian or Ubuntu: OCI archives (target/images/{relay,operator}.oci.tar) built by
## scripts/image.py from Debian's packages and the release binaries, without a registry or
## a container engine, installing only what the build uses; the same inputs give the same
## digest. Elsewhere, or with IMAGE_ENGINE=podman|docker|buildah: the same files through
## the Containerfile (scripts/image.sh). Push them with
## `skopeo copy oci-archive:target/images/relay.oci.tar docker://REGISTRY/ankusa/relay:TAG`.
IMAGE_PROFILE ?= release
IMAGE_REGISTRY ?= ghcr.io/ankusa
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
IMAGE_DIR = target/$(if $(filter dev,$(IMAGE_PROFILE)),debug,$(IMAGE_PROFILE))
image:
	@IMAGE_REGISTRY=$(IMAGE_REGISTRY) IMAGE_TAG=$(IMAGE_TAG) bash scripts/image.sh

# The archives from binaries of IMAGE_PROFILE (`make e2e`: the debug ones it has built, so
# it passes IMAGE_BUILD=).
IMAGE_BUILD ?= $(CARGO) build --profile $(IMAGE_PROFILE) -p ankusa-relay --bin ankusa-relay \
	-p ankusa-operator --bin ankusa-operator
image-archives:
	$(IMAGE_BUILD)
	python3 scripts/image.py --binary $(IMAGE_DIR)/ankusa-relay --ref $(IMAGE_REGISTRY)/relay:$(IMAGE_TAG) --out target/images/relay.oci.tar
	python3 scripts/image.py --binary $(IMAGE_DIR)/ankusa-operator --ref $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG) --out target/images/operator.oci.tar

## Build the control plane's binaries (cached under ~/.cache/ankusa) without starting it.
testenv:
	@bash scripts/k8s-testenv.sh build

## Regenerate crates/crds/manifests/relay.yaml and the chart's CRD template from crates/crds/src/relay.rs.
crds:
	$(CARGO) run -p ankusa-crds --bin crdgen

## The judged benches against the ledger of their last figures (docs/bench-ledger.tsv):
## fails when a figure is more than 10% worse (docs/performance.md, "The ledger").
bench-check: deps
	@bash scripts/install-deps.sh bench
	python3 scripts/bench-check.py

## The self-asserting benches (not part of `make test`; see docs/testing.md).
bench: deps
	@bash scripts/install-deps.sh bench
	$(CARGO) bench -p ankusa-relay --bench gauges
	$(CARGO) bench -p ankusa-relay --bench dispatch_tick
	$(CARGO) bench -p ankusa-relay --bench ingest
	$(CARGO) bench -p ankusa-relay --bench delivery
	$(CARGO) bench -p ankusa-relay --bench pull
	$(CARGO) bench -p ankusa-relay --bench migration
	$(CARGO) bench -p ankusa-relay --bench replay
	$(CARGO) bench -p ankusa-relay --bench sustain
	$(CARGO) bench -p ankusa-relay --bench depth
	$(CARGO) bench -p ankusa-relay --bench latency
	$(CARGO) bench -p ankusa-relay --bench fairness
	$(CARGO) bench -p ankusa-relay --bench forward
	$(CARGO) bench -p ankusa-relay --bench slow_clients
	$(CARGO) bench -p ankusa-relay --bench drain
	$(CARGO) bench -p ankusa-relay --bench archive
	$(CARGO) bench -p ankusa-relay --bench tenant_quota
	$(CARGO) bench -p ankusa-relay --bench console
	$(CARGO) bench -p ankusa-relay --bench backup
	$(CARGO) bench -p ankusa-relay --bench nats
	$(CARGO) bench -p ankusa-relay --bench kafka
	$(CARGO) bench -p ankusa-relay --bench endpoints
