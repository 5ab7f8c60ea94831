#!/usr/bin/env bash
# The format upgrade end to end, on the real control plane `make test` starts: Relays whose
# nodes run the previous release (store format 2, holding the hooks it acked) moved to
# the current one (format 3) by the operator's gate, with real backup Jobs, a real
# StatefulSet controller and real relay processes (e2e/runner.py). Scenarios:
#
# 1. `up`, 3 nodes: each node is backed up after the node before it finished and before it
#    moves; highest ordinal first, one at a time; the operator is SIGKILLed while a node
#    is backed up and while one moves, the StatefulSet is deleted (orphaning its pods),
#    and it still finishes with every acked hook in place and counters equal to a fold of
#    the families.
# 2. `nobk`: the backup claim does not exist: no backup Job is made, no pod moves, the
#    Relay is Degraded naming the claim; once the claim is made the upgrade completes.
# 3. `crash`: a release that crash-loops after migrating stops the roll (Failed, the pod
#    named), and a fixed release of the same format rolls forward.
# 4. `scale`: a claim left by a scale-down, and a scale back up requested mid-upgrade: the
#    claim's old store is backed up (offline) before a pod of the new release opens it.
#
# 5. `again`: a Relay deleted and applied again with a newer release over the claims it
#    left: the image is probed and each claim backed up offline before any node opens it.
# 6. `probe`: the probe of an image that does not start fails (ProbeFailed, nothing rolls);
#    the tag pushed again with a build that starts and `spec.upgrade.retry` changed, the
#    image is probed again and the nodes roll onto it.
#
# In 1, the pods run the new release pinned to the digest its probe resolved; the tag
# pushed again later does not change what a recreated pod runs.
#
#   scripts/k8s-testenv.sh run -- bash e2e/upgrade.sh      (make test does this)
set -euo pipefail
OLD=ghcr.io/ankusa/relay:0.0.9
NEW=ghcr.io/ankusa/relay:0.1.0
BROKEN=ghcr.io/ankusa/relay:0.1.1
FIXED=ghcr.io/ankusa/relay:0.1.2
UNRUNNABLE=ghcr.io/ankusa/relay:0.1.3
export ANKUSA_E2E_RELEASES="{\"$OLD\":\"previous\",\"$NEW\":\"current\",\"$BROKEN\":\"crash-after-migrate\",\"$FIXED\":\"current\",\"$UNRUNNABLE\":\"does-not-start\"}"
source "$(dirname "$0")/lib.sh"
e2e_start

# ANKUSA_E2E_ONLY=name runs one scenario (up, nobk, crash, scale, again, probe).
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
  image: ${RELAY_IMAGE:-$OLD}
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
set_spec() { kubectl -n "$ns" patch relay "$1" --type merge -p "{\"spec\":$2}" >/dev/null; }
install() { # name replicas: a Relay on the previous release with a backup claim of its own
  backup_claim "$1-backups"
  relay "$1" "$2" "$1-backups"
  wait_installed "$1"
}
wait_installed() { # the previous release up on every node
  kubectl -n "$ns" wait --for=condition=Ready "relay/$1" --timeout=3m >/dev/null ||
    fail "$1 did not become Ready on $OLD"
  [ "$(field "$1" '{.status.storeFormat}')" = 2 ] || fail "$1 is not at format 2"
}

