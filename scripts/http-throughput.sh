#!/usr/bin/env bash
# HTTP throughput of `tensor-wasm serve` (the real server: default limits,
# metrics, request ids, tracing) against the minimal axum + wasmtime reference
# server of crates/tensor-wasm-bench, both invoking the same trivial `add`
# module with the same request, measured interleaved (A B A B ...) in one run
# by the in-repo load generator.
#
# Writes bench-results/http-throughput/<YYYY-MM-DD>.json (<date>-N.json for
# later runs the same day) and a copy as latest.json.
# Knobs (environment): ROUNDS (5), ROUND_S (5), CONNECTIONS (16),
# WARMUP_S (2), LOADGEN_THREADS (1), AUTH (on: bearer tokens checked on every
# request, as deployed; off: `serve --insecure-no-auth`, the same server with
# quotas, limits and metrics but no token check), INLINE (on: the default,
# short import-free calls run on the server's async threads; off:
# `serve --no-inline-calls`, every call handed to the blocking pool as the
# minimal server does), PEER (floor: the default, `minimal-server --floor`,
# the server's own engine configuration with epochs and the call inline, the
# honest floor, target ratio 1.0; minimal: the older peer, a plain pooling
# engine and spawn_blocking, target 0.8), BASELINE_BIN (another build of
# `tensor-wasm`, run with the same flags and measured in the same rounds:
# A B A' per round, for an A/B of two commits). With `perf` on the PATH each
# measurement also records the server's CPU time per request (`perf stat -e
# task-clock` of the server process over the measured seconds, divided by
# the requests answered): `cpu_us_per_req`, the cost of a request on the
# server's side, less sensitive than req/s to the load generator sharing the
# cores. Loopback only; every server is killed on exit.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
ROUND_S=${ROUND_S:-5}
CONNECTIONS=${CONNECTIONS:-16}
WARMUP_S=${WARMUP_S:-2}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
AUTH=${AUTH:-on}
case $AUTH in on | off) ;; *) echo "AUTH must be on or off" >&2; exit 2 ;; esac
INLINE=${INLINE:-on}
case $INLINE in on | off) ;; *) echo "INLINE must be on or off" >&2; exit 2 ;; esac
PEER=${PEER:-floor}
case $PEER in
    floor) TARGET_RATIO=1.0 ;;
    minimal) TARGET_RATIO=0.8 ;;
    *) echo "PEER must be floor or minimal" >&2; exit 2 ;;
esac
BASELINE_BIN=${BASELINE_BIN:-}
# What the baseline build is (a commit, say), recorded in the run file.
BASELINE_LABEL=${BASELINE_LABEL:-}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command_line="ROUNDS=$ROUNDS ROUND_S=$ROUND_S CONNECTIONS=$CONNECTIONS WARMUP_S=$WARMUP_S LOADGEN_THREADS=$LOADGEN_THREADS AUTH=$AUTH INLINE=$INLINE PEER=$PEER${BASELINE_BIN:+ BASELINE_BIN=<another build>} bash scripts/http-throughput.sh"

for tool in cargo curl jq; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done

echo "== building release binaries" >&2
cargo build --release -p tensor-wasm-cli -p tensor-wasm-bench --bins >&2
bin=$root/target/release
# What was built: taken now, so a commit landing during the run is not misattributed.
git_commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git_dirty=$(git status --porcelain 2>/dev/null | sed 's/^...//' | jq -R . | jq -cs .)

tmp=$(mktemp -d)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a server in the background (in this shell, so the trap knows its
# pid), waits for its "listening on http://ADDR" line and sets $addr.
# $1 names its log files under $tmp.
start_server() {
    local name=$1
    shift
    "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
    local _
    addr=""
    for _ in $(seq 1 200); do
        addr=$(grep -o 'listening on http://[0-9.:]*' "$tmp/$name.out" 2>/dev/null | head -n1 | sed 's|.*http://||' || true)
        [ -n "$addr" ] && break
        sleep 0.05
    done
    if [ -z "$addr" ]; then
        echo "$name did not start; its stderr:" >&2
        cat "$tmp/$name.err" >&2
        exit 1
    fi
}

cat >"$tmp/add.wat" <<'WAT'
(module
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add))
WAT
body='{"export":"add","args":[1,2]}'

