#!/usr/bin/env bash
# Installs the tools `make test` needs when they are missing: clang, lld,
# wasi-libc and the wasm32 compiler-rt builtins (to build the C example guest).
set -euo pipefail

probe() {
  local tmp
  tmp=$(mktemp -d)
  printf 'int main(void){return 0;}\n' > "$tmp/p.c"
  clang --target=wasm32-wasi -O2 "$tmp/p.c" -o "$tmp/p.wasm" >/dev/null 2>&1
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

if command -v clang >/dev/null 2>&1 && probe; then
  exit 0
fi

echo "installing clang, lld, wasi-libc (C guest toolchain) ..."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q clang lld wasi-libc libclang-rt-dev-wasm32 >/dev/null; then
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q clang lld wasi-libc libclang-rt-dev-wasm32 >/dev/null
fi
probe || { echo "clang still cannot build wasm32-wasi programs" >&2; exit 1; }
