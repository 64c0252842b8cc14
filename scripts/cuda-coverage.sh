#!/usr/bin/env bash
# `make cuda-coverage`: line coverage of the CUDA backend (crates/tensor-wasm-gpu/src/cuda.rs,
# cuda/*.rs, raw_launch.rs) from tensor-wasm-gpu's tests, including their run on the stand-in
# driver (src/standin_tests.rs re-runs the `#[ignore]`d CUDA tests as a child process; the child
# inherits LLVM_PROFILE_FILE, whose %p/%m give it profiles of its own, merged into the report).
#
# Installs the pinned cargo-llvm-cov into .tools (git-ignored) when missing, builds into
# cargo-llvm-cov's own target dir (target/llvm-cov-target: instrumented artifacts never replace
# the ordinary ones), prints the per-file line coverage, writes a summary to
# bench-results/coverage/cuda-<date>.txt and fails when cuda.rs + cuda/*.rs together are below
# the threshold. Not part of `make test`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
THRESHOLD=${CUDA_COVERAGE_THRESHOLD:-85}
# 0.9.1 needs Rust 1.87 or newer (its rust-version); the workspace builds with 1.95.
LLVM_COV_VERSION=0.9.1
LLVM_COV="$ROOT/.tools/bin/cargo-llvm-cov"

# --- tools -------------------------------------------------------------------------------
if ! rustup component list --installed 2>/dev/null | grep -q '^llvm-tools'; then
  echo "installing the llvm-tools rustup component (llvm-profdata, llvm-cov) ..."
  rustup component add llvm-tools
fi
if [[ "$("$LLVM_COV" llvm-cov --version 2>/dev/null)" != "cargo-llvm-cov $LLVM_COV_VERSION" ]]; then
  echo "installing cargo-llvm-cov $LLVM_COV_VERSION into $ROOT/.tools (a few minutes, once) ..."
  # Its own temporary build dir, not the workspace's target dir.
  env -u CARGO_TARGET_DIR cargo install --quiet --locked --root "$ROOT/.tools" \
    cargo-llvm-cov --version "=$LLVM_COV_VERSION"
  [[ "$("$LLVM_COV" llvm-cov --version 2>/dev/null)" == "cargo-llvm-cov $LLVM_COV_VERSION" ]] ||
    { echo "cargo-llvm-cov $LLVM_COV_VERSION did not install at $LLVM_COV" >&2; exit 1; }
fi
# NVRTC (the tests compile CUDA C++) comes from `make deps`.
NVRTC_LIB_DIR="$ROOT/.tools/nvrtc/nvidia/cu13/lib"
[[ -f "$NVRTC_LIB_DIR/libnvrtc.so.13" ]] || scripts/install-deps.sh

# --- run -----------------------------------------------------------------------------------
# An explicit coverage target dir, whatever CARGO_TARGET_DIR says.
export CARGO_LLVM_COV_TARGET_DIR="${CARGO_LLVM_COV_TARGET_DIR:-$ROOT/target/llvm-cov-target}"
export LD_LIBRARY_PATH="$NVRTC_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TEST_CMD="cargo llvm-cov -p tensor-wasm-gpu"
json=$(mktemp)
missing=$(mktemp)
trap 'rm -f "$json" "$missing"' EXIT
start=$(date +%s)
# Runs the tests (removing the profiles of earlier runs first), then the JSON summary.
# shellcheck disable=SC2086
"$LLVM_COV" ${TEST_CMD#cargo } --json --summary-only --output-path "$json"
# The lines the profiles never reached, per file (`--show-missing-lines`).
"$LLVM_COV" llvm-cov report --show-missing-lines > "$missing"
seconds=$(( $(date +%s) - start ))

out_dir="$ROOT/bench-results/coverage"
mkdir -p "$out_dir"
summary="$out_dir/cuda-$(date -u +%F).txt"
commit=$(git rev-parse --short HEAD)
if [[ -n "$(git status --porcelain -- crates)" ]]; then commit="$commit-dirty"; fi
python3 - "$json" "$missing" "$summary" "$THRESHOLD" "$commit" "$seconds" "$TEST_CMD" <<'PY'
import json, re, sys, datetime
json_path, missing_path, summary_path, threshold, commit, seconds, command = sys.argv[1:]
threshold = float(threshold)
prefix = "crates/tensor-wasm-gpu/src/"
backend = ["cuda.rs", "cuda/probe.rs", "cuda/modules.rs", "cuda/lane.rs",
           "cuda/launch.rs", "cuda/events.rs"]
extra = ["raw_launch.rs"]
files = {}
for data in json.load(open(json_path))["data"]:
    for f in data["files"]:
        name = f["filename"]
        at = name.find(prefix)
        if at >= 0:
            files[name[at + len(prefix):]] = f["summary"]["lines"]
missing = {}
for line in open(missing_path):
    m = re.match(r"(\S+):\s*(\d[\d, -]*)$", line.strip())
    if m and prefix in m.group(1):
        missing[m.group(1).split(prefix, 1)[1]] = m.group(2)
rows, covered, total = [], 0, 0
for name in backend + extra:
    lines = files.get(name)
    if lines is None:
        sys.exit(f"no coverage data for {prefix}{name}")
    rows.append((name, lines["covered"], lines["count"], lines["percent"]))
    if name in backend:
        covered += lines["covered"]
        total += lines["count"]
percent = 100.0 * covered / total
text = [
    "CUDA backend line coverage (tensor-wasm-gpu's tests, the stand-in driver's child run included)",
    f"date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}",
    f"commit: {commit}",
    f"command: make cuda-coverage ({command}, LD_LIBRARY_PATH with NVRTC)",
    f"tests + report: {seconds} s",
    "",
    f"{'file':<40} {'lines':>7} {'covered':>8} {'percent':>8}",
]
for name, c, n, p in rows:
    text.append(f"{prefix + name:<40} {n:>7} {c:>8} {p:>7.1f}%")
text.append(f"{'cuda.rs + cuda/*.rs':<40} {total:>7} {covered:>8} {percent:>7.1f}%  (threshold {threshold:g} %)")
text.append("")
text.append("lines with a count of 0 (why each is left: bench-results/coverage/README.md):")
for name, *_ in rows:
    text.append(f"  {prefix + name}: {missing.get(name, 'none')}")
report = "\n".join(text) + "\n"
open(summary_path, "w").write(report)
print(report, end="")
print(f"written to {summary_path}")
if percent < threshold:
    sys.exit(f"cuda-coverage: cuda.rs + cuda/*.rs line coverage {percent:.1f} % is below {threshold:g} %")
PY
