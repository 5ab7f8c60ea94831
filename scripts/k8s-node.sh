# The real node of scripts/k8s-testenv.sh (sourced by it): containerd, runc and the CNI
# plugins from Debian's packages, kubelet built from the pinned Kubernetes module, CoreDNS
# as the cluster DNS, a pod bridge of its own, and local volumes. Everything lives under
# DIR/node; every process is started here and stopped by its PID; whatever it changes on
# the host is recorded before and restored by restore_host.
#
# Uses (from k8s-testenv.sh): log, spawn, dir, cache, root, NODE_NAME.

# The pod network: a /23 of 10.213.0.0/16 no interface or route of the host uses. Its first
# /24 is the Service range (the `kubernetes` Service is its .1, the bridge's own address);
# pods get addresses from the second /24.
pick_subnet() {
  local used third
  used=$(ip -4 -o addr show; ip -4 route show)
  for _ in $(seq 1 50); do
    third=$(( (RANDOM % 120) * 2 + 2 ))
    if ! grep -q "10\.213\.${third}\.\|10\.213\.$((third + 1))\." <<<"$used"; then
      node_ip="10.213.${third}.1"
      svc_range="10.213.${third}.0/24"
      pod_subnet="10.213.${third}.0/23"
      pod_first="10.213.$((third + 1)).2"
      pod_last="10.213.$((third + 1)).254"
      return 0
    fi
  done
  log "no free /23 in 10.213.0.0/16 for the pod bridge"
  return 1
}

# What the host looks like before the node touches it: sysctls, network namespaces,
# iptables, and each cgroup hierarchy's top level.
record_host() {
  local n=$dir/node
  : >"$n/sysctls"
  local key
  for key in vm/overcommit_memory kernel/panic kernel/panic_on_oops net/ipv4/ip_forward; do
    echo "$key $(cat "/proc/sys/$key")" >>"$n/sysctls"
  done
  ls /var/run/netns 2>/dev/null | sort >"$n/netns.before" || true
  local t
  for t in iptables ip6tables; do
    "$t-save" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9:]*\]//' >"$n/$t.before" || true
  done
  nft list tables >"$n/nft-tables.before"
  : >"$n/cgroups.before"
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] || continue
    find "$h" -mindepth 1 -maxdepth 1 -type d >>"$n/cgroups.before"
  done
}

start_node() {
  local api_port=$1
  local n=$dir/node bin=$cache
  mkdir -p "$n"/{cni/net.d,cni/ipam,containerd,kubelet,pod-logs,volumes}
  [ "$(id -u)" = 0 ] || { log "the real node needs root (ANKUSA_TESTENV_NODE=0 runs without it)"; return 1; }
  local tool
  for tool in containerd runc ctr ip iptables-save nft /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "$tool" ] || {
      log "the real node needs $tool (scripts/install-deps.sh installs it)"
      return 1
    }
  done
  record_host
  echo "$pod_subnet $node_ip" >"$n/subnet"

  # The pod bridge: an address of its own and nothing else (no route, no forwarding).
  local br="ankbr$((RANDOM % 10000))"
  echo "$br" >"$n/bridge"
  ip link add "$br" type bridge
  ip addr add "${node_ip}/23" dev "$br"
  ip link set "$br" up
  cat >"$n/cni/net.d/10-ankusa.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "ankusa-testenv",
  "plugins": [{
    "type": "bridge",
    "bridge": "$br",
    "isGateway": false,
    "isDefaultGateway": false,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "dataDir": "$n/cni/ipam",
      "ranges": [[{ "subnet": "$pod_subnet", "rangeStart": "$pod_first", "rangeEnd": "$pod_last" }]]
    }
  }]
}
EOF

  # The API server for pods: the `kubernetes` Service's ClusterIP is the bridge's address,
  # where this forwards to the API server on 127.0.0.1.
  spawn apiserver-forward python3 "$root/scripts/tcp_forward.py" "${node_ip}:443" "127.0.0.1:${api_port}"
  kubectl_env=(--kubeconfig "$dir/kubeconfig")
  for _ in $(seq 1 50); do
    "$bin/kubectl" "${kubectl_env[@]}" get --raw /readyz >/dev/null 2>&1 && break
    sleep 0.1
  done
  # `kubernetes` Service endpoints: the forwarder (the reconciler is off in the testenv).
  cat <<EOF | "$bin/kubectl" "${kubectl_env[@]}" apply --server-side --force-conflicts -f - >/dev/null