# --- 1. a three-node upgrade, with the StatefulSet deleted and the operator killed ---
if only up; then
echo "e2e: up: three nodes on the previous release (format 2)"
install up 3
# A watch, not a poll: a phase shorter than a poll's second (a quick Verifying) is seen too.
kubectl -n "$ns" get relay up -o wide --no-headers --watch >"$work/up-columns.log" 2>/dev/null &
pids+=($!)
echo "e2e: up: moving to $NEW"
# The runner holds these steps until the test has acted in them.
touch "$work/hold-backup-up-2" "$work/hold-backup-up-1" "$work/hold-ready-up-1"
set_spec up "{\"image\":\"$NEW\"}"
e2e_until 120 moving_is up BackingUp up-2 || fail "up-2 was never backed up"
echo "e2e: up: the operator SIGKILLed while up-2 is backed up; a new one takes over"
kill -KILL "$operator_pid"
e2e_operator
rm "$work/hold-backup-up-2"
e2e_until 120 moving_is up BackingUp up-1 || fail "up-1 was never backed up"
echo "e2e: up: the StatefulSet deleted, its pods orphaned, while up-1 is backed up"
kubectl -n "$ns" delete statefulset up --cascade=orphan >/dev/null
rm "$work/hold-backup-up-1"
e2e_until 120 moving_is up Verifying up-1 || fail "up-1 never moved"
e2e_until 60 bash -c "grep -q 'started up-1 release=current' '$work/runner.log'" || fail "up-1 never started $NEW"
echo "e2e: up: the operator SIGKILLed while up-1 moves; a new one takes over"
kill -KILL "$operator_pid"
e2e_operator
rm "$work/hold-ready-up-1"
e2e_until 300 phase_is up Completed || fail "the upgrade did not complete: $(field up '{.status.upgrade}')"
kubectl -n "$ns" get relay up
images=$(kubectl -n "$ns" get pods -l app.kubernetes.io/instance=up,app.kubernetes.io/component=relay \
  -o jsonpath='{.items[*].spec.containers[0].image}')
for i in $images; do
  case "$i" in "$NEW@sha256:"*) ;; *) fail "a node runs $i, not $NEW pinned to the digest the probe resolved" ;; esac
done

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
  later=$(awk -v s="$started" '$2 > s' "$work/runner.log")
  case "$later" in *"started up-$i release=previous"*) fail "up-$i went back to the previous release" ;; esac
  prev_start=$started
done
# Every hook the previous release acked is on a node of the Relay, and counted.
token=$(kubectl -n "$ns" get secret up-operator-token -o jsonpath='{.data.token}' | base64 -d)
up_nodes() {
  up_answers=()
  for i in 0 1 2; do
    up_answers+=("$(curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:${proxy}/admin/$ns/up-$i/v1/node")") || return 1
  done
  e2e_fixture_moved_all "${up_answers[@]}" 2>/dev/null
}
e2e_until 60 up_nodes || { e2e_fixture_moved_all "${up_answers[@]}"; fail "after the upgrade: ${up_answers[*]}"; }
grep -q "Verifying.*up-2" "$work/up-columns.log" && grep -q "Verifying.*up-0" "$work/up-columns.log" &&
  grep -q "Completed" "$work/up-columns.log" || fail "kubectl get relays did not show the cursor moving"
for reason in UpgradeStarted BackupStarted BackupSucceeded PartitionLowered NodeVerified UpgradeCompleted; do
  [ -n "$(kubectl -n "$ns" get events --field-selector "reason=$reason" -o name)" ] ||
    fail "no $reason Event"
done
metrics=$(curl -fsS "http://$operator_metrics/metrics")
case "$metrics" in *"ankusa_operator_upgrade_phase{namespace=\"$ns\",relay=\"up\",phase=\"Completed\"} 1"*) ;;
  *) fail "the operator's metrics do not show up's upgrade Completed" ;; esac
case "$metrics" in *"ankusa_operator_last_backup_timestamp_seconds{namespace=\"$ns\",relay=\"up\"} 1"*) ;;
  *) fail "the operator's metrics have no last backup time for up" ;; esac
echo "e2e: up: the cursor as kubectl get relays showed it:"
# (Without the AGE column, each state once.)
sed -E 's/[[:space:]]+[0-9]+s$//' "$work/up-columns.log" | uniq | sed 's/^/  /'
echo "e2e: up: $NEW pushed again (now a release that crash-loops); up-0 recreated keeps its digest"
python3 -c 'import json, os, sys; r = json.loads(os.environ["ANKUSA_E2E_RELEASES"]); r[sys.argv[1]] = "crash-after-migrate"; print(json.dumps(r))' \
  "$NEW" >"$work/releases.json"
