#!/usr/bin/env bash
# Installs what building and testing Ankusa needs, only where it is missing.
# - libclang (bindgen, for the RocksDB bindings) from Debian's libclang-dev
# - a C++ compiler for RocksDB itself
# - cargo-nextest, the test runner `make test` uses
set -euo pipefail

need_apt=()
if ! compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null && ! compgen -G "/usr/lib/*/libclang*.so*" >/dev/null; then
  need_apt+=(libclang-dev)
fi
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: installing ${need_apt[*]} with apt-get"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${need_apt[@]}"
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "install-deps: installing cargo-nextest from crates.io"
  cargo install cargo-nextest --locked
fi
