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
#   in a pod of namespace `apps`, behind a headless Service of that name (and the CA
#   bundle's sink, tls-consumer.apps.svc:8443, the same over HTTPS on test CAs' certificates).
# The test's namespaces give every pod of theirs a toleration of the real node's taint
# (the API server's PodTolerationRestriction, the namespace's defaultTolerations) and kwok's
# nodes are tainted for the test, so every pod of the test runs on the real node — and no
# other: pods of earlier tests still waiting for a node stay off it (the node's own taint
# stays). kwok's taint goes at the end. ANKUSA_E2E_KEEP=1 keeps the namespaces.
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
cut_rules=() # iptables rules the test inserted, each as one string
say() { echo "e2e-node: [$SECONDS s] $*"; }
failure=
fail() { failure="e2e-node: FAIL: $*"; echo "$failure" >&2; exit 1; }
# The PID of a pod's container (its PID 1), as the node's containerd sees it.
container_pid() {
  local cid pid
  cid=$(kubectl get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
  pid=$("${ctr[@]}" tasks ls | awk -v c="${cid#containerd://}" '$1 == c { print $2 }')
  [ -n "$pid" ] || fail "no task for $1 ($cid)"
  echo "$pid"
}
# The configuration of the test's own Relays: one source whose tenant is a header, one sink
# that nothing answers (their deliveries wait and retry).
demo_config='  config:
    inline:
      sinks: [{ id: nowhere, url: "http://127.0.0.1:9/hooks", timeout_ms: 200 }]
      routes: [{ id: r, sinks: [nowhere] }]
      sources: [{ id: demo, tenant: { header: x-tenant }, verify: { scheme: none }, route: r }]'
# No relay pod of Relay $1 is left.
gone() { [ -z "$(kubectl get pods -l "app.kubernetes.io/instance=$1,app.kubernetes.io/component=relay" -o name)" ]; }
# The host directory of a container's memory cgroup (cgroup v1).
memory_cgroup() {
  local path
  path=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' "/proc/$1/cgroup")
  [ -n "$path" ] && [ "$path" != / ] && [ -f "/sys/fs/cgroup/memory$path/memory.limit_in_bytes" ] ||
    fail "PID $1 has no memory cgroup of its own"
  echo "/sys/fs/cgroup/memory$path"
}

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
    # Last, where a shortened report still shows it: the disk the node's pods share.
    df -h "$ANKUSA_TESTENV_DIR" >&2 || true
  fi
  if [ "${ANKUSA_E2E_KEEP:-}" != 1 ]; then
    helm uninstall second --namespace ankusa-second >/dev/null 2>&1 || true
    helm uninstall ankusa --namespace ankusa-system >/dev/null 2>&1 || true
    kubectl delete namespace "$ns" apps ankusa-system ankusa-second ${dra:-} ${drb:-} --wait=false >/dev/null 2>&1 || true
  fi
  kubectl taint nodes -l type=kwok ankusa.dev/real-node-test- >/dev/null 2>&1 || true
  kubectl delete pv "slow-$ns" --wait=false >/dev/null 2>&1 || true
  for r in "${cut_rules[@]}"; do read -ra rule <<<"$r"; iptables -D "${rule[@]}" 2>/dev/null || true; done
  # slowfs unmounts when it stops; a mount left behind (it was killed) goes before its files.
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ! grep -q " $work/slow-volume " /proc/mounts || umount -l "$work/slow-volume" || true
  rm -rf "$work"
  # What failed, again, after the cluster's state: the end of a log shows it.
  [ $rc -eq 0 ] || echo "${failure:-e2e-node: FAIL: exit $rc at line ${failed_line:-?}}" >&2
  exit $rc
}
trap cleanup EXIT
trap 'failed_line=$LINENO' ERR


say "loading the images of make image into the node's containerd"
for f in relay operator; do
  "${ctr[@]}" images import "target/images/$f.oci.tar" >/dev/null
done
# Listed first, then searched: `grep -q` stops reading at its match, and under pipefail
# the lister's SIGPIPE would fail a pipe whose image is there.
images=$("${ctr[@]}" images ls -q)
grep -qx ghcr.io/ankusa/relay:0.1.0 <<<"$images" ||
  fail "the relay image is not in containerd, which has: $(tr '\n' ' ' <<<"$images")"
# The previous release's image: e2e/previous_release.py (the format-2 release's admin and
# backup API over the committed format-2 fixture store) on Debian's python3, with this
# tree's relay binary (lib.sh's relay_bin) for restore, inspect and offline backup.
old=ghcr.io/ankusa/relay:0.0.9
new=ghcr.io/ankusa/relay:0.1.0
python3 scripts/image.py --binary "$relay_bin" --ref "$old" --out "$work/previous.oci.tar" \
  --program /usr/bin/python3.11 --package libpython3.11-minimal --package libpython3.11-stdlib \
  --file e2e/previous_release.py=/usr/local/lib/ankusa/previous_release.py \
  --file crates/relay/tests/fixtures/store-v2.tar.zst=/usr/local/lib/ankusa/store-v2.tar.zst \
  --entrypoint '["/usr/bin/python3.11", "/usr/local/lib/ankusa/previous_release.py", "pod"]' \
  >"$work/previous-image.log" 2>&1 &
previous_image=$!
pids+=("$previous_image")
# The previous release's chart (e2e/previous-chart.rev: a commit whose Relay CRD lacks
# spec.config.secretDirs), with this tree's operator binary under the tag `previous`: what
# is tested is Helm's upgrade of the chart, the CRD and the Deployment, and the leader's
# handover; the operator's code is the same on both sides.
prev_rev=$(tr -d '[:space:]' <e2e/previous-chart.rev)
mkdir -p "$work/previous-chart"
git archive "$prev_rev" charts/ankusa | tar -x -C "$work/previous-chart"
python3 scripts/image.py --binary "$operator_bin" --ref ghcr.io/ankusa/operator:previous \
  --out "$work/operator-previous.oci.tar" >"$work/operator-previous.log" 2>&1 \
  || fail "the previous operator image: $(cat "$work/operator-previous.log")"
"${ctr[@]}" images import "$work/operator-previous.oci.tar" >/dev/null
kubectl taint nodes -l type=kwok ankusa.dev/real-node-test=true:NoSchedule --overwrite >/dev/null

# A namespace of the test: Pod Security's `restricted` enforced, and its pods tolerate the
# real node's taint. (ankusa-system may exist already: the operator's tests use it.)
test_namespace() {
  kubectl create namespace "$1" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl label namespace "$1" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest --overwrite >/dev/null
  kubectl annotate namespace "$1" --overwrite \
    'scheduler.alpha.kubernetes.io/defaultTolerations=[{"key": "ankusa.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}]' >/dev/null
}
for n in ankusa-system "$ns" apps; do test_namespace "$n"; done
# The CRD, made without Helm by the test cluster (kubectl's server-side apply), is labelled
# for Helm to adopt. kubectl still owns its fields: the chart's upgrades below pass
# --force-conflicts, as docs/operator.md says to for a CRD first applied by kubectl.
# (The chart's ClusterRole and binding are named with the release's namespace: another
# install's, in another namespace, does not collide with them.)
for obj in crd/relays.ankusa.dev; do
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
admin_token=$(openssl rand -hex 24)
kubectl create secret generic webhook-secrets \
  --from-literal=github=e2e-github-secret --from-literal=stripe=whsec_e2e_stripe \
  --from-literal=shopify="$shopify_secret" --from-literal=sink="$sink_secret" \
  --from-literal=admin="$admin_token" >/dev/null

say "the example's sink: ankusa-relay sink as webhook-consumer.apps.svc:8080"
sink_service() { # the headless Service of sink pod $1 in apps
kubectl -n apps apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: { name: $1 }
spec:
  clusterIP: None
  selector: { app: $1 }
  ports: [{ name: http, port: 8080 }]
EOF
}
sink_service webhook-consumer
sink_pod() { # a sink's pod, $1 or the example's (again, after the drain's outage: a new log)
local name=${1:-webhook-consumer}
kubectl -n apps apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: { name: $name, labels: { app: $name } }
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
}
sink_pod

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
  pid=$(container_pid "hooks-$p")
  grep -q "^Uid:.*10001" "/proc/$pid/status" || fail "hooks-$p does not run as 10001"
  [ "$(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -d' ' -f1)" = /usr/local/bin/ankusa-relay ] \
    || fail "hooks-$p PID 1 is not the relay"
  awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo" | grep -q '^ro' || fail "hooks-$p root is writable"
  read -r soft hard < <(awk '/^Max open files/ { print $4, $5 }' "/proc/$pid/limits")
  [ "$soft" = "$hard" ] || fail "hooks-$p open-file limit: soft $soft, hard $hard"
done
kubectl get pod hooks-0 -o jsonpath='{.spec.securityContext.fsGroupChangePolicy} {.spec.containers[0].startupProbe.httpGet.path}' \
  | grep -qx "OnRootMismatch /healthz" || fail "the pod has no fsGroupChangePolicy or startupProbe"

say "README: kubectl port-forward pod/hooks-0 9090, and the console takes the Secret's admin key"
port=$(python3 scripts/free_ports.py)
kubectl port-forward pod/hooks-0 "$port:9090" >"$work/pf-console.log" 2>&1 &
pids+=($!)
e2e_until 30 curl -fsS "http://127.0.0.1:$port/healthz" -o /dev/null || fail "port-forward to the admin port did not come up"
signed=$(curl -sS -o /dev/null -D - -X POST "http://127.0.0.1:$port/ui/login" \
  --data-urlencode "token=$(kubectl get secret webhook-secrets -o jsonpath='{.data.admin}' | base64 -d)")
case "$signed" in
  *" 303 "*[Ss]et-[Cc]ookie:*) ;;
  *) fail "the console refused the example's ops token: $signed" ;;
esac
curl -fsS -o /dev/null -H "Authorization: Bearer $admin_token" "http://127.0.0.1:$port/v1/node" \
  || fail "the admin API refused the example's ops token"

say "hooks through kubectl port-forward to hooks-0 are delivered to the sink and counted"
port=$(python3 scripts/free_ports.py)
kubectl port-forward pod/hooks-0 "$port:8080" >"$work/pf.log" 2>&1 &
pids+=($!)
e2e_until 30 curl -fsS "http://127.0.0.1:$port/healthz" -o /dev/null || fail "port-forward did not come up"
url="http://127.0.0.1:$port/ingest/shopify"
python3 e2e/hooks.py send "$url" "$shopify_secret" "$work/acked" --count 60 --tenants 6 --prefix first
delivered() {
  kubectl -n apps logs webhook-consumer >"$work/sink.log" 2>/dev/null
  python3 e2e/hooks.py check "$work/acked" "$work/sink.log" "$@" >/dev/null 2>&1
}
e2e_until 60 delivered || { python3 e2e/hooks.py check "$work/acked" "$work/sink.log" || true; fail "not every acked hook was delivered"; }
python3 e2e/hooks.py check "$work/acked" "$work/sink.log"