# Starts `$2 serve` as server $1 with the run's flags, raises the default
# tenant's rate quota, deploys add.wat and sets $served_url and $served_token.
start_tensor_wasm() {
    local name=$1 binary=$2 data=$tmp/$1-data
    local cmd=(env -u RUST_LOG "$binary" serve --listen 127.0.0.1:0 --data-dir "$data")
    if [ "$AUTH" = off ]; then
        cmd+=(--insecure-no-auth)
    fi
    if [ "$INLINE" = off ]; then
        cmd+=(--no-inline-calls)
    fi
    start_server "$name" "${cmd[@]}"
    local at=$addr _ token admin tenant
    for _ in $(seq 1 200); do
        curl -sf "http://$at/readyz" >/dev/null && break
        sleep 0.05
    done
    curl -sf "http://$at/readyz" >/dev/null || { echo "$name never became ready" >&2; exit 1; }
    if [ "$AUTH" = on ]; then
        token=$(jq -r .tenant_token "$data/credentials.json")
        admin=$(jq -r .admin_token "$data/credentials.json")
        tenant=$(jq -r .tenant_id "$data/credentials.json")
    else
        # No token is checked; the default tenant (and its quotas) serves every request.
        token=unused admin=unused
        tenant=$(curl -sf "http://$at/tenants" | jq -r '.tenants[] | select(.name == "default") | .id')
    fi
    # The default tenant's rate quota (1000 req/s) would cap the run: raise it
    # far above what the machine can do, keeping the token bucket on the path.
    curl -sf -X PATCH -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
        -d '{"quotas":{"requests_per_second":10000000,"burst":10000000}}' \
        "http://$at/tenants/$tenant" >/dev/null
    local deployed
    deployed=$(curl -sf -H "Authorization: Bearer $token" -H 'content-type: application/wasm' \
        --data-binary @"$tmp/add.wat" "http://$at/functions?name=add")
    served_url="http://$at/functions/$(jq -r .id <<<"$deployed")/invoke"
    served_token=$token
}

echo "== starting tensor-wasm serve" >&2
start_tensor_wasm tensor-wasm "$bin/tensor-wasm"
tw_url=$served_url
tw_pid=${pids[-1]}
# The default tenant's token, which the load generator sends to every server
# (the minimal one ignores it), so all parse the same request bytes.
token=$served_token
fn_id=${tw_url#*/functions/}
fn_id=${fn_id%/invoke}
if [ -n "$BASELINE_BIN" ]; then
    echo "== starting the baseline build ($BASELINE_BIN)" >&2
    baseline_commit=${BASELINE_LABEL:-$("$BASELINE_BIN" --version 2>/dev/null | head -n1 || echo unknown)}
    start_tensor_wasm baseline "$BASELINE_BIN"
    bl_url=$served_url
    bl_pid=${pids[-1]}
    bl_token=$served_token
fi

echo "== starting minimal-server ($PEER)" >&2
min_cmd=("$bin/minimal-server" --listen 127.0.0.1:0 --module "$tmp/add.wat")
if [ "$PEER" = floor ]; then
    min_cmd+=(--floor)
fi
start_server minimal "${min_cmd[@]}"
min_pid=${pids[-1]}
min_addr=$addr
min_url="http://$min_addr/functions/$fn_id/invoke"

# Every server must answer the same thing before anything is timed.
for url in "$tw_url" "$min_url" ${BASELINE_BIN:+"$bl_url"}; do
    bearer=$token
    [ "$url" = "${bl_url:-}" ] && bearer=$bl_token
    answer=$(curl -sf -H "Authorization: Bearer $bearer" -H 'content-type: application/json' -d "$body" "$url")
    if [ "$(jq -c . <<<"$answer")" != '{"results":[3]}' ]; then
        echo "unexpected answer from $url: $answer" >&2
        exit 1
    fi
done

loadgen() { # url seconds [bearer]
    LOADGEN_BEARER=${3:-$token} "$bin/loadgen" --url "$1" --connections "$CONNECTIONS" \
        --duration-s "$2" --threads "$LOADGEN_THREADS" --body "$body"
}

# `loadgen` while `perf stat` counts server $4's CPU time: the load
# generator's line with `cpu_us_per_req` added (null without perf).
measured() { # url seconds bearer pid
    if ! command -v perf >/dev/null; then
        loadgen "$1" "$2" "$3" | jq -c '. + {cpu_us_per_req: null}'
        return
    fi
    perf stat -x, -e task-clock -p "$4" -o "$tmp/perf-stat" -- sleep "$2" &
    local stat_pid=$! result cpu_ms
    result=$(loadgen "$1" "$2" "$3")
    wait "$stat_pid"
    cpu_ms=$(awk -F, '/task-clock/ {print $1}' "$tmp/perf-stat")
    jq -c --argjson cpu_ms "${cpu_ms:-null}" \
        '. + {cpu_us_per_req: (if $cpu_ms == null or .requests == 0 then null
                               else ($cpu_ms * 1000 / .requests * 100 | round / 100) end)}' <<<"$result"
}

