#!/usr/bin/env bash
# `make gpu-suite-dry-run`: the CPU-side test of the GPU suite. Runs the artifact's runner
# with --device cpu --quick into a temporary directory and checks the result files with
# check_results.py (every file present, provenance on every file, backend labelled CPU,
# every section passed, the --out directory as the device tool would bring it back).
# Usage: scripts/gpu-suite/dry-run.sh [ARTIFACT_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${1:-.gpu-suite}
case "$DIR" in /*) ;; *) DIR="$ROOT/$DIR" ;; esac
[[ -f "$DIR/bin/gpu-suite.gz" ]] || { echo "no artifact at $DIR: run make gpu-suite" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
bash "$DIR/run.sh" --device cpu --quick --out "$tmp/out" --work "$tmp/work" > "$tmp/runner.log" 2>&1 || true
results=$(ls -d "$tmp"/work/*-cpu-dry-run 2>/dev/null | head -1)
if [[ -z "$results" ]] || ! python3 "$DIR/check_results.py" --device cpu "$results" "$tmp/out"; then
  tail -n 60 "$tmp/runner.log"
  exit 1
fi
echo "gpu-suite dry run (CPU backend, quick sizes) passed in $(( $(date +%s) - start )) s"