say "helm upgrade to the previous release's chart and back (CRD, RBAC, Deployment): the operator rolls twice, relay/hooks's pods untouched"
# relay/hooks's pods, each as name/uid/restarts: the same string while none restarted.
hooks_pods() {
  kubectl get pods -l app.kubernetes.io/instance=hooks,app.kubernetes.io/name=ankusa-relay \
    -o jsonpath='{range .items[*]}{.metadata.name}/{.metadata.uid}/{.status.containerStatuses[0].restartCount}{"\n"}{end}'
}
crd_has_secret_dirs() {
  kubectl get crd relays.ankusa.dev -o jsonpath='{.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.config.properties}' \
    | grep -q secretDirs
}
# Only the chart's operator pods of image $1 are left, every one Ready.
operator_on() {
  local pods
  pods=$(kubectl -n ankusa-system get pods -l app.kubernetes.io/name=ankusa-operator \
    -o jsonpath='{range .items[*]}{.spec.containers[0].image}/{.status.containerStatuses[0].ready}{"\n"}{end}')
  [ -n "$pods" ] && [ -z "$(grep -vx "$1/true" <<<"$pods")" ]
}
pods_before=$(hooks_pods)
sts_generation=$(kubectl get statefulset hooks -o jsonpath='{.metadata.generation}')
crd_has_secret_dirs || fail "this tree's CRD has no spec.config.secretDirs"
helm upgrade ankusa "$work/previous-chart/charts/ankusa" --namespace ankusa-system --set image.tag=previous \
  --force-conflicts >/dev/null
crd_has_secret_dirs && fail "the previous chart's CRD is not the one in the cluster after helm upgrade"
e2e_until 180 operator_on ghcr.io/ankusa/operator:previous || fail "the operator did not roll to the previous chart's image"
# --reset-values: without it Helm would keep the previous release's image.tag=previous.
helm upgrade ankusa charts/ankusa --namespace ankusa-system --reset-values --force-conflicts >/dev/null
crd_has_secret_dirs || fail "helm upgrade did not bring this tree's CRD back"
e2e_until 180 operator_on ghcr.io/ankusa/operator:0.1.0 || fail "the operator did not roll to this tree's image"
# The new leader reconciles: the PodDisruptionBudget, deleted, is made again.
pdb_uid=$(kubectl get pdb hooks -o jsonpath='{.metadata.uid}')
kubectl delete pdb hooks --wait=true >/dev/null
remade() { local u; u=$(kubectl get pdb hooks -o jsonpath='{.metadata.uid}' 2>/dev/null) && [ -n "$u" ] && [ "$u" != "$pdb_uid" ]; }
leader() { kubectl -n ankusa-system get lease ankusa-operator -o jsonpath='{.spec.holderIdentity}'; }
new_leader() {
  [ "$(kubectl -n ankusa-system get pod "$(leader)" -o jsonpath='{.spec.containers[0].image}' 2>/dev/null)" \
    = ghcr.io/ankusa/operator:0.1.0 ]
}
e2e_until 60 new_leader || fail "no operator pod of this tree's image holds the Lease: $(leader)"
e2e_until 90 remade || fail "the upgraded operator did not make relay/hooks's PodDisruptionBudget again"
kubectl wait --for=condition=Ready relay/hooks --timeout=60s >/dev/null || fail "relay/hooks is not Ready after the upgrades"
[ "$(hooks_pods)" = "$pods_before" ] || fail "the chart's upgrades restarted relay pods: $pods_before -> $(hooks_pods)"
[ "$(kubectl get statefulset hooks -o jsonpath='{.metadata.generation}')" = "$sts_generation" ] \
  || fail "the chart's upgrades changed relay/hooks's StatefulSet"
python3 e2e/hooks.py send "$url" "$shopify_secret" "$work/acked" --count 12 --tenants 6 --prefix upgraded
e2e_until 60 delivered || fail "hooks sent after the upgrades were not delivered"

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

# The first hooks' tenants in the Relay's status (the operator polls the nodes every 30 s:
# checked after the section above rather than waited for).
counted() { [ "$(kubectl get relay hooks -o jsonpath='{.status.tenants.count}')" = 6 ]; }
e2e_until 60 counted || fail "the Relay's status does not count the 6 tenants: $(kubectl get relay hooks -o jsonpath='{.status.tenants}')"

say "a SIGKILL from outside to hooks-2's PID 1: the kubelet restarts the container, nothing acked is lost"
restarts=$(kubectl get pod hooks-2 -o jsonpath='{.status.containerStatuses[0].restartCount}')
pid=$(container_pid hooks-2)
python3 e2e/hooks.py send "$url" "$shopify_secret" "$work/acked" --count 100 --tenants 6 --rate 20 --prefix killed \
  >"$work/killed.log" 2>&1 &
sender=$!
sleep 2
kill -KILL "$pid"
wait "$sender" || { cat "$work/killed.log" >&2; fail "hooks around the SIGKILL were not acked"; }
e2e_until 120 bash -c "[ \"\$(kubectl get pod hooks-2 -o jsonpath='{.status.containerStatuses[0].restartCount}/{.status.containerStatuses[0].ready}')\" = \"$((restarts + 1))/true\" ]" \
  || fail "the kubelet did not restart hooks-2's container"
e2e_until 90 delivered --allow-duplicates || { python3 e2e/hooks.py check "$work/acked" "$work/sink.log" --allow-duplicates || true; fail "acked hooks were lost across the SIGKILL"; }
python3 e2e/hooks.py check "$work/acked" "$work/sink.log" --allow-duplicates

say "a source added to the Relay's configuration and tenants.max raised reach the running nodes through the ConfigMap: no pod restarted"
pods_before=$(hooks_pods)
hash_before=$(kubectl get statefulset hooks -o jsonpath='{.spec.template.metadata.annotations.ankusa\.dev/config-hash}')
kubectl patch relay hooks --type json -p '[{"op": "add", "path": "/spec/config/inline/sources/-",
  "value": {"id": "added", "tenant": {"header": "x-tenant"}, "verify": {"scheme": "none"}, "route": "to-internal"}},
  {"op": "replace", "path": "/spec/tenants/max", "value": 100001}]' >/dev/null
added() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/ingest/added" \
    -H 'x-tenant: reload-tenant' -H 'content-type: application/json' -d '{"added":true}')" = 202 ]
}
# The kubelet refreshes a ConfigMap volume at its pod sync (every minute by default, 10 s on
# the test node); the node reads its file every 2 s.
e2e_until 240 added || fail "the added source never took a hook: $(kubectl logs hooks-0 --tail 20 2>&1)"
grep -q "configuration reloaded" <<<"$(kubectl logs hooks-0)" || fail "hooks-0 logged no reload"
tenants_max() { # each node's ankusa_tenants_max, one line each
  local p ip
  for p in 0 1 2; do
    ip=$(kubectl get pod "hooks-$p" -o jsonpath='{.status.podIP}')
    curl -fsS -H "Authorization: Bearer $admin_token" "http://$ip:9090/metrics" | awk '$1 == "ankusa_tenants_max" { print $2 }'
  done
}
all_raised() { [ "$(tenants_max | sort -u)" = 100001 ]; }
e2e_until 60 all_raised || fail "tenants.max did not reach every node: $(tenants_max | tr '\n' ' ')"
[ "$(kubectl get statefulset hooks -o jsonpath='{.spec.template.metadata.annotations.ankusa\.dev/config-hash}')" = "$hash_before" ] \
  || fail "adding a source changed the pods' config hash: the pods roll"
sleep 5
pods_after=$(hooks_pods)
[ "$pods_after" = "$pods_before" ] || fail "pods restarted on a reloadable change: $pods_before -> $pods_after"

say "config.caBundleRef: a sink on a test CA reached over HTTPS; the CA rotated in the Secret and the sink's certificate with it; reached again, no pod restarted"
# A CA and a certificate for tls-consumer.apps.svc it signed, in directory $1.
test_ca() {
  mkdir -p "$1"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=e2e sinks CA $(basename "$1")" \
    -keyout "$1/ca.key" -out "$1/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=tls-consumer.apps.svc \
    -keyout "$1/tls.key" -out "$1/tls.csr" 2>/dev/null
  printf 'subjectAltName=DNS:tls-consumer.apps.svc\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$1/ext"
  openssl x509 -req -in "$1/tls.csr" -CA "$1/ca.crt" -CAkey "$1/ca.key" -CAcreateserial -days 2 \
    -extfile "$1/ext" -out "$1/tls.crt" 2>/dev/null || fail "openssl could not sign the sink's certificate"
}
# The TLS sink's pod on the certificate of CA $1 (made again: it reads its files at start),
# and the Relay's bundle Secret holding that CA.
tls_sink_on() {
  kubectl -n apps delete pod tls-consumer --ignore-not-found --wait=true >/dev/null
  kubectl -n apps create secret tls tls-consumer --cert "$work/$1/tls.crt" --key "$work/$1/tls.key" \
    --dry-run=client -o yaml | kubectl -n apps apply -f - >/dev/null
  kubectl -n apps apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: { name: tls-consumer, labels: { app: tls-consumer } }
spec:
  securityContext: { runAsNonRoot: true, runAsUser: 10001, seccompProfile: { type: RuntimeDefault } }
  containers:
  - name: sink
    image: ghcr.io/ankusa/relay:0.1.0
    imagePullPolicy: Never
    args: [sink, --listen, "[::]:8443", --tls-cert, /tls/tls.crt, --tls-key, /tls/tls.key]
    volumeMounts: [{ name: tls, mountPath: /tls, readOnly: true }]
    resources: { requests: { cpu: 20m, memory: 32Mi } }
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: { drop: [ALL] }
  volumes: [{ name: tls, secret: { secretName: tls-consumer } }]
EOF
  kubectl create secret generic sinks-ca --from-file=ca.crt="$work/$1/ca.crt" --dry-run=client -o yaml \
    | kubectl apply -f - >/dev/null
  kubectl -n apps wait --for=condition=Ready pod/tls-consumer --timeout=60s >/dev/null || fail "the TLS sink did not start"
}
test_ca "$work/ca-first"
test_ca "$work/ca-second"
sink_service tls-consumer
tls_sink_on ca-first
kubectl apply -f - >/dev/null <<EOF
apiVersion: ankusa.dev/v1alpha1
kind: Relay
metadata: { name: tls }
spec:
  replicas: 1
  image: ghcr.io/ankusa/relay:0.1.0
  storage: { size: 1Gi, storageClassName: $ANKUSA_TESTENV_STORAGE_CLASS }
  resources: { requests: { cpu: 50m, memory: 64Mi } }
  config:
    caBundleRef: { secret: { name: sinks-ca } }
    inline:
      sinks: [{ id: tls, url: "https://tls-consumer.apps.svc:8443/hooks", timeout_ms: 2000 }]
      routes: [{ id: r, sinks: [tls] }]
      sources: [{ id: demo, tenant: { header: x-tenant }, verify: { scheme: none }, route: r }]
      retry: { schedule_ms: [500, 1000], max_attempts: 1000, jitter: none }