echo "== warm-up ${WARMUP_S}s each" >&2
warm_tw=$(loadgen "$tw_url" "$WARMUP_S")
warm_min=$(loadgen "$min_url" "$WARMUP_S")
warm_bl=null
if [ -n "$BASELINE_BIN" ]; then
    warm_bl=$(loadgen "$bl_url" "$WARMUP_S" "$bl_token")
fi

rounds_file=$tmp/rounds.jsonl
: >"$rounds_file"
for round in $(seq 1 "$ROUNDS"); do
    a=$(measured "$tw_url" "$ROUND_S" "$token" "$tw_pid")
    b=$(measured "$min_url" "$ROUND_S" "$token" "$min_pid")
    c=null
    if [ -n "$BASELINE_BIN" ]; then
        c=$(measured "$bl_url" "$ROUND_S" "$bl_token" "$bl_pid")
        echo "round $round: baseline    $c" >&2
    fi
    echo "round $round: tensor-wasm $a" >&2
    echo "round $round: minimal     $b" >&2
    jq -cn --argjson round "$round" --argjson a "$a" --argjson b "$b" --argjson c "$c" \
        '{round: $round, tensor_wasm: $a, minimal: $b} + (if $c == null then {} else {baseline: $c} end)' \
        >>"$rounds_file"
done

date_utc=$(date -u +%F)
out_dir=$root/bench-results/http-throughput
mkdir -p "$out_dir"
# A second run on the same day keeps the first: <date>-2.json, <date>-3.json, ...
out=$out_dir/$date_utc.json
n=2
while [ -e "$out" ]; do
    out=$out_dir/$date_utc-$n.json
    n=$((n + 1))
done

