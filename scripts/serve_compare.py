#!/usr/bin/env python3
"""`make serve-compare`: the same `wasi:http` components served by `wasmtime serve` (the
reference host: wasmtime-cli of the wasmtime version TensorWasm embeds, installed into
.tools/bin by this script when missing) and by `tensor-wasm serve`.

1. A list of requests (methods, paths, queries, headers, JSON, a large body, a streamed
   request body, a streamed response, the handler's own error statuses) is sent to both
   hosts running the Python handler (examples/components/python/http_app.py) and the C
   handler (examples/components/c/http.c); status, content type and body must be identical.
   Two requests whose answer the host makes (the handler traps; it sets a wasi:http error
   code) are recorded for both hosts, not compared: docs/components.md says what TensorWasm
   answers.
2. Throughput of the C handler's hello-world route: closed-loop keep-alive load by the
   in-repo load generator, interleaved (TensorWasm, wasmtime serve, ...) for ROUNDS rounds.

3. With BASELINE_BIN (the `tensor-wasm` binary of another commit, built by the caller), that
   server is started the same way and its hello-world route joins every round, so this
   commit's throughput is compared with that commit's in the same run (an A/B).

Writes bench-results/serve-compare/<date>[-N].json. Exits 1 when an answer differs.
Knobs (environment): ROUNDS (5), ROUND_S (5), CONNECTIONS (16), WARMUP_S (2), BASELINE_BIN
(unset), BASELINE_COMMIT (what BASELINE_BIN was built from, recorded in the run file).
"""

