# Images of the two binaries, for Kubernetes (the operator's Relay pods and Jobs run
# `ankusa-relay`; the chart's Deployment runs `ankusa-operator`). Both entrypoints are the
# binary itself and run as UID 10001 on a read-only root filesystem.
#
#   docker build --target relay -t registry.example/ankusa/relay:dev .
#   docker build --target operator -t registry.example/ankusa/operator:dev .
#
# (No Docker engine runs on the development machines of this project; e2e/run.sh takes
# the images as ANKUSA_RELAY_IMAGE and ANKUSA_OPERATOR_IMAGE.)
FROM rust:1-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p ankusa-relay -p ankusa-operator

FROM debian:bookworm-slim AS runtime
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* && useradd --uid 10001 --user-group --no-create-home ankusa
USER 10001:10001

FROM runtime AS relay
COPY --from=build /src/target/release/ankusa-relay /usr/local/bin/ankusa-relay
ENTRYPOINT ["/usr/local/bin/ankusa-relay"]

FROM runtime AS operator
COPY --from=build /src/target/release/ankusa-operator /usr/local/bin/ankusa-operator
ENTRYPOINT ["/usr/local/bin/ankusa-operator"]
