#!/usr/bin/env bash
# `make api-conformance`: the OpenAPI document and the server agree. Runs
# schemathesis (pinned, from PyPI, in .tools/schemathesis) with every check and
# every phase (examples, coverage, fuzzing, and the stateful phase, which
# follows the document's links from POST /functions, /invoke-async,
# /snapshots and /tenants) against a real `tensor-wasm serve` on a loopback
# port with a fresh data directory: the default tenant's token for the
# function and job routes, the admin token for /tenants and /metrics.
# Settings: scripts/api-conformance/schemathesis.toml (bounded examples).
# Extra arguments go to `st run` (e.g. `--max-examples 50`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CARGO=${CARGO:-cargo}
SCHEMATHESIS_VERSION=4.32.5
VENV="$ROOT/.tools/schemathesis"

if [[ "$("$VENV/bin/st" --version 2>/dev/null)" != *" $SCHEMATHESIS_VERSION" ]]; then
  echo "installing schemathesis==$SCHEMATHESIS_VERSION into $VENV ..."
  PY=$(command -v python3 || command -v python) || { echo "python3 is needed for schemathesis" >&2; exit 1; }
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  PIP_ROOT_USER_ACTION=ignore "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "schemathesis==$SCHEMATHESIS_VERSION"
fi

"$CARGO" build --quiet -p tensor-wasm-cli
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# --fuel and --allow-raw-ptx: the document lets a deploy ask for a fuel budget
# and for the raw-PTX capability (granted to the default tenant below).
RUST_LOG=warn target/debug/tensor-wasm serve --listen 127.0.0.1:0 --data-dir "$WORK/data" \
  --device cpu --fuel --allow-raw-ptx >"$WORK/stdout" 2>"$WORK/serve.log" &
SERVER_PID=$!
BASE=
for _ in $(seq 300); do
  BASE=$(sed -n 's/^tensor-wasm listening on //p' "$WORK/stdout")
  [[ -n "$BASE" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$BASE" ]] || { echo "api-conformance: the server did not start" >&2; exit 1; }
for _ in $(seq 300); do
  [[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/readyz")" == 200 ]] && break
  sleep 0.1
done

credential() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$WORK/data/credentials.json" "$1"; }
export TENSOR_WASM_TENANT_TOKEN TENSOR_WASM_ADMIN_TOKEN
TENSOR_WASM_TENANT_TOKEN=$(credential tenant_token)
TENSOR_WASM_ADMIN_TOKEN=$(credential admin_token)
# Room for every generated request: quota refusals are documented answers,
# but a run spent on them would test little else.
curl -sf -o /dev/null -X PATCH "$BASE/tenants/$(credential tenant_id)" \
  -H "Authorization: Bearer $TENSOR_WASM_ADMIN_TOKEN" -H 'Content-Type: application/json' \
  -d '{"raw_ptx": true, "quotas": {"max_functions": 100000, "requests_per_second": 100000, "burst": 100000}}'

"$VENV/bin/st" --config-file scripts/api-conformance/schemathesis.toml run \
  crates/tensor-wasm-api/openapi.json --url "$BASE" --checks all \
  --phases examples,coverage,fuzzing,stateful "$@"
