#!/usr/bin/env bash
# The format upgrade end to end, on the real control plane `make test` starts: Relays whose
# nodes run the previous release (store format 2, holding the hooks it acked) moved to
# the current one (format 3) by the operator's gate, with real backup Jobs, a real
# StatefulSet controller and real relay processes (e2e/runner.py). Scenarios:
#
# 1. `up`, 3 nodes: each node is backed up after the node before it finished and before it
#    moves; highest ordinal first, one at a time; the StatefulSet is deleted (orphaning
#    its pods) and the operator SIGKILLed mid-upgrade, and it still finishes with every
#    acked hook in place and counters equal to a fold of the families.
# 2. `nobk`: a backup that cannot run (its claim does not exist) fails at its deadline: no
#    pod moves, the Relay is Degraded naming the Job.
# 3. `crash`: a release that crash-loops after migrating stops the roll (Failed, the pod
#    named), and a fixed release of the same format rolls forward.
#
#   scripts/k8s-testenv.sh run -- bash e2e/upgrade.sh      (make test does this)
set -euo pipefail
OLD=ghcr.io/ankusa/relay:0.0.9
NEW=ghcr.io/ankusa/relay:0.1.0
BROKEN=ghcr.io/ankusa/relay:0.1.1
FIXED=ghcr.io/ankusa/relay:0.1.2
export ANKUSA_E2E_RELEASES="{\"$OLD\":\"previous\",\"$NEW\":\"current\",\"$BROKEN\":\"crash-after-migrate\",\"$FIXED\":\"current\"}"
source "$(dirname "$0")/lib.sh"
e2e_start

fail() { echo "e2e: $*" >&2; exit 1; }
# ANKUSA_E2E_ONLY=name runs one scenario (up, nobk, crash).
only() { [ -z "${ANKUSA_E2E_ONLY:-}" ] || [ "$ANKUSA_E2E_ONLY" = "$1" ]; }
field() { kubectl -n "$ns" get relay "$1" -o jsonpath="$2"; }
phase_is() { [ "$(field "$1" '{.status.upgrade.phase}')" = "$2" ]; }
moving_is() { phase_is "$1" "$2" && [ "$(field "$1" '{.status.upgrade.currentPod}')" = "$3" ]; }
runner_ms() { grep -E "$1" "$work/runner.log" | head -n1 | awk '{print $2}'; }
claim_dir() { # the host directory of a claim's volume
  local pv
  pv=$(kubectl -n "$ns" get pvc "$1" -o jsonpath='{.spec.volumeName}')
  kubectl get pv "$pv" -o jsonpath='{.spec.hostPath.path}'
}
backup_claim() {
  kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: $1 }
spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Gi } } }
EOF
}
relay() { # name replicas backup-claim [extra spec YAML]
  kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: ankusa.dev/v1alpha1
kind: Relay
metadata: { name: $1 }
spec:
  replicas: $2
  image: $OLD
  storage: { size: 1Gi }
  backup: { destination: { claimName: $3 }, retention: 2 }
  config:
    inline:
      sinks: [{ id: nowhere, url: "http://127.0.0.1:9/hooks", timeout_ms: 200 }]
      routes: [{ id: r, sinks: [nowhere] }]
      sources: [{ id: demo, tenant: { header: x-tenant }, verify: { scheme: none }, route: r }]
${4:-}
EOF
}
wait_installed() { # the previous release up on every node
  kubectl -n "$ns" wait --for=condition=Ready "relay/$1" --timeout=3m >/dev/null ||
    fail "$1 did not become Ready on $OLD"
  [ "$(field "$1" '{.status.storeFormat}')" = 2 ] || fail "$1 is not at format 2"
}

# --- 1. a three-node upgrade, with the StatefulSet deleted and the operator killed ---
if only up; then
echo "e2e: up: three nodes on the previous release (format 2)"
backup_claim up-backups
relay up 3 up-backups
wait_installed up
( while sleep 1; do kubectl -n "$ns" get relay up --no-headers 2>/dev/null; done ) >"$work/up-columns.log" &
pids+=($!)
echo "e2e: up: moving to $NEW"
kubectl -n "$ns" patch relay up --type merge -p "{\"spec\":{\"image\":\"$NEW\"}}" >/dev/null
e2e_until 120 moving_is up BackingUp up-1 || fail "up-1 was never backed up"
echo "e2e: up: the StatefulSet deleted, its pods orphaned, while up-1 is backed up"
kubectl -n "$ns" delete statefulset up --cascade=orphan >/dev/null
e2e_until 120 moving_is up Verifying up-1 || fail "up-1 never moved"
echo "e2e: up: the operator SIGKILLed while up-1 moves; a new one takes over"
kill -KILL "$operator_pid"
e2e_operator
e2e_until 300 phase_is up Completed || fail "the upgrade did not complete: $(field up '{.status.upgrade}')"
kubectl -n "$ns" get relay up