starts=$(grep -c "started up-0 " "$work/runner.log")
kubectl -n "$ns" delete pod up-0 >/dev/null
e2e_until 60 bash -c "[ \$(grep -c 'started up-0 ' '$work/runner.log') -gt $starts ]" || fail "up-0 was not recreated"
grep "started up-0 " "$work/runner.log" | tail -n1 | grep -q "release=current image=$NEW@sha256:" ||
  fail "the recreated up-0 runs: $(grep 'started up-0 ' "$work/runner.log" | tail -n1)"
all_ready() { [ "$(field up '{.status.conditions[?(@.type=="Ready")].status}/{.status.nodesReady}')" = "True/3/3" ]; }
e2e_until 60 all_ready || fail "up is not Ready after up-0 came back"
rm "$work/releases.json"

# The stores, closed: counters equal a fold of the families.
dirs=()
for i in 0 1 2; do dirs+=("$(claim_dir "data-up-$i")/data"); done
kubectl -n "$ns" delete relay up --wait=true >/dev/null
e2e_until 60 bash -c "[ -z \"\$(kubectl -n $ns get pods -l app.kubernetes.io/instance=up,app.kubernetes.io/component=relay -o name)\" ]" ||
  fail "up's pods did not go"
sleep 1
for d in "${dirs[@]}"; do
  "$relay_bin" store verify --data "$d" >/dev/null || fail "the counters of $d do not fold"
done

fi

# --- 2. a backup that cannot run fails at its deadline, and nothing moves ---
if only nobk; then
echo "e2e: nobk: a backup whose claim does not exist"
relay nobk 2 no-such-claim "  upgrade: { timeouts: { backupSeconds: 60 } }"
wait_installed nobk
set_spec nobk "{\"image\":\"$NEW\"}"
held() { [ "$(field nobk '{.status.conditions[?(@.type=="Degraded")].reason}')" = BackupClaimNotReady ]; }
e2e_until 120 held || fail "the missing claim is not a condition: $(field nobk '{.status.conditions}')"
message=$(field nobk '{.status.conditions[?(@.type=="Degraded")].message}')
case "$message" in *no-such-claim*) ;; *) fail "Degraded does not name the claim: $message" ;; esac
sleep 3 # a few more reconciles: still no Job, still nobody moved
[ -z "$(kubectl -n "$ns" get jobs -l ankusa.dev/job=backup,app.kubernetes.io/instance=nobk -o name)" ] ||
  fail "a backup Job was made for a claim that does not exist"
grep -q "started nobk-.* release=current" "$work/runner.log" && fail "a nobk node moved without a backup"
phase_is nobk BackingUp || fail "the upgrade is not waiting: $(field nobk '{.status.upgrade}')"
echo "e2e: nobk: $message"
# The claim made, the upgrade goes on by itself, backups first.
backup_claim no-such-claim
e2e_until 240 phase_is nobk Completed || fail "the upgrade did not go on once the claim existed: $(field nobk '{.status.upgrade}')"
[ -n "$(kubectl -n "$ns" get jobs -l ankusa.dev/job=backup,app.kubernetes.io/instance=nobk -o name)" ] ||
  fail "nobk completed without a backup Job"
echo "e2e: nobk: the claim made, the upgrade completed"

fi

# --- 3. a release that crash-loops after migrating; a fixed one rolls forward ---
if only crash; then
echo "e2e: crash: $BROKEN crash-loops after migrating"
install crash 2
set_spec crash "{\"image\":\"$BROKEN\"}"
e2e_until 180 phase_is crash Failed || fail "the upgrade did not fail: $(field crash '{.status.upgrade}')"
error=$(field crash '{.status.upgrade.lastError}')
case "$error" in *crash-1*CrashLoopBackOff*) ;; *) fail "lastError: $error" ;; esac
grep -q "started crash-0 release=crash-after-migrate" "$work/runner.log" && fail "crash-0 moved after crash-1 failed"
echo "e2e: crash: stopped at $error; fixing forward with $FIXED"
set_spec crash "{\"image\":\"$FIXED\"}"
e2e_until 240 phase_is crash Completed || fail "the fix did not roll forward: $(field crash '{.status.upgrade}')"
kubectl -n "$ns" wait --for=condition=Ready relay/crash --timeout=2m >/dev/null || fail "crash is not Ready"
[ "$(field crash '{.status.storeFormat}')" = 3 ] || fail "crash is not at format 3"
kubectl -n "$ns" get relays
fi