EOF
kubectl wait --for=condition=Ready relay/tls --timeout=3m >/dev/null || fail "relay/tls did not become Ready"
tls_ip=$(kubectl get pod tls-0 -o jsonpath='{.status.podIP}')
tls_pod() { kubectl get pod tls-0 -o jsonpath='{.metadata.uid}/{.status.containerStatuses[0].restartCount}'; }
tls_before=$(tls_pod)
# (Each output read whole before it is searched: `grep -q` stops at its match, and under
# pipefail the lister's SIGPIPE would fail the check.)
printed() { grep -qF "{\"tls\":\"$1\"} → 204" <<<"$(kubectl -n apps logs tls-consumer 2>/dev/null)"; }
over_tls() { # hook $1 acked by tls-0 and printed by the TLS sink
  curl -fsS -X POST -H 'x-tenant: t1' -H 'content-type: application/json' -d "{\"tls\":\"$1\"}" \
    "http://$tls_ip:8080/ingest/demo" -o /dev/null || fail "tls-0 did not ack hook $1"
  e2e_until 90 printed "$1" || fail "hook $1 never reached the TLS sink: $(kubectl logs tls-0 --tail 10 2>&1)"
}
over_tls first
tls_sink_on ca-second
over_tls second
grep -q "reloading the configuration" <<<"$(kubectl logs tls-0)" || fail "tls-0 did not read its rotated bundle again"
[ "$(tls_pod)" = "$tls_before" ] || fail "tls-0 restarted for a rotated bundle: $tls_before -> $(tls_pod)"
kubectl delete relay tls --wait=false >/dev/null
kubectl -n apps delete pod tls-consumer --wait=false >/dev/null

say "a second chart release in another namespace: it leaves the Relays to the first (a Warning Event on each), which reports it in Degraded; nothing of relay/hooks changes; uninstalled, the report goes"
pods_before=$(hooks_pods)
sts_generation=$(kubectl get statefulset hooks -o jsonpath='{.metadata.generation}')
test_namespace ankusa-second
helm install second charts/ankusa --namespace ankusa-second --set crds.install=false --set replicaCount=1 >/dev/null
second_ready() {
  kubectl -n ankusa-second get pods -l app.kubernetes.io/name=ankusa-operator \
    -o jsonpath='{.items[*].status.containerStatuses[0].ready}' | grep -q true
}
e2e_until 120 second_ready || fail "the second release's operator did not become Ready"
refused() {
  grep -q "install ankusa-second/" <<<"$(kubectl get events \
    --field-selector reason=ManagedByAnotherOperator,involvedObject.name=hooks -o jsonpath='{.items[*].message}')"
}
e2e_until 90 refused || fail "the second install wrote no ManagedByAnotherOperator Event on relay/hooks"
reported() {
  grep -q "install ankusa-second/ankusa-operator watches this Relay too" \
    <<<"$(kubectl get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Degraded")].message}')"
}
e2e_until 90 reported || fail "relay/hooks does not report the second install: $(kubectl get relay hooks -o jsonpath='{.status.conditions}')"
[ "$(kubectl get relay hooks -o jsonpath='{.status.operator}')" = ankusa-system/ankusa-operator ] \
  || fail "relay/hooks is managed by $(kubectl get relay hooks -o jsonpath='{.status.operator}')"
grep -q "another operator install manages this Relay" <<<"$(kubectl -n ankusa-second logs deploy/second-ankusa 2>/dev/null)" \
  || fail "the second install did not say it leaves relay/hooks alone"
helm uninstall second --namespace ankusa-second >/dev/null
kubectl delete namespace ankusa-second --wait=true --timeout=120s >/dev/null || fail "namespace ankusa-second did not go"
not_reported() { ! reported; }
e2e_until 90 not_reported || fail "relay/hooks still reports the uninstalled install"
[ "$(hooks_pods)" = "$pods_before" ] || fail "the second install restarted relay pods: $pods_before -> $(hooks_pods)"
[ "$(kubectl get statefulset hooks -o jsonpath='{.metadata.generation}')" = "$sts_generation" ] \
  || fail "the second install changed relay/hooks's StatefulSet"

# --- a slow start ---------------------------------------------------------------------------
# A node whose volume is a directory mounted again through FUSE (e2e/testenv/slowfs) that
# holds every read of a file for as long as the test says: a disk freshly attached and slow.
# Its store then opens for as long as the test keeps the disk slow. The watch of that open
# (70 s) runs beside the OOM kill and the format upgrade below.
say "a slow disk under slow-0's store: not restarted while the store opens, /healthz 200 and /readyz 503 store_opening meanwhile, SIGTERM ends it at once"
slowfs_src=e2e/testenv/slowfs
slowfs_bin=${XDG_CACHE_HOME:-$HOME/.cache}/ankusa/slowfs-$(cat "$slowfs_src"/go.mod "$slowfs_src"/go.sum "$slowfs_src"/main.go | sha256sum | cut -c1-16)
if [ ! -x "$slowfs_bin" ]; then
  (cd "$slowfs_src" && go build -o "$slowfs_bin.part" .) && mv "$slowfs_bin.part" "$slowfs_bin"
fi
mkdir -p "$work/slow-backing" "$work/slow-volume"
echo 0 >"$work/slow-delay-ms"
"$slowfs_bin" -backing "$work/slow-backing" -mount "$work/slow-volume" -control "$work/slow-delay-ms" \
  >"$work/slowfs.log" 2>&1 &
slowfs_pid=$!
pids+=("$slowfs_pid")
slow_pv=slow-$ns
mounted() { awk -v m="$work/slow-volume" '$2 == m && $3 == "fuse.slowfs"' /proc/mounts | grep -q .; }
e2e_until 20 mounted || fail "slowfs did not mount: $(cat "$work/slowfs.log")"
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: { name: $slow_pv }
spec:
  capacity: { storage: 1Gi }
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: $ANKUSA_TESTENV_STORAGE_CLASS
  claimRef: { namespace: $ns, name: data-slow-0 }
  local: { path: $work/slow-volume }
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - { key: kubernetes.io/hostname, operator: In, values: [$node] }
---
apiVersion: ankusa.dev/v1alpha1
kind: Relay
metadata: { name: slow }
spec:
  replicas: 1
  image: ghcr.io/ankusa/relay:0.1.0
  storage: { size: 1Gi, storageClassName: $ANKUSA_TESTENV_STORAGE_CLASS }
  resources: { requests: { cpu: 50m, memory: 64Mi } }
$demo_config
EOF
kubectl wait --for=condition=Ready relay/slow --timeout=3m >/dev/null || fail "relay/slow did not become Ready"
slow_ip=$(kubectl get pod slow-0 -o jsonpath='{.status.podIP}')
for i in $(seq 1 20); do
  curl -fsS -X POST -H 'x-tenant: t1' -H 'content-type: application/json' -d "{\"n\":$i}" \
    "http://$slow_ip:8080/ingest/demo" -o /dev/null || fail "hook $i was not acked"
done
# Every read now takes 5 s; the container is killed and the kubelet starts it again.
echo 5000 >"$work/slow-delay-ms"
slow_restarts=$(kubectl get pod slow-0 -o jsonpath='{.status.containerStatuses[0].restartCount}')
kill -KILL "$(container_pid slow-0)"
running_again() {
  [ "$(kubectl get pod slow-0 -o jsonpath='{.status.containerStatuses[0].restartCount}')" = $((slow_restarts + 1)) ] &&
    curl -fsS "http://$slow_ip:9090/healthz" -o /dev/null
}
e2e_until 60 running_again || fail "slow-0 did not start again"
# For longer than liveness's budget (6 × 10 s): same container, alive, not ready, opening.
watch_slow_start() {
  local started opening=0 end=$((SECONDS + 70)) state answer
  started=$(kubectl get pod slow-0 -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')
  while [ $SECONDS -lt $end ]; do
    state=$(kubectl get pod slow-0 -o jsonpath='{.status.containerStatuses[0].restartCount}/{.status.containerStatuses[0].state.running.startedAt}/{.status.containerStatuses[0].ready}')
    [ "$state" = "$((slow_restarts + 1))/$started/false" ] || fail "slow-0 while its store opens: $state"
    curl -fsS "http://$slow_ip:9090/healthz" -o /dev/null || fail "slow-0's /healthz did not answer 200 while its store opens"
    answer=$(curl -sS -w ' %{http_code}' "http://$slow_ip:9090/readyz")
    case "$answer" in *store_opening*" 503") opening=$((opening + 1)) ;; *) fail "slow-0's /readyz while its store opens: $answer" ;; esac
    sleep 5
  done
  echo "$opening"
}
watch_slow_start >"$work/slow-watch.out" 2>&1 &
slow_watch=$!
pids+=("$slow_watch")

say "hooks-1 over its memory limit: the kernel kills it, the kubelet restarts it, nothing acked is lost"
# The container's memory cgroup is tightened to what it holds now plus a little (the pod's
# own limit would take a long burst to reach), then a burst of large hooks goes straight
# to the pod's address on the bridge: the kernel's OOM killer ends PID 1 mid-burst. The
# restarted container gets the pod's limit again.
restarts=$(kubectl get pod hooks-1 -o jsonpath='{.status.containerStatuses[0].restartCount}')
pid=$(container_pid hooks-1)
mem=$(memory_cgroup "$pid")
pod_limit=$(cat "$mem/memory.limit_in_bytes")
# The node read that limit from its cgroup and sized its store from it (a quarter).
opening=$(kubectl logs hooks-1 | grep "opening the store" | tail -n1)
echo "$opening" | grep -Eq "memory_limit\"?[=:]\"?$pod_limit\b" ||
  fail "hooks-1 did not find its memory limit ($pod_limit) in its cgroup: $opening"