apiVersion: v1
kind: Endpoints
metadata: { name: kubernetes, namespace: default }
subsets:
- addresses: [{ ip: "$node_ip" }]
  ports: [{ name: https, port: 443, protocol: TCP }]
EOF

  # The cluster DNS on the bridge's address: pods and headless Services' names.
  cat >"$n/Corefile" <<EOF
.:53 {
    bind $node_ip
    errors
    kubernetes cluster.local in-addr.arpa {
        kubeconfig $dir/kubeconfig-coredns testenv
        pods insecure
    }
}
EOF
  spawn coredns "$bin/coredns" -conf "$n/Corefile"

  # containerd with the CRI plugin; everything it keeps under DIR/node/containerd.
  cat >"$n/containerd.toml" <<EOF
version = 2
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/containerd.sock"
[ttrpc]
  address = "$n/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/ankusa/pause:testenv"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$n/cni/net.d"
EOF
  spawn containerd containerd --config "$n/containerd.toml"
  for _ in $(seq 1 100); do
    ctr --address "$n/containerd.sock" version >/dev/null 2>&1 && break
    sleep 0.1
  done
  # The sandbox image, built like the project's images (scripts/image.py), once.
  if [ ! -f "$cache/pause.oci.tar" ]; then
    python3 "$root/scripts/image.py" --binary "$bin/pause" --ref docker.io/ankusa/pause:testenv \
      --out "$cache/pause.oci.tar" >/dev/null
  fi
  ctr --address "$n/containerd.sock" -n k8s.io images import "$cache/pause.oci.tar" >/dev/null

  # kubelet: cgroup v1 (failCgroupV1: false), cgroupfs, served on 127.0.0.1.
  local ports
  ports=($(python3 "$root/scripts/free_ports.py" 2))
  : >"$n/resolv.conf"
  cat >"$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$n/containerd.sock
address: 127.0.0.1
port: ${ports[0]}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${ports[1]}
podLogsDirectory: $n/pod-logs
oomScoreAdj: 0
failSwapOn: false
clusterDNS: [$node_ip]
clusterDomain: cluster.local
resolvConf: $n/resolv.conf
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $dir/ca.crt }
authorization: { mode: Webhook }
registerWithTaints:
- { key: ankusa.dev/real-node, value: "true", effect: NoSchedule }
# No eviction or image collection for disk: the node's disk is the machine's, shared with
# other work whose free space swings (a CI run's relays were evicted when it fell under
# 2 %), and the images the tests import are not pulled again once collected. "0%" turns
# a disk signal off; an image collection threshold of 100 turns collection off.
evictionHard:
  memory.available: 100Mi
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# A Secret's or ConfigMap's update reaches a mounted volume at the pod's next sync: every
# 10 s here, not every minute, so the tests' rotations and reloads land in seconds.
syncFrequency: 10s
EOF
  spawn kubelet "$bin/kubelet" --config "$n/kubelet.yaml" --kubeconfig "$dir/kubeconfig-kubelet" \
    --root-dir "$n/kubelet" --hostname-override "$NODE_NAME"
  for _ in $(seq 1 300); do
    "$bin/kubectl" "${kubectl_env[@]}" get "node/$NODE_NAME" >/dev/null 2>&1 && break
    sleep 0.2
  done
  if ! "$bin/kubectl" "${kubectl_env[@]}" wait --for condition=Ready "node/$NODE_NAME" --timeout 120s >/dev/null 2>&1; then
    log "the real node did not become Ready; the end of $dir/kubelet.log:"
    tail -n 20 "$dir/kubelet.log" >&2
    return 1
  fi

  # Local volumes on the node, for the tests' claims: a StorageClass that binds when a pod
  # is scheduled, and volumes of directories under DIR/node/volumes (the pod's fsGroup
  # owns them once the kubelet mounts them).
  {
    cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: { name: ankusa-local }
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
EOF
    local i
    for i in $(seq 0 15); do
      mkdir -p "$n/volumes/pv$i"
      cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: { name: ankusa-local-$i }
spec:
  capacity: { storage: 100Gi }
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ankusa-local
  local: { path: $n/volumes/pv$i }
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - { key: kubernetes.io/hostname, operator: In, values: [$NODE_NAME] }
EOF
    done
  } | "$bin/kubectl" "${kubectl_env[@]}" apply -f - >/dev/null
  log "real node $NODE_NAME Ready: pods on $br ($pod_subnet), DNS and the API server at $node_ip"
}

