#!/usr/bin/env python3
"""Signed Shopify-style hooks for the e2e on the real node, and the check of what a sink got.

    e2e/hooks.py send URL SECRET OUT --count N [--tenants K] [--rate R] [--seconds S]
                      [--size BYTES] [--parallel P]
        POSTs N hooks (HMAC-SHA256 in X-Shopify-Hmac-Sha256, the shop as the tenant, a
        webhook id of its own each; P senders at once; bodies padded to about BYTES) to
        URL, as a provider does: each is retried until the
        relay acks it (202, or 200 for a duplicate) or S seconds pass. Appends each acked
        hook's id (the relay's hk_...) to OUT and prints how many were acked and retried.
        URL `@FILE` reads the URLs from FILE (one a line) at every attempt, and takes them
        in turn: a load balancer over the pods the test writes there as they come and go.
        --times appends each id with the time its ack came (ms since the epoch).
    e2e/hooks.py check ACKED SINK_LOG [--allow-duplicates] [--acked-before MS]
        Every acked id is in the sink's log (`received hk_... (...)` lines, signature ok);
        exits 1 naming what is missing. With --acked-before, only the ids whose ack came
        before MS (ms since the epoch; ACKED written with --times) must be there. Prints the deliveries and the duplicates; a
        duplicate fails unless --allow-duplicates (a crash may redeliver; a graceful stop
        must not).
"""
import argparse
import base64
import hashlib
import hmac
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request


def send(a):
    deadline = time.monotonic() + a.seconds
    gap = 1.0 / a.rate if a.rate else 0
    lock = threading.Lock()
    totals = {"acked": 0, "retried": 0}
    failed = []

    def one(i, out):
        shop = f"shop-{i % a.tenants}.example"
        doc = {"n": i, "shop": shop}
        if a.size:
            doc["pad"] = "x" * max(0, a.size - len(json.dumps(doc)) - 10)
        body = json.dumps(doc).encode()
        sig = base64.b64encode(hmac.new(a.secret.encode(), body, hashlib.sha256).digest()).decode()
        req = urllib.request.Request("http://127.0.0.1:9/" if a.url.startswith("@") else a.url, data=body, method="POST", headers={
            "content-type": "application/json",
            "x-shopify-hmac-sha256": sig,
            "x-shopify-shop-domain": shop,
            "x-shopify-topic": "orders/create",
            "x-shopify-webhook-id": f"{a.prefix}-{i}",
        })
        tries = 0
        while True:
            if a.url.startswith("@"):
                try:
                    urls = [u.strip() for u in open(a.url[1:]) if u.strip()]
                except OSError:
                    urls = []
                req.full_url = urls[(i + tries) % len(urls)] if urls else "http://127.0.0.1:9/"
            tries += 1
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    answer = json.loads(r.read() or b"{}")
                    if r.status in (200, 202) and "id" in answer:
                        with lock:
                            stamp = f" {int(time.time() * 1000)}" if a.times else ""
                            out.write(answer["id"] + stamp + "\n")
                            out.flush()
                            totals["acked"] += 1
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            with lock:
                totals["retried"] += 1
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def worker(k, out):
        for i in range(k, a.count, a.parallel):
            if not one(i, out):
                failed.append(i)
                return
            if gap:
                time.sleep(gap)

    with open(a.out, "a") as out:
        threads = [threading.Thread(target=worker, args=(k, out)) for k in range(a.parallel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failed:
        sys.exit(f"hooks: hook {failed[0]} not acked within {a.seconds} s ({totals['acked']} acked)")
    print(f"hooks: {totals['acked']} acked, {totals['retried']} retries")


def check(a):
    acked = []
    for l in open(a.acked):
        parts = l.split()
        if not parts:
            continue
        if a.acked_before is not None and (len(parts) < 2 or int(parts[1]) >= a.acked_before):
            continue
        acked.append(parts[0])
    seen = {}
    bad = 0
    for line in open(a.sink_log, errors="replace"):
        m = re.search(r"received (hk_[A-Za-z0-9_-]+) \(.*?, (signature [^)]*)\)", line)
        if not m:
            continue
        seen[m.group(1)] = seen.get(m.group(1), 0) + 1
        if m.group(2) != "signature ok":
            bad += 1
    missing = [i for i in set(acked) if i not in seen]
    dups = sum(n - 1 for i, n in seen.items() if i in set(acked) and n > 1)
    print(f"hooks: {len(set(acked))} acked, {sum(seen.values())} deliveries seen, "
          f"{len(missing)} missing, {dups} duplicates, {bad} with a bad signature")
    if missing:
        sys.exit(f"hooks: acked but never delivered: {sorted(missing)[:10]}")
    if bad:
        sys.exit("hooks: deliveries whose signature did not verify")
    if dups and not a.allow_duplicates:
        sys.exit("hooks: hooks delivered twice")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send")
    s.add_argument("url")
    s.add_argument("secret")
    s.add_argument("out")
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--tenants", type=int, default=5)
    s.add_argument("--rate", type=float, default=0)
    s.add_argument("--seconds", type=float, default=120)
    s.add_argument("--prefix", default="wh")
    s.add_argument("--size", type=int, default=0, help="pad each body to about this many bytes")
    s.add_argument("--parallel", type=int, default=1, help="senders at once (--rate is each one's)")
    s.add_argument("--times", action="store_true", help="write each ack's time beside its id")
    c = sub.add_parser("check")
    c.add_argument("acked")
    c.add_argument("sink_log")
    c.add_argument("--allow-duplicates", action="store_true")
    c.add_argument("--acked-before", type=int, help="only ids acked before this time (ms since the epoch)")
    a = p.parse_args()
    send(a) if a.cmd == "send" else check(a)


if __name__ == "__main__":
    main()
