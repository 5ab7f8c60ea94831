#!/usr/bin/env python3
"""Real relay nodes behind kwok's pods, for the e2e tests.

kwok reports pods Running and Ready but runs nothing. For every relay pod (label
app.kubernetes.io/component=relay) that kwok reports Running in NAMESPACE, this runner
starts one real `ankusa-relay run` process: the pod's own relay.yaml (the ConfigMap the
operator wrote), the pod's environment from its Secrets, and, overridden through the
relay's ANKUSA_* variables, a data directory of its own and loopback ports. When the pod
goes away (deleted, or replaced by a new one of the same name), the process is stopped;
the data directory stays, as a volume would.

Which program a pod runs is its image's release, from ANKUSA_E2E_RELEASES (JSON, image →
release; an image not named there is `current`; WORKDIR/releases.json, when a test
writes it, replaces it: a tag pushed again). A probe pod reports the digest its tag
resolves to now (its image ID, `repo@sha256:…`); an image pinned to a digest runs the
release that digest was issued for, whatever its tag names since:
- `current`: this tree's `ankusa-relay run`;
- `previous`: e2e/previous_release.py, the format-2 release before it (its store is the
  committed v2 fixture, restored on first start);
- `crash-after-migrate`: a release that migrates the store to format 3, then exits 1
  every time it starts;
- `does-not-start`: an image whose binary cannot run at all (every command, a probe's
  `version --json` too, exits 1: `exec format error`).
A node's data directory is its volume claim's PersistentVolume (a host directory), so a
store outlives its pod, a scale-down and the StatefulSet, as it does on a cluster. kwok
marks a pod Ready when it starts it; the runner then reports what the process does, as a
kubelet would: Ready only while `/readyz` answers 200, and a process that exits is
`CrashLoopBackOff` and restarted after a pause.

The operator's Job pods (label ankusa.dev/job) run too: their container's command, with
the relay binary of this tree (a probe of the `previous` release answers that release's
`version --json`), their claims mapped to their volumes' host directories, their Secret
variables resolved; the pod is then marked Succeeded or Failed from the real exit code,
with the termination message the container wrote.

A test can hold a step where it wants to act: while WORKDIR/hold-backup-POD exists, backup
Job pods of that node wait to be run; while WORKDIR/hold-ready-POD exists, that pod, once it
runs the `current` release, is not reported Ready.

It also serves, on 127.0.0.1:PROXY_PORT, `/admin/{namespace}/{pod}/...` forwarded to that
pod's admin listener (the operator's node URL template points here), and
`/ingest/{namespace}/{pod}/...` to its ingest listener. And it binds each pending volume claim of the
namespace to a PersistentVolume of its own (the control plane has no storage
provisioner). It writes `ready` into WORKDIR once its proxy listens, and exits on SIGTERM.

    runner.py NAMESPACE WORKDIR PROXY_PORT RELAY_BINARY
"""

import hashlib
import http.client
import http.server
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

NAMESPACE, WORKDIR, PROXY_PORT, RELAY = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
SELECTOR = "app.kubernetes.io/name=ankusa-relay,app.kubernetes.io/component=relay"
JOB_SELECTOR = "ankusa.dev/job"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from free_ports import free_ports  # noqa: E402
FIXTURE_V2 = os.path.join(HERE, "..", "crates", "relay", "tests", "fixtures", "store-v2.tar.zst")
RELEASES = json.loads(os.environ.get("ANKUSA_E2E_RELEASES") or "{}")
# What a container of the `does-not-start` release does, whatever its command.
UNRUNNABLE = 'echo "exec /usr/bin/ankusa-relay: exec format error" >&2; exit 1'
DATA_MOUNT = "/var/lib/ankusa"
RESTART_PAUSE_S = 2.0

nodes = {}  # pod name -> {"uid", "proc", "admin", "ingest", "release", ...}
jobs_seen = set()  # uids of Job pods run
lock = threading.Lock()
stopping = threading.Event()


def log(msg):
    print(f"e2e-runner: {int(time.time() * 1000)} {msg}", file=sys.stderr, flush=True)


issued = {}  # digest -> the release it was issued for


