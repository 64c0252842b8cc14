#!/usr/bin/env python3
"""Soak: a bounded mixed load on one `tensor-wasm serve` over loopback for a set time,
while a second tenant's latency is sampled; writes a run file and fails when a bound breaks.

Usage: scripts/soak.py BIN [--minutes 10] [--out bench-results/soak/<date>.json]

Tenant A (the default tenant) runs, each from its own client thread: deploy / invoke / delete
cycles, invocations, streams read by slow readers and streams abandoned mid-way, async jobs,
snapshot capture and deletion, hostile guests (an infinite loop, a memory hog, a trap, a
malformed module), and clients that disconnect mid-request. Tenant B (created by the admin)
calls a small export every 50 ms from a process of its own, first alone (its unloaded latency)
and then through the load. Every second the server's RSS and open file descriptors are sampled from /proc.

The run fails (exit 1) unless: no answer is a 5xx outside the codes the load provokes on
purpose, RSS and descriptors stay bounded (the last third's peak within 1.5x the first
third's, plus a small slack), tenant B's p99 under load stays within 2x its unloaded p99,
and a final consistency check finds every acknowledged function and snapshot.
Only the Python standard library is used.
"""

import argparse
import datetime
import http.client
import json
import multiprocessing
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")

# 5xx codes the load provokes on purpose (hostile guests).
EXPECTED_5XX = {"guest_trap", "memory_limit_exceeded", "invocation_timeout", "output_too_large"}


class Client:
    """One keep-alive connection to the server, reopened after an error."""

    def __init__(self, port, token, timeout=30):
        self.port, self.token, self.timeout = port, token, timeout
        self.conn = None

    def request(self, method, path, body=None, ctype="application/json"):
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            headers = {"authorization": f"Bearer {self.token}"}
            if body is not None:
                headers["content-type"] = ctype
                if isinstance(body, str):
                    body = body.encode()
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                return response.status, data
            except (ConnectionError, http.client.HTTPException, socket.timeout):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise

    def json(self, method, path, body=None, ctype="application/json"):
        status, data = self.request(method, path, body, ctype)
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            return status, data


