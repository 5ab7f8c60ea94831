#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1 for the tests: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake nodes whose pods report Running
# and Ready), all built from their Go modules (e2e/testenv/go.mod pins them) into a cache
# outside target/, never downloaded as prebuilt binaries.
#
#   scripts/k8s-testenv.sh build              build the binaries once per version
#   scripts/k8s-testenv.sh run -- CMD ARGS... start, run CMD with the cluster's env, stop
#   scripts/k8s-testenv.sh start DIR          start in the background; `source DIR/env`
#   scripts/k8s-testenv.sh stop DIR           stop what `start DIR` started
#
# What CMD (or `source DIR/env`) gets:
#   KUBECONFIG                       cluster-admin on the full control plane
#   ANKUSA_TESTENV_BARE_KUBECONFIG   a second kube-apiserver on the same etcd under another
#                                    prefix, with no controllers and no optional CRD: an
#                                    empty cluster (the ServiceMonitor API is not served)
#   ANKUSA_TESTENV_AUDIT_LOG         the full API server's audit log (every write, JSON)
#   ANKUSA_TESTENV_BIN               the directory of the binaries (kubectl among them)
#   ANKUSA_TESTENV_DIR               certificates, kubeconfigs, logs
# and, with the real node (ANKUSA_TESTENV_NODE=1, the default; 0 for kwok's nodes only):
#   ANKUSA_TESTENV_NODE              the real node's name (a kubelet on containerd; tainted
#                                    ankusa.dev/real-node:NoSchedule, so that only pods that
#                                    tolerate it, or tests that lift the taint, land on it)
#   ANKUSA_TESTENV_NODE_IP           the pod bridge's own address: pods reach the API server
#                                    (as the `kubernetes` Service) and the cluster DNS there,
#                                    and a test's host process serves pods there
#   ANKUSA_TESTENV_CONTAINERD        the containerd socket (`ctr --address`), namespace k8s.io
#   ANKUSA_TESTENV_STORAGE_CLASS     a StorageClass of local volumes on the real node
#
# The real node changes the host, and `stop` restores it: the sysctls kubelet rewrites
# (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) and net.ipv4.ip_forward (which
# stays 0: no packet is forwarded), a bridge with pod veths (no gateway, no masquerade, no
# route out), the pods' network namespaces, cgroups (kubepods), and mounts under DIR.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
KWOK_VERSION=v0.8.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0
cache="${ANKUSA_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ankusa/k8s-${K8S_VERSION}}"
COREDNS_VERSION=v1.15.0
HELM_VERSION=v4.3.2
# The Gateway API's CRDs (standard channel), from their module: its own cache file, so a
# new version does not rebuild the control plane.
GATEWAY_API_VERSION=v1.6.3
stamp="$cache/.built-${K8S_VERSION}-${ETCD_VERSION}-${KWOK_VERSION}-${PROMETHEUS_OPERATOR_VERSION}-${COREDNS_VERSION}-${HELM_VERSION}-4"

log() { echo "k8s-testenv: $*" >&2; }
# The real node: on unless ANKUSA_TESTENV_NODE=0.
with_node=${ANKUSA_TESTENV_NODE:-1}
# The node's name, which resolves to 127.0.0.1 everywhere: the API server reaches the
# kubelet by it (kubelet refuses a loopback node IP, and reports the host's own address,
# which nothing here sends to).
NODE_NAME=localhost

