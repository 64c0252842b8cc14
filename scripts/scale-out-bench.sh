#!/usr/bin/env bash
# Scale-out bench: HTTP invoke throughput of `tensor-wasm serve` over the shared store
# (PostgreSQL + S3) against the same binary over its local data dir, measured interleaved
# (local, shared, local, shared ...) in one run by the in-repo load generator; deploy latency
# p50/p99 in both modes; invalidation lag (a deploy on one shared replica until another serves
# it) p50/p99. Starts its own PostgreSQL 15 (Debian's package; as the `postgres` user under root)
# and S3 server (SeaweedFS `weed` from .tools/seaweedfs, `make deps`), on loopback.
#
# Writes bench-results/scale-out/<YYYY-MM-DD>.json (<date>-N.json for later runs that day).
# Knobs (environment): ROUNDS (5), ROUND_S (5), CONNECTIONS (16), WARMUP_S (2), DEPLOYS (50),
# LAG_SAMPLES (30).
set -euo pipefail

ROUNDS=${ROUNDS:-5}
ROUND_S=${ROUND_S:-5}
CONNECTIONS=${CONNECTIONS:-16}
WARMUP_S=${WARMUP_S:-2}
DEPLOYS=${DEPLOYS:-50}
LAG_SAMPLES=${LAG_SAMPLES:-30}
TARGET_RATIO=0.95

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command_line="ROUNDS=$ROUNDS ROUND_S=$ROUND_S CONNECTIONS=$CONNECTIONS WARMUP_S=$WARMUP_S DEPLOYS=$DEPLOYS LAG_SAMPLES=$LAG_SAMPLES bash scripts/scale-out-bench.sh"
for tool in cargo curl jq python3; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done
PG_BIN=/usr/lib/postgresql/15/bin
WEED=$root/.tools/seaweedfs/bin/weed
[ -x "$PG_BIN/initdb" ] && [ -x "$WEED" ] || { echo "PostgreSQL 15 or weed missing: run make deps" >&2; exit 1; }

echo "== building release binaries" >&2
cargo build --release -p tensor-wasm-cli -p tensor-wasm-bench --bins >&2
bin=$root/target/release
git_commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git_dirty=$(git status --porcelain 2>/dev/null | sed 's/^...//' | jq -R . | jq -cs .)