rss=$(awk '$1 == "rss" { print $2 }' "$mem/memory.stat")
limit=$((rss + (24 << 20)))
until echo "$limit" >"$mem/memory.limit_in_bytes" 2>/dev/null; do # EBUSY: its cache did not shrink yet
  limit=$((limit + (8 << 20)))
  [ "$limit" -lt "$pod_limit" ] || fail "hooks-1's memory limit could not be lowered"
done
say "  hooks-1's cgroup: $((rss >> 20)) MiB resident; its limit of $((pod_limit >> 20)) MiB lowered to $((limit >> 20)) MiB"
ip=$(kubectl get pod hooks-1 -o jsonpath='{.status.podIP}')
python3 e2e/hooks.py send "http://$ip:8080/ingest/shopify" "$shopify_secret" "$work/acked" --count 96 --tenants 6 \
  --parallel 16 --size 1000000 --seconds 180 --prefix oom >"$work/oom.log" 2>&1 ||
  { cat "$work/oom.log" >&2; fail "the hooks around the OOM kill were not acked"; }
cat "$work/oom.log"
oomed() {
  [ "$(kubectl get pod hooks-1 -o jsonpath='{.status.containerStatuses[0].restartCount}/{.status.containerStatuses[0].lastState.terminated.reason}/{.status.containerStatuses[0].ready}')" = "$((restarts + 1))/OOMKilled/true" ]
}
e2e_until 120 oomed ||
  fail "hooks-1 was not OOM-killed and restarted: $(kubectl get pod hooks-1 -o jsonpath='{.status.containerStatuses[0]}')"
[ "$(cat "$(memory_cgroup "$(container_pid hooks-1)")/memory.limit_in_bytes")" = "$pod_limit" ] ||
  fail "the restarted hooks-1 does not have the pod's memory limit"
e2e_until 120 delivered --allow-duplicates || { python3 e2e/hooks.py check "$work/acked" "$work/sink.log" --allow-duplicates || true; fail "acked hooks were lost across the OOM kill"; }
python3 e2e/hooks.py check "$work/acked" "$work/sink.log" --allow-duplicates
kubectl get relays

# --- the format upgrade with two real images ----------------------------------------------
# (Beside the slow start's watch; its previous release's image was built from the start.)
say "the format upgrade with two real images: $old (format 2) to $new, backed up to a real claim"
wait "$previous_image" || fail "the previous release's image was not built: $(cat "$work/previous-image.log")"
"${ctr[@]}" images import "$work/previous.oci.tar" >/dev/null
# What a pull from a registry records beside the tag, and `ctr images import` does not: the
# repository digest, which the node then reports as the image ID of the probe's container
# (the target release's) and the operator pins the nodes to (docs/deployment.md).
digest=$(tar -xOf target/images/relay.oci.tar index.json |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')
"${ctr[@]}" images tag --force "$new" "${new%:*}@$digest" >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: old-backups }
spec:
  storageClassName: $ANKUSA_TESTENV_STORAGE_CLASS
  accessModes: [ReadWriteOnce]
  resources: { requests: { storage: 1Gi } }
---
apiVersion: ankusa.dev/v1alpha1
kind: Relay
metadata: { name: old }
spec:
  replicas: 2
  image: $old
  storage: { size: 1Gi, storageClassName: $ANKUSA_TESTENV_STORAGE_CLASS }
  resources: { requests: { cpu: 50m, memory: 64Mi } }
  backup: { destination: { claimName: old-backups }, retention: 2 }
$demo_config
EOF
kubectl wait --for=condition=Ready relay/old --timeout=3m >/dev/null || fail "relay/old did not become Ready on $old"
[ "$(kubectl get relay old -o jsonpath='{.status.storeFormat}')" = 2 ] || fail "relay/old is not at format 2"
kubectl get relay old
kubectl patch relay old --type merge -p "{\"spec\":{\"image\":\"$new\"}}" >/dev/null
completed() { [ "$(kubectl get relay old -o jsonpath='{.status.upgrade.phase}')" = Completed ]; }
e2e_until 300 completed || fail "the upgrade did not complete: $(kubectl get relay old -o jsonpath='{.status.upgrade}')"
kubectl wait --for=condition=Ready relay/old --timeout=2m >/dev/null || fail "relay/old is not Ready after the upgrade"
kubectl get relay old -o wide
[ "$(kubectl get relay old -o jsonpath='{.status.storeFormat}')" = 3 ] || fail "relay/old is not at format 3"
# The backup Jobs ran as pods of the new image on the node, onto the backup claim.
jobs=$(kubectl get pods -l ankusa.dev/job,app.kubernetes.io/instance=old \
  -o jsonpath='{range .items[*]}{.metadata.labels.ankusa\.dev/job}/{.spec.nodeName}/{.status.phase}/{.spec.containers[0].args[0]} {end}')
say "  the operator's Job pods (kind/node/phase/command): $jobs"
case "$jobs" in *"backup/$node/Succeeded/backup"*) ;; *) fail "no backup Job pod succeeded on the node" ;; esac
host_path() { # the host directory of a claim's local volume
  kubectl get pv "$(kubectl get pvc "$1" -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.local.path}'
}
backups=$(host_path old-backups)
started_ms() {
  date -d "$(kubectl get pod "$1" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')" +%s000
}
# Order: old-1 first; each node backed up before it moved; old-0's backup after old-1 moved
# (the times of the pods' starts are whole seconds).
moved_1=$(started_ms old-1)
[ "$moved_1" -le "$(started_ms old-0)" ] || fail "old-0 moved before old-1"
for i in 1 0; do
  image=$(kubectl get pod "old-$i" -o jsonpath='{.spec.containers[0].image}')
  case "$image" in "$new@sha256:"*) ;; *) fail "old-$i runs $image, not $new pinned to the digest its probe resolved" ;; esac
  archive=$(ls "$backups/old/old-$i/" 2>/dev/null | grep -E '^b[0-9]+\.tar\.zst$' | sort | tail -n1)
  [ -n "$archive" ] || fail "no backup of old-$i in the backup claim"
  taken=${archive#b}; taken=${taken%.tar.zst}
  [ "$taken" -lt "$(($(started_ms "old-$i") + 1000))" ] || fail "old-$i moved before its backup ($taken)"
  [ "$i" = 1 ] || [ "$((taken + 1000))" -gt "$moved_1" ] || fail "old-0's backup ($taken) is older than old-1's move"
  "$relay_bin" restore --from "$backups/old/old-$i/$archive" --data "$work/restored-$i" |
    grep -q "store format 2" || fail "the backup of old-$i is not its format-2 store"
done
# A drain is not stalled by the Jobs: their finished pods (kept a day) are outside the
# PodDisruptionBudget, which allows one relay pod's eviction and refuses a second while
# the first is away. (When a Job pod matched its selector, the disruption controller could
# not count the pods of a Job and allowed no eviction at all.)
say "the PodDisruptionBudget after the Jobs: one eviction allowed, a second refused"
allowed() { [ "$(kubectl get pdb old -o jsonpath='{.status.disruptionsAllowed}/{.status.expectedPods}')" = 1/2 ]; }
e2e_until 60 allowed || fail "PodDisruptionBudget old: $(kubectl get pdb old -o jsonpath='{.status}')"
evict() {
  echo "{\"apiVersion\": \"policy/v1\", \"kind\": \"Eviction\", \"metadata\": {\"name\": \"$1\", \"namespace\": \"$ns\"}}" |
    kubectl create --raw "/api/v1/namespaces/$ns/pods/$1/eviction" -f - 2>&1 >/dev/null
}
uid0=$(kubectl get pod old-0 -o jsonpath='{.metadata.uid}')
out=$(evict old-0) || fail "the eviction of old-0 was refused: $out"
out=$(evict old-1) && fail "a second eviction while old-0 is away was allowed"
case "$out" in *"disruption budget"*) ;; *) fail "the second eviction failed otherwise: $out" ;; esac
back() { # old-0 again: a new pod, ready
  [ "$(kubectl get pod old-0 -o jsonpath='{.metadata.uid}' 2>/dev/null)" != "$uid0" ] &&
    [ "$(kubectl get pod old-0 -o jsonpath='{.status.containerStatuses[0].ready}' 2>/dev/null)" = true ]
}
e2e_until 120 back || fail "old-0 did not come back after its eviction"
kubectl wait --for=condition=Ready relay/old --timeout=2m >/dev/null || fail "relay/old is not Ready after the eviction"
# Every hook the previous release acked is on both nodes, and counted.
node_answer() { # sets answer to /v1/node of pod $1 ($2 names the port-forward's log)
  local port
  port=$(python3 scripts/free_ports.py)
  kubectl port-forward "pod/$1" "$port:9090" >"$work/pf-$1-$2.log" 2>&1 &
  pids+=($!)
  e2e_until 30 curl -fs "http://127.0.0.1:$port/healthz" -o /dev/null || fail "port-forward to $1 did not come up"
  answer=$(curl -fsS -H "Authorization: Bearer $(kubectl get secret old-operator-token -o jsonpath='{.data.token}' | base64 -d)" \
    "http://127.0.0.1:$port/v1/node")
}
old_nodes() { # $1 names the port-forwards' logs
  old_answers=()
  for i in 0 1; do
    node_answer "old-$i" "$1"
    old_answers+=("$answer")
  done
  e2e_fixture_moved_all "${old_answers[@]}" 2>/dev/null
}
tries=0
until old_nodes "upgrade-$tries"; do
  tries=$((tries + 1))
  [ "$tries" -lt 20 ] || { e2e_fixture_moved_all "${old_answers[@]}"; fail "after the upgrade: ${old_answers[*]}"; }
  sleep 3
done
# Scheduled backups: every minute, each node in turn onto the same claim, two kept per node.
say "scheduled backups of relay/old: every minute, one node at a time, retention 3"
kubectl patch relay old --type merge -p '{"spec":{"backup":{"schedule":"* * * * *","retention":3}}}' >/dev/null
both_backed_up() {
  [ "$(kubectl get relay old -o jsonpath='{range .status.scheduledBackups.nodes[*]}{.lastSuccess}{" "}{end}' | wc -w)" = 2 ]
}
e2e_until 240 both_backed_up ||
  fail "no scheduled backup of each node: $(kubectl get relay old -o jsonpath='{.status.scheduledBackups}')"
