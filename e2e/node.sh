#!/usr/bin/env bash
# End to end on the real node of the control plane `make test` starts (a kubelet on
# containerd, scripts/k8s-node.sh): README "On Kubernetes" step by step, with the images
# `make image` builds, then what only a kubelet does to the pods.
#
#   scripts/k8s-testenv.sh run -- bash e2e/node.sh      (make test does this)
#
# Needs target/images/{relay,operator}.oci.tar (`make e2e` builds them from the debug
# binaries: IMAGE_PROFILE=dev). What it changes from the README's commands, and why:
# - the namespaces enforce the `restricted` Pod Security Standard (created first, labelled);
# - the test cluster installed the Relay CRD itself (and e2e/run.sh the chart's RBAC with
#   kubectl), so those are labelled for Helm to adopt;
# - examples/relay.yaml is applied with storage.storageClassName set to the node's local
#   volumes, CPU requests a two-core node can hold, and no backup section (the backup
#   claim's e2e is the upgrade gate's);
# - the example's sink, http://webhook-consumer.apps.svc:8080/hooks, is `ankusa-relay sink`
#   in a pod of namespace `apps`, behind a headless Service of that name.
# The node's taint is lifted and kwok's nodes are tainted for the test, so every pod runs
# on the real node; both are put back at the end. ANKUSA_E2E_KEEP=1 keeps the namespaces.
set -euo pipefail
# e2e_until, and the checks of the control plane's variables and the binaries.
source "$(dirname "$0")/lib.sh"

if [ -z "${ANKUSA_TESTENV_NODE:-}" ]; then
  echo "e2e-node: no real node: run under scripts/k8s-testenv.sh (make test does)" >&2
  exit 1
fi
for f in target/images/relay.oci.tar target/images/operator.oci.tar; do
  [ -f "$f" ] || { echo "e2e-node: $f is missing (make e2e builds it)" >&2; exit 1; }
done
node=$ANKUSA_TESTENV_NODE
ctr=(ctr --address "$ANKUSA_TESTENV_CONTAINERD" -n k8s.io)
work=$(mktemp -d "${TMPDIR:-/tmp}/ankusa-e2e-node.XXXXXX")
ns=hooks-$(openssl rand -hex 3)
pids=()
say() { echo "e2e-node: $*"; }
fail() { echo "e2e-node: FAIL: $*" >&2; exit 1; }

cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then
    echo "e2e-node: failed; what the cluster shows:" >&2
    kubectl get pods -A -o wide --field-selector "spec.nodeName=$node" >&2 || true
    kubectl -n "$ns" get relays,statefulsets,pvc -o wide >&2 || true
    kubectl -n "$ns" describe pods >&2 2>/dev/null | tail -n 60 || true
    kubectl -n ankusa-system logs deploy/ankusa --tail 40 >&2 || true
    for p in 0 1 2; do kubectl -n "$ns" logs "hooks-$p" --tail 20 >&2 2>/dev/null || true; done
    tail -n 30 "$ANKUSA_TESTENV_DIR/kubelet.log" >&2 || true
  fi
  if [ "${ANKUSA_E2E_KEEP:-}" != 1 ]; then
    helm uninstall ankusa --namespace ankusa-system >/dev/null 2>&1 || true
    kubectl delete namespace "$ns" apps ankusa-system --wait=false >/dev/null 2>&1 || true
  fi
  kubectl taint nodes -l type=kwok ankusa.dev/real-node-test- >/dev/null 2>&1 || true
  kubectl taint nodes "$node" ankusa.dev/real-node=true:NoSchedule --overwrite >/dev/null 2>&1 || true
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT


say "loading the images of make image into the node's containerd"
for f in relay operator; do
  "${ctr[@]}" images import "target/images/$f.oci.tar" >/dev/null
done
"${ctr[@]}" images ls -q | grep -qx ghcr.io/ankusa/relay:0.1.0 || fail "the relay image is not in containerd"
kubectl taint nodes -l type=kwok ankusa.dev/real-node-test=true:NoSchedule --overwrite >/dev/null
kubectl taint nodes "$node" ankusa.dev/real-node- >/dev/null

# ankusa-system may exist already (the operator's tests use it in make test).
for n in ankusa-system "$ns" apps; do
  kubectl create namespace "$n" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl label namespace "$n" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest --overwrite >/dev/null
done
# Cluster-wide objects of the chart made without Helm (the CRD by the test cluster, the
# RBAC by e2e/run.sh's kubectl apply of the rendered chart) are labelled for Helm to adopt.
for obj in crd/relays.ankusa.dev clusterrole/ankusa clusterrolebinding/ankusa; do
  kubectl get "$obj" >/dev/null 2>&1 || continue
  kubectl label "$obj" app.kubernetes.io/managed-by=Helm --overwrite >/dev/null
  kubectl annotate "$obj" meta.helm.sh/release-name=ankusa \
    meta.helm.sh/release-namespace=ankusa-system --overwrite >/dev/null