tmp=$(mktemp -d)
chmod 755 "$tmp"
pids=()
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    [ -f "$tmp/pg/data/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$tmp/pg/data" stop -m immediate >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
free_pair() { # a port p in 20000..44999 with p + 10000 free too (weed's gRPC ports)
    python3 -c '
import random, socket
for _ in range(1000):
    p = random.randrange(20000, 45000)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass'
}

echo "== starting PostgreSQL and the S3 server" >&2
mkdir -p "$tmp/pg"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$tmp/pg"
pg_port=$(free_port)
as_pg "$PG_BIN/initdb" -D "$tmp/pg/data" -A trust -U tw >/dev/null
as_pg "$PG_BIN/pg_ctl" -D "$tmp/pg/data" -l "$tmp/pg/log" -w start \
    -o "-p $pg_port -k $tmp/pg -c listen_addresses=127.0.0.1" >/dev/null
"$PG_BIN/createdb" -h 127.0.0.1 -p "$pg_port" -U tw bench
store=postgres://tw@127.0.0.1:$pg_port/bench
s3=$(free_pair) master=$(free_pair) volume=$(free_pair) filer=$(free_pair)
mkdir -p "$tmp/s3"
"$WEED" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$tmp/s3" -s3 -s3.port="$s3" \
    -s3.port.iceberg=0 -s3.port.lance=0 -master.port="$master" -volume.port="$volume" \
    -filer.port="$filer" -volume.max=20 >"$tmp/s3.log" 2>&1 &
pids+=($!)
s3_up=""
for _ in $(seq 1 300); do
    if curl -sf -X PUT "http://127.0.0.1:$s3/tw-bench" >/dev/null; then s3_up=1; break; fi
    sleep 0.2
done
[ -n "$s3_up" ] || { echo "the S3 server did not start" >&2; exit 1; }
export AWS_ENDPOINT=http://127.0.0.1:$s3 AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 \
    AWS_ACCESS_KEY_ID=tensor-wasm-bench AWS_SECRET_ACCESS_KEY=tensor-wasm-bench

start_server() { # name data-dir [args]: sets $addr
    local name=$1 dir=$2
    shift 2
    env -u RUST_LOG "$bin/tensor-wasm" serve --listen 127.0.0.1:0 --data-dir "$dir" "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
    addr=""
    for _ in $(seq 1 400); do
        addr=$(grep -o 'listening on http://[0-9.:]*' "$tmp/$name.out" 2>/dev/null | head -n1 | sed 's|.*http://||' || true)
        [ -n "$addr" ] && curl -sf "http://$addr/readyz" >/dev/null && break
        sleep 0.05
    done
    curl -sf "http://$addr/readyz" >/dev/null || { echo "$name did not start:" >&2; cat "$tmp/$name.err" >&2; exit 1; }
}

echo "== starting the servers" >&2
start_server local "$tmp/local"
local_addr=$addr
start_server shared "$tmp/shared" --store "$store" --blob-store s3://tw-bench/bench
shared_addr=$addr
cp "$tmp/shared/credentials.json" "$tmp/follower-credentials.json"
mkdir -p "$tmp/follower" && cp "$tmp/follower-credentials.json" "$tmp/follower/credentials.json"
start_server follower "$tmp/follower" --store "$store" --blob-store s3://tw-bench/bench
follower_addr=$addr

cat >"$tmp/add.wat" <<'WAT'
(module
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add))
WAT
body='{"export":"add","args":[1,2]}'
setup() { # addr data-dir: raises the rate quota, deploys add, prints the invoke URL
    local addr=$1 dir=$2 token admin tenant id
    token=$(jq -r .tenant_token "$dir/credentials.json")
    admin=$(jq -r .admin_token "$dir/credentials.json")
    tenant=$(jq -r .tenant_id "$dir/credentials.json")
    curl -sf -X PATCH -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
        -d '{"quotas":{"requests_per_second":10000000,"burst":10000000,"max_functions":100000}}' \
        "http://$addr/tenants/$tenant" >/dev/null
    id=$(curl -sf -H "Authorization: Bearer $token" -H 'content-type: application/wasm' \
        --data-binary @"$tmp/add.wat" "http://$addr/functions?name=add" | jq -r .id)
    echo "http://$addr/functions/$id/invoke"
}
local_url=$(setup "$local_addr" "$tmp/local")
shared_url=$(setup "$shared_addr" "$tmp/shared")
local_token=$(jq -r .tenant_token "$tmp/local/credentials.json")
shared_token=$(jq -r .tenant_token "$tmp/shared/credentials.json")

loadgen() { # url token seconds
    LOADGEN_BEARER=$2 "$bin/loadgen" --url "$1" --connections "$CONNECTIONS" --duration-s "$3" \
        --threads 1 --body "$body"
}
echo "== throughput: warm-up, then $ROUNDS interleaved rounds of ${ROUND_S}s" >&2
loadgen "$local_url" "$local_token" "$WARMUP_S" >/dev/null
loadgen "$shared_url" "$shared_token" "$WARMUP_S" >/dev/null
rounds=$tmp/rounds.jsonl
: >"$rounds"
for round in $(seq 1 "$ROUNDS"); do
    a=$(loadgen "$local_url" "$local_token" "$ROUND_S")
    b=$(loadgen "$shared_url" "$shared_token" "$ROUND_S")
    echo "round $round: local $a / shared $b" >&2
    jq -cn --argjson round "$round" --argjson a "$a" --argjson b "$b" \
        '{round: $round, local: $a, shared: $b}' >>"$rounds"
done

deploy_times() { # addr token: $DEPLOYS deploy latencies in seconds, one per line
    local i
    for i in $(seq 1 "$DEPLOYS"); do
        curl -sf -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $2" \
            -H 'content-type: application/wasm' --data-binary @"$tmp/add.wat" \
            "http://$1/functions?name=latency-$i"
    done
}
echo "== deploy latency, $DEPLOYS each" >&2
deploy_times "$local_addr" "$local_token" >"$tmp/deploy-local.txt"
deploy_times "$shared_addr" "$shared_token" >"$tmp/deploy-shared.txt"