def releases():
    try:
        with open(os.path.join(WORKDIR, "releases.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return RELEASES


def digest_of(image):
    """What a registry answers for the tag now."""
    release = releases().get(image, "current")
    digest = "sha256:" + hashlib.sha256(f"{image}\n{release}".encode()).hexdigest()
    issued[digest] = release
    return digest


def release_of(ref):
    if "@sha256:" in ref:
        tag, digest = ref.split("@", 1)
        return issued.get(digest) or releases().get(tag, "current")
    return releases().get(ref, "current")


def kubectl_json(*args):
    out = subprocess.run(["kubectl", "-n", NAMESPACE, *args, "-o", "json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


# Ports handed to nodes: a node that restarts binds its ports again, so they come from
# below the ephemeral range (scripts/free_ports.py) and are never handed out twice.
HANDED_OUT = set()


def node_ports(n):
    ports = free_ports(n, HANDED_OUT)
    HANDED_OUT.update(ports)
    return ports


def secret_value(name, key):
    import base64
    s = kubectl_json("get", "secret", name)
    if not s or key not in (s.get("data") or {}):
        return None
    return base64.b64decode(s["data"][key]).decode()


def provision():
    claims = kubectl_json("get", "pvc") or {"items": []}
    for c in claims["items"]:
        if c.get("status", {}).get("phase") == "Bound" or c["spec"].get("volumeName"):
            continue
        name = f"{NAMESPACE}-{c['metadata']['name']}"
        pv = {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": c["spec"]["resources"]["requests"]["storage"]},
                "accessModes": c["spec"].get("accessModes", ["ReadWriteOnce"]),
                "storageClassName": c["spec"].get("storageClassName") or "",
                "hostPath": {"path": os.path.join(WORKDIR, "volumes", name)},
                "claimRef": {"namespace": NAMESPACE, "name": c["metadata"]["name"]},
                "persistentVolumeReclaimPolicy": "Retain",
            },
        }
        subprocess.run(["kubectl", "apply", "-f", "-"], input=json.dumps(pv), text=True,
                       capture_output=True)


def claim_host_path(claim):
    """The host directory of a bound claim's PersistentVolume, or None."""
    pvc = kubectl_json("get", "pvc", claim)
    volume = pvc and pvc["spec"].get("volumeName")
    if not volume or pvc.get("status", {}).get("phase") != "Bound":
        return None
    pv = kubectl_json("get", "pv", volume)
    path = pv and pv["spec"].get("hostPath", {}).get("path")
    if path:
        os.makedirs(path, exist_ok=True)
    return path


def mounts_of(pod, container):
    """mountPath -> host directory, for every claim the container mounts; None if one is
    not bound yet."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in pod["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
    out = {}
    for m in container.get("volumeMounts", []):
        if m["name"] in claims:
            path = claim_host_path(claims[m["name"]])
            if path is None:
                return None
            out[m["mountPath"]] = path
    return out


def map_path(arg, mounts):
    for mount, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if arg == mount or arg.startswith(mount + "/"):
            return host + arg[len(mount):]
    return arg


def container_env(pod, container):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANKUSA_")}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.name":
            env[e["name"]] = pod["metadata"]["name"]
        elif field:
            return None  # a field this runner does not know: fail loudly rather than guess
        elif ref:
            value = secret_value(ref["name"], ref["key"])
            if value is None:
                return None  # as a kubelet would: the pod cannot start without it
            env[e["name"]] = value
        elif "value" in e:
            env[e["name"]] = e["value"]
    return env


def patch_status(name, uid, status):
    # The uid is a precondition: a pod recreated under the same name since is left alone.
    body = {"metadata": {"uid": uid}, "status": status}
    out = subprocess.run(["kubectl", "-n", NAMESPACE, "patch", "pod", name, "--subresource=status",
                          "--type=strategic", "-p", json.dumps(body)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        log(f"status of {name} not patched: {out.stderr.strip()}")


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def report(name, node, ready, waiting=None):
    """What a kubelet reports of the relay container."""
    state = ({"running": None, "waiting": {"reason": waiting, "message": "the relay exited"}}
             if waiting else {"waiting": None, "running": {"startedAt": now()}})
    flag = "True" if ready else "False"
    patch_status(name, node["uid"], {
        "conditions": [{"type": "Ready", "status": flag, "lastTransitionTime": now()},
                       {"type": "ContainersReady", "status": flag, "lastTransitionTime": now()}],
        "containerStatuses": [{"name": "relay", "image": node["image"], "ready": ready,
                               "restartCount": node["restarts"], "state": state}],
    })
    node["reported"] = (ready, waiting)


def start(pod):
    name = pod["metadata"]["name"]
    instance = pod["metadata"]["labels"]["app.kubernetes.io/instance"]
    cm = kubectl_json("get", "configmap", f"{instance}-config")
    secret = f"{instance}-operator-token"
    token, backup_token = secret_value(secret, "token"), secret_value(secret, "backup-token")
    cluster_token = secret_value(secret, "cluster-token")
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "relay")
    mounts = mounts_of(pod, container)
    env = container_env(pod, container)
    if (not cm or token is None or backup_token is None or cluster_token is None or mounts is None
            or env is None):
        return None
    home = os.path.join(WORKDIR, "nodes", name)
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "relay.yaml"), "w") as f:
        f.write(cm["data"]["relay.yaml"])
    token_file, backup_file = os.path.join(home, "operator-token"), os.path.join(home, "backup-token")
    cluster_file = os.path.join(home, "cluster-token")
    for path, value in ((token_file, token), (backup_file, backup_token), (cluster_file, cluster_token)):
        with open(path, "w") as f:
            f.write(value)
    if pod["spec"].get("enableServiceLinks", True):
        # What a kubelet injects for every Service of the namespace, unless told not to.
        services = kubectl_json("get", "services") or {"items": []}
        for svc in services["items"]:
            ip = svc["spec"].get("clusterIP")
            if not ip or ip == "None":
                continue
            prefix = svc["metadata"]["name"].upper().replace("-", "_")
            port = svc["spec"]["ports"][0]["port"]
            env[f"{prefix}_SERVICE_HOST"] = ip
            env[f"{prefix}_SERVICE_PORT"] = str(port)
            env[f"{prefix}_PORT"] = f"tcp://{ip}:{port}"
    volume = mounts[DATA_MOUNT]
    data, backups = os.path.join(volume, "data"), os.path.join(volume, "backups")
    image = container["image"]
    release = release_of(image)
    admin, ingest = node_ports(2)
    env.update({
        "ANKUSA_DATA_DIR": data,
        "ANKUSA_INGEST__LISTEN": f"127.0.0.1:{ingest}",
        "ANKUSA_ADMIN__LISTEN": f"127.0.0.1:{admin}",
        "ANKUSA_ADMIN__BACKUP_DIR": backups,
        "ANKUSA_ADMIN__TOKENS": json.dumps([
            {"name": "ankusa-operator", "secret": {"file": token_file}, "scope": "admin"},
            {"name": "ankusa-backup", "secret": {"file": backup_file}, "scope": "backup"}]),
        # The Secret volume's file, where the pod would mount it.
        "ANKUSA_CLUSTER__TOKEN": json.dumps({"file": cluster_file}),
    })
    if release == "previous":
        cmd = [sys.executable, os.path.join(HERE, "previous_release.py"), "run", RELAY, FIXTURE_V2,
               data, backups, str(admin), token_file, backup_file]
    elif release == "does-not-start":
        cmd = ["bash", "-c", UNRUNNABLE]
    elif release == "crash-after-migrate":
        cmd = ["bash", "-c", '"$0" store migrate --data "$1" && echo "crashing after the migration" >&2; exit 1',
               RELAY, data]
    else:
        cmd = [RELAY, "run", "--config", os.path.join(home, "relay.yaml")]
    out = open(os.path.join(home, "relay.log"), "ab")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out)
    log(f"started {name} release={release} image={image} pid={proc.pid} admin={admin} ingest={ingest}")
    node = {"uid": pod["metadata"]["uid"], "proc": proc, "admin": admin, "ingest": ingest,
            "release": release, "image": image, "cmd": cmd, "env": env, "log": out,
            "restarts": 0, "reported": None, "exited_at": None}
    # kwok reported the pod Ready as it started it; a kubelet would not before the
    # readiness probe passes.
    report(name, node, False)
    return node


def readyz(node):
    try:
        conn = http.client.HTTPConnection("127.0.0.1", node["admin"], timeout=0.5)
        conn.request("GET", "/readyz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def watch(name, node):
    """Report the process as a kubelet would; restart one that exited, after a pause."""
    if node["proc"].poll() is not None:
        if node["exited_at"] is None:
            node["exited_at"] = time.time()
            node["restarts"] += 1
            log(f"{name} exited with {node['proc'].returncode}")
            report(name, node, False, "CrashLoopBackOff")
        elif time.time() - node["exited_at"] > RESTART_PAUSE_S:
            node["proc"] = subprocess.Popen(node["cmd"], env=node["env"], stdout=node["log"],
                                            stderr=node["log"])
            node["exited_at"] = None
            log(f"restarted {name} release={node['release']} pid={node['proc'].pid}")
        return
    held = node["release"] == "current" and os.path.exists(
        os.path.join(WORKDIR, f"hold-ready-{name}"))
    ready = readyz(node) and not held
    if node["reported"] != (ready, None):
        report(name, node, ready)


def run_job(pod):
    """Run a Job pod's container and report its end as a kubelet would."""
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]
    mounts = mounts_of(pod, container)
    env = container_env(pod, container)
    if mounts is None or env is None:
        return False
    args = list(container.get("args", []))
    if "--from" in args:
        node = args[args.index("--from") + 1].rstrip("/").rsplit("/", 1)[-1]
        if os.path.exists(os.path.join(WORKDIR, f"hold-backup-{node}")):
            return False  # held by the test: run on a later round
    term = tempfile.NamedTemporaryFile(prefix="termination-", dir=WORKDIR, delete=False).name
    args = [term if a == container.get("terminationMessagePath", "/dev/termination-log")
            else map_path(a, mounts) for a in args]
    started = now()

    image = container["image"]
    repo = image.split("@", 1)[0].rsplit(":", 1)[0] if "/" in image else image
    image_id = f"docker-pullable://{repo}@" + (
        image.split("@", 1)[1] if "@sha256:" in image else digest_of(image))

    def body():
        release = release_of(container["image"])
        if release == "does-not-start":
            with open(term, "w"):
                pass
            out = subprocess.run(["bash", "-c", UNRUNNABLE], capture_output=True, text=True)
        elif args[:1] == ["version"] and release == "previous":
            cmd = [sys.executable, os.path.join(HERE, "previous_release.py"), "version"]
            with open(term, "w") as f:
                out = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True)
        else:
            out = subprocess.run([RELAY, *args], env=env, capture_output=True, text=True)
        with open(term) as f:
            message = f.read()
        if not message:
            message = (out.stderr or "")[-1024:] if out.returncode else ""
        log(f"job pod {name} {' '.join(args[:2])} exited {out.returncode}: {(out.stderr or '').strip()[-300:]}")
        code = out.returncode
        patch_status(name, pod["metadata"]["uid"], {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now()}],
            "containerStatuses": [{
                "name": container["name"], "image": container["image"], "ready": False,
                "restartCount": 0, "imageID": image_id,
                "state": {"running": None, "terminated": {
                    "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                    "message": message[:4096], "startedAt": started, "finishedAt": now()}}}],
        })

    threading.Thread(target=body, daemon=True).start()
    return True


def stop(name, node):
    node["proc"].terminate()
    try:
        node["proc"].wait(timeout=10)
    except subprocess.TimeoutExpired:
        node["proc"].kill()
    log(f"stopped {name}")


def reconcile_pods():
    provision()
    pods = kubectl_json("get", "pods", "-l", SELECTOR)
    if pods is None:
        return
    running = {}
    for p in pods["items"]:
        if p["metadata"].get("deletionTimestamp"):
            continue
        if p.get("status", {}).get("phase") == "Running":
            running[p["metadata"]["name"]] = p
    with lock:
        for name in list(nodes):
            node = nodes[name]
            pod = running.get(name)
            if pod is None or pod["metadata"]["uid"] != node["uid"]:
                stop(name, nodes.pop(name))
        for name, pod in running.items():
            if name not in nodes:
                # The list may be old by now (stopping nodes takes time): a pod deleted
                # since, or replaced, is not started (a StatefulSet deleted with its Relay
                # recreates a pod for a moment; its process must not start after it went).
                fresh = kubectl_json("get", "pod", name)
                if (not fresh or fresh["metadata"]["uid"] != pod["metadata"]["uid"]
                        or fresh["metadata"].get("deletionTimestamp")):
                    continue
                node = start(fresh)
                if node:
                    nodes[name] = node
        for name, node in nodes.items():
            watch(name, node)
    jobs = kubectl_json("get", "pods", "-l", JOB_SELECTOR) or {"items": []}
    for p in jobs["items"]:
        uid = p["metadata"]["uid"]
        if uid in jobs_seen or p.get("status", {}).get("phase") != "Running":
            continue
        if run_job(p):
            jobs_seen.add(uid)


class Proxy(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def forward(self):
        # /{admin|ingest}/{namespace}/{pod}/{rest}
        parts = self.path.split("/", 4)
        if len(parts) < 5 or parts[1] not in ("admin", "ingest") or parts[2] != NAMESPACE:
            self.send_error(404, "no such node")
            return
        listener, pod, rest = parts[1], parts[3], "/" + parts[4]
        with lock:
            node = nodes.get(pod)
        if not node:
            self.send_error(502, f"{pod} is not running")
            return
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        conn = http.client.HTTPConnection("127.0.0.1", node[listener], timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            conn.request(self.command, rest, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError as e:
            self.send_error(502, str(e))
            return
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = forward


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", PROXY_PORT), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    with open(os.path.join(WORKDIR, "ready"), "w") as f:
        f.write(str(os.getpid()))
    while not stopping.is_set():
        try:
            reconcile_pods()
        except Exception as e:  # a transient API error: try again on the next round
            log(f"round failed: {e}")
        stopping.wait(0.5)
    with lock:
        for name in list(nodes):
            stop(name, nodes.pop(name))
    server.shutdown()


if __name__ == "__main__":
    main()
