#!/usr/bin/env python3
"""A consumer of an Ankusa pull sink, in Python's standard library only (docs/pull.md).

    ANKUSA_PULL_TOKEN=... python3 examples/pull_consumer.py \\
        --url http://127.0.0.1:8080 --sink billing-queue

It claims hooks with a long poll, handles each one (here: prints a line; put your work in
`handle`), acks what it handled and nacks what failed. When the relay cannot be reached
it waits and tries again; the leases it held run out and their hooks come back, so a
crash or a lost connection loses nothing (a hook may come twice: make `handle`
idempotent, e.g. on the hook's `id`).
"""

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request


class Refused(Exception):
    """The relay refused the call for good (a bad token, an unknown sink, a bad bound)."""


def call(url, token, path, body, timeout):
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"authorization": "Bearer " + token, "content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        answer = json.loads(e.read() or b"{}")
        if e.code == 409:
            # Some leases were not held any more (they ran out): the rest were settled.
            return answer
        if e.code in (400, 401, 404):
            raise Refused(f"{e.code} {answer.get('error')}: {answer.get('message')}")
        raise


def body_of(hook):
    if "body" in hook:
        return hook["body"].encode()
    return base64.b64decode(hook.get("body_base64", ""))


def handle(hook):
    """Your work. Return True when the hook is handled (it is acked), False to have it
    retried on the relay's schedule (it is nacked)."""
    print(json.dumps({"id": hook["id"], "tenant": hook["tenant"], "attempt": hook["attempt"],
                      "bytes": len(body_of(hook))}), flush=True)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("ANKUSA_PULL_URL", "http://127.0.0.1:8080"))
    p.add_argument("--sink", required=True)
    p.add_argument("--max", type=int, default=100, help="hooks per claim")
    p.add_argument("--wait-ms", type=int, default=20000, help="how long a claim waits")
    p.add_argument("--limit", type=int, help="stop after this many hooks were settled")
    args = p.parse_args()
    token = os.environ.get("ANKUSA_PULL_TOKEN")
    if not token:
        sys.exit("set ANKUSA_PULL_TOKEN to a consumer token (pull.consumers)")
    base = f"/pull/{args.sink}"
    timeout = args.wait_ms / 1000 + 30
    settled, backoff = 0, 0.5
    while args.limit is None or settled < args.limit:
        try:
            hooks = call(args.url, token, base + "/claim",
                         {"max": args.max, "wait_ms": args.wait_ms}, timeout)["hooks"]
            acks, nacks = [], []
            for hook in hooks:
                (acks if handle(hook) else nacks).append(hook["lease"])
            for what, leases in (("ack", acks), ("nack", nacks)):
                if leases:
                    answer = call(args.url, token, f"{base}/{what}", {"leases": leases}, timeout)
                    settled += answer.get("settled", 0)
            backoff = 0.5
        except Refused as e:
            sys.exit(f"pull: {e}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            print(f"pull: {e}; again in {backoff:.1f} s", file=sys.stderr, flush=True)
            time.sleep(backoff)
            backoff = min(backoff * 2, 30)


if __name__ == "__main__":
    main()
