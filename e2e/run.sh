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
source "$(dirname "$0")/lib.sh"
e2e_start

echo "e2e: applying the example Relay"
kubectl -n "$ns" create secret generic webhook-secrets \
  --from-literal=github=e2e-github-secret-0123456789 \
  --from-literal=stripe=whsec_e2e_stripe_secret \
  --from-literal=shopify=e2e-shopify-secret \
  --from-literal=sink=whsec_ZTJlLXNpbmstc2VjcmV0LTAxMjM0NTY3ODk= \
  --from-literal=admin=e2e-admin-token-0123456789abcdef >/dev/null
sed -e '/^  backup:/,/^    policy:/d' -e 's/replicas: 3/replicas: 2/' -e 's/size: 20Gi/size: 1Gi/' \
  examples/relay.yaml | kubectl -n "$ns" apply -f - >/dev/null

echo "e2e: waiting for relay/hooks to be Ready"
# Ready, and both nodes answering: kwok reports a new pod Ready before the runner has seen
# its process's /readyz, so one look can catch a node on its way up.
all_ready() {
  [ "$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}/{.status.nodesReady}')" = "True/2/2" ]
}
e2e_until 300 all_ready || fail "relay/hooks did not become Ready with 2/2 nodes"
kubectl -n "$ns" get relays
gen=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.metadata.generation}')
observed=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].observedGeneration}')
[ "$gen" = "$observed" ] || fail "Ready describes generation $observed, not $gen"
version=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.nodes[0].version}')
format=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.storeFormat}')
[ -n "$version" ] && [ "$format" = 3 ] || fail "nodes did not report (version '$version', format '$format')"

echo "e2e: a signed hook sent to hooks-0 is acked, and counted in the Relay's status"
ingest="http://127.0.0.1:${proxy}/ingest/$ns/hooks-0/ingest/stripe"
body='{"id":"evt_e2e","account":"acct_e2e","type":"ping"}'
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$ingest" -H 'content-type: application/json' -d "$body")
[ "$code" = 401 ] || fail "an unsigned Stripe hook was answered $code"
ts=$(date +%s)
sig=$(printf '%s.%s' "$ts" "$body" | openssl dgst -sha256 -hmac whsec_e2e_stripe_secret -hex | awk '{print $NF}')
code=$(curl -s -o "$work/ack.json" -w '%{http_code}' -X POST "$ingest" -H 'content-type: application/json' \
  -H "stripe-signature: t=${ts},v1=${sig}" -d "$body")
[ "$code" = 202 ] || fail "a signed hook was answered $code: $(cat "$work/ack.json")"
echo "e2e: the same event sent to hooks-1 reaches its tenant's owner, which answers it is a duplicate; the status counts the tenant once, owned by one node"
# The operator wrote both nodes into each one's cluster.nodes: whichever node owns
# acct_e2e dedupes the provider's retry, whichever node it reaches.
code=$(curl -s -o "$work/dup.json" -w '%{http_code}' -X POST "http://127.0.0.1:${proxy}/ingest/$ns/hooks-1/ingest/stripe" \
  -H 'content-type: application/json' -H "stripe-signature: t=${ts},v1=${sig}" -d "$body")
first=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' "$work/ack.json")
[ "$code" = 200 ] && grep -q "\"id\":\"$first\"" "$work/dup.json" && grep -q '"duplicate":true' "$work/dup.json" \
  || fail "the retry sent to hooks-1 was answered $code: $(cat "$work/dup.json") (first: $first)"
for _ in $(seq 1 100); do
  tenants=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.tenants.count}')
  [ "$tenants" = 1 ] && break
  sleep 0.2
done
[ "$tenants" = 1 ] || fail "the status counts $tenants tenants, not 1"
# One node owns acct_e2e: its share is 1, the other's 0 (the status polls every 2 s).
for _ in $(seq 1 100); do
  owned=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.nodes[*].tenantsOwned}')
  [ "$(tr ' ' '\n' <<<"$owned" | sort | tr '\n' ' ')" = "0 1 " ] && break
  sleep 0.2
done
[ "$(tr ' ' '\n' <<<"$owned" | sort | tr '\n' ' ')" = "0 1 " ] \
  || fail "the nodes' owned tenants are '$owned', not one node with 1"
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
grep -q "stopped hooks-0" "$work/runner.log" || fail "the runner did not stop hooks-0's process"
[ "$(grep -c "started hooks-0" "$work/runner.log")" -ge 2 ] || fail "no process for the new hooks-0"
# The new process opened the old store: the tenant of the hook acked before is there.
token=$(kubectl -n "$ns" get secret hooks-operator-token -o jsonpath='{.data.token}' | base64 -d)
for _ in $(seq 1 100); do
  node=$(curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:${proxy}/admin/$ns/hooks-0/v1/node" 2>/dev/null || true)
  case "$node" in *'"tenants":1'*) break ;; esac
  sleep 0.2
done
case "$node" in *'"tenants":1'*) ;; *) fail "the restarted hooks-0 reports: $node" ;; esac
kubectl -n "$ns" wait --for=condition=Ready relay/hooks --timeout=2m >/dev/null

echo "e2e: after an image change (same store format), Ready waits until every node runs it"
kubectl -n "$ns" patch relay hooks --type merge -p '{"spec":{"image":"ghcr.io/ankusa/relay:0.1.1"}}' >/dev/null
gen=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.metadata.generation}')
kubectl -n "$ns" wait --for=condition=Ready relay/hooks --timeout=2m >/dev/null
observed=$(kubectl -n "$ns" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].observedGeneration}')
[ "$observed" = "$gen" ] || fail "Ready describes generation $observed, not $gen"
images=$(kubectl -n "$ns" get pods -l app.kubernetes.io/component=relay -o jsonpath='{.items[*].spec.containers[0].image}')
for i in $images; do
  # The release as its probe resolved it: the tag pinned to a digest.
  case "$i" in ghcr.io/ankusa/relay:0.1.1@sha256:*) ;; *) fail "Ready while a node runs $i" ;; esac
done
# (kwok reports a replaced pod Ready at once; the runner starts its process within a round.)
moved() { [ "$(grep -c 'started hooks-.*image=ghcr.io/ankusa/relay:0.1.1' "$work/runner.log")" -ge 2 ]; }
e2e_until 30 moved || fail "the nodes' processes did not move to 0.1.1"
echo "e2e: passed"
