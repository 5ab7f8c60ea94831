# The set-up every e2e script shares (sourced): a namespace with the chart installed, the
# runner (e2e/runner.py) giving kwok's pods real processes, and the operator process with
# the chart's ServiceAccount's token. `e2e_start` sets ns, work, proxy, relay_bin,
# operator_bin and operator_pid; everything stops on exit, the namespace goes (unless
# ANKUSA_E2E_KEEP=1), and a failure prints the operator's and the runner's logs.
# ANKUSA_E2E_RELEASES (image → release, see runner.py) is passed to the runner.

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if [ -z "${KUBECONFIG:-}" ] || [ -z "${ANKUSA_TESTENV_DIR:-}" ]; then
  echo "e2e: no control plane: run under scripts/k8s-testenv.sh (make test does)" >&2
  exit 1
fi
relay_bin="$root/target/debug/ankusa-relay"
operator_bin="$root/target/debug/ankusa-operator"
for b in "$relay_bin" "$operator_bin"; do
  [ -x "$b" ] || { echo "e2e: $b is missing (make e2e builds it)" >&2; exit 1; }
done

pids=()
# A failure's reason: printed when it happens, and again last, after the logs cleanup shows
# (the end of a long log names it).
e2e_failure=
fail() { e2e_failure="e2e: FAIL: $*"; echo "$e2e_failure" >&2; exit 1; }
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then
    echo "e2e: failed; the operator's log:" >&2
    tail -n 60 "$work/operator.log" >&2 || true
    echo "e2e: the runner's log:" >&2
    tail -n 40 "$work/runner.log" >&2 || true
    kubectl -n "$ns" get relays,pods,pvc,jobs -o wide >&2 || true
  fi
  if [ "${ANKUSA_E2E_KEEP:-}" != 1 ]; then
    kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
    # The chart's cluster-wide RBAC goes with it (a namespace's deletion leaves it).
    kubectl delete "clusterrolebinding/$ns-ankusa" "clusterrole/$ns-ankusa" --ignore-not-found >/dev/null 2>&1 || true
    rm -rf "$work"
  else
    echo "e2e: kept namespace $ns and $work" >&2
  fi
  [ $rc -eq 0 ] || [ -z "$e2e_failure" ] || echo "$e2e_failure" >&2
  exit $rc
}
free_port() { python3 scripts/free_ports.py; }

# The operator process (again, after a SIGKILL: e2e_operator starts another); its
# /metrics on $operator_metrics.
e2e_operator() {
  operator_metrics="127.0.0.1:$(free_port)"
  KUBECONFIG="$work/operator-kubeconfig" "$operator_bin" run \
    --watch-namespace "$ns" --metrics-addr "$operator_metrics" \
    --lease-namespace "$ns" --identity "e2e-operator-$RANDOM" --poll-interval-s 2 \
    --lease-duration-s 4 --renew-deadline-s 3 --retry-period-s 1 \
    --node-url-template "http://127.0.0.1:${proxy}/admin/{namespace}/{pod}" \
    --node-ingest-url-template "http://127.0.0.1:${proxy}/ingest/{namespace}/{pod}" \
    >>"$work/operator.log" 2>&1 &
  operator_pid=$!
  pids+=("$operator_pid")
}

e2e_start() {
  ns="ankusa-e2e-$(openssl rand -hex 3)"
  work=$(mktemp -d "${TMPDIR:-/tmp}/ankusa-e2e.XXXXXX")
  trap cleanup EXIT
  echo "e2e: installing the chart into $ns (the operator's namespace, and the Relay's)"
  kubectl create namespace "$ns" >/dev/null
  python3 scripts/render-chart.py charts/ankusa --namespace "$ns" --release ankusa \
    --values-json "{\"image\":{\"tag\":\"e2e\"},\"watchNamespace\":\"$ns\"}" \
    | kubectl apply --server-side -n "$ns" -f - >/dev/null
  kubectl wait --for=condition=Established crd/relays.ankusa.dev --timeout=1m >/dev/null

  # The operator process, with the chart's ServiceAccount's token: the chart's RBAC is
  # what it has. (kwok's pods of the chart's Deployment run nothing; this process is the
  # operator.)
  local token
  token=$(kubectl -n "$ns" create token ankusa --duration 2h)
  python3 - "$KUBECONFIG" "$token" >"$work/operator-kubeconfig" <<'PY'
import sys
text = open(sys.argv[1]).read()
head, _, _ = text.partition("users:")
print(head + "users:\n- name: admin\n  user:\n    token: " + sys.argv[2] + "\n"
      + "contexts:\n- name: testenv\n  context: { cluster: testenv, user: admin }\ncurrent-context: testenv")
PY
  if kubectl --kubeconfig "$work/operator-kubeconfig" get secrets -A >/dev/null 2>&1; then
    echo "e2e: the operator's ServiceAccount can list every Secret: the chart grants too much" >&2
    exit 1
  fi

  proxy=$(free_port)
  python3 e2e/runner.py "$ns" "$work" "$proxy" "$relay_bin" >"$work/runner.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do [ -f "$work/ready" ] && break; sleep 0.1; done
  e2e_operator
}

# Waits (up to $1 seconds) until the command in "${@:2}" succeeds.
e2e_until() {
  local limit=$1; shift
  local end=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.5
  done
}

# The format-2 fixture's stores moved to format 3, on every node of a Relay whose stores
# are copies of it ($@, each a node's /v1/node): each node at format 3 with the four
# tenants; the fixture's 16 deliveries a store (13 of them of hooks the store holds: 3 are
# rows whose hook was already lost in format 2, which a node drops as undeliverable) all on
# some node — the copies' rows of the tenants a node does not own move to their owner (the
# handoff), so they are counted over the Relay, once no node has a batch on its way.
e2e_fixture_moved_all() {
  python3 - "$@" <<'PY'
import json, sys
nodes = [json.loads(a) for a in sys.argv[1:]]
rows = 0
for n in nodes:
    c = n["counters"]
    assert n["store_format"] == 3 and n["migrating_to"] is None, n
    assert n["tenants"] == 4, n
    h = (n.get("cluster") or {}).get("handoff") or {}
    assert h.get("staged", 0) == 0, n
    rows += c["pending"] + c["scheduled"] + c["inflight"] + c["dead"]
assert 13 * len(nodes) <= rows <= 16 * len(nodes), (rows, nodes)
PY
}

