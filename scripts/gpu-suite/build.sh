#!/usr/bin/env bash
# Assembles the GPU-suite artifact (`make gpu-suite`, after the release build):
#
#   DIR/bin/tensor-wasm.gz, DIR/bin/gpu-suite.gz  stripped release binaries, gzipped (run.sh
#                                            unpacks them; together they exceed the carry limit
#                                            uncompressed)
#   DIR/examples/*.wat, DIR/examples/c/*.wasm the example guests
#   DIR/run.sh, torch_peer.py, summarize.py, check_results.py
#   DIR/BUILD_INFO.json                      commit, toolchain, sizes
#   DIR/expected/http-check-cpu-build.json   the CPU backend's responses, recorded here
#   DIR/expected/onnx/, onnx-models/         the ONNX cases of scripts/onnx/graphs.py, models.py
#   DIR/expected/bit-identity.{json,bin}     the CPU backend's memory after every kernel of
#                                            the conformance set (tensor_wasm_jit::conformance)
#
# and checks that it, with the working tree, fits the device tool's 64 MiB carry limit.
# Usage: scripts/gpu-suite/build.sh DIR
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${1:-.gpu-suite}
case "$DIR" in /*) ;; *) DIR="$ROOT/$DIR" ;; esac
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
LIMIT=$((64 << 20))

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/examples/c" "$DIR/expected"
for bin in tensor-wasm gpu-suite; do
  strip -o "$DIR/bin/$bin" "$TARGET/release/$bin"
done
cp "$ROOT"/examples/*.wat "$DIR/examples/"
cp "$ROOT"/examples/c/*.wasm "$DIR/examples/c/"
for f in run.sh torch_peer.py summarize.py check_results.py; do
  cp "$ROOT/scripts/gpu-suite/$f" "$DIR/"
done
chmod +x "$DIR/run.sh"

cd "$ROOT"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- crates scripts examples sdk Cargo.toml Cargo.lock 2>/dev/null; then
  commit="$commit-dirty"
fi
artifact_bytes=$(du -sb "$DIR" | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
BUILD_COMMIT=$commit ARTIFACT=$DIR ARTIFACT_BYTES=$artifact_bytes TREE_BYTES=$tree_bytes \
python3 - <<'EOF'
import datetime, json, os, platform, subprocess
d = os.environ["ARTIFACT"]
sizes = {}
for root, _, files in os.walk(d):
    for f in files:
        p = os.path.join(root, f)
        sizes[os.path.relpath(p, d)] = os.path.getsize(p)
rustc = subprocess.run(["rustc", "-V"], capture_output=True, text=True).stdout.strip()
info = {
    "commit": os.environ["BUILD_COMMIT"],
    "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "rustc": rustc,
    "build_machine": f"{platform.system()} {platform.release()} {platform.machine()}",
    "command": "make gpu-suite (cargo build --release -p tensor-wasm-cli --bin tensor-wasm -p tensor-wasm-gpu-suite --bin gpu-suite; scripts/gpu-suite/build.sh)",
    "profile": "release, stripped",
    "bytes": {"bin/tensor-wasm": sizes.get("bin/tensor-wasm"), "bin/gpu-suite": sizes.get("bin/gpu-suite"),
              "artifact_total": int(os.environ["ARTIFACT_BYTES"]),
              "working_tree_that_travels": int(os.environ["TREE_BYTES"] or 0)},
}
json.dump(info, open(os.path.join(d, "BUILD_INFO.json"), "w"), indent=2)
EOF

# The CPU backend's responses on this machine: what the GPU run must reproduce.
PROV="$DIR/expected/build-provenance.json"
python3 - "$PROV" "$DIR/BUILD_INFO.json" <<'EOF'
import datetime, json, os, platform, sys
build = json.load(open(sys.argv[2]))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
json.dump({
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "kernel": f"{platform.system()} {platform.release()}",
                "arch": platform.machine()},
    "gpu": None, "driver": "none (build machine, CPU backend)", "cuda_version": "none (build machine, CPU backend)",
    "commit": build["commit"], "build": build,
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "command": "make gpu-suite (expected CPU record)", "device": "cpu",
}, open(sys.argv[1], "w"), indent=2)
EOF
LD_LIBRARY_PATH="$ROOT/.tools/nvrtc/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$DIR/bin/gpu-suite" http-check --device cpu --name http-check-cpu-build --out "$DIR/expected" \
  --provenance "$PROV" --server "$DIR/bin/tensor-wasm" --examples "$DIR/examples" \
  > "$DIR/expected/build.log" 2>&1 || {
  cat "$DIR/expected/build.log"
  echo "gpu-suite: the CPU record failed (above); the artifact is not usable" >&2
  exit 1
}
# The ONNX cases of the wasi-nn section (scripts/onnx/graphs.py, with ONNX Runtime's outputs);
# the long deadline-test model is left out.
"$ROOT/.tools/onnx/bin/python" "$ROOT/scripts/onnx/graphs.py" "$DIR/expected/onnx" > /dev/null || {
  echo "gpu-suite: writing the ONNX cases failed (make deps installs .tools/onnx)" >&2
  exit 1
}
rm -rf "$DIR/expected/onnx/slow"
"$ROOT/.tools/onnx/bin/python" "$ROOT/scripts/onnx/models.py" "$DIR/expected/onnx-models" > /dev/null || {
  echo "gpu-suite: writing the real models failed (make deps installs .tools/onnx)" >&2
  exit 1
}
# The CPU backend's memory after every kernel of the conformance set: what the GPU's
# bit-identity section must reproduce byte for byte.
"$DIR/bin/gpu-suite" bit-identity --record "$DIR/expected" --device cpu --out "$DIR/expected" \
  --provenance "$PROV" > "$DIR/expected/build.log" 2>&1 || {
  cat "$DIR/expected/build.log"
  echo "gpu-suite: the bit-identity record failed (above); the artifact is not usable" >&2
  exit 1
}
rm -f "$PROV" "$DIR/expected/build.log" "$DIR/expected/bit-identity-record.json"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu-suite artifact: $DIR"
for bin in tensor-wasm gpu-suite; do
  plain=$(stat -c %s "$DIR/bin/$bin")
  gzip -9 -n "$DIR/bin/$bin"
  echo "  bin/$bin.gz: $(mib "$(stat -c %s "$DIR/bin/$bin.gz")") ($(mib "$plain") unpacked)"
done
artifact_bytes=$(du -sb "$DIR" | cut -f1)
echo "  artifact total: $(mib "$artifact_bytes"); working tree that travels: $(mib "$tree_bytes")"
echo "  together: $(mib $((artifact_bytes + tree_bytes))) of the 64 MiB the device tool carries"
if (( artifact_bytes + tree_bytes > LIMIT )); then
  echo "gpu-suite: the artifact and the working tree exceed 64 MiB" >&2
  exit 1
fi
