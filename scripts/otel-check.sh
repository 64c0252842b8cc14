#!/usr/bin/env bash
# `make otel-check`: the server's traces read back from a real trace store.
#
# The store is Arize Phoenix from PyPI (an OTLP/HTTP protobuf receiver over
# SQLite with a REST query API), pinned with every dependency in
# scripts/otel-store-constraints.txt and installed once under
# .tools/otel-store. Jaeger and the OpenTelemetry Collector would need Go
# modules, which this machine cannot fetch. Phoenix stores spans, parents and
# attributes; it drops span kinds, links and resource attributes, so those
# are checked by the decoding receiver of crates/tensor-wasm-cli/tests/otel.rs
# only.
#
# Steps: install (idempotent), start Phoenix on free loopback ports with a
# fresh database, run the ignored test `spans_reach_a_real_trace_store`
# against it, stop it. Prints how long the install and the start took.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${OTEL_STORE_DIR:-$ROOT/.tools/otel-store}"
VERSION="20.26.1"
CARGO="${CARGO:-cargo}"

now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

install() {
    local marker="$VENV/.installed"
    if [[ -f "$marker" && "$(cat "$marker")" == "arize-phoenix==$VERSION" ]]; then
        return 0
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --no-cache-dir -q \
        -c "$ROOT/scripts/otel-store-constraints.txt" "arize-phoenix==$VERSION"
    "$VENV/bin/python" -c "import phoenix"
    echo "arize-phoenix==$VERSION" > "$marker"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

t0="$(now)"
install
echo "otel-check: trace store installed in $(since "$t0") s ($VENV)"

DATA="$(mktemp -d)"
HTTP_PORT="$(free_port)"
GRPC_PORT="$(free_port)"
LOG="$DATA/phoenix.log"
# Offline and quiet: no usage reports, nothing fetched, no assistants.
t1="$(now)"
env PHOENIX_HOST=127.0.0.1 PHOENIX_PORT="$HTTP_PORT" PHOENIX_GRPC_PORT="$GRPC_PORT" \
    PHOENIX_WORKING_DIR="$DATA" PHOENIX_TELEMETRY_ENABLED=false \
    PHOENIX_ALLOW_EXTERNAL_RESOURCES=false PHOENIX_DISABLE_AGENT_ASSISTANT=true \
    PHOENIX_AGENTS_DISABLE_BASH=true PHOENIX_AGENTS_DISABLE_WEB_ACCESS=true \
    PHOENIX_ENABLE_MCP_SERVER=false PHOENIX_ENABLE_AUTH=false \
    setsid "$VENV/bin/phoenix" serve >"$LOG" 2>&1 </dev/null &
PID=$!
stop() {
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null || true
    rm -rf "$DATA"
}
trap stop EXIT

STORE="http://127.0.0.1:$HTTP_PORT"
for _ in $(seq 1 600); do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "otel-check: the trace store exited while starting:" >&2
        tail -n 30 "$LOG" >&2
        exit 1
    fi
    if curl -fsS "$STORE/healthz" >/dev/null 2>&1; then break; fi
    sleep 0.2
done
curl -fsS "$STORE/healthz" >/dev/null
echo "otel-check: trace store ready in $(since "$t1") s at $STORE"

LD_LIBRARY_PATH="$ROOT/.tools/nvrtc/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
TENSOR_WASM_OTEL_STORE="$STORE" \
    "$CARGO" test -p tensor-wasm-cli --test otel -- --ignored --exact \
    spans_reach_a_real_trace_store --nocapture
