#!/usr/bin/env bash
# End to end on the real control plane that `make test` starts (scripts/k8s-testenv.sh):
# the chart installed, the operator running as the chart's ServiceAccount, real relay
# nodes behind kwok's pods (e2e/runner.py), the example Relay applied and waited for.
#
#   scripts/k8s-testenv.sh run -- bash e2e/run.sh      (make test does this)
#
# Needs target/debug/ankusa-relay and target/debug/ankusa-operator (`make e2e` builds
# them). ANKUSA_E2E_KEEP=1 leaves the namespace and the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
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

ns="ankusa-e2e-$(openssl rand -hex 3)"
work=$(mktemp -d "${TMPDIR:-/tmp}/ankusa-e2e.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then
    echo "e2e: failed; the operator's log:" >&2
    tail -n 60 "$work/operator.log" >&2 || true
    echo "e2e: the runner's log:" >&2
    tail -n 30 "$work/runner.log" >&2 || true
    kubectl -n "$ns" get relays,pods,pvc -o wide >&2 || true
  fi
  if [ "${ANKUSA_E2E_KEEP:-}" != 1 ]; then
    kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
    rm -rf "$work"
  else
    echo "e2e: kept namespace $ns and $work" >&2
  fi
  exit $rc
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "e2e: installing the chart into $ns (the operator's namespace, and the Relay's)"
kubectl create namespace "$ns" >/dev/null
python3 scripts/render-chart.py charts/ankusa --namespace "$ns" --release ankusa \
  --values-json "{\"image\":{\"tag\":\"e2e\"},\"watchNamespace\":\"$ns\"}" \
  | kubectl apply --server-side -n "$ns" -f - >/dev/null
kubectl wait --for=condition=Established crd/relays.ankusa.dev --timeout=1m >/dev/null

# The operator process, with the chart's ServiceAccount's token: the chart's RBAC is what
# it has. (kwok's pods of the chart's Deployment run nothing; this process is the operator.)
token=$(kubectl -n "$ns" create token ankusa --duration 2h)
python3 - "$KUBECONFIG" "$token" >"$work/operator-kubeconfig" <<'EOF'
import sys
text = open(sys.argv[1]).read()
head, _, _ = text.partition("users:")
print(head + "users:\n- name: admin\n  user:\n    token: " + sys.argv[2] + "\n"
      + "contexts:\n- name: testenv\n  context: { cluster: testenv, user: admin }\ncurrent-context: testenv")
EOF
if kubectl --kubeconfig "$work/operator-kubeconfig" get secrets -A >/dev/null 2>&1; then
  echo "e2e: the operator's ServiceAccount can list every Secret: the chart grants too much" >&2
  exit 1
fi

proxy=$(free_port)
python3 e2e/runner.py "$ns" "$work" "$proxy" "$relay_bin" >"$work/runner.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -f "$work/ready" ] && break; sleep 0.1; done

KUBECONFIG="$work/operator-kubeconfig" "$operator_bin" run \
  --watch-namespace "$ns" --metrics-addr "127.0.0.1:$(free_port)" \
  --lease-namespace "$ns" --identity e2e-operator --poll-interval-s 2 \
  --node-url-template "http://127.0.0.1:${proxy}/admin/{namespace}/{pod}" \
  >"$work/operator.log" 2>&1 &
pids+=($!)

echo "e2e: applying the example Relay"
kubectl -n "$ns" create secret generic webhook-secrets \
  --from-literal=github=e2e-github-secret-0123456789 \
  --from-literal=stripe=whsec_e2e_stripe_secret \
  --from-literal=sink=whsec_ZTJlLXNpbmstc2VjcmV0LTAxMjM0NTY3ODk= >/dev/null
sed -e '/^  backup:/,/^    policy:/d' -e 's/replicas: 3/replicas: 2/' -e 's/size: 20Gi/size: 1Gi/' \
  examples/relay.yaml | kubectl -n "$ns" apply -f - >/dev/null

echo "e2e: waiting for relay/hooks to be Ready"
kubectl -n "$ns" wait --for=condition=Ready relay/hooks --timeout=5m >/dev/null
kubectl -n "$ns" get relays
gen=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.metadata.generation}')
observed=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].observedGeneration}')
[ "$gen" = "$observed" ] || { echo "e2e: Ready describes generation $observed, not $gen" >&2; exit 1; }
nodes=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.nodesReady}')
[ "$nodes" = "2/2" ] || { echo "e2e: nodesReady is $nodes" >&2; exit 1; }
version=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.nodes[0].version}')
format=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.storeFormat}')
[ -n "$version" ] && [ "$format" = 3 ] || { echo "e2e: nodes did not report (version '$version', format '$format')" >&2; exit 1; }