jq -s \
    --arg date "$date_utc" \
    --arg timestamp "$(date -u +%FT%TZ)" \
    --arg commit "$git_commit" \
    --argjson dirty "$git_dirty" \
    --argjson nproc "$(nproc)" \
    --arg uname "$(uname -srm)" \
    --arg cpu "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')" \
    --arg command "$command_line" \
    --arg tw_cmd "tensor-wasm serve --listen 127.0.0.1:0 --data-dir <tmp>$([ "$AUTH" = off ] && echo ' --insecure-no-auth')$([ "$INLINE" = off ] && echo ' --no-inline-calls') (defaults otherwise, RUST_LOG unset; auth $AUTH, inline calls $INLINE)" \
    --arg min_cmd "minimal-server --listen 127.0.0.1:0 --module add.wat$([ "$PEER" = floor ] && echo ' --floor')" \
    --arg peer "$PEER" \
    --arg baseline_bin "${BASELINE_BIN:+$(basename "$BASELINE_BIN") (${baseline_commit:-unknown})}" \
    --argjson warm_bl "$warm_bl" \
    --arg loadgen_cmd "loadgen --url <server>/functions/<id>/invoke --connections $CONNECTIONS --duration-s $ROUND_S --threads $LOADGEN_THREADS --body '$body'" \
    --arg module_wat "$(cat "$tmp/add.wat")" \
    --arg body "$body" \
    --argjson rounds "$ROUNDS" --argjson round_s "$ROUND_S" \
    --argjson connections "$CONNECTIONS" --argjson warmup_s "$WARMUP_S" \
    --argjson threads "$LOADGEN_THREADS" \
    --argjson warm_tw "$warm_tw" --argjson warm_min "$warm_min" \
    --argjson target "$TARGET_RATIO" '
    def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                       else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def stats(f): map(f) | {median: median, min: min, max: max};
    def r3: . * 1000 | round / 1000;
    def cpu(xs): if (xs | map(.cpu_us_per_req) | any(. == null)) then null
                 else xs | stats(.cpu_us_per_req) end;
    . as $r
    | ($r | map(.tensor_wasm)) as $a
    | ($r | map(.minimal)) as $b
    | ($a | stats(.req_per_s)) as $a_rps
    | ($b | stats(.req_per_s)) as $b_rps
    | ($a_rps.median / $b_rps.median | r3) as $ratio
    | {
        benchmark: "http-throughput",
        description: "Closed-loop HTTP/1.1 keep-alive load on POST /functions/{id}/invoke of a trivial add(i32,i32) module: tensor-wasm serve (A) against the minimal axum + wasmtime reference server (B; peer_mode floor: the server'"'"'s engine configuration, epochs, the call inline; minimal: plain pooling engine, spawn_blocking), interleaved A B A B in one run (A B A'"'"' with a baseline build). Server and load generator share the machine.",
        peer_mode: $peer,
        date: $date,
        timestamp_utc: $timestamp,
        git_commit: $commit,
        git_uncommitted_paths: $dirty,
        machine: {nproc: $nproc, uname: $uname, cpu_model: $cpu},
        command: $command,
        config: {rounds: $rounds, round_seconds: $round_s, connections: $connections,
                 warmup_seconds: $warmup_s, loadgen_threads: $threads,
                 request_body: $body, module_wat: $module_wat},
        servers: {tensor_wasm: $tw_cmd, minimal: $min_cmd},
        loadgen: $loadgen_cmd,
        warmup: {tensor_wasm: $warm_tw, minimal: $warm_min},
        rounds: $r,
        summary: {
          tensor_wasm: {req_per_s: $a_rps, p50_us: ($a | stats(.p50_us)),
                        p99_us: ($a | stats(.p99_us)), errors_total: ($a | map(.errors) | add),
                        cpu_us_per_req: cpu($a)},
          minimal: {req_per_s: $b_rps, p50_us: ($b | stats(.p50_us)),
                    p99_us: ($b | stats(.p99_us)), errors_total: ($b | map(.errors) | add),
                    cpu_us_per_req: cpu($b)}
        },
        ratio_req_per_s_tensor_wasm_over_minimal: {
          median: $ratio,
          definition: "median req/s of tensor_wasm / median req/s of minimal",
          per_round: ($r | map(.tensor_wasm.req_per_s / .minimal.req_per_s | r3)),
          per_round_median: ($r | map(.tensor_wasm.req_per_s / .minimal.req_per_s) | median | r3)
        },
        target: {ratio_at_least: $target, met: ($ratio >= $target)}
      }
    + (if ($r[0].baseline // null) == null then {} else
        ($r | map(.baseline)) as $c
        | {baseline: {binary: $baseline_bin, warmup: $warm_bl,
                      req_per_s: ($c | stats(.req_per_s)), p50_us: ($c | stats(.p50_us)),
                      p99_us: ($c | stats(.p99_us)), errors_total: ($c | map(.errors) | add),
                      cpu_us_per_req: cpu($c)},
           ratio_req_per_s_tensor_wasm_over_baseline: {
             per_round: ($r | map(.tensor_wasm.req_per_s / .baseline.req_per_s | r3)),
             per_round_median: ($r | map(.tensor_wasm.req_per_s / .baseline.req_per_s) | median | r3)}}
      end)' "$rounds_file" >"$out"
cp "$out" "$out_dir/latest.json"

jq -r '"ratio tensor-wasm/minimal (median req/s): \(.ratio_req_per_s_tensor_wasm_over_minimal.median)  tensor-wasm \(.summary.tensor_wasm.req_per_s.median) req/s, minimal \(.summary.minimal.req_per_s.median) req/s; target >= \(.target.ratio_at_least): \(.target.met)"' "$out"
echo "wrote $out and $out_dir/latest.json" >&2