# module_dir MODULE@VERSION: the module's files in the Go module cache (downloaded and
# checked against the checksum database).
module_dir() {
  (cd "$root/e2e/testenv" && go mod download -json "$1") |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

# The Gateway API's standard CRDs the operator's HTTPRoute needs (GatewayClass, Gateway,
# HTTPRoute), read from the module's files once into the cache.
gateway_crds() {
  local out="$cache/gateway-api-${GATEWAY_API_VERSION}.yaml"
  if [ ! -f "$out" ]; then
    local dir kind
    mkdir -p "$cache"
    dir=$(GOTOOLCHAIN=local module_dir "sigs.k8s.io/gateway-api@${GATEWAY_API_VERSION}")
    : >"$out.part"
    for kind in gatewayclasses gateways httproutes; do
      { echo "---"; cat "$dir/config/crd/standard/gateway.networking.k8s.io_${kind}.yaml"; } >>"$out.part"
    done
    mv "$out.part" "$out"
  fi
  echo "$out"
}

build() {
  gateway_crds >/dev/null
  if [ -f "$stamp" ]; then
    return 0
  fi
  command -v go >/dev/null || { log "Go is needed to build the control plane"; exit 1; }
  command -v openssl >/dev/null || {
    log "installing openssl with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl
  }
  mkdir -p "$cache"
  local started=$SECONDS
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl ${K8S_VERSION} and etcd ${ETCD_VERSION} (first time only)"
  # One `go build` for all five: they share most of their packages, which compile once.
  # Their version stamped as Kubernetes' own build does (a chart's kubeVersion is checked
  # against it).
  local minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  # Without the symbol table and DWARF (`-s -w`), which no test reads: less to link.
  local ldflags="-s -w"
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$root/e2e/testenv" && go build -ldflags "$ldflags" -o "$cache/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kubectl)
  (cd "$root/e2e/testenv" && go build -ldflags "-s -w" -o "$cache/etcd" go.etcd.io/etcd/server/v3)
  # The real node's pod sandbox binary, and the cluster DNS (CoreDNS with the plugins the
  # Corefile below uses; its own module, e2e/testenv/coredns/go.mod).
  (cd "$root/e2e/testenv" && go build -ldflags "-s -w" -o "$cache/pause" ./pause)
  log "building CoreDNS ${COREDNS_VERSION}"
  (cd "$root/e2e/testenv/coredns" && go build -ldflags "-s -w" -o "$cache/coredns" .)
  # The Helm CLI, for `helm install` as the README runs it (e2e/testenv/helm/go.mod).
  log "building helm ${HELM_VERSION}"
  (cd "$root/e2e/testenv/helm" && go build -ldflags "-s -w" -o "$cache/helm" helm.sh/helm/v4/cmd/helm)
  log "building kwok ${KWOK_VERSION}"
  (cd "$root/e2e/testenv" && GOBIN="$cache" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}")
  # The Prometheus Operator's own ServiceMonitor CRD, from its module's files.
  local dir
  dir=$(module_dir "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}")
  cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" "$cache/servicemonitors.yaml"
  chmod u+w "$cache/servicemonitors.yaml"
  # kwok's own stages, from its module: nodes become Ready and keep a heartbeat, pods
  # become Running and Ready, deleted pods go. Not `pod-complete`, which would mark every
  # Job's pod Succeeded without running anything: a Job's pod stays Running until the
  # test that runs its work says how it ended.
  dir=$(module_dir "sigs.k8s.io/kwok@${KWOK_VERSION}")
  local stage
  : >"$cache/kwok-stages.yaml"
  for stage in node/fast/node-initialize node/heartbeat/node-heartbeat pod/fast/pod-ready pod/fast/pod-delete; do
    { echo "---"; cat "$dir/kustomize/stage/$stage.yaml"; } >>"$cache/kwok-stages.yaml"
  done
  touch "$stamp"
  log "built in $((SECONDS - started)) s into $cache"
}

# wait_ready URL TOKEN WHAT: until URL answers 200, or a process started here has died.
wait_ready() {
  local url=$1 token=$2 what=$3
  for _ in $(seq 1 600); do
    if curl -fsk -H "Authorization: Bearer $token" "$url" >/dev/null 2>&1; then
      return 0
    fi
    while read -r pid name; do
      if ! kill -0 "$pid" 2>/dev/null; then
        log "$name exited; the end of $dir/$name.log:"
        tail -n 5 "$dir/$name.log" >&2
        return 1
      fi
    done <"$dir/pids"
    sleep 0.2
  done
  log "$what did not become ready at $url"
  return 1
}