# Order: highest ordinal first; each node's backup after the node above it moved and
# before it moved itself; no node ever went back to the previous release.
prev_start=0
for i in 2 1 0; do
  started=$(runner_ms "started up-$i release=current")
  [ -n "$started" ] || fail "up-$i never ran the current release"
  [ "$started" -gt "$prev_start" ] || fail "up-$i moved before the node above it"
  archive=$(ls "$(claim_dir up-backups)/up/up-$i/" | grep -E '^b[0-9]+\.tar\.zst$' | sort | tail -n1)
  [ -n "$archive" ] || fail "no backup of up-$i"
  taken=${archive#b}; taken=${taken%.tar.zst}
  [ "$taken" -lt "$started" ] || fail "up-$i moved ($started) before its backup ($taken)"
  [ "$taken" -gt "$prev_start" ] || fail "up-$i's backup ($taken) is older than the move of the node above it ($prev_start)"
  if awk -v s="$started" '$2 > s' "$work/runner.log" | grep -q "started up-$i release=previous"; then
    fail "up-$i went back to the previous release"
  fi
  prev_start=$started
done
# Every hook the previous release acked is on every node, and counted.
token=$(kubectl -n "$ns" get secret up-operator-token -o jsonpath='{.data.token}' | base64 -d)
for i in 0 1 2; do
  node=$(curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:${proxy}/admin/$ns/up-$i/v1/node")
  python3 - "$node" <<'EOF' || fail "up-$i after the upgrade: $node"
import json, sys
n = json.loads(sys.argv[1])
c = n["counters"]
assert n["store_format"] == 3 and n["migrating_to"] is None, n
assert n["tenants"] == 4, n
# The fixture's deliveries, wherever the node has moved them since: 16 rows, of which 13
# belong to hooks the store holds (3 are rows whose hook was already lost in format 2, and
# the node drops those as undeliverable).
assert 13 <= c["pending"] + c["scheduled"] + c["inflight"] + c["dead"] <= 16, n
EOF
done
grep -q "Verifying.*up-2" "$work/up-columns.log" && grep -q "Verifying.*up-0" "$work/up-columns.log" &&
  grep -q "Completed" "$work/up-columns.log" || fail "kubectl get relays did not show the cursor moving"
for reason in UpgradeStarted BackupStarted BackupSucceeded PartitionLowered NodeVerified UpgradeCompleted; do
  kubectl -n "$ns" get events --field-selector "reason=$reason" -o name | grep -q . ||
    fail "no $reason Event"
done
echo "e2e: up: the cursor as kubectl get relays showed it:"
# (Without the AGE column, each state once.)
sed -E 's/[[:space:]]+[0-9]+s$//' "$work/up-columns.log" | uniq | sed 's/^/  /'
# The stores, closed: counters equal a fold of the families.
dirs=()
for i in 0 1 2; do dirs+=("$(claim_dir "data-up-$i")/data"); done
kubectl -n "$ns" delete relay up --wait=true >/dev/null
e2e_until 60 bash -c "! grep -q . <(kubectl -n $ns get pods -l app.kubernetes.io/instance=up -o name)" ||
  fail "up's pods did not go"
sleep 1
for d in "${dirs[@]}"; do
  "$relay_bin" store verify --data "$d" >/dev/null || fail "the counters of $d do not fold"
done

fi

# --- 2. a backup that cannot run fails at its deadline, and nothing moves ---
if only nobk; then
echo "e2e: nobk: a backup whose claim does not exist"
relay nobk 2 no-such-claim "  upgrade: { timeouts: { backupSeconds: 10 } }"
wait_installed nobk
kubectl -n "$ns" patch relay nobk --type merge -p "{\"spec\":{\"image\":\"$NEW\"}}" >/dev/null
e2e_until 120 phase_is nobk Failed || fail "the upgrade did not fail: $(field nobk '{.status.upgrade}')"
reason=$(field nobk '{.status.conditions[?(@.type=="Degraded")].reason}')
message=$(field nobk '{.status.conditions[?(@.type=="Degraded")].message}')
[ "$reason" = BackupFailed ] || fail "Degraded is $reason: $message"
case "$message" in *nobk-backup-1-*) ;; *) fail "Degraded does not name the Job: $message" ;; esac
grep -q "started nobk-.* release=current" "$work/runner.log" && fail "a nobk node moved without a backup"
kubectl -n "$ns" get events --field-selector reason=BackupFailed -o name | grep -q . || fail "no BackupFailed Event"
echo "e2e: nobk: $message"

fi

# --- 3. a release that crash-loops after migrating; a fixed one rolls forward ---
if only crash; then
echo "e2e: crash: $BROKEN crash-loops after migrating"
backup_claim crash-backups
relay crash 2 crash-backups
wait_installed crash
kubectl -n "$ns" patch relay crash --type merge -p "{\"spec\":{\"image\":\"$BROKEN\"}}" >/dev/null
e2e_until 180 phase_is crash Failed || fail "the upgrade did not fail: $(field crash '{.status.upgrade}')"
error=$(field crash '{.status.upgrade.lastError}')
case "$error" in *crash-1*CrashLoopBackOff*) ;; *) fail "lastError: $error" ;; esac
grep -q "started crash-0 release=crash-after-migrate" "$work/runner.log" && fail "crash-0 moved after crash-1 failed"
echo "e2e: crash: stopped at $error; fixing forward with $FIXED"
kubectl -n "$ns" patch relay crash --type merge -p "{\"spec\":{\"image\":\"$FIXED\"}}" >/dev/null
e2e_until 240 phase_is crash Completed || fail "the fix did not roll forward: $(field crash '{.status.upgrade}')"
kubectl -n "$ns" wait --for=condition=Ready relay/crash --timeout=2m >/dev/null || fail "crash is not Ready"
[ "$(field crash '{.status.storeFormat}')" = 3 ] || fail "crash is not at format 3"
kubectl -n "$ns" get relays
fi
echo "e2e: upgrade: passed"