kubectl get relay old -o jsonpath='{.status.scheduledBackups}' | python3 -m json.tool
# The claim's room, as the last backup Job reported it: what the next room check reads.
claim_room() {
  kubectl get relay old -o json | python3 -c '
import json, sys
rooms = json.load(sys.stdin)["status"].get("backupClaims", [])
assert len(rooms) == 1 and rooms[0]["freeBytes"] > 0 and rooms[0]["job"].startswith("old-backup-"), rooms
'
}
e2e_until 60 claim_room || fail "no room of the backup claim in the status: $(kubectl get relay old -o jsonpath='{.status.backupClaims}')"
[ "$(kubectl get relay old -o jsonpath='{.status.conditions[?(@.type=="ScheduledBackups")].status}')" = True ] ||
  fail "ScheduledBackups is not True: $(kubectl get relay old -o jsonpath='{.status.conditions[?(@.type=="ScheduledBackups")]}')"
# One run is enough: the upgrade's format-2 backups stay for the rollback below.
kubectl patch relay old --type merge -p '{"spec":{"backup":{"schedule":null}}}' >/dev/null
for i in 0 1; do
  kept=$(ls "$backups/old/old-$i/" | grep -cE '^b[0-9]+\.tar\.zst$')
  [ "$kept" -le 3 ] || fail "old-$i keeps $kept archives, retention is 3"
  newest=$(ls "$backups/old/old-$i/" | grep -E '^b[0-9]+\.tar\.zst$' | sort | tail -n1)
  "$relay_bin" restore --from "$backups/old/old-$i/$newest" --data "$work/scheduled-$i" |
    grep -q "store format 3" || fail "the scheduled backup of old-$i is not its format-3 store"
done
# --- one node restored alone while the other serves ------------------------------------------
say "restoreNode: old-1 restored alone from its newest backup while old-0 serves its tenants; the hooks it lost are counted"
old_token=$(kubectl get secret old-operator-token -o jsonpath='{.data.token}' | base64 -d)
ip0=$(kubectl get pod old-0 -o jsonpath='{.status.podIP}')
ip1=$(kubectl get pod old-1 -o jsonpath='{.status.podIP}')
uid0=$(kubectl get pod old-0 -o jsonpath='{.metadata.uid}')
no_backup_running() { [ -z "$(kubectl get pods -l ankusa.dev/job=backup,app.kubernetes.io/instance=old --field-selector=status.phase=Running -o name)" ]; }
e2e_until 120 no_backup_running || fail "a scheduled backup of old is still running"
# Twenty tenants, one hook each through old-0 (forwarded to its owner): which old-1 stores
# is asked of old-1 alone. All after old-1's newest backup.
on1=() on0=()
for t in $(seq 0 19); do
  code=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "http://$ip0:8080/ingest/demo" -H "x-tenant: rn-$t" -d '{"n":0}')
  [ "$code" = 202 ] || fail "hook for rn-$t: $code"
  code=$(curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $old_token" -H 'ankusa-cluster-local: 1' \
    "http://$ip1:9090/v1/tenants/rn-$t")
  case "$code" in 200) on1+=("rn-$t") ;; 404) on0+=("rn-$t") ;; *) fail "GET /v1/tenants/rn-$t on old-1: $code" ;; esac
done
[ ${#on1[@]} -gt 0 ] && [ ${#on0[@]} -gt 0 ] || fail "the tenants did not spread over both nodes: old-1 has ${on1[*]:-none}"
# Five more for each of old-1's: its store acks ${#on1[@]} + 5 × ${#on1[@]} hooks after the backup.
for t in "${on1[@]}"; do
  for k in 1 2 3 4 5; do
    code=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "http://$ip1:8080/ingest/demo" -H "x-tenant: $t" -d "{\"n\":$k}")
    [ "$code" = 202 ] || fail "hook $k for $t: $code"
  done
done
lost=$((${#on1[@]} * 6))
# old-0's tenants keep sending throughout; every answer is recorded.
(
  while [ ! -e "$work/restore-stream-stop" ]; do
    for t in "${on0[@]}"; do
      curl -sS -o /dev/null -w '%{http_code}\n' --max-time 5 -X POST "http://$ip0:8080/ingest/demo" -H "x-tenant: $t" -d '{"stream":1}' \
        >>"$work/restore-stream.codes" 2>>"$work/restore-stream.err" || echo error >>"$work/restore-stream.codes"
    done
    sleep 0.2
  done
) &
stream_pid=$!
pids+=("$stream_pid")
restored() { # the restore of request $1 completed, old-1 back and Ready
  [ "$(kubectl get relay old -o jsonpath='{.status.restore.request}/{.status.restore.phase}')" = "$1/Completed" ] &&
    [ "$(kubectl get relay old -o jsonpath='{.status.nodesReady}')" = 2/2 ] &&
    kubectl get statefulset old >/dev/null 2>&1
}
rows_on_1() { # the rows old-1's store holds (one a hook: one sink, which nothing answers)
  curl -fsS -H "Authorization: Bearer $old_token" "http://$(kubectl get pod old-1 -o jsonpath='{.status.podIP}'):9090/v1/node" |
    python3 -c 'import json, sys; c = json.load(sys.stdin)["counters"]; print(c["pending"] + c["scheduled"] + c["inflight"] + c["dead"])'
}
before_rows=$(rows_on_1)
kubectl patch relay old --type merge -p '{"spec":{"restoreNode":{"ordinal":1,"request":"readable"}}}' >/dev/null
e2e_until 240 restored readable || fail "old-1 was not restored: $(kubectl get relay old -o jsonpath='{.status.restore} {.status.conditions}')"
after_rows=$(rows_on_1)
report=$(kubectl get relay old -o jsonpath='{.status.restore.report}')
# The report against what the node itself counted before and after: the rows it lost.
python3 - "$report" "$lost" "$before_rows" "$after_rows" <<'PY' || fail "the restore's report: $report (this test acked $lost hooks on old-1 after the backup; old-1 held $before_rows rows before, $after_rows after)"
import json, sys
r = json.loads(sys.argv[1])
sent, before, after = (int(v) for v in sys.argv[2:])
assert r["lostHooks"] == before - after, r
assert r["lostHooks"] >= sent, r
assert r["replacedSeq"] - r["backupSeq"] >= r["lostHooks"], r
PY
say "  restored: $(kubectl get relay old -o jsonpath='{.status.restore.message}')"
# A volume that no longer opens: its files garbled under the running node, which is then
# SIGKILLed (no close to write them again): the kubelet's restarts fail to open the store.
d1="$(host_path data-old-1)/data"
restarts=$(kubectl get pod old-1 -o jsonpath='{.status.containerStatuses[0].restartCount}')
pid=$(container_pid old-1)
echo garbage >"$d1/CURRENT"
rm -f "$d1"/MANIFEST-* "$d1"/OPTIONS-*
kill -KILL "$pid"
broken() { [ "$(kubectl get pod old-1 -o jsonpath='{.status.containerStatuses[0].restartCount}')" -gt "$((restarts + 1))" ]; }
e2e_until 120 broken || fail "old-1 did not fail to start on its garbled store: $(kubectl get pod old-1 -o jsonpath='{.status.containerStatuses[0]}')"
say "  old-1's store garbled and its process killed: it fails to start ($(kubectl get pod old-1 -o jsonpath='{.status.containerStatuses[0].restartCount}') restarts)"
kubectl patch relay old --type merge -p '{"spec":{"restoreNode":{"ordinal":1,"request":"corrupt"}}}' >/dev/null
e2e_until 240 restored corrupt || fail "old-1's corrupt store was not restored: $(kubectl get relay old -o jsonpath='{.status.restore} {.status.conditions}')"
case "$(kubectl get relay old -o jsonpath='{.status.restore.report.replacedUnreadable}')" in
  "") fail "the report of the corrupt store's restore does not say it could not be read: $(kubectl get relay old -o jsonpath='{.status.restore.report}')" ;;
esac
say "  restored over a corrupt store: $(kubectl get relay old -o jsonpath='{.status.restore.message}')"
touch "$work/restore-stream-stop"
wait "$stream_pid" || true
sent=$(wc -l <"$work/restore-stream.codes")
refused=$(grep -vc '^202$' "$work/restore-stream.codes" || true)
[ "$sent" -gt 20 ] || fail "old-0's tenants sent only $sent hooks during the restores"
[ "$refused" = 0 ] || fail "old-0's tenants saw $refused of $sent answers other than 202 during the restores: $(sort "$work/restore-stream.codes" | uniq -c | tr '\n' ' ') $(tail -n3 "$work/restore-stream.err")"
[ "$(kubectl get pod old-0 -o jsonpath='{.metadata.uid}')" = "$uid0" ] || fail "old-0 was restarted by the restores of old-1"
kubectl patch relay old --type json -p '[{"op":"remove","path":"/spec/restoreNode"}]' >/dev/null
say "  old-0 answered all $sent of its tenants' hooks 202 during both restores, on the same pod"

# The stores, closed: counters equal a fold of the families.
dirs=("$(host_path data-old-0)/data" "$(host_path data-old-1)/data")
kubectl delete relay old --wait=true >/dev/null
e2e_until 90 gone old || fail "old's pods did not go"
for d in "${dirs[@]}"; do
  "$relay_bin" store verify --data "$d" >/dev/null || fail "the counters of $d do not fold"
done

# --- disaster recovery: the Relay and its volumes lost, made again from its backups --------
say "bootstrap: relay/old and its data claims deleted, made again from the backups on old-backups"
kubectl delete pvc data-old-0 data-old-1 --wait=true >/dev/null
relay_old() { # relay/old on release $1, with the spec lines $2 added
  kubectl apply -f - >/dev/null <<EOF
apiVersion: ankusa.dev/v1alpha1
kind: Relay
metadata: { name: old }
spec:
  replicas: 2
  image: $1
  storage: { size: 1Gi, storageClassName: $ANKUSA_TESTENV_STORAGE_CLASS }
  resources: { requests: { cpu: 50m, memory: 64Mi } }
  backup: { destination: { claimName: old-backups }, retention: 3 }
$2
$demo_config
EOF
}
relay_old "$new" "  bootstrap: { fromBackup: { claimName: old-backups } }"
restored() { [ "$(kubectl get relay old -o jsonpath='{.status.restore.phase}')" = Completed ]; }
e2e_until 240 restored || fail "the bootstrap did not complete: $(kubectl get relay old -o jsonpath='{.status.restore}')"
kubectl wait --for=condition=Ready relay/old --timeout=3m >/dev/null ||
  fail "relay/old made from its backups is not Ready: $(kubectl get relay old -o jsonpath='{.status.conditions}')"
kubectl get relay old -o jsonpath='{.status.restore}' | python3 -m json.tool
# Each node serves what it held at its newest (scheduled, format-3) backup: every hook the
# previous release acked.
tries=0
until old_nodes "bootstrap-$tries"; do
  tries=$((tries + 1))
  [ "$tries" -lt 20 ] || { e2e_fixture_moved_all "${old_answers[@]}"; fail "made from their backups: ${old_answers[*]}"; }
  sleep 3
done

# --- rollback by restore: back to the format-2 release -----------------------------------------
say "rollback: spec.image back to $old; held without rollbackTo; with it every node stops, is restored from its format-2 backup and starts on $old"
kubectl patch relay old --type merge -p "{\"spec\":{\"image\":\"$old\"}}" >/dev/null
held() { [ "$(kubectl get relay old -o jsonpath='{.status.conditions[?(@.type=="Degraded")].reason}')" = FormatTooOld ]; }
e2e_until 120 held || fail "a lower release without rollbackTo was not held: $(kubectl get relay old -o jsonpath='{.status.conditions}')"
[ "$(kubectl get relay old -o jsonpath='{.status.restore.reason}')" = Bootstrap ] || fail "a rollback began without rollbackTo"
kubectl patch relay old --type merge -p "{\"spec\":{\"upgrade\":{\"rollbackTo\":{\"image\":\"$old\",\"acknowledgeDataLoss\":true}}}}" >/dev/null
rolled_back() {
  [ "$(kubectl get relay old -o jsonpath='{.status.restore.reason}/{.status.restore.phase}')" = Rollback/Completed ]
}
e2e_until 300 rolled_back || fail "the rollback did not complete: $(kubectl get relay old -o jsonpath='{.status.restore}')"
kubectl wait --for=condition=Ready relay/old --timeout=3m >/dev/null ||
  fail "relay/old is not Ready after the rollback: $(kubectl get relay old -o jsonpath='{.status.conditions}')"
kubectl get relay old -o wide
[ "$(kubectl get relay old -o jsonpath='{.status.storeFormat}')" = 2 ] || fail "relay/old is not at format 2 after the rollback"
for i in 0 1; do
  image=$(kubectl get pod "old-$i" -o jsonpath='{.spec.containers[0].image}')
  case "$image" in "$old"*) ;; *) fail "old-$i runs $image after the rollback, not $old" ;; esac
  node_answer "old-$i" rollback
  python3 - "$answer" <<'PY' || fail "old-$i after the rollback: $answer"
import json, sys
n = json.loads(sys.argv[1])
c = n["counters"]
assert n["store_format"] == 2, n
assert 13 <= c["pending"] + c["inflight"] + c["dead"] <= 16, n
PY
  # The format-3 store it had is on its volume, moved aside, not deleted.
  ls -d "$(host_path "data-old-$i")"/data.replaced-* >/dev/null 2>&1 ||
    fail "old-$i's format-3 store was not kept beside the restored one"
done
kubectl delete relay old --wait=true >/dev/null
e2e_until 90 gone old || fail "old's pods did not go"

# --- a slow start, continued: deleted while its store opens ---
wait "$slow_watch" || fail "$(cat "$work/slow-watch.out")"
say "  slow-0 stayed up $(cat "$work/slow-watch.out") checks (70 s) while its store opened; the kubelet did not restart it"
answer=$(curl -sS -w ' %{http_code}' "http://$slow_ip:9090/readyz")
case "$answer" in *store_opening*" 503") ;; *) fail "slow-0's store is no longer opening: $answer" ;; esac
grace=$(kubectl get statefulset slow -o jsonpath='{.spec.template.spec.terminationGracePeriodSeconds}')
t0=$SECONDS
kubectl delete pod slow-0 --wait=true --timeout=120s >/dev/null
took=$((SECONDS - t0))
# The pre-stop pause (5 s), then SIGTERM: the process ends at once.
[ "$took" -lt 15 ] || fail "slow-0, deleted while its store opened, took $took s to stop (grace $grace s)"
say "  deleted while its store opened: gone in $took s (5 s of it the pre-stop pause; grace $grace s)"
echo 0 >"$work/slow-delay-ms"
kubectl wait --for=condition=Ready relay/slow --timeout=3m >/dev/null || fail "relay/slow did not come back"
token=$(kubectl get secret slow-operator-token -o jsonpath='{.data.token}' | base64 -d)
slow_ip=$(kubectl get pod slow-0 -o jsonpath='{.status.podIP}')
answer=$(curl -fsS -H "Authorization: Bearer $token" "http://$slow_ip:9090/v1/node")
python3 - "$answer" <<'PY' || fail "slow-0 lost acked hooks: $answer"
import json, sys
c = json.loads(sys.argv[1])["counters"]
assert c["pending"] + c["scheduled"] + c["inflight"] + c["dead"] == 20, c
PY
kubectl delete relay slow --wait=true >/dev/null
e2e_until 90 gone slow || fail "slow's pods did not go"
kubectl delete pvc data-slow-0 --wait=true >/dev/null
kubectl delete pv "$slow_pv" --wait=true >/dev/null
kill -TERM "$slowfs_pid"
wait "$slowfs_pid" 2>/dev/null || true
mounted && fail "slowfs is still mounted"

