#!/usr/bin/env python3
"""Renders PERFORMANCE.md from the run files under bench-results/.

Every number in the output comes from a committed file; the document names
the file, machine, date and commit of each table. Output depends only on
those files, so running it twice gives the same bytes.

Usage: python3 scripts/perf_doc.py > PERFORMANCE.md
"""
import glob
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RESULTS = os.path.join(ROOT, "bench-results")

INVENTORY = [
    ("e2e/healthz/get", "tensor-wasm-bench", "benches/e2e_inference.rs", "GET /healthz through the full router (oneshot)", "requests/s"),
    ("e2e/create_function/post", "tensor-wasm-bench", "benches/e2e_inference.rs", "POST /functions of a tiny WAT module, fresh state per iteration", "requests/s"),
    ("e2e/invoke_not_found/post", "tensor-wasm-bench", "benches/e2e_inference.rs", "POST /functions/<unknown>/invoke error path", "requests/s"),
    ("e2e/invoke/export_call", "tensor-wasm-bench", "benches/e2e_inference.rs", "POST invoke of a deployed `add` export through the router", "requests/s"),
    ("instantiate/instance_pre", "tensor-wasm-bench", "benches/instantiate.rs", "Runtime::invoke_export of a no-arg export: store, instantiate, call", "calls/s"),
    ("instantiate/raw_wasmtime", "tensor-wasm-bench", "benches/instantiate.rs", "raw wasmtime peer: pooling engine, Store::new + InstancePre::instantiate + call", "calls/s"),
    ("dispatch/serial/<N>", "tensor-wasm-bench", "benches/kernel_dispatch.rs", "N dispatches one after another: permit acquire + release + future poll", "dispatches/s"),
    ("dispatch/concurrent_cap64/<N>", "tensor-wasm-bench", "benches/kernel_dispatch.rs", "N dispatches from 4 threads through a cap-64 dispatcher", "dispatches/s"),
    ("memory_bandwidth/sequential/<bytes>", "tensor-wasm-bench", "benches/memory_bandwidth.rs", "copy_from_slice into a GuardedHostBuffer, with a Vec memcpy peer", "bytes/s"),
    ("jit_compile/emit_text/<kernel>", "tensor-wasm-bench", "benches/jit_compile.rs", "PTX text emission of vector_add[4], vector_add[16], matmul[16x16x16], conv2d[3x3]", "kernels/s"),
    ("jit_compile/fingerprint/matmul_16x16x16", "tensor-wasm-bench", "benches/jit_compile.rs", "fingerprint of one blueprint + target", "hashes/s"),
    ("jit_compile/cache/cold_miss_then_insert", "tensor-wasm-bench", "benches/jit_compile.rs", "KernelCache miss: emit + insert + get on a fresh cache (built outside the timing)", "kernels/s"),
    ("jit_compile/cache/warm_hit", "tensor-wasm-bench", "benches/jit_compile.rs", "KernelCache::get of a present kernel", "lookups/s"),
    ("tenant_registry/lookup/<N>", "tensor-wasm-tenant", "benches/context_switch.rs", "TenantRegistry::lookup of an existing id among N tenants", "lookups/s"),
    ("tenant_registry/consume_release/256KiB", "tensor-wasm-tenant", "benches/context_switch.rs", "Tenant::acquire of 256 KiB guest memory + guard drop", "round trips/s"),
    ("cold_start/capture/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "portable snapshot capture of a realistic image (zstd frames, both cores)", "bytes/s"),
    ("cold_start/restore/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "eager portable restore", "bytes/s"),
    ("cold_start/restore_lazy/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "local image: open + mmap copy-on-write + first touch", "bytes/s"),
    ("cold_start/disk_round_trip/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "capture + write + read + restore", "bytes/s"),
    ("cold_start/memcpy/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "memcpy peer of the same image", "bytes/s"),
    ("memory_bandwidth/strided/<bytes>", "tensor-wasm-bench", "benches/memory_bandwidth.rs", "64-byte copies at a 4096-byte stride over a GuardedHostBuffer, with a Vec peer", "bytes/s"),
]


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt_ns(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns"


def machine_line(m):
    if not m:
        return "unknown machine"
    if "cpu" in m:
        return f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('kernel', '')}".strip(", ")
    return f"{m.get('cpu_model', 'unknown CPU')}, {m.get('nproc')} cores, {m.get('uname', '')}".strip(", ")


def rel(path):
    return os.path.relpath(path, ROOT)


def criterion_section(out):
    files = sorted(glob.glob(os.path.join(RESULTS, "criterion", "*.json")))
    out.append("## Criterion results\n")
    if not files:
        out.append("No Criterion run file is committed yet.\n")
        return
    for path in files:
        doc = load(path)
        out.append(f"### `{rel(path)}`\n")
        out.append(f"- machine: {machine_line(doc.get('machine'))}")
        out.append(f"- date: {doc.get('date')}; commit: `{doc.get('commit')}`")
        out.append(f"- command: `{doc.get('command')}`\n")
        out.append("| bench id | median | 95 % CI of the median | std dev |")
        out.append("|---|---|---|---|")
        benches = doc["benches"]
        for key, b in benches.items():
            ci = f"{fmt_ns(b['median_lo_ns'])} … {fmt_ns(b['median_hi_ns'])}"
            out.append(f"| `{key}` | {fmt_ns(b['median_ns'])} | {ci} | {fmt_ns(b['std_dev_ns'])} |")
        out.append("")
        pairs = [
            ("instantiate/instance_pre", "instantiate/raw_wasmtime", "our invocation path ÷ raw wasmtime instantiate + call"),
        ]
        for ours, peer, what in pairs:
            if ours in benches and peer in benches:
                ratio = benches[ours]["median_ns"] / benches[peer]["median_ns"]
                out.append(f"Ratio, same run: {what} = **{ratio:.2f}×** (medians).\n")
        peers = []
        for key in benches:
            parts = key.split("/")
            if len(parts) == 3 and not parts[1].endswith("_vec_peer"):
                peer = f"{parts[0]}/{parts[1]}_vec_peer/{parts[2]}"
                if peer in benches:
                    peers.append((key, peer))
        if peers:
            out.append("| ours vs peer (same run) | ratio of medians |")
            out.append("|---|---|")
            for ours, peer in peers:
                if peer in benches:
                    out.append(f"| `{ours}` ÷ `{peer}` | {benches[ours]['median_ns'] / benches[peer]['median_ns']:.2f}× |")
            out.append("")


def throughput_section(out):
    path = os.path.join(RESULTS, "http-throughput", "latest.json")
    out.append("## HTTP throughput: tensor-wasm vs a minimal axum + wasmtime server\n")
    if not os.path.exists(path):
        out.append("No run file is committed yet.\n")
        return
    doc = load(path)
    s = doc["summary"]
    out.append(f"From `{rel(path)}` — machine: {machine_line(doc.get('machine'))}; "
               f"date: {doc.get('timestamp_utc', doc.get('date'))}; commit: `{doc.get('git_commit')}`; "
               f"command: `{doc.get('command')}`.\n")
    out.append("Both servers run on the same machine as the load generator, interleaved A B A B; "
               "figures are medians over the rounds (min … max in brackets).\n")
    out.append("| server | req/s | p50 | p99 |")
    out.append("|---|---|---|---|")
    for name, label in (("tensor_wasm", "tensor-wasm serve (limits, metrics, request ids on)"),
                        ("minimal", "minimal axum + wasmtime (pooling, InstancePre, nothing else)")):
        r = s[name]
        rps = r["req_per_s"]
        out.append(f"| {label} | {rps['median']:.0f} [{rps['min']:.0f} … {rps['max']:.0f}] | "
                   f"{r['p50_us']['median']} µs | {r['p99_us']['median']} µs |")
    ratio = doc.get("ratio_req_per_s_tensor_wasm_over_minimal")
    if isinstance(ratio, dict):
        ratio = ratio.get("median")
    if ratio is not None:
        out.append(f"\nRatio tensor-wasm ÷ minimal (req/s, medians): **{float(ratio):.2f}×** "
                   f"(target ≥ 0.80×).\n")


def main():
    out = [
        "# Performance",
        "",
        "<!-- Generated by `make perf-doc` (scripts/perf_doc.py) from bench-results/. Do not edit by hand. -->",
        "",
        "Every number here comes from a committed run file under `bench-results/`, named next to",
        "its table with the machine, date, commit and command that produced it. Absolute times are",
        "only meaningful on their machine; comparisons are made as ratios of runs interleaved in the",
        "same script or the same Criterion run. GPU figures appear only once measured on a GPU.",
        "",
        "## How we measure",
        "",
        "- Criterion benches (`crates/tensor-wasm-bench/benches/`, `harness = false`): warm-up, then at",
        "  least 30 samples; the median and its confidence interval are reported. Each bench that has a",
        "  peer (raw wasmtime, `memcpy`) measures it in the same run so the ratio is what we track.",
        "- HTTP throughput: `make http-throughput` (scripts/http-throughput.sh) runs the real server and",
        "  a minimal reference server alternately under the in-repo load generator (closed loop,",
        "  keep-alive connections, loopback, bounded in time).",
        "- Run files: `scripts/criterion_summary.py` turns Criterion's `estimates.json` into",
        "  `bench-results/criterion/*.json`; the throughput script writes `bench-results/http-throughput/`.",
        "",
        "## Bench inventory",
        "",
        "| bench id | crate | file | what it measures | unit |",
        "|---|---|---|---|---|",
    ]
    for row in INVENTORY:
        out.append("| `{}` | {} | `{}` | {} | {} |".format(*row))
    out.append("")
    criterion_section(out)
    throughput_section(out)
    out.append("## GPU\n")
    gpu = sorted(glob.glob(os.path.join(RESULTS, "gpu", "*")))
    if gpu:
        for d in gpu:
            out.append(f"- `{rel(d)}`")
        out.append("")
    else:
        out.append("No GPU run file is committed yet: no figure for CUDA launches, unified memory or")
        out.append("kernel throughput is published until one is measured on an H100/H200.\n")
    print("\n".join(out).rstrip() + "\n", end="")


if __name__ == "__main__":
    main()
