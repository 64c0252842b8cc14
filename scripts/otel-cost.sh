#!/usr/bin/env bash
# What exporting traces costs an invoke: `tensor-wasm serve` without trace
# export (A) and the same build exporting every request's spans (B:
# OTEL_TRACES_SAMPLER=always_on, OTLP/HTTP to a local receiver that answers
# every export at once), under the same closed-loop HTTP load of a trivial
# `add` module, interleaved per round (A B, then B A, ...).
#
# Writes bench-results/otel-cost/<YYYY-MM-DD>.json (<date>-N.json for later
# runs the same day). Knobs (environment): ROUNDS (6), ROUND_S (5),
# CONNECTIONS (16), WARMUP_S (2). With `perf` on the PATH each measurement
# also records the server's CPU time per request. Loopback only; every
# process is killed on exit.
set -euo pipefail

ROUNDS=${ROUNDS:-6}
ROUND_S=${ROUND_S:-5}
CONNECTIONS=${CONNECTIONS:-16}
WARMUP_S=${WARMUP_S:-2}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command_line="ROUNDS=$ROUNDS ROUND_S=$ROUND_S CONNECTIONS=$CONNECTIONS WARMUP_S=$WARMUP_S bash scripts/otel-cost.sh"
for tool in cargo curl jq python3; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done

echo "== building release binaries" >&2
cargo build --release -p tensor-wasm-cli -p tensor-wasm-bench --bins >&2
bin=$root/target/release
git_commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git_dirty=$(git status --porcelain 2>/dev/null | sed 's/^...//' | jq -R . | jq -cs .)

tmp=$(mktemp -d)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The receiver: answers every OTLP export 200 at once and counts the bytes.
cat >"$tmp/sink.py" <<'PY'
import http.server, sys, threading
received = {"requests": 0, "bytes": 0}
lock = threading.Lock()
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        with lock:
            received["requests"] += 1
            received["bytes"] += n
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def do_GET(self):
        body = ("%d %d" % (received["requests"], received["bytes"])).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
PY
python3 "$tmp/sink.py" >"$tmp/sink.out" &
pids+=($!)
for _ in $(seq 1 100); do [ -s "$tmp/sink.out" ] && break; sleep 0.05; done
sink="http://127.0.0.1:$(head -n1 "$tmp/sink.out")"

cat >"$tmp/add.wat" <<'WAT'
(module
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add))
WAT
body='{"export":"add","args":[1,2]}'

# Starts server $1 (`env` assignments in $2..) and sets $url, $token, $pid.
start() {
    local name=$1 data=$tmp/$1-data
    shift
    env -u RUST_LOG "$@" "$bin/tensor-wasm" serve --listen 127.0.0.1:0 --data-dir "$data" \
        >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pid=$!
    pids+=($pid)
    local addr="" _
    for _ in $(seq 1 200); do
        addr=$(grep -o 'listening on http://[0-9.:]*' "$tmp/$name.out" 2>/dev/null | head -n1 | sed 's|.*http://||' || true)
        [ -n "$addr" ] && break
        sleep 0.05
    done
    [ -n "$addr" ] || { echo "$name did not start:" >&2; cat "$tmp/$name.err" >&2; exit 1; }
    for _ in $(seq 1 200); do curl -sf "http://$addr/readyz" >/dev/null && break; sleep 0.05; done
    token=$(jq -r .tenant_token "$data/credentials.json")
    local admin tenant
    admin=$(jq -r .admin_token "$data/credentials.json")
    tenant=$(jq -r .tenant_id "$data/credentials.json")
    curl -sf -X PATCH -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
        -d '{"quotas":{"requests_per_second":10000000,"burst":10000000}}' \
        "http://$addr/tenants/$tenant" >/dev/null
    local id
    id=$(curl -sf -H "Authorization: Bearer $token" -H 'content-type: application/wasm' \
        --data-binary @"$tmp/add.wat" "http://$addr/functions?name=add" | jq -r .id)
    url="http://$addr/functions/$id/invoke"
    local answer
    answer=$(curl -sf -H "Authorization: Bearer $token" -H 'content-type: application/json' -d "$body" "$url")
    [ "$(jq -c . <<<"$answer")" = '{"results":[3]}' ] || { echo "$name answered $answer" >&2; exit 1; }
}

start off
off_url=$url off_token=$token off_pid=$pid
start on OTEL_EXPORTER_OTLP_ENDPOINT="$sink" OTEL_TRACES_SAMPLER=always_on
on_url=$url on_token=$token on_pid=$pid

measured() { # url bearer pid
    local result
    if ! command -v perf >/dev/null; then
        LOADGEN_BEARER=$2 "$bin/loadgen" --url "$1" --connections "$CONNECTIONS" \
            --duration-s "$ROUND_S" --threads 1 --body "$body" | jq -c '. + {cpu_us_per_req: null}'
        return
    fi
    perf stat -x, -e task-clock -p "$3" -o "$tmp/perf-stat" -- sleep "$ROUND_S" &
    local stat_pid=$! cpu_ms
    result=$(LOADGEN_BEARER=$2 "$bin/loadgen" --url "$1" --connections "$CONNECTIONS" \
        --duration-s "$ROUND_S" --threads 1 --body "$body")
    wait "$stat_pid"
    cpu_ms=$(awk -F, '/task-clock/ {print $1}' "$tmp/perf-stat")
    jq -c --argjson cpu_ms "${cpu_ms:-null}" \
        '. + {cpu_us_per_req: (if $cpu_ms == null or .requests == 0 then null
                               else ($cpu_ms * 1000 / .requests * 100 | round / 100) end)}' <<<"$result"
}