# --- a scale-down that drains ----------------------------------------------------------------
say "scale-down 3 → 2 with the sink down while 30 tenants keep sending: hooks-2 hands every row over before it goes, SIGKILLed and hooks-1 deleted mid-drain; every acked hook delivered once after"
hooks_token=$(kubectl get secret hooks-operator-token -o jsonpath='{.data.token}' | base64 -d)
node_of() { # /v1/node of pod $1
  curl -fsS --max-time 5 -H "Authorization: Bearer $hooks_token" \
    "http://$(kubectl get pod "$1" -o jsonpath='{.status.podIP}'):9090/v1/node"
}
rows_of() { # the rows pod $1 holds, by its own counters
  node_of "$1" | python3 -c 'import json, sys; c = json.load(sys.stdin)["counters"]; print(c["pending"] + c["scheduled"] + c["inflight"] + c["dead"])'
}
handoff_of() { # pod $1's handoff account (/v1/node's cluster.handoff)
  node_of "$1" | python3 -c 'import json, sys; print(json.dumps((json.load(sys.stdin).get("cluster") or {}).get("handoff")))'
}
relay_pods=app.kubernetes.io/instance=hooks,app.kubernetes.io/component=relay
kubectl -n apps delete pod webhook-consumer --wait=true >/dev/null
base=0
for p in 0 1 2; do base=$((base + $(rows_of "hooks-$p"))); done
# The provider's load balancer: the ready relay pods' addresses, kept current while pods
# roll and die (hooks.py reads the file at every attempt).
(
  while [ ! -e "$work/drain-stop" ]; do
    kubectl get pods -l "$relay_pods" -o jsonpath='{range .items[?(@.status.containerStatuses[0].ready==true)]}http://{.status.podIP}:8080/ingest/shopify{"\n"}{end}' \
      >"$work/lb.tmp" 2>/dev/null && mv "$work/lb.tmp" "$work/lb"
    sleep 1
  done
) &
pids+=($!)
# The Relay's status as the operator writes it, with the hooks acked by then.
# And the leaving node's log while it lasts (the pod goes when it has drained): what a
# failure below shows of the hooks it held.
(
  while [ ! -e "$work/drain-stop" ]; do
    st=$(kubectl get relay hooks -o jsonpath='{.status.tenants}|{.status.nodes}|{.status.draining}' 2>/dev/null) &&
      echo "$(sort -u "$work/drain-acked" 2>/dev/null | wc -l)|$st"
    kubectl logs hooks-2 >"$work/hooks-2.log.tmp" 2>/dev/null && mv "$work/hooks-2.log.tmp" "$work/hooks-2.log"
    sleep 2
  done
) >"$work/drain-samples" &
pids+=($!)
e2e_until 10 test -s "$work/lb" || fail "no relay pod is ready"
python3 e2e/hooks.py send "@$work/lb" "$shopify_secret" "$work/drain-acked" --count 600 --tenants 30 --rate 15 \
  --seconds 400 --prefix drain >"$work/drain-send.log" 2>&1 &
drain_sender=$!
pids+=("$drain_sender")
holds_rows() { [ "$(rows_of hooks-2)" -ge 40 ]; }
e2e_until 60 holds_rows ||
  fail "hooks-2 does not hold the rows of its tenants: $(node_of hooks-2)"
say "  hooks-2 holds $(rows_of hooks-2) rows (the sink is down); spec.replicas: 2"
kubectl patch relay hooks --type merge -p '{"spec":{"replicas":2}}' >/dev/null
leaving_rows() { # hooks-2 leaving: prints the rows it still holds
  node_of hooks-2 2>/dev/null | python3 -c '
import json, sys
n = json.load(sys.stdin); c = n.get("cluster") or {}
assert c.get("leaving"), "not leaving"
h = c.get("handoff") or {}
print(h.get("rows_leaving", 0) + h.get("staged", 0))' 2>/dev/null
}
e2e_until 240 leaving_rows >/dev/null || fail "hooks-2 never learned it is leaving: $(node_of hooks-2)"
at_kill=$(leaving_rows)
kill -KILL "$(container_pid hooks-2)"
say "  hooks-2 on the new node list, holding $at_kill rows: its PID 1 SIGKILLed"
# hooks-1 once it runs the new list (the StatefulSet's revision): deleted, the receiver gone
# for as long as the StatefulSet takes to make it again.
sts_rolled() {
  local want
  want=$(kubectl get statefulset hooks -o jsonpath='{.status.updateRevision}')
  [ "$(kubectl get pod "$1" -o jsonpath='{.metadata.labels.controller-revision-hash}/{.status.containerStatuses[0].ready}')" = "$want/true" ]
}
e2e_until 240 sts_rolled hooks-1 || fail "hooks-1 never rolled onto the new node list"
at_delete=$(leaving_rows || echo unknown)
uid1=$(kubectl get pod hooks-1 -o jsonpath='{.metadata.uid}')
kubectl delete pod hooks-1 --wait=false >/dev/null
say "  hooks-1 (a receiver) deleted while hooks-2 held $at_delete rows"
shrunk() {
  [ "$(kubectl get statefulset hooks -o jsonpath='{.spec.replicas}')" = 2 ] &&
    ! kubectl get pod hooks-2 >/dev/null 2>&1
}
e2e_until 300 shrunk ||
  fail "the scale-down did not end: $(kubectl get relay hooks -o jsonpath='{.status.draining} {.status.conditions[?(@.type=="Progressing")]}')"
