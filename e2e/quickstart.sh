#!/usr/bin/env bash
# The newcomer's path, as the README writes it: `make run` (its own installer, build and
# start, nothing for tests), then the README's quickstart block — the sink, the first
# hook, /v1/node — run as written. The store goes to a temporary directory
# (ANKUSA_DATA_DIR), not ./data/quickstart, so a developer's own quickstart store is
# left alone. `make test` runs it after nextest, when 8080, 9090 and 9999 are free.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
run_pid='' sink_pid=''
cleanup() {
  # Only what this script started: make's process group (make and the node), the sink.
  [ -z "$run_pid" ] || kill -TERM -- "-$run_pid" 2>/dev/null || true
  [ -z "$sink_pid" ] || kill -TERM "$sink_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "quickstart: $*" >&2
  echo "--- make run" >&2
  tail -n 40 "$work/run.log" >&2 || true
  echo "--- sink" >&2
  tail -n 20 "$work/sink.log" >&2 || true
  exit 1
}

started=$(date +%s)
ANKUSA_DATA_DIR="$work/data" setsid make --no-print-directory run >"$work/run.log" 2>&1 &
run_pid=$!
until curl -fsS http://127.0.0.1:9090/readyz >/dev/null 2>&1; do
  kill -0 "$run_pid" 2>/dev/null || fail "make run exited before the node was ready"
  [ $(($(date +%s) - started)) -lt 900 ] || fail "the node was not ready within 900 s"
  sleep 0.2
done
[ -d "$work/data" ] || fail "the store is not where ANKUSA_DATA_DIR says"
# `make run` installs only what the node needs: no test runner was asked for.
if grep -q -e nextest -e schemathesis -e helm-python -e nightly "$work/run.log"; then
  fail "make run installed something for the tests"
fi

# The README's second sh block, lines continued with a backslash joined: the sink, the
# hook, the node's status.
mapfile -t commands < <(python3 - <<'EOF'
import re
readme = open("README.md").read()
block = readme.split("```sh\n")[2].split("```")[0].replace("\\\n", " ")
for line in block.splitlines():
    if line.strip():
        print(line.strip())
EOF
)
[ ${#commands[@]} -eq 3 ] || fail "the README's quickstart block has ${#commands[@]} commands, not 3"
sh -c "exec ${commands[0]}" >"$work/sink.log" 2>&1 &
sink_pid=$!
until curl -s -o /dev/null http://127.0.0.1:9999/ 2>/dev/null; do
  kill -0 "$sink_pid" 2>/dev/null || fail "the sink exited"
  sleep 0.1
done
ack=$(sh -c "${commands[1]}" 2>>"$work/curl.log")
echo "$ack" | head -n 1 | grep -q '^HTTP/1.1 202' || fail "the first hook was not accepted: $ack"
id=$(echo "$ack" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
[ -n "$id" ] || fail "no hook id in: $ack"
node=$(sh -c "${commands[2]}" 2>>"$work/curl.log")
echo "$node" | python3 -c '
import json, sys
n = json.load(sys.stdin)
assert n["store_format"] == 3 and n["tenants"] == 1, n
' || fail "/v1/node: $node"
delivered=
for _ in $(seq 1 300); do
  if grep -q "$id.*signature ok" "$work/sink.log"; then
    delivered=1
    break
  fi
  sleep 0.1
done
[ -n "$delivered" ] || fail "the sink never printed hook $id with its signature checked"
# The README's next step: the console, signed in with the quickstart's token, lists the hook
# on its overview and `acme` on its Tenants page.
token=$(grep -o "Bearer [a-z-]*" README.md | head -n 1 | cut -d' ' -f2)
jar="$work/console.cookies"
curl -fsS -o /dev/null -c "$jar" -X POST http://127.0.0.1:9090/ui/login --data-urlencode "token=$token" \
  || fail "the console refused the README's token $token"
overview=$(curl -fsS -b "$jar" http://127.0.0.1:9090/ui/)
echo "$overview" | grep -q "$id" || fail "the console's overview does not list hook $id"
curl -fsS -b "$jar" http://127.0.0.1:9090/ui/tenants | grep -q '>acme<' \
  || fail "the console's Tenants page does not list acme"
echo "quickstart: make run, then the README's block as written: hook $id accepted, delivered, signature ok, on the console ($(($(date +%s) - started)) s)"
