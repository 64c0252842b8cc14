#!/usr/bin/env bash
# Server CPU per request under load: `perf stat` (task-clock, context
# switches, migrations) of one server process while the in-repo load
# generator drives `POST .../invoke` of the trivial `add` for 5 s (16
# connections, after a 2 s warm-up). Complements scripts/http-throughput.sh:
# req/s says how fast, this says where the server's CPU goes.
#
# Usage: scripts/http-cpu.sh tw|min [extra serve flags...]
#   tw:  tensor-wasm serve --insecure-no-auth (default tenant's rate quota
#        raised as in http-throughput.sh), e.g. `tw --no-inline-calls`
#   min: the minimal axum + wasmtime server of crates/tensor-wasm-bench
# Needs release binaries (cargo build --release -p tensor-wasm-cli -p
# tensor-wasm-bench --bins), perf, curl, jq. Loopback port 18181.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$root/target/release
mode=${1:?tw or min}; shift
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
printf '(module (func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 i32.add))' >"$tmp/add.wat"
addr=127.0.0.1:18181
if [ "$mode" = tw ]; then
    "$bin/tensor-wasm" serve --listen $addr --data-dir "$tmp/data" --insecure-no-auth "$@" >"$tmp/log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf "http://$addr/readyz" >/dev/null && break; sleep 0.05; done
    tenant=$(curl -sf "http://$addr/tenants" | jq -r '.tenants[] | select(.name == "default") | .id')
    curl -sf -X PATCH -H 'content-type: application/json' \
        -d '{"quotas":{"requests_per_second":10000000,"burst":10000000}}' "http://$addr/tenants/$tenant" >/dev/null
    id=$(curl -sf -H 'content-type: application/wasm' --data-binary @"$tmp/add.wat" "http://$addr/functions?name=add" | jq -r .id)
else
    "$bin/minimal-server" --listen $addr --module "$tmp/add.wat" >"$tmp/log" 2>&1 &
    pid=$!
    sleep 1
    id=add
fi
url=http://$addr/functions/$id/invoke
"$bin/loadgen" --url "$url" --duration-s 2 >/dev/null
perf stat -x, -e task-clock,context-switches,cpu-migrations -p "$pid" -o "$tmp/stat" -- sleep 5 &
stat_pid=$!
load=$("$bin/loadgen" --url "$url" --duration-s 5)
wait $stat_pid
requests=$(jq .requests <<<"$load")
task_ms=$(awk -F, '$3=="task-clock"{print $1}' "$tmp/stat")
switches=$(awk -F, '$3=="context-switches"{print $1}' "$tmp/stat")
echo "server=$mode flags='$*' load=$load"
awk -v ms="$task_ms" -v n="$requests" -v cs="$switches" 'BEGIN {
    printf "server CPU %.0f ms over %d requests: %.1f us/request; %d context switches: %.2f/request\n", ms, n, ms * 1000 / n, cs, cs / n }'
