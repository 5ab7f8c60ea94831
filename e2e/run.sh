#!/usr/bin/env bash
# End-to-end test on a real Kubernetes cluster: install the operator from the chart, apply
# the example Relay, and wait until it is Ready.
#
# Runs only where KUBECONFIG is set (and says so when it is not). Needs images of the two
# binaries the cluster can pull:
#   ANKUSA_OPERATOR_IMAGE  e.g. registry.example/ankusa/operator:dev
#   ANKUSA_RELAY_IMAGE     e.g. registry.example/ankusa/relay:dev
# Optional: ANKUSA_E2E_NAMESPACE (default ankusa-e2e), ANKUSA_E2E_KEEP=1 to leave it all.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${KUBECONFIG:-}" ]; then
  echo "e2e: skipped — KUBECONFIG is not set (these tests need a real cluster)"
  exit 0
fi
: "${ANKUSA_OPERATOR_IMAGE:?set ANKUSA_OPERATOR_IMAGE to an operator image the cluster can pull}"
: "${ANKUSA_RELAY_IMAGE:?set ANKUSA_RELAY_IMAGE to a relay image the cluster can pull}"
ns="${ANKUSA_E2E_NAMESPACE:-ankusa-e2e}"

cleanup() {
  if [ "${ANKUSA_E2E_KEEP:-}" != "1" ]; then
    kubectl delete namespace "$ns" --ignore-not-found --wait=false >/dev/null
  fi
}
trap cleanup EXIT

echo "e2e: installing the operator into $ns"
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
repo="${ANKUSA_OPERATOR_IMAGE%:*}"
tag="${ANKUSA_OPERATOR_IMAGE##*:}"
python3 scripts/render-chart.py charts/ankusa --namespace "$ns" --release ankusa \
  --values-json "{\"image\":{\"repository\":\"$repo\",\"tag\":\"$tag\"},\"watchNamespace\":\"$ns\"}" \
  | kubectl apply --server-side -n "$ns" -f -
kubectl -n "$ns" rollout status deployment/ankusa --timeout=5m
kubectl wait --for=condition=Established crd/relays.ankusa.dev --timeout=1m

echo "e2e: applying the example Relay"
kubectl -n "$ns" create secret generic webhook-secrets \
  --from-literal=github=e2e-github-secret-0123456789 \
  --from-literal=stripe=whsec_e2e_stripe_secret \
  --from-literal=sink=whsec_ZTJlLXNpbmstc2VjcmV0LTAxMjM0NTY3ODk= \
  --dry-run=client -o yaml | kubectl apply -f -
sed -e "s#image: ghcr.io/ankusa/relay:0.1.0#image: $ANKUSA_RELAY_IMAGE#" \
    -e '/^  backup:/,/^    policy:/d' \
    -e 's/enabled: true/enabled: false/' \
    -e 's/replicas: 3/replicas: 2/' \
    -e 's/size: 20Gi/size: 1Gi/' \
    examples/relay.yaml | kubectl -n "$ns" apply -f -

echo "e2e: waiting for relay/hooks to be Ready"
if ! kubectl -n "$ns" wait --for=condition=Ready relay/hooks --timeout=10m; then
  kubectl -n "$ns" get relay hooks -o yaml
  kubectl -n "$ns" get pods,events
  exit 1
fi
kubectl -n "$ns" get relays
gen=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.metadata.generation}')
observed=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].observedGeneration}')
[ "$gen" = "$observed" ] || { echo "e2e: Ready describes generation $observed, not $gen"; exit 1; }
nodes=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.nodesReady}')
[ "$nodes" = "2/2" ] || { echo "e2e: nodesReady is $nodes"; exit 1; }
echo "e2e: passed"