[ "$(kubectl get pod hooks-1 -o jsonpath='{.metadata.uid}')" != "$uid1" ] || fail "hooks-1 was not deleted"
wait "$drain_sender" || { cat "$work/drain-send.log" >&2; fail "the hooks sent through the scale-down were not acked"; }
cat "$work/drain-send.log"
acked=$(sort -u "$work/drain-acked" | wc -l)
# Once the status reads both nodes again: exactly the rows held before and every hook acked
# since (the sink is still down: nothing was delivered), and nothing staged on either node
# (a batch staged for hooks-2 while a node ran the old list is taken back, not left there).
exact() {
  [ "$(kubectl get relay hooks -o jsonpath='{.status.nodesReady}/{.status.draining}')" = 2/2/0 ] &&
    [ "$(kubectl get relay hooks -o jsonpath='{.status.tenants.pending} {.status.tenants.scheduled} {.status.tenants.inflight} {.status.tenants.dead}' |
      awk '{ print $1 + $2 + $3 + $4 }')" = "$((base + acked))" ] &&
    for p in hooks-0 hooks-1; do
      handoff_of "$p" | python3 -c 'import json, sys; h = json.load(sys.stdin); assert h and h["staged"] == 0' 2>/dev/null || return 1
    done
}
# Which acked hooks a node's hook log no longer shows waiting (for a failure's message),
# and what every node's log, the leaving one's included, says of them.
not_waiting() {
  local ip0 id answer missing
  ip0=$(kubectl get pod hooks-0 -o jsonpath='{.status.podIP}')
  missing=$(for id in $(sort -u "$work/drain-acked"); do
    answer=$(curl -sS --max-time 5 -H "Authorization: Bearer $hooks_token" "http://$ip0:9090/v1/hooks/$id")
    grep -Eq '"state": ?"(pending|scheduled|inflight|dead|queued)"' <<<"$answer" || echo "$id: $answer"
  done | head -n 5)
  echo "$missing"
  for p in 0 1; do echo "hooks-$p's handoff: $(handoff_of "hooks-$p" 2>&1)"; done
  for p in 0 1; do kubectl logs "hooks-$p" | grep -E "dropped rows|handoff" | tail -n 5; done
  for id in $(cut -d: -f1 <<<"$missing"); do
    for p in 0 1; do kubectl logs "hooks-$p" | grep -F "$id" | sed "s/^/hooks-$p: /" | tail -n 5; done
    grep -F "$id" "$work/hooks-2.log" 2>/dev/null | sed 's/^/hooks-2: /' | tail -n 5
  done
  echo "the leaving node's retained store:"
  "$relay_bin" store inspect --data "$(host_path data-hooks-2)/data" 2>&1 | grep -E 'counters|tenant' | head -n 5
  echo "the leaving node's last lines:"; tail -n 20 "$work/hooks-2.log" 2>/dev/null
  echo "the status through the drain:"; tail -n 10 "$work/drain-samples"
}
e2e_until 120 exact || fail "after the drain the Relay counts $(kubectl get relay hooks -o jsonpath='{.status.tenants}') for $base + $acked rows; $(not_waiting)"
touch "$work/drain-stop"
# Every reading while each node answered: never more rows than hooks acked by then (a row
# on two nodes would be counted twice); some reading saw the drain.
python3 - "$work/drain-samples" "$base" <<'PY' || fail "the Relay's status during the drain: $(tail -n 5 "$work/drain-samples")"
import json, sys
base = int(sys.argv[2])
read = drained = 0
for line in open(sys.argv[1]):
    acked, tenants, nodes, draining = line.rstrip("\n").split("|")
    if not tenants or not nodes:
        continue
    t, ns = json.loads(tenants), json.loads(nodes)
    if draining and int(draining) > 0:
        drained += 1
    if not all(n.get("ready") for n in ns):
        continue
    total = sum(t.get(k, 0) for k in ("pending", "scheduled", "inflight", "dead"))
    # One hook at a time is on its way: committed, its answer not read yet.
    assert total <= base + int(acked) + 1, (total, base, acked, line)
    read += 1
assert read >= 3 and drained >= 1, (read, drained)
print(f"e2e-node:   {read} readings with every node answering, none over the hooks acked; {drained} showed the drain")
PY
d2="$(host_path data-hooks-2)/data"
kubectl get pvc data-hooks-2 -o jsonpath='{.status.phase}' | grep -qx Bound || fail "data-hooks-2 was not retained"
"$relay_bin" store inspect --data "$d2" >"$work/inspect-2.txt" || fail "store inspect of data-hooks-2: $(cat "$work/inspect-2.txt")"
grep -q "node counters: pending=0 scheduled=0 inflight=0 dead=0 bytes=0" "$work/inspect-2.txt" ||
  fail "the retained claim of the drained hooks-2 holds rows: $(cat "$work/inspect-2.txt")"
say "  store inspect of data-hooks-2 (retained): $(grep 'node counters' "$work/inspect-2.txt")"
say "  the sink back; each tenant's waiting rows retried at once (POST /v1/tenants/{t}/retry, relay-wide)"
sink_pod
kubectl -n apps wait --for=condition=Ready pod/webhook-consumer --timeout=2m >/dev/null || fail "the sink did not come back"
ip0=$(kubectl get pod hooks-0 -o jsonpath='{.status.podIP}')
for t in $(seq 0 29); do
  curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $hooks_token" "http://$ip0:9090/v1/tenants/shop-$t.example/retry" ||
    fail "retry of shop-$t.example"
done
drain_delivered() {
  kubectl -n apps logs webhook-consumer >"$work/sink-drain.log" 2>/dev/null
  python3 e2e/hooks.py check "$work/drain-acked" "$work/sink-drain.log" >/dev/null 2>&1
}
e2e_until 120 drain_delivered || { python3 e2e/hooks.py check "$work/drain-acked" "$work/sink-drain.log" || true; fail "hooks acked through the scale-down were not delivered once each"; }
python3 e2e/hooks.py check "$work/drain-acked" "$work/sink-drain.log"

# --- the operator cut off from the API server ----------------------------------------------
say "the operator's pods cut off from the API server: none stays Ready; reachable again, they are Ready and reconcile"
op_selector=app.kubernetes.io/name=ankusa-operator
op_ready() { kubectl -n ankusa-system get pods -l "$op_selector" -o jsonpath='{range .items[*]}{.status.containerStatuses[0].ready}{"\n"}{end}'; }
# The pods reach the API server at the kubernetes Service's address (the bridge's, where
# the node forwards to it): a reset for every packet they send there.
op_ips=$(kubectl -n ankusa-system get pods -l "$op_selector" -o jsonpath='{.items[*].status.podIP}')
for ip in $op_ips; do
  rule=(INPUT -s "$ip" -d "$ANKUSA_TESTENV_NODE_IP" -p tcp --dport 443 -j REJECT --reject-with tcp-reset)
  iptables -I "${rule[@]}"
  cut_rules+=("${rule[*]}")
done
# Every cut pod answered for, and none Ready. Read whole, then searched: in `! op_ready |
# grep -q true` under pipefail, a grep that found `true` and quit before kubectl had
# written everything made kubectl's SIGPIPE the pipe's status, which `!` turned into "none
# Ready" (the check passed at once with a Ready pod, then failed 15 s later). An empty
# answer proves nothing either.
op_count=$(wc -w <<<"$op_ips")
none_ready() {
  local r
  r=$(op_ready) || return 1
  [ "$(grep -c . <<<"$r")" -eq "$op_count" ] && ! grep -q true <<<"$r"
}
e2e_until 150 none_ready || fail "an operator pod cut off from the API server stayed Ready: $(op_ready | tr '\n' ' ')"
sleep 15
none_ready || fail "an operator pod cut off from the API server became Ready again: $(op_ready | tr '\n' ' ')"
say "  no operator pod Ready while cut off; $(kubectl -n ankusa-system get pods -l "$op_selector" -o jsonpath='{range .items[*]}{.metadata.name} restarts={.status.containerStatuses[0].restartCount} {end}')"
for r in "${cut_rules[@]}"; do read -ra rule <<<"$r"; iptables -D "${rule[@]}"; done
cut_rules=()
e2e_until 180 bash -c "kubectl -n ankusa-system get pods -l $op_selector -o jsonpath='{.items[*].status.containerStatuses[0].ready}' | grep -q true" ||
  fail "no operator pod became Ready once the API server was reachable"
kubectl patch relay hooks --type merge -p '{"spec":{"tenants":{"max":100001}}}' >/dev/null
reconciled() {
  [ "$(kubectl get relay hooks -o jsonpath='{.status.observedGeneration}')" = "$(kubectl get relay hooks -o jsonpath='{.metadata.generation}')" ] &&
    kubectl get configmap hooks-config -o jsonpath='{.data.relay\.yaml}' | grep -q 'max: 100001'
}
e2e_until 120 reconciled || fail "the operator did not reconcile a change once reachable again"

# --- backups that outlive the namespace ---------------------------------------------------
say "backups in a bucket: pushes every 10 s under load, kubectl delete namespace, the Relay recreated in another namespace from the bucket; every hook acked before the last completed backup delivered once"
# SeaweedFS's S3 gateway on the pod bridge's own address (the pods reach the host there;
# the test made that bridge), every port its own, its files and logs in $work.
weed=$(bash scripts/seaweedfs.sh)
mapfile -t weed_ports < <(python3 scripts/free_ports.py 8)
mkdir -p "$work/weed"
(cd "$work/weed" && TMPDIR="$work/weed" exec "$weed" -logdir="$work/weed" server \
  -ip="$ANKUSA_TESTENV_NODE_IP" -ip.bind="$ANKUSA_TESTENV_NODE_IP" -metricsPort=0 -dir="$work/weed" \
  -master.port="${weed_ports[0]}" -master.port.grpc="${weed_ports[1]}" \
  -volume.port="${weed_ports[2]}" -volume.port.grpc="${weed_ports[3]}" \
  -filer.port="${weed_ports[4]}" -filer.port.grpc="${weed_ports[5]}" \
  -s3.port="${weed_ports[6]}" -s3.port.grpc="${weed_ports[7]}" \
  -master.telemetry=false -volume.minFreeSpace=64MiB -s3 -s3.port.iceberg=0 -s3.port.lance=0 >"$work/weed/weed.out" 2>&1) &
