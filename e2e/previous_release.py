#!/usr/bin/env python3
"""The previous release of the relay node, as the e2e upgrade tests need it.

The release before format 3 was an earlier implementation; what the operator and a newer
release rely on of it is its store (format 2) and its admin API, and that is what this
serves, over a real store:

- on first start, an empty data directory gets the format-2 fixture store (hooks acked
  by the previous release: pending, retrying, inflight and dead deliveries of four
  tenants), restored by `ankusa-relay restore`;
- `GET /healthz`, `/readyz`; `GET /v1/node` (store format 2, its counts as the store
  holds them); `GET /v1/tenants` (empty);
- the backup API of that release: `POST /v1/backups` packs the store into the node's
  backup directory (`ankusa-relay backup offline`, the store being closed here) and
  `GET /v1/backups/{id}/archive` serves it. There is no `POST /v1/backups/stream`: a
  newer `backup pull` falls back to the two-step API, as it does against a real older
  node;
- `ankusa-relay version --json` of this release: `previous_release.py version`.

As the entrypoint of the previous release's image (e2e/node.sh builds it with
scripts/image.py: Debian's python3, this file, the fixture and this tree's relay binary for
`restore`, `store inspect` and `backup offline`), `pod` takes the arguments the operator
gives a relay container and serves at the places the operator's pod layout fixes: the
data and backup directories on the data volume, the admin port, the token files of its
Secret volume (that release read them from the same places).

    previous_release.py run RELAY_BINARY FIXTURE DATA_DIR BACKUP_DIR ADMIN_PORT TOKEN_FILE...
    previous_release.py version
    previous_release.py pod run --config /etc/ankusa/relay.yaml
    previous_release.py pod version --json [--write PATH]
"""

import http.server
import json
import socket
import os
import re
import signal
import subprocess
import sys
import threading

VERSION = "0.0.9"
FORMAT = 2


# The operator's pod layout (crates/operator/src/resources.rs) and the image's files.
POD = {
    "relay": "/usr/local/bin/ankusa-relay",
    "fixture": "/usr/local/lib/ankusa/store-v2.tar.zst",
    "data": "/var/lib/ankusa/data",
    "backups": "/var/lib/ankusa/backups",
    "port": 9090,
    "tokens": ["/etc/ankusa-operator/token", "/etc/ankusa-operator/backup-token"],
}


def version(write=None):
    answer = json.dumps({"version": VERSION, "store_format": FORMAT})
    if write:
        with open(write, "w") as f:
            f.write(answer)
    print(answer)


class DualStackServer(http.server.ThreadingHTTPServer):
    """On [::], IPv4 too (as the relay's `[::]` listeners), or on 127.0.0.1."""

    def __init__(self, host, port, handler):
        if host == "::":
            self.address_family = socket.AF_INET6
        super().__init__((host, port), handler)

    def server_bind(self):
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def run(relay, fixture, data, backup_dir, port, token_files, host="127.0.0.1"):
    if not os.path.isdir(data) or not os.listdir(data):
        subprocess.run([relay, "restore", "--from", fixture, "--data", data], check=True,
                       stdout=sys.stderr)
    tokens = set()
    for f in token_files:
        with open(f) as fh:
            tokens.add(fh.read().strip())
    lock = threading.Lock()

    def counts():
        # `store inspect` of the closed store: the families' key counts.
        out = subprocess.run([relay, "store", "inspect", "--data", data],
                             capture_output=True, text=True, check=True).stdout
        keys = {m.group(1): int(m.group(2))
                for m in re.finditer(r"^(\w+)\s+\w+\s+(\d+)$", out, re.M)}
        return keys

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, status, body, ctype="application/json"):
            data_ = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data_)))
            self.end_headers()
            self.wfile.write(data_)

        def authorised(self):
            auth = self.headers.get("authorization", "")
            if auth.startswith("Bearer ") and auth[7:].strip() in tokens:
                return True
            self.answer(401, {"error": "unauthorized"})
            return False

        def do_GET(self):
            if self.path in ("/healthz", "/readyz"):
                return self.answer(200, b"ok", "text/plain")
            if not self.authorised():
                return
            if self.path == "/v1/node":
                with lock:
                    keys = counts()
                return self.answer(200, {
                    "version": VERSION, "supported_format": FORMAT, "store_format": FORMAT,
                    "migrating_to": None, "migration": None, "tenants": 0,
                    "counters": {"pending": keys.get("due_v2", 0), "scheduled": 0,
                                 "inflight": keys.get("inflight_v2", 0),
                                 "dead": keys.get("dead", 0), "bytes": 0,
                                 "archive_pending": keys.get("archive_pending", 0)},
                    "oldest_due_at_ms": None,
                })
            if self.path.startswith("/v1/tenants"):
                return self.answer(200, {"tenants": []})
            m = re.fullmatch(r"/v1/backups/(b\d+)/archive", self.path)
            if m:
                path = os.path.join(backup_dir, m.group(1) + ".tar.zst")
                if not os.path.exists(path):
                    return self.answer(404, {"error": "no such backup"})
                with open(path, "rb") as f:
                    return self.answer(200, f.read(), "application/zstd")
            self.answer(404, {"error": "not found"})

        def do_POST(self):
            if not self.authorised():
                return
            if self.path != "/v1/backups":
                return self.answer(404, {"error": "not found"})
            with lock:
                out = subprocess.run(
                    [relay, "backup", "offline", "--data", data, "--to", backup_dir,
                     "--keep", "2"], capture_output=True, text=True)
            m = re.search(r"backup (b\d+): (\d+) bytes", out.stdout)
            if out.returncode != 0 or not m:
                return self.answer(500, {"error": out.stderr.strip()})
            self.answer(200, {"id": m.group(1), "bytes": int(m.group(2)),
                              "store_format": FORMAT})

    server = DualStackServer(host, port, Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"previous release {VERSION} (store format {FORMAT}) on {host} port {port}",
          file=sys.stderr, flush=True)
    server.serve_forever()


def pod(args):
    if args[:1] == ["version"]:
        write = args[args.index("--write") + 1] if "--write" in args else None
        return version(write)
    if args[:1] != ["run"]:
        sys.exit(f"previous release {VERSION}: unknown command {args}")
    os.makedirs(POD["backups"], exist_ok=True)
    run(POD["relay"], POD["fixture"], POD["data"], POD["backups"], POD["port"],
        POD["tokens"], host="::")


if __name__ == "__main__":
    if sys.argv[1] == "version":
        version()
    elif sys.argv[1] == "pod":
        pod(sys.argv[2:])
    else:
        relay, fixture, data, backup_dir, port = sys.argv[2:7]
        run(relay, fixture, data, backup_dir, int(port), sys.argv[7:])