kubeconfig() { # kubeconfig FILE PORT TOKEN
  local file=$1 port=$2 token=$3
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: https://127.0.0.1:${port}
    certificate-authority-data: $(base64 -w0 <"$dir/ca.crt")
users:
- name: admin
  user:
    token: ${token}
contexts:
- name: testenv
  context: { cluster: testenv, user: admin, namespace: default }
current-context: testenv
EOF
}

start() {
  dir=$1
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  build
  local bin=$cache
  : >"$dir/pids"
  spawn() { # spawn NAME CMD...
    local name=$1
    shift
    "$@" >"$dir/$name.log" 2>&1 &
    echo "$! $name" >>"$dir/pids"
    disown $!  # stopped by `stop`, not reported by this shell's job control
  }

  # The real node's pod network, chosen before the API server: its first /24 is the
  # Service range, so the `kubernetes` Service's ClusterIP is the bridge's own address.
  if [ "$with_node" = 1 ]; then
    pick_subnet
  else
    node_ip=10.96.0.1 svc_range=10.96.0.0/16
  fi
  # Certificates: a CA, the API servers' serving certificate for 127.0.0.1 (and the pod
  # bridge's address), and the service-account signing key.
  (
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
      -subj "/CN=ankusa-testenv-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:%s,DNS:localhost,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' "$node_ip" >san.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out server.crt -days 2 -extfile san.ext 2>/dev/null
    # The API server's client certificate towards kubelets (logs, exec, port-forward).
    openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out kubelet-client.crt -days 2 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  # One user per component, so that the audit log tells the tests' own writes from the
  # scheduler's bindings and kwok's pod status updates.
  local token kcm_token sched_token kwok_token kubelet_token coredns_token
  token=$(openssl rand -hex 24); kcm_token=$(openssl rand -hex 24)
  sched_token=$(openssl rand -hex 24); kwok_token=$(openssl rand -hex 24)
  kubelet_token=$(openssl rand -hex 24); coredns_token=$(openssl rand -hex 24)
  {
    echo "${token},admin,admin-uid,system:masters"
    echo "${kcm_token},system:kube-controller-manager,kcm-uid,system:masters"
    echo "${sched_token},system:kube-scheduler,scheduler-uid,system:masters"
    echo "${kwok_token},kwok,kwok-uid,system:masters"
    echo "${kubelet_token},system:node:${NODE_NAME},kubelet-uid,system:masters"
    echo "${coredns_token},coredns,coredns-uid,system:masters"
  } >"$dir/tokens.csv"
  # Every request that writes, at the Metadata level: the tests count writes with it.
  cat >"$dir/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
EOF

  local etcd_port etcd_peer api_port bare_port kcm_port sched_port kwok_port
  local ports
  # Distinct ports, picked at once: none is bound until its process starts.
  ports=($(python3 "$root/scripts/free_ports.py" 8))
  etcd_port=${ports[0]}; etcd_peer=${ports[1]}; api_port=${ports[2]}; bare_port=${ports[3]}
  kcm_port=${ports[4]}; sched_port=${ports[5]}; kwok_port=${ports[6]}

  spawn etcd "$bin/etcd" --data-dir "$dir/etcd" --name testenv \
    --listen-client-urls "http://127.0.0.1:${etcd_port}" \
    --advertise-client-urls "http://127.0.0.1:${etcd_port}" \
    --listen-peer-urls "http://127.0.0.1:${etcd_peer}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer}" \
    --initial-cluster "testenv=http://127.0.0.1:${etcd_peer}" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296
  wait_ready "http://127.0.0.1:${etcd_port}/health" "" etcd

  apiserver() { # apiserver NAME PORT PREFIX EXTRA...
    local name=$1 port=$2 prefix=$3
    shift 3
    spawn "$name" "$bin/kube-apiserver" \
      --etcd-servers "http://127.0.0.1:${etcd_port}" --etcd-prefix "$prefix" \
      --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
      --tls-cert-file "$dir/server.crt" --tls-private-key-file "$dir/server.key" \
      --client-ca-file "$dir/ca.crt" \
      --token-auth-file "$dir/tokens.csv" \
      --service-account-issuer https://kubernetes.default.svc.cluster.local \
      --service-account-key-file "$dir/sa.pub" \
      --service-account-signing-key-file "$dir/sa.key" \
      --authorization-mode RBAC \
      --service-cluster-ip-range "$svc_range" \
      --allow-privileged=false \
      --endpoint-reconciler-type none \
      --cert-dir "$dir/$name-certs" \
      "$@"
  }
  # The real node's kubelet serves on 127.0.0.1 under the name `localhost`.
  # PodTolerationRestriction: e2e/node.sh's namespaces tolerate the real node's taint for
  # every pod of theirs (scheduler.alpha.kubernetes.io/defaultTolerations).
  apiserver kube-apiserver "$api_port" /registry \
    --enable-admission-plugins PodTolerationRestriction \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.log" \
    --audit-log-mode blocking --kubelet-preferred-address-types Hostname \
    --kubelet-client-certificate "$dir/kubelet-client.crt" --kubelet-client-key "$dir/kubelet-client.key"
  apiserver kube-apiserver-bare "$bare_port" /registry-bare
  wait_ready "https://127.0.0.1:${api_port}/readyz" "$token" kube-apiserver
  wait_ready "https://127.0.0.1:${bare_port}/readyz" "$token" "the bare kube-apiserver"
  kubeconfig "$dir/kubeconfig" "$api_port" "$token"
  kubeconfig "$dir/kubeconfig-bare" "$bare_port" "$token"
  kubeconfig "$dir/kubeconfig-kcm" "$api_port" "$kcm_token"
  kubeconfig "$dir/kubeconfig-scheduler" "$api_port" "$sched_token"
  kubeconfig "$dir/kubeconfig-kwok" "$api_port" "$kwok_token"
  kubeconfig "$dir/kubeconfig-kubelet" "$api_port" "$kubelet_token"
  kubeconfig "$dir/kubeconfig-coredns" "$api_port" "$coredns_token"

  spawn kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/kubeconfig-kcm" --authentication-kubeconfig "$dir/kubeconfig-kcm" \
    --authorization-kubeconfig "$dir/kubeconfig-kcm" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
    --service-account-private-key-file "$dir/sa.key" --root-ca-file "$dir/ca.crt" \
    --use-service-account-credentials --controllers '*' \
    --cert-dir "$dir/kcm-certs" \
    --concurrent-statefulset-syncs 5 --concurrent-job-syncs 5 --node-monitor-grace-period 60s
  spawn kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$dir/kubeconfig-scheduler" --authentication-kubeconfig "$dir/kubeconfig-scheduler" \
    --authorization-kubeconfig "$dir/kubeconfig-scheduler" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false \
    --cert-dir "$dir/scheduler-certs"
  spawn kwok "$bin/kwok" --kubeconfig "$dir/kubeconfig-kwok" --config "$bin/kwok-stages.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 --node-port "$kwok_port" --cidr 10.244.0.0/16 \
    --server-address "127.0.0.1:${ports[7]}"

  local kubectl=("$bin/kubectl" --kubeconfig "$dir/kubeconfig")
  # Two fake nodes for the pods.
  for n in 0 1; do
    cat <<EOF | "${kubectl[@]}" apply -f - >/dev/null
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-${n}
  annotations: { kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0" }
  labels: { type: kwok, kubernetes.io/hostname: kwok-node-${n}, kubernetes.io/os: linux }
status:
  allocatable: { cpu: "64", memory: 256Gi, pods: "110" }
  capacity: { cpu: "64", memory: 256Gi, pods: "110" }
EOF
  done
  # The CRDs: the Relay from the committed manifest (on both servers), the ServiceMonitor
  # from the Prometheus Operator's module and the Gateway API's from theirs (on the full
  # control plane only).
  "${kubectl[@]}" apply --server-side -f "$root/crates/crds/manifests/relay.yaml" >/dev/null
  "${kubectl[@]}" apply --server-side -f "$cache/servicemonitors.yaml" >/dev/null
  "${kubectl[@]}" apply --server-side -f "$(gateway_crds)" >/dev/null
  "${kubectl[@]}" wait --for condition=Established --timeout 60s \
    crd/relays.ankusa.dev crd/servicemonitors.monitoring.coreos.com \
    crd/httproutes.gateway.networking.k8s.io crd/gateways.gateway.networking.k8s.io >/dev/null
  "$bin/kubectl" --kubeconfig "$dir/kubeconfig-bare" apply --server-side \
    -f "$root/crates/crds/manifests/relay.yaml" >/dev/null
  "$bin/kubectl" --kubeconfig "$dir/kubeconfig-bare" wait --for condition=Established \
    --timeout 60s crd/relays.ankusa.dev >/dev/null
  # Wait until the controllers run (the default ServiceAccount exists) and kwok has made
  # the nodes Ready.
  "${kubectl[@]}" wait --for condition=Ready node --all --timeout 60s >/dev/null
  for _ in $(seq 1 300); do
    "${kubectl[@]}" get serviceaccount default -n default >/dev/null 2>&1 && break
    sleep 0.2
  done
  while read -r pid name; do
    kill -0 "$pid" 2>/dev/null || { log "$name exited: see $dir/$name.log"; return 1; }
  done <"$dir/pids"
  if [ "$with_node" = 1 ]; then
    start_node "$api_port"
  fi

  cat >"$dir/env" <<EOF
export KUBECONFIG="$dir/kubeconfig"
export ANKUSA_TESTENV_BARE_KUBECONFIG="$dir/kubeconfig-bare"
export ANKUSA_TESTENV_AUDIT_LOG="$dir/audit.log"
export ANKUSA_TESTENV_BIN="$bin"
export ANKUSA_TESTENV_DIR="$dir"
export PATH="$bin:\$PATH"
EOF
  if [ "$with_node" = 1 ]; then
    cat >>"$dir/env" <<EOF
export ANKUSA_TESTENV_NODE="$NODE_NAME"
export ANKUSA_TESTENV_NODE_IP="$node_ip"
export ANKUSA_TESTENV_CONTAINERD="$dir/node/containerd.sock"
export ANKUSA_TESTENV_STORAGE_CLASS=ankusa-local
EOF
  fi
  log "control plane ${K8S_VERSION} up at https://127.0.0.1:${api_port} (source $dir/env)"
}

stop() {
  local dir=$1
  [ -f "$dir/pids" ] || return 0
  if [ -d "$dir/node" ]; then stop_node "$dir"; fi
  local pids
  pids=$(tac "$dir/pids" | cut -d' ' -f1)
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 1 100); do
    local alive=0
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  rm -f "$dir/pids"
  if [ -d "$dir/node" ]; then restore_host "$dir"; fi
  return 0
}

# shellcheck source=scripts/k8s-node.sh
source "$root/scripts/k8s-node.sh"

case "${1:-}" in
  build) build ;;
  start) [ $# -eq 2 ] || { echo "usage: $0 start DIR" >&2; exit 2; }; start "$2" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  run)
    shift
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || { echo "usage: $0 run -- CMD ARGS..." >&2; exit 2; }
    work=$(mktemp -d "${TMPDIR:-/tmp}/ankusa-k8s.XXXXXX")
    trap 'stop "$work"; [ "${ANKUSA_TESTENV_KEEP:-}" = 1 ] || rm -rf "$work"' EXIT
    trap 'exit 130' INT TERM
    start_at=$SECONDS
    start "$work"
    log "started in $((SECONDS - start_at)) s"
    # shellcheck disable=SC1091
    source "$work/env"
    "$@"
    ;;
  *) echo "usage: $0 build | run -- CMD ARGS... | start DIR | stop DIR" >&2; exit 2 ;;
esac
