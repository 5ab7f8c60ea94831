#!/usr/bin/env bash
# Runs every fuzz target under fuzz/ (cargo fuzz, libFuzzer, nightly) for SECONDS each;
# fails on any crash, leak or timeout. `make test` runs it for 20 s a target (a smoke),
# `make fuzz` for 10 minutes. The corpus a run grows is kept in fuzz/corpus/<target>
# (not committed); the committed seeds in fuzz/seeds/<target> are read, never written.
# A crash leaves its input in fuzz/artifacts/<target>/: add it to the seeds with the fix.
#
#   scripts/fuzz.sh SECONDS [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?seconds per target}
shift || true

# cargo-fuzz, built once and cached outside target/.
FUZZ_VERSION=0.13.2
root="${ANKUSA_CACHE:-$HOME/.cache/ankusa}/cargo-fuzz-$FUZZ_VERSION"
if [ ! -x "$root/bin/cargo-fuzz" ]; then
  echo "fuzz: installing cargo-fuzz $FUZZ_VERSION from crates.io into $root"
  # Unoptimised: it only drives cargo, and a fresh machine builds it in a fraction of the time.
  cargo install cargo-fuzz --version "$FUZZ_VERSION" --locked --root "$root" --quiet --debug
fi
export PATH="$root/bin:$PATH"
# libFuzzer's instrumentation needs a nightly compiler; this machine carries one.
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain (rustup toolchain install nightly): the fuzz targets cannot be built" >&2
  exit 1
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build
# One libFuzzer process a core (FUZZ_JOBS, default nproc): each runs one target on one
# thread, so the smoke takes ceil(targets / cores) x SECONDS.
jobs=${FUZZ_JOBS:-$(nproc)}
fuzz_one() {
  local t=$1 log=$2
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t" "fuzz/artifacts/$t"
  cargo +nightly fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT_S:-10}" -rss_limit_mb=2048 -print_final_stats=1 \
    >"$log" 2>&1
}
report() {
  local t=$1 log=$2 rc=$3 runs corpus
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz: $t FAILED (input in fuzz/artifacts/$t/)" >&2
    return 1
  fi
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1)
  corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
  echo "fuzz: $t ok — ${runs#Done } in ${seconds}s, corpus $corpus inputs"
  rm -f "$log"
}
failed=0
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  pids=() logs=()
  for t in "${batch[@]}"; do
    logs+=("$(mktemp)")
    fuzz_one "$t" "${logs[-1]}" &
    pids+=($!)
  done
  for k in "${!batch[@]}"; do
    rc=0
    wait "${pids[$k]}" || rc=$?
    report "${batch[$k]}" "${logs[$k]}" "$rc" || failed=1
  done
  [ "$failed" -eq 0 ] || exit 1
done
