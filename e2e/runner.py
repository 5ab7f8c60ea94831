#!/usr/bin/env python3
"""Real relay nodes behind kwok's pods, for the e2e tests.

kwok reports pods Running and Ready but runs nothing. For every relay pod (label
app.kubernetes.io/component=relay) that kwok reports Running in NAMESPACE, this runner
starts one real `ankusa-relay run` process: the pod's own relay.yaml (the ConfigMap the
operator wrote), the pod's environment from its Secrets, and, overridden through the
relay's ANKUSA_* variables, a data directory of its own and loopback ports. When the pod
goes away (deleted, or replaced by a new one of the same name), the process is stopped;
the data directory stays, as a volume would.

It also serves, on 127.0.0.1:PROXY_PORT, `/admin/{namespace}/{pod}/...` forwarded to that
pod's admin listener (the operator's node URL template points here), and
`/ingest/{namespace}/{pod}/...` to its ingest listener. And it binds each pending volume claim of the
namespace to a PersistentVolume of its own (the control plane has no storage
provisioner). It writes `ready` into WORKDIR once its proxy listens, and exits on SIGTERM.

    runner.py NAMESPACE WORKDIR PROXY_PORT RELAY_BINARY
"""

import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

NAMESPACE, WORKDIR, PROXY_PORT, RELAY = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
SELECTOR = "app.kubernetes.io/name=ankusa-relay,app.kubernetes.io/component=relay"
TOKEN_FILE_IN_POD = "/etc/ankusa-operator/token"

nodes = {}  # pod name -> {"uid", "proc", "admin", "ingest"}
lock = threading.Lock()
stopping = threading.Event()


def log(msg):
    print(f"e2e-runner: {msg}", file=sys.stderr, flush=True)


def kubectl_json(*args):
    out = subprocess.run(["kubectl", "-n", NAMESPACE, *args, "-o", "json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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


def start(pod):
    name = pod["metadata"]["name"]
    instance = pod["metadata"]["labels"]["app.kubernetes.io/instance"]
    cm = kubectl_json("get", "configmap", f"{instance}-config")
    token = secret_value(f"{instance}-operator-token", "token")
    if not cm or token is None:
        return None
    home = os.path.join(WORKDIR, "nodes", name)
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "relay.yaml"), "w") as f:
        f.write(cm["data"]["relay.yaml"])
    token_file = os.path.join(home, "operator-token")
    with open(token_file, "w") as f:
        f.write(token)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANKUSA_")}
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "relay")
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            value = secret_value(ref["name"], ref["key"])
            if value is None:
                return None  # as a kubelet would: the pod cannot start without it
            env[e["name"]] = value
        elif "value" in e:
            env[e["name"]] = e["value"]
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
    admin, ingest = free_port(), free_port()
    env.update({
        "ANKUSA_DATA_DIR": os.path.join(home, "data"),
        "ANKUSA_INGEST__LISTEN": f"127.0.0.1:{ingest}",
        "ANKUSA_ADMIN__LISTEN": f"127.0.0.1:{admin}",
        "ANKUSA_ADMIN__BACKUP_DIR": os.path.join(home, "backups"),
        "ANKUSA_ADMIN__TOKENS": json.dumps([{
            "name": "ankusa-operator", "secret": {"file": token_file}, "scope": "admin"}]),
    })
    out = open(os.path.join(home, "relay.log"), "ab")
    proc = subprocess.Popen([RELAY, "run", "--config", os.path.join(home, "relay.yaml")],
                            env=env, stdout=out, stderr=out)
    log(f"started {name} (pid {proc.pid}, admin {admin}, ingest {ingest})")
    return {"uid": pod["metadata"]["uid"], "proc": proc, "admin": admin, "ingest": ingest}


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
            if pod is None or pod["metadata"]["uid"] != node["uid"] or node["proc"].poll() is not None:
                stop(name, nodes.pop(name))
        for name, pod in running.items():
            if name not in nodes:
                node = start(pod)
                if node:
                    nodes[name] = node


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
