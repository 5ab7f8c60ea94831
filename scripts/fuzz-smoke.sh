#!/usr/bin/env bash
# The fuzz smoke of `make test` (scripts/fuzz.sh, 20 s a target), run in the background at
# the lowest priority from the moment the toolchains are in until the tests end: its
# nightly build and its fixed-length runs take the CPU the other steps leave idle (the e2e
# scripts mostly wait on the control plane and its pods) instead of 4 minutes of their own.
# A crash, leak or timeout still fails `make test`, at `wait`. An input's timeout (60 s
# here, 10 s in `make fuzz`) allows for a process that waits its turn behind the tests.
#
#   scripts/fuzz-smoke.sh start   begin it
#   scripts/fuzz-smoke.sh wait    wait for it; print its report, fail if it failed
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  start)
    FUZZ_TIMEOUT_S=60 bash scripts/background.sh start fuzz-smoke \
      nice -n 19 bash scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-20}"
    echo "fuzz-smoke: running in the background at nice 19 (log: target/fuzz-smoke/log)"
    ;;
  wait) bash scripts/background.sh wait fuzz-smoke --show ;;
  *) echo "usage: $0 start|wait" >&2; exit 2 ;;
esac