import datetime
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WASMTIME_VERSION = "48.0.8"
WASMTIME = ROOT / ".tools/bin/wasmtime"
ROUNDS = int(os.environ.get("ROUNDS", "5"))
ROUND_S = int(os.environ.get("ROUND_S", "5"))
CONNECTIONS = int(os.environ.get("CONNECTIONS", "16"))
WARMUP_S = int(os.environ.get("WARMUP_S", "2"))
BASELINE_BIN = os.environ.get("BASELINE_BIN")
BASELINE_COMMIT = os.environ.get("BASELINE_COMMIT", "unknown")


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def ensure_wasmtime():
    try:
        out = subprocess.run([WASMTIME, "--version"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        out = ""
    if f"wasmtime {WASMTIME_VERSION}" not in out:
        print(f"installing wasmtime-cli {WASMTIME_VERSION} into .tools (long, once) ...",
              file=sys.stderr)
        run(["cargo", "install", "--quiet", "--locked", "--root", ROOT / ".tools",
             "wasmtime-cli", "--version", f"={WASMTIME_VERSION}", "--no-default-features",
             "--features",
             "run,serve,component-model-async,cranelift,pooling-allocator,parallel-compilation"])


def wasi_http_wit() -> Path:
    host = re.search(r"^host: (\S+)", subprocess.run(
        ["rustc", "-vV"], capture_output=True, text=True, check=True).stdout, re.M).group(1)
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--offline", "--filter-platform", host],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    manifest = next(p["manifest_path"] for p in meta["packages"]
                    if p["name"] == "wasmtime-wasi-http")
    return Path(manifest).parent / "wit"


def build_components(tmp: Path):
    wit = wasi_http_wit()
    package = re.search(r"^package (\S+)@(\S+);", (wit / "deps/http.wit").read_text(), re.M)
    world = f"{package.group(1)}/proxy@{package.group(2)}"
    py = tmp / "http-python.wasm"
    run([ROOT / ".tools/componentize-py/bin/componentize-py", "-d", wit, "-w", world,
         "componentize", "-p", ROOT / "examples/components/python", "http_app", "-o", py])
    gen = tmp / "c-bindings"
    run([ROOT / ".tools/bin/wit-bindgen", "c", wit, "--world", world, "--out-dir", gen])
    core = tmp / "http-c.core.wasm"
    run(["clang", "--target=wasm32-wasi", "-O2", "-mexec-model=reactor", "-I", gen,
         ROOT / "examples/components/c/http.c", gen / "proxy.c",
         gen / "proxy_component_type.o", "-o", core])
    c = tmp / "http-c.wasm"
    run([ROOT / ".tools/bin/wasm-tools", "component", "new", core, "-o", c])
    return {"python": py, "c": c}, world


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, path: str = "/", timeout: float = 60.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing answers on port {port}")


def request(port, method, path, headers=None, body=None, chunks=None):
    """One request on a fresh connection: (status, content type, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = dict(headers or {})
    if chunks is not None:
        conn.putrequest(method, path)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("transfer-encoding", "chunked")
        conn.endheaders()
        for chunk in chunks:
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    else:
        conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, response.getheader("content-type"), data


def request_list():
    """(name, method, path, headers, body, chunks); the handler makes every answer."""
    large = bytes((i * 7) % 251 for i in range(900_000))
    chunks = [bytes([65 + i % 26]) * 10_000 for i in range(40)]
    x = {"x-request-id": "compare-1", "x-tenant-thing": "blue", "x-other": "two words"}
    return [
        ("hello", "GET", "/hello", {}, None, None),
        ("item with query", "GET", "/items/7?x=1&y=two", {}, None, None),
        ("DELETE", "DELETE", "/items/7", {}, None, None),
        ("PUT", "PUT", "/items/9", {}, b"", None),
        ("PATCH", "PATCH", "/items/3?q", {}, b"{}", None),
        ("handler's 400", "GET", "/items/seven", {}, None, None),
        ("handler's 404", "GET", "/nowhere", {}, None, None),
        ("root", "GET", "/", {}, None, None),
        ("headers", "GET", "/headers", x, None, None),
        ("JSON", "POST", "/sum", {"content-type": "application/json"},
         b'{"numbers": [1, 2, 3.5, -4]}', None),
        ("bad JSON", "POST", "/sum", {"content-type": "application/json"}, b"{nope", None),
        ("large body echoed", "PUT", "/echo", {"content-type": "application/x-test"}, large, None),
        ("streamed request body", "POST", "/echo", {"content-type": "text/plain"}, None, chunks),
        ("streamed response", "GET", "/stream?n=500", {}, None, None),
    ]


C_REQUESTS = [
    ("hello", "GET", "/hello", {}, None, None),
    ("item", "GET", "/items/42?x=1", {}, None, None),
    ("item by POST", "POST", "/items/5", {}, b"ignored", None),
    ("handler's 404", "GET", "/nowhere", {}, None, None),
    ("large body echoed", "POST", "/echo", {}, bytes(range(256)) * 2000, None),
]

HOST_ANSWERED = [("trap", "GET", "/boom"), ("wasi:http error code", "GET", "/fail")]


def summary(answer):
    status, ctype, body = answer
    shown = body.decode("utf-8", "replace") if len(body) <= 200 else None
    return {"status": status, "content_type": ctype, "body_bytes": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(), "body": shown}


def compare(tw_port, tw_prefix, tw_auth, wt_port, requests):
    rows, same = [], True
    for name, method, path, headers, body, chunks in requests:
        ours = request(tw_port, method, tw_prefix + path, {**headers, **tw_auth}, body, chunks)
        theirs = request(wt_port, method, path, headers, body, chunks)
        equal = ours == theirs
        same &= equal
        rows.append({"name": name, "method": method, "path": path,
                     "request_body_bytes": len(body or b"") + sum(map(len, chunks or [])),
                     "streamed_request": chunks is not None, "identical": equal,
                     "tensor_wasm": summary(ours), "wasmtime_serve": summary(theirs)})
        print(f"{'same' if equal else 'DIFFERENT'}: {method} {path}", file=sys.stderr)
    return rows, same


def loadgen(url, seconds, bearer):
    out = subprocess.run(
        [ROOT / "target/release/loadgen", "--url", url, "--connections", str(CONNECTIONS),
         "--duration-s", str(seconds), "--body", "", "--content-type", "text/plain"],
        capture_output=True, text=True, check=True, env={**os.environ, "LOADGEN_BEARER": bearer})
    return json.loads(out.stdout)


def start_tensor_wasm(binary, data, components, procs, err):
    """`binary serve` on a free port with its data in `data` (appended to `procs`), the
    tenant's quotas raised, `components` deployed: its port, their ids, its credentials."""
    port = free_port()
    procs.append(subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
        stdout=subprocess.DEVNULL, stderr=open(err, "w"),
        env={k: v for k, v in os.environ.items() if k != "RUST_LOG"}))
    wait_http(port, "/readyz")
    creds = json.loads((data / "credentials.json").read_text())
    auth = {"authorization": f"Bearer {creds['tenant_token']}"}
    admin = {"authorization": f"Bearer {creds['admin_token']}",
             "content-type": "application/json"}
    # Room for the load: the quotas' refusals are answers too, but fast ones.
    quotas = json.dumps({"quotas": {
        "requests_per_second": 10_000_000, "burst": 10_000_000,
        "max_concurrent_invocations": 100_000, "max_live_instances": 100_000,
        "max_guest_memory_bytes": 1 << 44, "max_gpu_memory_bytes": 1 << 44}}).encode()
    status, _, text = request(port, "PATCH", f"/tenants/{creds['tenant_id']}", admin, quotas)
    assert status == 200, text
    ids = {}
    for kind, wasm in components.items():
        status, _, text = request(
            port, "POST",
            f"/functions?name=http-{kind}&timeout_ms=30000&memory_limit_bytes={64 << 20}",
            {**auth, "content-type": "application/wasm"}, wasm.read_bytes())
        assert status == 201, text
        ids[kind] = json.loads(text)["id"]
    return port, ids, creds