# --- 4. a claim left by a scale-down is backed up before the new release can open it ---
if only scale; then
echo "e2e: scale: three nodes on the previous release, scaled down to two (data-scale-2 stays)"
install scale 3
set_spec scale '{"replicas":2}'
e2e_until 60 bash -c "! kubectl -n $ns get pod scale-2 >/dev/null 2>&1" || fail "scale-2 did not go"
kubectl -n "$ns" wait --for=condition=Ready relay/scale --timeout=2m >/dev/null || fail "scale is not Ready at 2"
echo "e2e: scale: moving to $NEW, and back to three nodes while it moves"
touch "$work/hold-backup-scale-1"
set_spec scale "{\"image\":\"$NEW\"}"
e2e_until 120 phase_is scale BackingUp || fail "the upgrade did not start"
set_spec scale '{"replicas":3}'
rm "$work/hold-backup-scale-1"
retained=$(field scale '{.status.upgrade.retainedClaims}')
[ "$retained" = "[2]" ] || fail "the retained claims are $retained"
e2e_until 300 phase_is scale Completed || fail "the upgrade did not complete: $(field scale '{.status.upgrade}')"
e2e_until 120 bash -c "grep -q 'started scale-2 release=current' '$work/runner.log'" || fail "scale-2 never came back"
grep -q "started scale-2 release=current" "$work/runner.log" || fail "scale-2 did not start on $NEW"
started=$(runner_ms "started scale-2 release=current")
completed_before=$(runner_ms "started scale-0 release=current")
[ "$started" -gt "$completed_before" ] || fail "scale-2 started on $NEW before the upgrade of the others ended"
archive=$(ls "$(claim_dir scale-backups)/scale/scale-2/" | grep -E '^b[0-9]+\.tar\.zst$' | head -n1)
[ -n "$archive" ] || fail "the retained claim of scale-2 was never backed up"
taken=${archive#b}; taken=${taken%.tar.zst}
[ "$taken" -lt "$started" ] || fail "scale-2 opened its old store ($started) before its backup ($taken)"
"$relay_bin" restore --from "$(claim_dir scale-backups)/scale/scale-2/$archive" --data "$work/scale-2-restored" |
  grep -q "store format 2" || fail "the backup of scale-2 is not its format-2 store"
e2e_until 120 bash -c "[ \"\$(kubectl -n $ns get relay scale -o jsonpath='{.status.nodesReady}')\" = 3/3 ]" ||
  fail "scale is not at 3/3"
echo "e2e: scale: scale-2's old store backed up (offline) before it opened on $NEW"
fi

# --- 5. a Relay re-created over its retained claims with a newer release: the gate first ---
if only again; then
echo "e2e: again: two nodes on the previous release, the Relay deleted (its claims stay)"
install again 2
kubectl -n "$ns" delete relay again --wait=true >/dev/null
e2e_until 60 bash -c "[ -z \"\$(kubectl -n $ns get pods -l app.kubernetes.io/instance=again,app.kubernetes.io/component=relay -o name)\" ]" ||
  fail "again's pods did not go"
e2e_until 60 bash -c "! kubectl -n $ns get statefulset again >/dev/null 2>&1" || fail "again's StatefulSet did not go"
before=$(grep -c "started again-" "$work/runner.log")
echo "e2e: again: applied again with $NEW over data-again-0 and data-again-1"
RELAY_IMAGE=$NEW relay again 2 again-backups
e2e_until 300 phase_is again Completed || fail "the re-created Relay did not go through the gate: $(field again '{.status.upgrade}') $(field again '{.status.conditions}')"
[ "$(field again '{.status.upgrade.adopting}')" = true ] || fail "the cursor is not an adoption: $(field again '{.status.upgrade}')"
e2e_until 120 bash -c "[ \"\$(kubectl -n $ns get relay again -o jsonpath='{.status.nodesReady}')\" = 2/2 ]" ||
  fail "again is not at 2/2"
tail -n +"$((before + 1))" <(grep "started again-" "$work/runner.log") | grep -qv "release=current" &&
  fail "a node of the re-created Relay started another release: $(grep "started again-" "$work/runner.log")"
for i in 0 1; do
  started=$(runner_ms "started again-$i release=current")
  [ -n "$started" ] || fail "again-$i never started $NEW"
  archive=$(ls "$(claim_dir again-backups)/again/again-$i/" | grep -E '^b[0-9]+\.tar\.zst$' | sort | tail -n1)
  [ -n "$archive" ] || fail "the retained claim of again-$i was never backed up"
  taken=${archive#b}; taken=${taken%.tar.zst}
  [ "$taken" -lt "$started" ] || fail "again-$i opened its store on $NEW ($started) before its backup ($taken)"
  "$relay_bin" restore --from "$(claim_dir again-backups)/again/again-$i/$archive" --data "$work/again-$i-restored" |
    grep -q "store format 2" || fail "the backup of again-$i is not its format-2 store"
done
echo "e2e: again: each retained store backed up (offline, at format 2) before a node opened it on $NEW"
fi

# --- 6. a failed image probe, probed again by spec.upgrade.retry ---
if only probe; then
echo "e2e: probe: one node on $NEW, then $UNRUNNABLE, whose binary does not run"
backup_claim probe-backups
RELAY_IMAGE=$NEW relay probe 1 probe-backups
kubectl -n "$ns" wait --for=condition=Ready relay/probe --timeout=3m >/dev/null || fail "probe did not become Ready on $NEW"
set_spec probe "{\"image\":\"$UNRUNNABLE\"}"
probe_failed() { field probe '{.status.conditions[*].message}' | grep -q "the image probe of $UNRUNNABLE failed"; }
e2e_until 180 probe_failed || fail "the probe did not fail: $(field probe '{.status.conditions}')"
field probe '{.status.conditions[*].message}' | grep -q "change spec.upgrade.retry to probe it again" ||
  fail "the condition does not say how to probe again: $(field probe '{.status.conditions}')"
grep -q "started probe-0 release=does-not-start" "$work/runner.log" && fail "probe-0 rolled onto an image whose probe failed"
echo "e2e: probe: failed; $UNRUNNABLE pushed again (a build that starts), spec.upgrade.retry set"
python3 -c 'import json, os, sys; r = json.loads(os.environ["ANKUSA_E2E_RELEASES"]); r[sys.argv[1]] = "current"; print(json.dumps(r))' \
  "$UNRUNNABLE" >"$work/releases.json"
set_spec probe '{"upgrade":{"retry":"1"}}'
rolled() { grep -q "started probe-0 release=current image=$UNRUNNABLE" "$work/runner.log"; }
e2e_until 180 rolled || fail "probe-0 did not roll onto $UNRUNNABLE after the retry: $(field probe '{.status.conditions}')"
kubectl -n "$ns" wait --for=condition=Ready relay/probe --timeout=2m >/dev/null || fail "probe is not Ready on $UNRUNNABLE"
[ "$(kubectl -n "$ns" get jobs -l app.kubernetes.io/instance=probe -o name | grep -c probe-probe-)" -ge 2 ] ||
  fail "no second probe Job: $(kubectl -n "$ns" get jobs -o name)"
rm "$work/releases.json"
echo "e2e: probe: probed again after the retry, and rolled"
fi
echo "e2e: upgrade: passed"
