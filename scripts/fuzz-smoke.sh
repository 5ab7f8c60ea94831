#!/usr/bin/env bash
# The fuzz smoke of `make test` (scripts/fuzz.sh, 20 s a target), run in the background at
# the lowest priority from the moment the toolchains are in until the tests end: its
# nightly build and its fixed-length runs take the CPU the other steps leave idle (the e2e
# scripts mostly wait on the control plane and its pods) instead of 4 minutes of their own.
# A crash, leak or timeout still fails `make test`, at `wait`.
#
#   scripts/fuzz-smoke.sh start   begin it
#   scripts/fuzz-smoke.sh wait    wait for it; fail with its log if it failed
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/fuzz-smoke
seconds=${FUZZ_SMOKE_SECONDS:-20}
case "${1:-}" in
  start)
    mkdir -p "$dir"
    rm -f "$dir/rc"
    (
      rc=0
      # An input's timeout allows for a process that waits its turn behind the tests.
      FUZZ_TIMEOUT_S=60 nice -n 19 bash scripts/fuzz.sh "$seconds" >"$dir/log" 2>&1 || rc=$?
      echo "$rc" >"$dir/rc"
    ) &
    echo "fuzz-smoke: running in the background at nice 19 (log: $dir/log)"
    ;;
  wait)
    [ -d "$dir" ] || { echo "fuzz-smoke: not started (scripts/fuzz-smoke.sh start)" >&2; exit 2; }
    started=$SECONDS
    while [ ! -f "$dir/rc" ]; do sleep 2; done
    rc=$(cat "$dir/rc")
    cat "$dir/log"
    if [ "$rc" != 0 ]; then
      echo "fuzz-smoke: FAILED" >&2
      exit "$rc"
    fi
    echo "fuzz-smoke: ok (waited $((SECONDS - started)) s)"
    ;;
  *) echo "usage: $0 start|wait" >&2; exit 2 ;;
esac