echo "== warm-up ${WARMUP_S}s each" >&2
LOADGEN_BEARER=$off_token "$bin/loadgen" --url "$off_url" --connections "$CONNECTIONS" --duration-s "$WARMUP_S" --threads 1 --body "$body" >/dev/null
LOADGEN_BEARER=$on_token "$bin/loadgen" --url "$on_url" --connections "$CONNECTIONS" --duration-s "$WARMUP_S" --threads 1 --body "$body" >/dev/null

rounds_file=$tmp/rounds.jsonl
: >"$rounds_file"
for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then
        a=$(measured "$off_url" "$off_token" "$off_pid")
        b=$(measured "$on_url" "$on_token" "$on_pid")
    else
        b=$(measured "$on_url" "$on_token" "$on_pid")
        a=$(measured "$off_url" "$off_token" "$off_pid")
    fi
    echo "round $round: off $a" >&2
    echo "round $round: on  $b" >&2
    jq -cn --argjson round "$round" --argjson a "$a" --argjson b "$b" \
        '{round: $round, off: $a, on: $b}' >>"$rounds_file"
done
read -r sink_requests sink_bytes < <(curl -sf "$sink/"; echo) || true
dropped=$(curl -sf -H "Authorization: Bearer $(jq -r .admin_token "$tmp/on-data/credentials.json")" \
    "${on_url%%/functions*}/metrics" | awk '/^tensor_wasm_otel_spans_dropped_total/ {s += $2} END {print s + 0}')
exported=$(curl -sf -H "Authorization: Bearer $(jq -r .admin_token "$tmp/on-data/credentials.json")" \
    "${on_url%%/functions*}/metrics" | awk '/^tensor_wasm_otel_spans_exported_total/ {print $2}')

date_utc=$(date -u +%F)
out_dir=$root/bench-results/otel-cost
mkdir -p "$out_dir"
out=$out_dir/$date_utc.json
n=2
while [ -e "$out" ]; do out=$out_dir/$date_utc-$n.json; n=$((n + 1)); done

isa=$(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx512f\|avx2' | sort -u | paste -sd, -)
jq -s \
    --arg date "$date_utc" --arg timestamp "$(date -u +%FT%TZ)" \
    --arg commit "$git_commit" --argjson dirty "$git_dirty" \
    --argjson nproc "$(nproc)" --arg uname "$(uname -srm)" \
    --arg cpu "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')" --arg isa "$isa" \
    --arg command "$command_line" --arg body "$body" \
    --argjson rounds "$ROUNDS" --argjson round_s "$ROUND_S" --argjson connections "$CONNECTIONS" \
    --argjson sink_requests "$sink_requests" --argjson sink_bytes "$sink_bytes" \
    --argjson dropped "${dropped:-0}" --argjson exported "${exported:-0}" '
    def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                       else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def stats(f): map(f) | {median: median, min: min, max: max};
    def r3: . * 1000 | round / 1000;
    def cpu(xs): if (xs | map(.cpu_us_per_req) | any(. == null)) then null
                 else xs | stats(.cpu_us_per_req) end;
    . as $r | ($r | map(.off)) as $a | ($r | map(.on)) as $b
    | {
        benchmark: "otel-cost",
        description: "Closed-loop HTTP/1.1 keep-alive load on POST /functions/{id}/invoke of a trivial add(i32,i32) module: the same release build without trace export (off) and exporting every request (on: OTEL_TRACES_SAMPLER=always_on, OTLP/HTTP protobuf to a loopback receiver answering at once), interleaved per round, the order alternating. Servers, receiver and load generator share the machine.",
        date: $date, timestamp_utc: $timestamp, commit: $commit, git_uncommitted_paths: $dirty,
        machine: {nproc: $nproc, uname: $uname, cpu_model: $cpu, isa: $isa},
        command: $command,
        config: {rounds: $rounds, round_seconds: $round_s, connections: $connections, request_body: $body},
        rounds: $r,
        summary: {
          off: {req_per_s: ($a | stats(.req_per_s)), p50_us: ($a | stats(.p50_us)),
                p99_us: ($a | stats(.p99_us)), errors_total: ($a | map(.errors) | add),
                cpu_us_per_req: cpu($a)},
          on: {req_per_s: ($b | stats(.req_per_s)), p50_us: ($b | stats(.p50_us)),
               p99_us: ($b | stats(.p99_us)), errors_total: ($b | map(.errors) | add),
               cpu_us_per_req: cpu($b)},
          ratio_req_per_s_on_over_off: {
            per_round: ($r | map(.on.req_per_s / .off.req_per_s | r3)),
            median: ($r | map(.on.req_per_s / .off.req_per_s) | median | r3)},
          ratio_p50_on_over_off: ($r | map(.on.p50_us / .off.p50_us) | median | r3),
          spans_exported: $exported, spans_dropped: $dropped,
          receiver: {export_requests: $sink_requests, bytes: $sink_bytes}
        }
      }' "$rounds_file" >"$out"
jq -r '"on/off req/s (median of rounds): \(.summary.ratio_req_per_s_on_over_off.median); off \(.summary.off.req_per_s.median) req/s, on \(.summary.on.req_per_s.median) req/s; p50 on/off \(.summary.ratio_p50_on_over_off); spans exported \(.summary.spans_exported), dropped \(.summary.spans_dropped)"' "$out"
echo "wrote $out" >&2