done
# README's commands with no -n go to the Relay's namespace (in a copy of the kubeconfig).
cp "$KUBECONFIG" "$work/kubeconfig"
export KUBECONFIG="$work/kubeconfig"
kubectl config set-context --current --namespace "$ns" >/dev/null

# --- README "On Kubernetes", step by step -----------------------------------------------
say "helm install ankusa charts/ankusa --namespace ankusa-system --create-namespace"
helm install ankusa charts/ankusa --namespace ankusa-system --create-namespace >/dev/null
sink_secret=whsec_ZTJlLXNpbmstc2VjcmV0LTAxMjM0NTY3ODk=
shopify_secret=e2e-shopify-secret
kubectl create secret generic webhook-secrets \
  --from-literal=github=e2e-github-secret --from-literal=stripe=whsec_e2e_stripe \
  --from-literal=shopify="$shopify_secret" --from-literal=sink="$sink_secret" >/dev/null

say "the example's sink: ankusa-relay sink as webhook-consumer.apps.svc:8080"
kubectl -n apps apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: { name: webhook-consumer }
spec:
  clusterIP: None
  selector: { app: webhook-consumer }
  ports: [{ name: http, port: 8080 }]
---
apiVersion: v1
kind: Pod
metadata: { name: webhook-consumer, labels: { app: webhook-consumer } }
spec:
  securityContext: { runAsNonRoot: true, runAsUser: 10001, seccompProfile: { type: RuntimeDefault } }
  containers:
  - name: sink
    image: ghcr.io/ankusa/relay:0.1.0
    imagePullPolicy: Never
    args: [sink, --listen, "[::]:8080", --secret, "$sink_secret"]
    ports: [{ containerPort: 8080 }]
    resources: { requests: { cpu: 50m, memory: 32Mi } }
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: { drop: [ALL] }
EOF

say "kubectl apply -f examples/relay.yaml (storage class, CPU requests; no backup section)"
python3 - "$ANKUSA_TESTENV_STORAGE_CLASS" >"$work/relay.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open("examples/relay.yaml"))
spec = doc["spec"]
spec["storage"]["storageClassName"] = sys.argv[1]
spec["resources"]["requests"] = {"cpu": "100m", "memory": "128Mi"}
spec.pop("backup", None)
print(yaml.safe_dump(doc))
PY
kubectl apply -f "$work/relay.yaml" >/dev/null
say "kubectl wait --for=condition=Ready relay/hooks --timeout=5m"
kubectl wait --for=condition=Ready relay/hooks --timeout=5m >/dev/null \
  || fail "relay/hooks did not become Ready"
kubectl get relays | tee "$work/relays.txt"
# Every column has a value (Pending and Dead may be 0).
python3 - "$work/relays.txt" <<'PY' || fail "kubectl get relays has an empty column"
import sys
head, row = open(sys.argv[1]).read().splitlines()[:2]
starts = [i for i, c in enumerate(head) if c != " " and (i == 0 or head[i - 1] == " ")]
cells = [row[a:b].strip() for a, b in zip(starts, starts[1:] + [len(row) + 1])]
names = head.split()
empty = [n for n, c in zip(names, cells) if c in ("", "<none>")]
sys.exit(f"empty: {empty}" if empty else 0)
PY

# --- the pods as the kubelet runs them ----------------------------------------------------
say "the operator runs as the chart's Deployment, from its image, with its ServiceAccount"
op_pods=$(kubectl -n ankusa-system get pods -l app.kubernetes.io/name=ankusa-operator -o jsonpath='{range .items[*]}{.spec.nodeName}/{.spec.serviceAccountName}/{.status.containerStatuses[0].image}/{.status.containerStatuses[0].ready}{"\n"}{end}')
echo "$op_pods" | grep -q "^$node/ankusa/ghcr.io/ankusa/operator:0.1.0/true$" \
  || fail "no ready operator pod from the image on the node: $op_pods"

say "each relay container: PID 1 is ankusa-relay as UID 10001, root filesystem read-only, soft open-file limit = hard"
for p in 0 1 2; do
  cid=$(kubectl get pod "hooks-$p" -o jsonpath='{.status.containerStatuses[0].containerID}')
  pid=$("${ctr[@]}" tasks ls | awk -v c="${cid#containerd://}" '$1 == c { print $2 }')
  [ -n "$pid" ] || fail "no task for hooks-$p ($cid)"
  grep -q "^Uid:.*10001" "/proc/$pid/status" || fail "hooks-$p does not run as 10001"
  [ "$(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -d' ' -f1)" = /usr/local/bin/ankusa-relay ] \
    || fail "hooks-$p PID 1 is not the relay"
  awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo" | grep -q '^ro' || fail "hooks-$p root is writable"
  read -r soft hard < <(awk '/^Max open files/ { print $4, $5 }' "/proc/$pid/limits")
  [ "$soft" = "$hard" ] || fail "hooks-$p open-file limit: soft $soft, hard $hard"