echo "e2e: a signed hook sent to hooks-0 is acked, and counted in the Relay's status"
ingest="http://127.0.0.1:${proxy}/ingest/$ns/hooks-0/ingest/stripe"
body='{"id":"evt_e2e","account":"acct_e2e","type":"ping"}'
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$ingest" -H 'content-type: application/json' -d "$body")
[ "$code" = 401 ] || { echo "e2e: an unsigned Stripe hook was answered $code" >&2; exit 1; }
ts=$(date +%s)
sig=$(printf '%s.%s' "$ts" "$body" | openssl dgst -sha256 -hmac whsec_e2e_stripe_secret -hex | awk '{print $NF}')
code=$(curl -s -o "$work/ack.json" -w '%{http_code}' -X POST "$ingest" -H 'content-type: application/json' \
  -H "stripe-signature: t=${ts},v1=${sig}" -d "$body")
[ "$code" = 202 ] || { echo "e2e: a signed hook was answered $code: $(cat "$work/ack.json")" >&2; exit 1; }
for _ in $(seq 1 100); do
  tenants=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.tenants.count}')
  [ "$tenants" = 1 ] && break
  sleep 0.2
done
[ "$tenants" = 1 ] || { echo "e2e: the status counts $tenants tenants, not 1" >&2; exit 1; }
kubectl -n "$ns" get relays

echo "e2e: hooks-0 deleted: its process stops, the StatefulSet's new pod gets one on the same store"
uid=$(kubectl -n "$ns" get pod hooks-0 -o jsonpath='{.metadata.uid}')
kubectl -n "$ns" delete pod hooks-0 --wait=false >/dev/null
for _ in $(seq 1 300); do
  now=$(kubectl -n "$ns" get pod hooks-0 -o jsonpath='{.metadata.uid}' 2>/dev/null || true)
  [ -n "$now" ] && [ "$now" != "$uid" ] && break
  sleep 0.2
done
for _ in $(seq 1 100); do
  [ "$(grep -c "started hooks-0" "$work/runner.log")" -ge 2 ] && break
  sleep 0.2
done
grep -q "stopped hooks-0" "$work/runner.log" || { echo "e2e: the runner did not stop hooks-0's process" >&2; exit 1; }
[ "$(grep -c "started hooks-0" "$work/runner.log")" -ge 2 ] || { echo "e2e: no process for the new hooks-0" >&2; exit 1; }
# The new process opened the old store: the tenant of the hook acked before is there.
token=$(kubectl -n "$ns" get secret hooks-operator-token -o jsonpath='{.data.token}' | base64 -d)
for _ in $(seq 1 100); do
  node=$(curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:${proxy}/admin/$ns/hooks-0/v1/node" 2>/dev/null || true)
  case "$node" in *'"tenants":1'*) break ;; esac
  sleep 0.2
done
case "$node" in *'"tenants":1'*) ;; *) echo "e2e: the restarted hooks-0 reports: $node" >&2; exit 1 ;; esac
kubectl -n "$ns" wait --for=condition=Ready relay/hooks --timeout=2m >/dev/null

echo "e2e: after an image change, Ready waits for the new generation"
kubectl -n "$ns" patch relay hooks --type merge -p '{"spec":{"image":"ghcr.io/ankusa/relay:0.1.1"}}' >/dev/null
gen=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.metadata.generation}')
if kubectl -n "$ns" wait --for=condition=Ready relay/hooks --timeout=5s >/dev/null 2>&1; then
  echo "e2e: kubectl wait returned at once after an image change" >&2
  exit 1
fi
# Not a slow operator: it has seen the new generation and says the nodes are not there yet.
for _ in $(seq 1 100); do
  observed=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].observedGeneration}')
  [ "$observed" = "$gen" ] && break
  sleep 0.2
done
ready=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')
[ "$observed" = "$gen" ] && [ "$ready" = False ] ||
  { echo "e2e: Ready is '$ready' at generation '$observed' after the image change (generation $gen)" >&2; exit 1; }
echo "e2e: Ready: $(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}')"
echo "e2e: passed"
