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
  cargo install cargo-fuzz --version "$FUZZ_VERSION" --locked --root "$root" --quiet
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
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t" "fuzz/artifacts/$t"
  log=$(mktemp)
  if ! cargo +nightly fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz: $t FAILED (input in fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1)
  corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
  echo "fuzz: $t ok — ${runs#Done } in ${seconds}s, corpus $corpus inputs"
  rm -f "$log"
done