done
kubectl get pod hooks-0 -o jsonpath='{.spec.securityContext.fsGroupChangePolicy} {.spec.containers[0].startupProbe.httpGet.path}' \
  | grep -qx "OnRootMismatch /healthz" || fail "the pod has no fsGroupChangePolicy or startupProbe"

say "hooks through kubectl port-forward to hooks-0 are delivered to the sink and counted"
port=$(python3 scripts/free_ports.py)
kubectl port-forward pod/hooks-0 "$port:8080" >"$work/pf.log" 2>&1 &
pids+=($!)
e2e_until 30 curl -fsS "http://127.0.0.1:$port/healthz" -o /dev/null || fail "port-forward did not come up"
url="http://127.0.0.1:$port/ingest/shopify"
python3 e2e/hooks.py send "$url" "$shopify_secret" "$work/acked" --count 60 --tenants 6 --prefix first
delivered() {
  kubectl -n apps logs webhook-consumer >"$work/sink.log" 2>/dev/null
  python3 e2e/hooks.py check "$work/acked" "$work/sink.log" >/dev/null 2>&1
}
e2e_until 60 delivered || { python3 e2e/hooks.py check "$work/acked" "$work/sink.log" || true; fail "not every acked hook was delivered"; }
python3 e2e/hooks.py check "$work/acked" "$work/sink.log"
counted() { [ "$(kubectl get relay hooks -o jsonpath='{.status.tenants.count}')" = 6 ]; }
e2e_until 60 counted || fail "the Relay's status does not count the 6 tenants: $(kubectl get relay hooks -o jsonpath='{.status.tenants}')"

say "kubectl delete pod hooks-1 during a steady stream: drained within its grace, the same volume, nothing lost or redelivered"
uid1=$(kubectl get pod hooks-1 -o jsonpath='{.metadata.uid}')
python3 e2e/hooks.py send "$url" "$shopify_secret" "$work/acked" --count 300 --tenants 6 --rate 20 --prefix steady \
  >"$work/steady.log" 2>&1 &
sender=$!
sleep 3
started=$SECONDS
kubectl delete pod hooks-1 --wait=true --timeout=120s >/dev/null
took=$((SECONDS - started))
grace=$(kubectl get statefulset hooks -o jsonpath='{.spec.template.spec.terminationGracePeriodSeconds}')
[ "$took" -lt "$grace" ] || fail "hooks-1 took $took s to stop (grace $grace s): SIGTERM did not end it"
wait "$sender" || { cat "$work/steady.log" >&2; fail "the steady stream was not acked"; }
cat "$work/steady.log"
e2e_until 120 bash -c "[ \"\$(kubectl get pod hooks-1 -o jsonpath='{.status.containerStatuses[0].ready}')\" = true ]" \
  || fail "hooks-1 did not come back"
[ "$(kubectl get pod hooks-1 -o jsonpath='{.metadata.uid}')" != "$uid1" ] || fail "hooks-1 was not replaced"
kubectl get pvc data-hooks-1 -o jsonpath='{.status.phase}' | grep -qx Bound || fail "hooks-1's claim is not bound"
e2e_until 90 delivered || { python3 e2e/hooks.py check "$work/acked" "$work/sink.log" || true; fail "acked hooks were lost across the pod's deletion"; }
python3 e2e/hooks.py check "$work/acked" "$work/sink.log"

say "a SIGKILL from outside to hooks-2's PID 1: the kubelet restarts the container, nothing acked is lost"
restarts=$(kubectl get pod hooks-2 -o jsonpath='{.status.containerStatuses[0].restartCount}')
cid=$(kubectl get pod hooks-2 -o jsonpath='{.status.containerStatuses[0].containerID}')
pid=$("${ctr[@]}" tasks ls | awk -v c="${cid#containerd://}" '$1 == c { print $2 }')
python3 e2e/hooks.py send "$url" "$shopify_secret" "$work/acked" --count 100 --tenants 6 --rate 20 --prefix killed \
  >"$work/killed.log" 2>&1 &
sender=$!
sleep 2
kill -KILL "$pid"
wait "$sender" || { cat "$work/killed.log" >&2; fail "hooks around the SIGKILL were not acked"; }
e2e_until 120 bash -c "[ \"\$(kubectl get pod hooks-2 -o jsonpath='{.status.containerStatuses[0].restartCount}/{.status.containerStatuses[0].ready}')\" = \"$((restarts + 1))/true\" ]" \
  || fail "the kubelet did not restart hooks-2's container"
e2e_until 90 delivered || { python3 e2e/hooks.py check "$work/acked" "$work/sink.log" --allow-duplicates || true; fail "acked hooks were lost across the SIGKILL"; }
python3 e2e/hooks.py check "$work/acked" "$work/sink.log" --allow-duplicates

kubectl get relays
say "ok"