# Stops the node's pods the way the kubelet does (their sandboxes' networks torn down,
# their namespaces removed), then the kubelet and containerd; DIR/pids stops the rest.
stop_node() {
  local dir=$1 n=$1/node
  local sock=$n/containerd.sock
  local kubectl=("$cache/kubectl" --kubeconfig "$dir/kubeconfig")
  # No controller recreates what is deleted now.
  local p name
  while read -r p name; do
    case $name in kube-controller-manager|kube-scheduler) kill -TERM "$p" 2>/dev/null || true ;; esac
  done <"$dir/pids"
  if [ -S "$sock" ]; then
    "${kubectl[@]}" delete pods -A --field-selector "spec.nodeName=$NODE_NAME" \
      --grace-period 1 --wait=false >/dev/null 2>&1 || true
    local left
    for _ in $(seq 1 150); do
      left=$(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null | wc -l)
      [ "$left" = 0 ] && break
      sleep 0.2
    done
  fi
  # kubelet first (it would restart what is stopped), then containerd.
  while read -r p name; do
    case $name in kubelet) kill -TERM "$p" 2>/dev/null || true ;; esac
  done <"$dir/pids"
  sleep 0.5
  if [ -S "$sock" ]; then
    # Whatever kept running: stop its task, remove its sandbox's network through the CRI
    # (removing the containers), so no shim outlives containerd.
    local c
    for c in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true
    done
    sleep 0.5
    for c in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true
    done
  fi
  while read -r p name; do
    case $name in containerd) kill -TERM "$p" 2>/dev/null || true ;; esac
  done <"$dir/pids"
  # Shims of this containerd (started by it, found by its socket in their arguments).
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# Puts back what the node changed: mounts under DIR, the pods' network namespaces, the
# cgroups it created, the bridge, the sysctls, and iptables if anything touched them.
restore_host() {
  local dir=$1 n=$1/node
  local m
  # Deepest first.
  for m in $(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  if [ -f "$n/netns.before" ]; then
    local ns
    for ns in $(ls /var/run/netns 2>/dev/null | sort | comm -13 "$n/netns.before" -); do
      case $ns in cni-*) ip netns delete "$ns" 2>/dev/null || true ;; esac
    done
  fi
  if [ -f "$n/cgroups.before" ]; then
    local h top
    for h in /sys/fs/cgroup/*/; do
      for top in "$h"kubepods "$h"kubepods.slice "$h"k8s.io; do
        [ -d "$top" ] || continue
        grep -qx "${top}" "$n/cgroups.before" && continue
        # Processes left in them were the node's containers.
        find "$top" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
          kill -KILL "$pid" 2>/dev/null || true
        done
        find "$top" -depth -type d -exec rmdir {} + 2>/dev/null || true
      done
    done
  fi
  if [ -f "$n/bridge" ]; then
    ip link delete "$(cat "$n/bridge")" 2>/dev/null || true
  fi
  if [ -f "$n/sysctls" ]; then
    local key value
    while read -r key value; do
      [ "$(cat "/proc/sys/$key")" = "$value" ] || echo "$value" >"/proc/sys/$key"
    done <"$n/sysctls"
  fi
  # kubelet adds its own chains (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY, KUBE-FIREWALL)
  # for IPv4 and IPv6, creating the tables if there were none: new tables go, and tables
  # that were there go back to what they were.
  local t now table
  if [ -f "$n/nft-tables.before" ]; then
    nft list tables | while read -r table; do
      grep -qxF "$table" "$n/nft-tables.before" || nft delete $table || true
    done
  fi
  for t in iptables ip6tables; do
    [ -f "$n/$t.before" ] || continue
    now=$("$t-save" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9:]*\]//' || true)
    if [ "$now" != "$(cat "$n/$t.before")" ]; then
      "$t-restore" <"$n/$t.before" || log "$t-restore failed: see $n/$t.before"
    fi
  done
  rm -rf "$n"
}