class Tally:
    """Answers by operation and status (with the error code), thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.unexpected = []

    def note(self, op, status, body, expected):
        code = ""
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = body["error"].get("code", "")
        key = f"{op} {status}{' ' + code if code else ''}"
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            ok = status in expected or (status >= 500 and code in EXPECTED_5XX and 500 in expected)
            if not ok and len(self.unexpected) < 50:
                self.unexpected.append({"op": op, "status": status, "body": str(body)[:300]})


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def start_server(binary, data_dir):
    log = open(os.path.join(os.path.dirname(data_dir), "serve.log"), "w")
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", data_dir],
        stdout=subprocess.PIPE, stderr=log, text=True,
        env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
    )
    line = proc.stdout.readline()
    if "listening on http://" not in line:
        raise SystemExit(f"server did not start: {line!r}")
    port = int(line.rsplit(":", 1)[1])
    creds = json.load(open(os.path.join(data_dir, "credentials.json")))
    for _ in range(300):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    return proc, port, creds


def wat(name):
    return open(os.path.join(EXAMPLES, name)).read()


class Soak:
    def __init__(self, port, creds, tenant_b_token, stop):
        self.port, self.creds, self.b_token, self.stop = port, creds, tenant_b_token, stop
        self.tally = Tally()
        self.kept_functions = {}  # id -> value its `id` export returns
        self.kept_snapshots = {}  # snapshot id -> function id
        self.lock = threading.Lock()
        self.serial = 0

    def a(self, timeout=30):
        return Client(self.port, self.creds["tenant_token"], timeout)

    def next_serial(self):
        with self.lock:
            self.serial += 1
            return self.serial

    def deployer(self):
        c = self.a()
        while not self.stop.is_set():
            n = self.next_serial()
            module = f'(module (func (export "id") (result i32) i32.const {n}))'
            s, body = c.json("POST", "/functions?name=soak", module, "application/wasm")
            self.tally.note("deploy", s, body, {201})
            if s != 201:
                time.sleep(0.2)
                continue
            fid = body["id"]
            s, body = c.json("POST", f"/functions/{fid}/invoke", json.dumps({"export": "id", "args": []}))
            self.tally.note("invoke-new", s, body, {200})
            with self.lock:
                keep = len(self.kept_functions) < 20 and n % 5 == 0
                if keep:
                    self.kept_functions[fid] = n
            if not keep:
                s, body = c.json("DELETE", f"/functions/{fid}")
                self.tally.note("delete", s, body, {204})
            time.sleep(0.05)

    def invoker(self, fid):
        c = self.a()
        while not self.stop.is_set():
            s, body = c.json("POST", f"/functions/{fid}/invoke", json.dumps({"export": "add", "args": [2, 3]}))
            self.tally.note("invoke", s, body, {200})
            time.sleep(0.01)

    def slow_streams(self, fid):
        """A stream read slowly; every other one abandoned half-way (a client that goes away)."""
        k = 0
        while not self.stop.is_set():
            k += 1
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            request = (
                f"POST /functions/{fid}/invoke-stream?export=ticks&args=%5B20%2C20%5D HTTP/1.1\r\n"
                f"host: 127.0.0.1\r\nauthorization: Bearer {self.creds['tenant_token']}\r\n"
                "content-length: 0\r\n\r\n"
            )
            sock.sendall(request.encode())
            received = b""
            try:
                while not self.stop.is_set():
                    chunk = sock.recv(16)
                    if not chunk:
                        break
                    received += chunk
                    if k % 2 == 0 and len(received) > 80:
                        break  # abandon it
                    time.sleep(0.05)
            except OSError:
                pass
            sock.close()
            status = int(received.split(b" ", 2)[1]) if received.startswith(b"HTTP/1.1 ") else 0
            self.tally.note("stream", status, None, {200})

    def jobs(self, fid):
        c = self.a()
        while not self.stop.is_set():
            s, body = c.json("POST", f"/functions/{fid}/invoke-async", json.dumps({"export": "nap", "args": [100]}))
            self.tally.note("job-submit", s, body, {202})
            if s != 202:
                time.sleep(0.5)
                continue
            job = body["job_id"]
            deadline = time.time() + 30
            while time.time() < deadline:
                s, body = c.json("GET", f"/jobs/{job}")
                if s != 200 or body.get("status") in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(0.05)
            ok = s == 200 and body.get("status") == "succeeded"
            self.tally.note("job-done", 200 if ok else 500, body, {200})

    def snapshots(self, fid):
        c = self.a()
        mine = []
        while not self.stop.is_set():
            s, body = c.json("POST", f"/functions/{fid}/snapshots", json.dumps({"init_export": "init"}))
            self.tally.note("snapshot", s, body, {201})
            if s == 201:
                mine.append(body["id"])
                with self.lock:
                    self.kept_snapshots[body["id"]] = fid
            s, body = c.json("POST", f"/functions/{fid}/invoke", json.dumps({"export": "lookup", "args": [7]}))
            self.tally.note("invoke-warm", s, body, {200})
            while len(mine) > 4:
                old = mine.pop(0)
                s, body = c.json("DELETE", f"/functions/{fid}/snapshots/{old}")
                self.tally.note("snapshot-delete", s, body, {204})
                with self.lock:
                    self.kept_snapshots.pop(old, None)
            time.sleep(0.5)

    def hostile(self, spin, hog, trap):
        c = self.a()
        while not self.stop.is_set():
            for op, fid, export, want in (
                ("spin", spin, "spin", 504),
                ("hog", hog, "grow", 500),
                ("trap", trap, "boom", 500),
            ):
                s, body = c.json("POST", f"/functions/{fid}/invoke", json.dumps({"export": export, "args": []}))
                self.tally.note(op, s, body, {want})
            s, body = c.json("POST", "/functions", b"\0asm\x01\0\0\0\x05garbage", "application/wasm")
            self.tally.note("malformed", s, body, {400})
            time.sleep(0.2)

    def disconnects(self, fid):
        """Clients that go away: mid-body, and before reading the answer."""
        while not self.stop.is_set():
            for partial in (True, False):
                try:
                    sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                    body = json.dumps({"export": "add", "args": [1, 2]}).encode()
                    head = (
                        f"POST /functions/{fid}/invoke HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                        f"authorization: Bearer {self.creds['tenant_token']}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(body) + (100 if partial else 0)}\r\n\r\n"
                    ).encode()
                    sock.sendall(head + body)
                    sock.close()
                except OSError:
                    pass
            self.tally.note("disconnect", 0, None, {0})
            time.sleep(0.1)



def sample_tenant_b(port, token, fid, stop, results):
    """Tenant B's sampler, in a process of its own so that the load threads' share of this
    script's interpreter lock never counts as server latency: calls a small export every 50 ms
    until `stop` is set, then puts (latencies in ms, unexpected answers, answer counts) on
    `results`."""
    c = Client(port, token)
    body = json.dumps({"export": "add", "args": [20, 22]})
    samples, unexpected, counts = [], [], {}
    while not stop.is_set():
        t0 = time.perf_counter()
        s, reply = c.json("POST", f"/functions/{fid}/invoke", body)
        samples.append((time.perf_counter() - t0) * 1000)
        key = f"tenant-b {s}"
        counts[key] = counts.get(key, 0) + 1
        if s != 200:
            unexpected.append({"op": "tenant-b", "status": s, "body": str(reply)[:300]})
        time.sleep(0.05)
    results.put((samples, unexpected, counts))


def tenant_b_phase(port, token, fid, run_while):
    """Samples tenant B in a child process while `run_while()` runs; returns what it got."""
    stop = multiprocessing.Event()
    results = multiprocessing.Queue()
    child = multiprocessing.Process(target=sample_tenant_b, args=(port, token, fid, stop, results))
    child.start()
    try:
        run_while()
    finally:
        stop.set()
    got = results.get(timeout=120)
    child.join(timeout=60)
    return got

def proc_sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--baseline-seconds", type=float, default=60)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="tw-soak-")
    data_dir = os.path.join(work, "data")
    proc, port, creds = start_server(args.binary, data_dir)
    admin = Client(port, creds["admin_token"])
    s, body = admin.json("PATCH", f"/tenants/{creds['tenant_id']}", json.dumps(
        {"quotas": {"max_functions": 1000, "requests_per_second": 0}}))
    assert s == 200, body
    s, body = admin.json("POST", "/tenants", json.dumps({"name": "soak-b"}))
    assert s == 201, body
    b_token = body["token"]
    b = Client(port, b_token)
    s, body = b.json("POST", "/functions?name=calc", wat("calc.wat"), "application/wasm")
    assert s == 201, body
    b_calc = body["id"]

    a = Client(port, creds["tenant_token"])

    def deploy(source, query):
        s, body = a.json("POST", f"/functions?{query}", source, "application/wasm")
        assert s == 201, body
        return body["id"]

    calc = deploy(wat("calc.wat"), "name=calc")
    stream = deploy(wat("stream.wat"), "name=stream")
    nap = deploy(wat("sleep.wat"), "name=nap")
    warm = deploy(wat("warm.wat"), "name=warm")
    spin = deploy(wat("loop.wat"), "name=spin&timeout_ms=200")
    hog = deploy(wat("hog.wat"), "name=hog&memory_limit_bytes=16777216")
    trap = deploy('(module (func (export "boom") unreachable))', "name=trap")

    stop = threading.Event()
    soak = Soak(port, creds, b_token, stop)
    unloaded, unexpected_b, counts_b = tenant_b_phase(
        port, b_token, b_calc, lambda: time.sleep(args.baseline_seconds))

    threads = [
        threading.Thread(target=soak.deployer),
        threading.Thread(target=soak.invoker, args=(calc,)),
        threading.Thread(target=soak.slow_streams, args=(stream,)),
        threading.Thread(target=soak.slow_streams, args=(stream,)),
        threading.Thread(target=soak.jobs, args=(nap,)),
        threading.Thread(target=soak.snapshots, args=(warm,)),
        threading.Thread(target=soak.hostile, args=(spin, hog, trap)),
        threading.Thread(target=soak.disconnects, args=(calc,)),
    ]
    samples = []

    def load():
        for t in threads:
            t.start()
        started = time.time()
        while time.time() - started < args.minutes * 60:
            rss, fds = proc_sample(proc.pid)
            samples.append({"t": round(time.time() - started, 1), "rss_bytes": rss, "fds": fds})
            time.sleep(1)
        stop.set()
        for t in threads:
            t.join()

    loaded, more_unexpected, more_counts = tenant_b_phase(port, b_token, b_calc, load)
    for key, n in list(counts_b.items()) + list(more_counts.items()):
        soak.tally.counts[key] = soak.tally.counts.get(key, 0) + n
    soak.tally.unexpected.extend(unexpected_b + more_unexpected)

    # Consistency: every acknowledged function and snapshot is there and works.
    missing = []
    for fid, value in soak.kept_functions.items():
        s, body = a.json("POST", f"/functions/{fid}/invoke", json.dumps({"export": "id", "args": []}))
        if (s, body) != (200, {"results": [value]}):
            missing.append({"function": fid, "status": s, "body": str(body)[:200]})
    s, body = a.json("GET", f"/functions/{warm}/snapshots")
    listed = {snap["id"] for snap in body["snapshots"]} if s == 200 else set()
    for snap in soak.kept_snapshots:
        if snap not in listed:
            missing.append({"snapshot": snap})
    proc.terminate()
    proc.wait(timeout=60)

    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]
    rss_first = max(x["rss_bytes"] for x in first)
    rss_last = max(x["rss_bytes"] for x in last)
    fds_first = max(x["fds"] for x in first)
    fds_last = max(x["fds"] for x in last)
    p99_unloaded = percentile(unloaded, 99)
    p99_loaded = percentile(loaded, 99)
    checks = {
        "no_unexpected_answers": not soak.tally.unexpected,
        "rss_bounded": rss_last <= rss_first * 1.5 + (16 << 20),
        "fds_bounded": fds_last <= fds_first * 1.5 + 16,
        "tenant_b_p99_within_2x": p99_loaded is not None and p99_loaded <= 2 * p99_unloaded,
        "every_acknowledged_object_found": not missing,
    }
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    run = {
        "what": "make soak: bounded mixed load on one server over loopback, second tenant sampled",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": cpu_model()},
        "minutes": args.minutes,
        "answers": dict(sorted(soak.tally.counts.items())),
        "unexpected_answers": soak.tally.unexpected,
        "rss_bytes": {"first_third_peak": rss_first, "last_third_peak": rss_last,
                      "max": max(x["rss_bytes"] for x in samples)},
        "open_fds": {"first_third_peak": fds_first, "last_third_peak": fds_last,
                     "max": max(x["fds"] for x in samples)},
        "tenant_b_ms": {
            "unloaded": {"n": len(unloaded), "p50": percentile(unloaded, 50), "p99": p99_unloaded},
            "loaded": {"n": len(loaded), "p50": percentile(loaded, 50), "p99": p99_loaded},
        },
        "consistency": {"functions": len(soak.kept_functions), "snapshots": len(soak.kept_snapshots),
                        "missing": missing},
        "checks": checks,
        "samples": samples,
    }
    out = args.out or os.path.join(ROOT, "bench-results", "soak",
                                   datetime.date.today().isoformat() + "-soak.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(run, f, indent=1)
        f.write("\n")
    print(json.dumps({k: run[k] for k in ("answers", "rss_bytes", "open_fds", "tenant_b_ms", "checks")}, indent=1))
    print(f"run file: {out}")
    sys.exit(0 if all(checks.values()) else 1)


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