pids+=($!)
s3="http://$ANKUSA_TESTENV_NODE_IP:${weed_ports[6]}"
e2e_until 90 curl -fsS -X PUT "$s3/hooks-dr" -o /dev/null || fail "SeaweedFS's S3 gateway never made the bucket: $(tail -5 "$work/weed/weed.out")"
dra=dr-a-$(openssl rand -hex 3)
drb=dr-b-$(openssl rand -hex 3)
for n in "$dra" "$drb"; do
  test_namespace "$n"
  kubectl -n "$n" create secret generic webhook-secrets \
    --from-literal=shopify="$shopify_secret" --from-literal=sink="$sink_secret" >/dev/null
  kubectl -n "$n" create secret generic s3-keys \
    --from-literal=AWS_ACCESS_KEY_ID=e2e --from-literal=AWS_SECRET_ACCESS_KEY=e2e-secret-key >/dev/null
done
# The Relay of both lives: its sink (dr-sink.apps) does not exist in the first, so nothing
# is delivered before the namespace goes; $1: the spec's backup and bootstrap.
dr_relay() {
cat <<EOF
apiVersion: ankusa.dev/v1alpha1
kind: Relay
metadata: { name: hooks }
spec:
  replicas: 2
  image: ghcr.io/ankusa/relay:0.1.0
  imagePullPolicy: Never
  storage: { size: 1Gi, storageClassName: $ANKUSA_TESTENV_STORAGE_CLASS }
  resources: { requests: { cpu: 100m, memory: 128Mi } }
  config:
    inline:
      sinks: [{ id: internal, url: "http://dr-sink.apps.svc:8080/hooks", secret: { env: SINK_SECRET }, timeout_ms: 2000 }]
      routes: [{ id: r, sinks: [internal] }]
      retry: { schedule_ms: [3000], max_attempts: 1000 }
      sources:
        - id: shopify
          tenant: { header: X-Shopify-Shop-Domain }
          verify: { scheme: hmac-sha256, secret: { env: SHOPIFY_WEBHOOK_SECRET }, header: X-Shopify-Hmac-Sha256, encoding: base64 }
          tenant_binding: shared-secret
          idempotency: { headers: [X-Shopify-Webhook-Id] }
          route: r
    secretEnv:
      - { name: SHOPIFY_WEBHOOK_SECRET, secretKeyRef: { name: webhook-secrets, key: shopify } }
      - { name: SINK_SECRET, secretKeyRef: { name: webhook-secrets, key: sink } }
$1
EOF
}
dr_relay "  backup:
    objectStore: { url: s3://hooks-dr/a, endpoint: \"$s3\", credentialsSecret: s3-keys, intervalSeconds: 10 }" |
  kubectl -n "$dra" apply -f - >/dev/null
dr_ready() { kubectl -n "$1" get relay hooks -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
dr_condition() { kubectl -n "$1" get relay hooks -o jsonpath="{.status.conditions[?(@.type==\"$2\")].$3}"; }
e2e_until 300 dr_ready "$dra" || fail "the first Relay did not become Ready"
dr_port=$(python3 scripts/free_ports.py)
kubectl -n "$dra" port-forward pod/hooks-0 "$dr_port:8080" >"$work/dr-pf.log" 2>&1 &
dr_pf=$!
pids+=("$dr_pf")
e2e_until 30 curl -fsS "http://127.0.0.1:$dr_port/healthz" -o /dev/null || fail "port-forward to $dra/hooks-0 did not come up"
# Load for longer than five pushes; the namespace goes while it runs.
python3 e2e/hooks.py send "http://127.0.0.1:$dr_port/ingest/shopify" "$shopify_secret" "$work/dr-acked" \
  --count 100000 --tenants 12 --rate 10 --parallel 2 --seconds 400 --times --prefix dr >"$work/dr-send.log" 2>&1 &
dr_send=$!
pids+=("$dr_send")
# A prefix's keys in the bucket: how many manifests, their total size, the newest manifest.
pushed() {
  python3 - "$s3" "$@" <<'PY'
import re, sys, urllib.parse, urllib.request
base, prefix = sys.argv[1], sys.argv[2]
keys, token = {}, None
while True:
    q = f"{base}/hooks-dr?list-type=2&prefix={urllib.parse.quote(prefix)}"
    if token:
        q += f"&continuation-token={urllib.parse.quote(token)}"
    x = urllib.request.urlopen(q).read().decode()
    for k, n in re.findall(r"<Key>([^<]+)</Key>.*?<Size>(\d+)</Size>", x, re.S):
        keys[k] = int(n)
    m = re.search(r"<NextContinuationToken>([^<]+)</NextContinuationToken>", x)
    if not m:
        break
    token = m.group(1)
manifests = sorted(k for k in keys if k.endswith("/manifest.json"))
if len(sys.argv) > 3:
    # The bucket against what one full copy per backup would hold, and the newest backup.
    import json
    sizes = [sum(f["size"] for f in json.load(urllib.request.urlopen(f"{base}/hooks-dr/{m}"))["files"]) for m in manifests]
    print(len(manifests), sum(keys.values()), sum(sizes), sizes[-1] if sizes else 0)
    small = sum(n for k, n in keys.items() if "/backups/" in k)
    print(f"table and blob files {sum(keys.values()) - small} bytes in {len(keys) - sum(1 for k in keys if '/backups/' in k)} files; each backup's own files and manifest {small} bytes", file=sys.stderr)
else:
    print(len(manifests), sum(keys.values()), manifests[-1] if manifests else "-")
PY
}
five_each() {
  local p n
  for p in 0 1; do
    read -r n _ _ < <(pushed "a/hooks-$p/backups/") || return 1
    [ "$n" -ge 5 ] || return 1
  done
}
e2e_until 240 five_each || fail "the nodes did not push five backups each: $(pushed a/hooks-0/backups/) / $(pushed a/hooks-1/backups/); $(dr_condition "$dra" ObjectStoreBackups message)"
kill -0 "$dr_send" 2>/dev/null || fail "the load stopped early: $(cat "$work/dr-send.log")"
[ "$(dr_condition "$dra" ObjectStoreBackups status)" = True ] ||
  fail "ObjectStoreBackups is not True: $(dr_condition "$dra" ObjectStoreBackups message)"
# The recovery point: the older of the two nodes' last completed backups, as the status
# reports them ("b<ms> at <time>": the checkpoint's time).
cut=$(kubectl -n "$dra" get relay hooks -o jsonpath='{range .status.nodes[*]}{.lastObjectBackup}{"\n"}{end}' |
  python3 -c 'import re,sys; v=[int(m) for m in re.findall(r"^b(\d+) at ", sys.stdin.read(), re.M)]; print(min(v) if len(v) == 2 else "")')
[ -n "$cut" ] || fail "the status names no last backup of each node: $(kubectl -n "$dra" get relay hooks -o jsonpath='{.status.nodes}')"
say "  five pushes each; the older last backup's checkpoint: $cut; kubectl delete namespace $dra (load still running)"
kubectl delete namespace "$dra" --wait=true --timeout=3m >/dev/null || fail "namespace $dra was not deleted"
kill "$dr_send" "$dr_pf" 2>/dev/null || true
wait "$dr_send" 2>/dev/null || true
before=$(awk -v c="$cut" '$2 < c' "$work/dr-acked" | wc -l)
after=$(awk -v c="$cut" '$2 >= c' "$work/dr-acked" | wc -l)
say "  $before hooks acked before it, $after after"
[ "$before" -gt 100 ] || fail "too few hooks acked before the last backup ($before)"
# The bucket after the pushes holds each file once: less than a full copy per backup would.
# (Not "less than 1.5x one full backup", which a store this small cannot meet: every
# compaction of its one level rewrites it whole; docs/testing.md, "Object storage".)
for p in 0 1; do
  read -r n total copies full < <(pushed "a/hooks-$p/" sizes)
  say "  hooks-$p: $n backups hold $total bytes in the bucket ($(python3 -c "print(f'{$total / $full:.2f}')")x the newest, $full bytes; one full copy each would be $copies)"
  [ "$total" -lt "$copies" ] || fail "hooks-$p: $total bytes in the bucket after $n backups, not less than a full copy of each ($copies)"
done

say "  the Relay recreated in $drb from the bucket (bootstrap.fromBackup.objectStore), its sink up"
sink_service dr-sink
sink_pod dr-sink
dr_relay "  bootstrap:
    fromBackup:
      objectStore: { url: s3://hooks-dr/a, endpoint: \"$s3\", credentialsSecret: s3-keys }
  backup:
    objectStore: { url: s3://hooks-dr/b, endpoint: \"$s3\", credentialsSecret: s3-keys, intervalSeconds: 10 }" |
  kubectl -n "$drb" apply -f - >/dev/null
restored() { [ "$(kubectl -n "$drb" get relay hooks -o jsonpath='{.status.restore.phase}')" = Completed ]; }
e2e_until 300 restored || fail "the restore from the bucket did not complete: $(kubectl -n "$drb" get relay hooks -o jsonpath='{.status.restore}')"
# The restore Jobs read the bucket and mount only their node's data claim.
for j in $(kubectl -n "$drb" get jobs -o name | grep -- -restore-); do
  vols=$(kubectl -n "$drb" get "$j" -o jsonpath='{range .spec.template.spec.volumes[*]}{.name}{" "}{end}')
  [ "$vols" = "data " ] || fail "$j mounts $vols"
done
e2e_until 300 dr_ready "$drb" || fail "the recreated Relay did not become Ready"
dr_delivered() {
  kubectl -n apps logs dr-sink >"$work/dr-sink.log" 2>/dev/null
  python3 e2e/hooks.py check "$work/dr-acked" "$work/dr-sink.log" --acked-before "$cut" >/dev/null 2>&1
}
e2e_until 180 dr_delivered || { python3 e2e/hooks.py check "$work/dr-acked" "$work/dr-sink.log" --acked-before "$cut" || true; fail "hooks acked before the last backup were not delivered once each"; }
python3 e2e/hooks.py check "$work/dr-acked" "$work/dr-sink.log" --acked-before "$cut"
b_pushed() { read -r n _ _ < <(pushed b/hooks-1/backups/) && [ "$n" -ge 1 ]; }
e2e_until 120 b_pushed || fail "the recreated Relay's nodes do not push to their own prefix"
kubectl delete namespace "$drb" --wait=false >/dev/null
kubectl -n apps delete pod/dr-sink service/dr-sink --wait=false >/dev/null

kubectl get relays
say "ok"
