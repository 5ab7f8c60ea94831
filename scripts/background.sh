#!/usr/bin/env bash
# A job of `make test` run in the background while the other steps run, and waited for
# later: its output goes to target/NAME/log, its exit status to target/NAME/rc.
#
#   scripts/background.sh start NAME COMMAND...   begin it
#   scripts/background.sh wait NAME [--show]      wait for it; fail with its log if it
#                                                 failed (--show: print the log either way)
set -euo pipefail
cd "$(dirname "$0")/.."
action=${1:-} name=${2:-}
[ -n "$name" ] || { echo "usage: $0 start NAME COMMAND... | wait NAME [--show]" >&2; exit 2; }
dir=target/$name
case "$action" in
  start)
    shift 2
    mkdir -p "$dir"
    rm -f "$dir/rc"
    (
      rc=0
      "$@" >"$dir/log" 2>&1 || rc=$?
      echo "$rc" >"$dir/rc"
    ) &
    ;;
  wait)
    [ -d "$dir" ] || { echo "$name: not started" >&2; exit 2; }
    started=$SECONDS
    while [ ! -f "$dir/rc" ]; do sleep 2; done
    rc=$(cat "$dir/rc")
    if [ "$rc" != 0 ] || [ "${3:-}" = --show ]; then
      cat "$dir/log" >&2
    fi
    if [ "$rc" != 0 ]; then
      echo "$name: FAILED (log: $dir/log)" >&2
      exit "$rc"
    fi
    echo "$name: ok (waited $((SECONDS - started)) s)"
    ;;
  *) echo "usage: $0 start NAME COMMAND... | wait NAME [--show]" >&2; exit 2 ;;
esac
