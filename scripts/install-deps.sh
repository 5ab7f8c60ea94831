#!/usr/bin/env bash
# Installs what Ankusa needs, only where it is missing.
#
#   scripts/install-deps.sh run    what `make run` needs to build and start a node:
#                                  libclang (bindgen, for the RocksDB bindings, Debian's
#                                  libclang-dev), a C++ compiler for RocksDB, a C one (zstd,
#                                  librdkafka), make, and OpenSSL's headers with pkg-config
#                                  (librdkafka's TLS). Nothing else: a first hook waits only on
#                                  the build.
#   scripts/install-deps.sh image  what `make image` uses on a Debian machine: the build's
#                                  (libclang, C and C++ compilers), objcopy (binutils) and
#                                  python3 for scripts/image.py, and apt's package lists for
#                                  its `apt-get download` of the base's packages. No test tool.
#   scripts/install-deps.sh bench  what `make bench` adds: wrk, the outside load generator
#                                  `ingest` drives the relay process with.
#   scripts/install-deps.sh system the Debian packages of what `make test` needs, alone (what
#                                  the Go tools' background builds wait for).
#   scripts/install-deps.sh        that, and what `make test` needs:
# - cargo-nextest, the test runner `make test` uses
# - a nightly Rust toolchain (minimal profile), for the fuzz smoke's cargo-fuzz (libFuzzer)
# - promtool (Debian's prometheus package), to lint the metrics exposition and test the
#   alert rules in tests; curl, which the README's quickstart test runs as the README writes it
# - helm-python-sdk (PyPI): the Helm engine, offline, to render and lint the chart in tests
# - schemathesis (PyPI): runs every operation of docs/openapi.json against a live node
# - the real Kubernetes node of the tests (scripts/k8s-node.sh): containerd, runc, the CNI
#   plugins, iptables and nftables (to put the host's tables back); skopeo to push the
#   images `make image` builds
# - iproute2 and iptables for the partition suite's network namespaces and drops
# - a Java runtime (17 or newer) and Maven: the Kafka sink's test broker is Apache Kafka's
#   own jars from Maven Central (scripts/kafka.sh)
set -euo pipefail
mode=${1:-test}
apt_install() { # Debian packages, as root or through sudo
  echo "install-deps: installing $* with apt-get"
  local sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$@"
}
case "$mode" in
  run | test | system | image) ;;
  bench)
    command -v wrk >/dev/null 2>&1 || apt_install wrk
    exit 0 ;;
  *) echo "usage: $0 [run|test|system|image|bench]" >&2; exit 2 ;;
esac

need_apt=()
# Ask dpkg: a bare libclang-cpp (present on fresh machines) is not what bindgen loads.
if ! dpkg -s libclang-dev >/dev/null 2>&1; then
  need_apt+=(libclang-dev)
fi
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
[ "$mode" = image ] || command -v make >/dev/null 2>&1 || need_apt+=(make)
# librdkafka's build (the Kafka sink) links Debian's OpenSSL, found through pkg-config.
dpkg -s libssl-dev >/dev/null 2>&1 || need_apt+=(libssl-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
if [ "$mode" = image ]; then
  command -v objcopy >/dev/null 2>&1 || need_apt+=(binutils)
  command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
  [ -f /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
elif [ "$mode" != run ]; then
  # The control plane's certificates (scripts/k8s-testenv.sh).
  command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
  # promtool lints the /metrics exposition in the admin tests (Debian's prometheus package).
  command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
  command -v curl >/dev/null 2>&1 || need_apt+=(curl)
  command -v containerd >/dev/null 2>&1 || need_apt+=(containerd)
  command -v runc >/dev/null 2>&1 || need_apt+=(runc)
  [ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
  command -v iptables-save >/dev/null 2>&1 || need_apt+=(iptables)
  command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
  command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
  command -v skopeo >/dev/null 2>&1 || need_apt+=(skopeo)
  command -v objcopy >/dev/null 2>&1 || need_apt+=(binutils)
  python3 -c 'import yaml' >/dev/null 2>&1 || need_apt+=(python3-yaml)
  # The console's browser test drives a real headless Chromium over WebDriver.
  [ -x /usr/bin/chromium ] || need_apt+=(chromium)
  [ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
  # The Kafka broker of the Kafka sink's tests: Kafka 4 runs on Java 17 or newer.
  java_ok() { java -version 2>&1 | awk -F'"' '/version/ { split($2, v, "."); exit !(v[1] >= 17) }'; }
  command -v java >/dev/null 2>&1 && java_ok || need_apt+=(default-jre-headless)
  command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  apt_install "${need_apt[@]}"
elif [ "$mode" = image ] && ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  # scripts/image.py downloads the base's packages: apt needs its lists (an image's are gone).
  $([ "$(id -u)" -eq 0 ] || echo sudo) apt-get update -qq
fi
[ "$mode" = image ] && exit 0
[ "$mode" = system ] && exit 0

[ "$mode" = test ] || exit 0

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "install-deps: installing cargo-nextest from crates.io"
  # Built unoptimised and without its self-update (which brings a TLS stack and aws-lc's C
  # build): a fresh machine compiles it in a fraction of the release build's 5 min 41 s,
  # and a test runner that only starts processes does not run slower for it.
  cargo install cargo-nextest --locked --debug --no-default-features
fi

# The chart tests render and lint charts/ankusa with Helm's own engine; this package
# carries it as a library, so no helm binary or cluster is needed.
HELM_SDK_VERSION=0.2.2
if ! python3 -c "import helm_python" >/dev/null 2>&1; then
  echo "install-deps: installing helm-python-sdk ${HELM_SDK_VERSION} from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "helm-python-sdk==${HELM_SDK_VERSION}"
fi

# The API contract test drives a live node with every operation of the OpenAPI document.
SCHEMATHESIS_VERSION=4.32.5
if ! python3 -c "import schemathesis, sys; sys.exit(schemathesis.__version__ != '${SCHEMATHESIS_VERSION}')" >/dev/null 2>&1; then
  echo "install-deps: installing schemathesis ${SCHEMATHESIS_VERSION} from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "schemathesis==${SCHEMATHESIS_VERSION}"
fi

# The fuzz smoke builds its targets with cargo-fuzz, whose libFuzzer instrumentation needs
# a nightly compiler (scripts/fuzz.sh installs cargo-fuzz itself, into its cache).
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "install-deps: installing a nightly Rust toolchain (minimal profile) with rustup"
  rustup toolchain install nightly --profile minimal --no-self-update
fi