echo "== invalidation lag, $LAG_SAMPLES samples" >&2
: >"$tmp/lag.txt"
for i in $(seq 1 "$LAG_SAMPLES"); do
    start=$(date +%s.%N)
    id=$(curl -sf -H "Authorization: Bearer $shared_token" -H 'content-type: application/wasm' \
        --data-binary @"$tmp/add.wat" "http://$shared_addr/functions?name=lag-$i" | jq -r .id)
    acked=$(date +%s.%N)
    until curl -sf -o /dev/null -H "Authorization: Bearer $shared_token" -H 'content-type: application/json' \
        -d "$body" "http://$follower_addr/functions/$id/invoke"; do :; done
    seen=$(date +%s.%N)
    echo "$start $acked $seen" >>"$tmp/lag.txt"
done

out_dir=$root/bench-results/scale-out
mkdir -p "$out_dir"
date_utc=$(date -u +%F)
out=$out_dir/$date_utc.json
n=2
while [ -e "$out" ]; do out=$out_dir/$date_utc-$n.json; n=$((n + 1)); done
TW_TIMESTAMP=$(date -u +%FT%TZ) TW_COMMIT=$git_commit TW_DIRTY=$git_dirty TW_CORES=$(nproc) \
TW_CPU=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') TW_UNAME=$(uname -srm) \
TW_COMMAND=$command_line TW_BODY=$body TW_CONNECTIONS=$CONNECTIONS TW_ROUND_S=$ROUND_S \
TW_TARGET=$TARGET_RATIO \
python3 - "$out" "$rounds" "$tmp/deploy-local.txt" "$tmp/deploy-shared.txt" "$tmp/lag.txt" <<'PY'
import json, os, statistics, sys
out, rounds_path, dl, ds, lag = sys.argv[1:]
env = os.environ
rounds = [json.loads(l) for l in open(rounds_path)]
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
def lat(path):
    xs = [float(l) for l in open(path) if l.strip()]
    return {"samples": len(xs), "p50_s": pct(xs, 50), "p99_s": pct(xs, 99), "max_s": max(xs)}
lags = [float(seen) - float(acked) for _, acked, seen in (l.split() for l in open(lag))]
ratios = [r["shared"]["req_per_s"] / r["local"]["req_per_s"] for r in rounds]
doc = {
    "kind": "scale-out",
    "timestamp_utc": env["TW_TIMESTAMP"],
    "git_commit": env["TW_COMMIT"],
    "git_dirty": json.loads(env["TW_DIRTY"]),
    "machine": {"cores": int(env["TW_CORES"]), "cpu": env["TW_CPU"], "uname": env["TW_UNAME"]},
    "command": env["TW_COMMAND"],
    "servers": "tensor-wasm serve (release, defaults, RUST_LOG unset): local = --data-dir only; "
               "shared = --store postgres://... --blob-store s3://... (PostgreSQL 15 and SeaweedFS "
               "weed on loopback); follower = a second shared replica",
    "loadgen": f"loadgen --connections {env['TW_CONNECTIONS']} --duration-s {env['TW_ROUND_S']} "
               f"--threads 1 --body '{env['TW_BODY']}' (bearer token, add module)",
    "rounds": rounds,
    "ratio_req_per_s_shared_over_local": {"per_round": ratios, "median": statistics.median(ratios),
                                          "min": min(ratios), "max": max(ratios)},
    "target_ratio": float(env["TW_TARGET"]),
    "deploy_latency": {"local": lat(dl), "shared": lat(ds)},
    "invalidation_lag_s": {"samples": len(lags), "p50_s": pct(lags, 50), "p99_s": pct(lags, 99),
                           "max_s": max(lags),
                           "how": "from a deploy acknowledged by one shared replica until the "
                                  "follower replica answers an invocation of it (curl polling)"},
}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(out)
PY