def median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def main():
    ensure_wasmtime()
    run(["cargo", "build", "--release", "-p", "tensor-wasm-cli", "-p", "tensor-wasm-bench",
         "--bins"], cwd=ROOT)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                           cwd=ROOT).stdout.split("\n")
    tmp = Path(tempfile.mkdtemp())
    procs = []
    try:
        components, world = build_components(tmp)
        tw_port, ids, creds = start_tensor_wasm(ROOT / "target/release/tensor-wasm",
                                                tmp / "data", components, procs, tmp / "tw.err")
        auth = {"authorization": f"Bearer {creds['tenant_token']}"}
        baseline = None
        if BASELINE_BIN:
            port, base_ids, base_creds = start_tensor_wasm(
                Path(BASELINE_BIN), tmp / "baseline-data", components, procs,
                tmp / "baseline.err")
            baseline = (f"http://127.0.0.1:{port}/functions/{base_ids['c']}/http/hello",
                        base_creds["tenant_token"])
        wt_ports = {}
        for kind, wasm in components.items():
            port = free_port()
            procs.append(subprocess.Popen(
                [WASMTIME, "serve", "-S", "cli", "--addr", f"127.0.0.1:{port}", wasm],
                stdout=subprocess.DEVNULL, stderr=open(tmp / f"wt-{kind}.err", "w")))
            wait_http(port, "/hello")
            wt_ports[kind] = port

        rows, same = compare(tw_port, f"/functions/{ids['python']}/http", auth,
                             wt_ports["python"], request_list())
        c_rows, c_same = compare(tw_port, f"/functions/{ids['c']}/http", auth, wt_ports["c"],
                                 C_REQUESTS)
        host_answered = []
        for name, method, path in HOST_ANSWERED:
            ours = request(tw_port, method, f"/functions/{ids['python']}/http{path}", auth)
            theirs = request(wt_ports["python"], method, path)
            host_answered.append({"name": name, "path": path, "tensor_wasm": summary(ours),
                                  "wasmtime_serve": summary(theirs)})

        tw_url = f"http://127.0.0.1:{tw_port}/functions/{ids['c']}/http/hello"
        wt_url = f"http://127.0.0.1:{wt_ports['c']}/hello"
        bearer = creds["tenant_token"]
        warm = {"tensor_wasm": loadgen(tw_url, WARMUP_S, bearer),
                "wasmtime_serve": loadgen(wt_url, WARMUP_S, bearer)}
        if baseline:
            warm["baseline"] = loadgen(baseline[0], WARMUP_S, baseline[1])
        rounds = []
        for n in range(1, ROUNDS + 1):
            a = loadgen(tw_url, ROUND_S, bearer)
            b = loadgen(wt_url, ROUND_S, bearer)
            row = {"round": n, "tensor_wasm": a, "wasmtime_serve": b}
            line = (f"round {n}: tensor-wasm {a['req_per_s']:.0f} req/s, wasmtime serve "
                    f"{b['req_per_s']:.0f} req/s")
            if baseline:
                row["baseline"] = loadgen(baseline[0], ROUND_S, baseline[1])
                line += f", baseline {row['baseline']['req_per_s']:.0f} req/s"
            print(line, file=sys.stderr)
            rounds.append(row)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    a_rps = [r["tensor_wasm"]["req_per_s"] for r in rounds]
    b_rps = [r["wasmtime_serve"]["req_per_s"] for r in rounds]
    ratio = round(median(a_rps) / median(b_rps), 3)
    errors = {host: sum(r[host]["errors"] for r in rounds) for host in ("tensor_wasm", "wasmtime_serve")}
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    out_dir = ROOT / "bench-results/serve-compare"
    out_dir.mkdir(parents=True, exist_ok=True)
    out, n = out_dir / f"{today}.json", 2
    while out.exists():
        out, n = out_dir / f"{today}-{n}.json", n + 1
    cpu = next((l.split(": ", 1)[1] for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), "unknown")
    result = {
        "benchmark": "serve-compare",
        "description": "The same wasi:http components under wasmtime serve (reference host) "
                       "and tensor-wasm serve: identical answers to a request list, and "
                       "throughput of a hello-world handler (closed-loop HTTP/1.1 keep-alive, "
                       "interleaved rounds; servers and load generator share the machine).",
        "date": today,
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%FT%TZ"),
        "git_commit": commit,
        "git_uncommitted_paths": [l[3:] for l in dirty if l],
        "machine": {"nproc": os.cpu_count(), "uname": " ".join(os.uname()[i] for i in (0, 2, 4)),
                    "cpu_model": cpu},
        "command": f"ROUNDS={ROUNDS} ROUND_S={ROUND_S} CONNECTIONS={CONNECTIONS} "
                   f"WARMUP_S={WARMUP_S} python3 scripts/serve_compare.py",
        "hosts": {
            "wasmtime_serve": f"wasmtime-cli {WASMTIME_VERSION}: wasmtime serve -S cli "
                              "--addr 127.0.0.1:<port> <component> (defaults otherwise)",
            "tensor_wasm": "tensor-wasm serve --listen 127.0.0.1:<port> --data-dir <tmp> "
                           "(defaults; the tenant's rate and concurrency quotas raised); "
                           "requests at /functions/<id>/http/<path> with the tenant's token",
        },
        "world": world,
        "components": {"python": "examples/components/python/http_app.py (componentize-py)",
                       "c": "examples/components/c/http.c (wit-bindgen, clang, wasm-tools)"},
        "compared": "status, content-type and body bytes (the hosts' own response headers, "
                    "date and x-request-id, are not compared)",
        "requests": {"python": rows, "c": c_rows},
        "all_identical": same and c_same,
        "host_answered": host_answered,
        "throughput": {
            "route": {"tensor_wasm": "POST /functions/<id>/http/hello",
                      "wasmtime_serve": "POST /hello"},
            "component": "c",
            "config": {"rounds": ROUNDS, "round_seconds": ROUND_S, "connections": CONNECTIONS,
                       "warmup_seconds": WARMUP_S},
            "warmup": warm,
            "rounds": rounds,
            "median_req_per_s": {"tensor_wasm": median(a_rps), "wasmtime_serve": median(b_rps)},
            "ratio_tensor_wasm_over_wasmtime_serve": ratio,
            "per_round_ratio": [round(a / b, 3) for a, b in zip(a_rps, b_rps)],
            "errors_total": errors,
            "target": {"ratio_at_least": 1.0,
                       "met": ratio >= 1.0 and not any(errors.values())},
        },
    }
    if BASELINE_BIN:
        c_rps = [r["baseline"]["req_per_s"] for r in rounds]
        result["throughput"]["baseline"] = {
            "commit": BASELINE_COMMIT,
            "median_req_per_s": median(c_rps),
            "errors_total": sum(r["baseline"]["errors"] for r in rounds),
            "ratio_tensor_wasm_over_baseline": round(median(a_rps) / median(c_rps), 3),
            "per_round_ratio": [round(a / c, 3) for a, c in zip(a_rps, c_rps)],
        }
        result["command"] = (f"BASELINE_BIN=<{BASELINE_COMMIT} build> BASELINE_COMMIT="
                             f"{BASELINE_COMMIT} " + result["command"])
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"answers identical: {result['all_identical']}; throughput ratio tensor-wasm / "
          f"wasmtime serve: {ratio}; wrote {out.relative_to(ROOT)}", file=sys.stderr)
    if any(errors.values()):
        print(f"load generator errors: {errors}: the throughput is not comparable", file=sys.stderr)
    sys.exit(0 if result["all_identical"] and not any(errors.values()) else 1)


if __name__ == "__main__":
    main()
