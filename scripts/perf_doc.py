#!/usr/bin/env python3
"""Renders PERFORMANCE.md and its SVG charts from the run files under bench-results/.

Every number in the output comes from a committed file; the document names
the file, machine, date and commit of each table and chart. It opens with the
headline table (each figure with its peer, ratio, goal and run file); the long
tables (CPU kernels, the Criterion baseline, GPU runs, the index of every run
file) are generated pages under docs/perf/, linked from it, so that it stays
under 60 KB (`--check` fails past that). Reading the
run files is in perf_runs.py, the charts in perf_charts.py (matplotlib, pinned:
run it with .tools/perf-doc/bin/python, which `make deps` creates). The output
depends only on those files (no clock, no git, no environment), so running it
twice, or on another checkout of the same commit, gives the same bytes.

Usage (`make perf-doc`, `make perf-doc-check`):
  .tools/perf-doc/bin/python scripts/perf_doc.py > PERFORMANCE.md  # prints the document, writes
                                                 # docs/charts/*.svg and docs/perf/*.md
  .tools/perf-doc/bin/python scripts/perf_doc.py --check  # renders into a temporary directory
                                                 # and fails (exit 1, with a diff) when
                                                 # PERFORMANCE.md, a page or a chart
                                                 # differs
"""
import difflib
import glob
import math
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True  # no scripts/__pycache__ from the two modules below
from perf_charts import CHARTS_DIR, charts_section, fmt_time_tick

# Generated pages of the tables too long for PERFORMANCE.md, and its size limit.
PAGES_DIR = "docs/perf"
MAX_DOC_BYTES = 60 * 1024
from perf_runs import (RESULTS, ROOT, criterion_files, fmt_bytes, fmt_ns, link, load, machine_line,
                       newest_having, provenance, rel)

INVENTORY = [
    ("e2e/healthz/get", "tensor-wasm-bench", "benches/e2e_inference.rs", "GET /healthz through the full router (oneshot)", "requests/s"),
    ("e2e/create_function/post", "tensor-wasm-bench", "benches/e2e_inference.rs", "POST /functions of a tiny WAT module, fresh state per iteration", "requests/s"),
    ("e2e/invoke_not_found/post", "tensor-wasm-bench", "benches/e2e_inference.rs", "POST /functions/<unknown>/invoke error path", "requests/s"),
    ("e2e/invoke/export_call", "tensor-wasm-bench", "benches/e2e_inference.rs", "POST invoke of a deployed `add` export through the router", "requests/s"),
    ("instantiate/instance_pre", "tensor-wasm-bench", "benches/instantiate.rs", "Runtime::invoke_export of a no-arg export: store, instantiate, call", "calls/s"),
    ("instantiate/raw_wasmtime", "tensor-wasm-bench", "benches/instantiate.rs", "raw wasmtime peer: pooling engine, Store::new + InstancePre::instantiate + call", "calls/s"),
    ("metrics_label_validation/try_new/{first,last,miss}", "tensor-wasm-bench", "benches/metrics_label_validation.rs", "HttpRequestLabels::try_new: route template + method to allow-listed metric labels (first route, last route, not a route)", "lookups/s"),
    ("call_export/noargs/call_export_with_args_empty", "tensor-wasm-bench", "benches/call_export_args.rs", "Runtime::invoke_export of `f() -> i32` with no arguments (same module as two_i32)", "calls/s"),
    ("call_export/args/two_i32", "tensor-wasm-bench", "benches/call_export_args.rs", "Runtime::invoke_export of `add(i32, i32)` with JSON arguments [1, 2]", "calls/s"),
    ("dispatch/serial/<N>", "tensor-wasm-bench", "benches/kernel_dispatch.rs", "N dispatches one after another: permit acquire + release + future poll", "dispatches/s"),
    ("dispatch/concurrent_cap64/<N>", "tensor-wasm-bench", "benches/kernel_dispatch.rs", "N dispatches from 4 threads through a cap-64 dispatcher", "dispatches/s"),
    ("memory_bandwidth/sequential/<bytes>", "tensor-wasm-bench", "benches/memory_bandwidth.rs", "copy_from_slice into a GuardedHostBuffer, with a Vec memcpy peer", "bytes/s"),
    ("memory_bandwidth/strided/<bytes>", "tensor-wasm-bench", "benches/memory_bandwidth.rs", "64-byte copies at a 4096-byte stride over a GuardedHostBuffer, with a Vec peer", "bytes/s"),
    ("jit_compile/emit_text/<kernel>", "tensor-wasm-bench", "benches/jit_compile.rs", "PTX text emission of vector_add[4], vector_add[16], matmul[16x16x16], conv2d[3x3]", "kernels/s"),
    ("jit_compile/fingerprint/matmul_16x16x16", "tensor-wasm-bench", "benches/jit_compile.rs", "fingerprint of one blueprint + target", "hashes/s"),
    ("jit_compile/cache/cold_miss_then_insert", "tensor-wasm-bench", "benches/jit_compile.rs", "KernelCache miss: emit + insert + get on a fresh cache (built outside the timing)", "kernels/s"),
    ("jit_compile/cache/warm_hit", "tensor-wasm-bench", "benches/jit_compile.rs", "KernelCache::get of a present kernel", "lookups/s"),
    ("tenant_registry/lookup/<N>", "tensor-wasm-tenant", "benches/context_switch.rs", "TenantRegistry::lookup of an existing id among N tenants", "lookups/s"),
    ("tenant_registry/consume_release/256KiB", "tensor-wasm-tenant", "benches/context_switch.rs", "Tenant::acquire of 256 KiB guest memory + guard drop", "round trips/s"),
    ("cold_start/capture/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "portable snapshot capture of a realistic image (zstd frames, both cores)", "bytes/s"),
    ("cold_start/capture_reused/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "the same capture as the runtime makes it: one PortableEncoder kept between captures, the snapshot copied into a kept buffer", "bytes/s"),
    ("cold_start/restore/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "eager portable restore", "bytes/s"),
    ("cold_start/map_lazy/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "local image: open + mmap copy-on-write + first touch (named restore_lazy in run files before the runtime bench existed)", "bytes/s"),
    ("cold_start/restore_lazy/<bytes>", "tensor-wasm-bench", "benches/snapshot_restore.rs", "whole invocation of an instance started from a snapshot, image mapped copy-on-write (unified host memory), to the end of its first call", "bytes/s"),
    ("cold_start/restore_eager/<bytes>", "tensor-wasm-bench", "benches/snapshot_restore.rs", "the same with pooled memory: stored pages read into the instance", "bytes/s"),
    ("cold_start/instantiate_plain/<bytes>", "tensor-wasm-bench", "benches/snapshot_restore.rs", "the same module and memory limit without a snapshot: plain instantiation + first call", "bytes/s"),
    ("cold_start/disk_round_trip/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "capture + write + read + restore", "bytes/s"),
    ("cold_start/memcpy/<bytes>", "tensor-wasm-snapshot", "benches/cold_start.rs", "memcpy peer of the same image", "bytes/s"),
    ("tail latency: dispatch/serial/100, dispatch/concurrent_cap64/100, e2e/healthz/get, e2e/invoke_not_found/post", "tensor-wasm-bench", "benches/tail_latency.rs", "timed samples per path, interleaved; p50/p95/p99/p99.9/max (not Criterion; diagnostic, not gated); `make tail-latency`", "latency percentiles"),
]

# Instruction-count benches (crates/tensor-wasm-icount/benches/icount.rs): id -> what one call does.
ICOUNT_PATHS = {
    "dispatch/permit_poll": "KernelDispatcher::acquire_blocking + track + wait (one dispatch, completion already resolved)",
    "validate_launch/matmul_16x16x16": "Blueprint::validate_launch of a valid 64×64×64 matmul launch",
    "validate_launch/vector_add_4": "Blueprint::validate_launch of a valid in-place vector_add[4] launch",
    "fingerprint/matmul_16x16x16": "Blueprint::fingerprint for sm_90 (SHA-256 of the blueprint + target)",
    "kernel_cache/warm_hit": "KernelCache::get of a present kernel",
    "tenant_lookup/lookup_256": "TenantRegistry::lookup of a tenant among 256",
    "tenant_authenticate/authenticate_256": "TenantRegistry::authenticate of a bearer secret (SHA-256, map, constant-time compare)",
    "snapshot/read_portable_meta": "read_portable_meta: header, metadata checksum, decode, module-hash check",
    "telemetry_off/request_hooks": "the trace hooks one invoke runs with traces off (spans not made: a flag check each)",
}


# ---------------------------------------------------------------------- headline

# The goals of the headline table, each from the document that sets it, never from a
# measurement: (comparison, value, unit, the one size it applies to or None for every size,
# source key of GOAL_SOURCES). HTTP throughput's goal is the one its run file records.
GOAL_SOURCES = {
    "snapshot": "snapshot restore and capture: the snapshot goals, as recorded in "
               "[docs/perf-experiments.md](docs/perf-experiments.md)",
    "spec": "JIT warm hit and tenant lookup: the done-when criteria S13 and S16 of the performance "
            "specification (S16 names a tenant context switch; its host side is what is measured here)",
    "http": "HTTP throughput: the target its run file records, the one set in "
            "[docs/perf-experiments.md](docs/perf-experiments.md)",
    "gpu": "GPU rows: the targets the GPU suite's `summary.json` records for its comparisons",
}

# Criterion figures with a peer measured in the same run, or a goal. `{n}` stands for the size
# (bytes, or tenants) of a bench family; the headline size is the largest the run file has.
# metric: "time" (ratio of medians, lower is better), "bytes" (GB/s = bytes ÷ median, ratio of
# GB/s, higher is better), "strided" (the same, 64 bytes moved per 4 KiB).
HEADLINE = [
    dict(what="Invocation of a no-argument export: store, instantiate, call",
         ours="instantiate/instance_pre", peer="instantiate/raw_wasmtime",
         peer_what="raw wasmtime (pooling engine, `InstancePre`)", metric="time"),
    dict(what="Invocation with two i32 arguments (JSON)",
         ours="call_export/args/two_i32", peer="call_export/noargs/call_export_with_args_empty",
         peer_what="the same call without arguments", metric="time"),
    dict(what="Sequential host copy into guest memory (`GuardedHostBuffer`)",
         ours="memory_bandwidth/sequential/{n}", peer="memory_bandwidth/sequential_vec_peer/{n}",
         peer_what="`Vec` (memcpy)", metric="bytes"),
    dict(what="Strided host copy (64 B per 4 KiB) into guest memory",
         ours="memory_bandwidth/strided/{n}", peer="memory_bandwidth/strided_vec_peer/{n}",
         peer_what="`Vec`", metric="strided"),
    dict(what="Lazy restore of an instance from a snapshot (mmap), to the end of its first call",
         ours="cold_start/restore_lazy/{n}", peer="cold_start/instantiate_plain/{n}",
         peer_what="plain instantiation + first call, same module", metric="time",
         goal=("≤", 1e6, "ns", 512 << 20, "snapshot")),
    dict(what="Eager restore of an instance into pooled memory, to the end of its first call",
         ours="cold_start/restore_eager/{n}", peer="cold_start/memcpy/{n}",
         peer_what="`memcpy` of the image", metric="bytes", goal=("≥", 2.0, "GB/s", None, "snapshot")),
    dict(what="Eager restore into a pooled slot that keeps its pages resident (`--pool-keep-resident-bytes`), "
              "to the end of its first call",
         ours="cold_start/restore_eager_resident/{n}", peer="cold_start/memcpy/{n}",
         peer_what="`memcpy` of the image into resident memory (goal: ≥ 0.5×)", metric="bytes"),
    dict(what="Eager restore into pooled memory that handed its pages back (the default)",
         ours="cold_start/restore_eager/{n}", peer="cold_start/memcpy_fresh/{n}",
         peer_what="`memcpy` of the image into fresh pages", metric="bytes"),
    dict(what="Portable snapshot restore (decode) of a realistic image",
         ours="cold_start/restore/{n}", peer="cold_start/memcpy/{n}",
         peer_what="`memcpy` of the image", metric="bytes", goal=("≥", 2.0, "GB/s", None, "snapshot")),
    dict(what="Portable snapshot capture (encode) of a realistic image",
         ours="cold_start/capture/{n}", peer="cold_start/memcpy/{n}",
         peer_what="`memcpy` of the image", metric="bytes", goal=("≥", 1.0, "GB/s", None, "snapshot")),
    dict(what="Portable snapshot capture through a kept encoder (the runtime's way)",
         ours="cold_start/capture_reused/{n}", peer="cold_start/memcpy/{n}",
         peer_what="`memcpy` of the image", metric="bytes", goal=("≥", 1.0, "GB/s", None, "snapshot")),
    dict(what="JIT kernel cache, warm hit", ours="jit_compile/cache/warm_hit", metric="time",
         goal=("<", 1e6, "ns", None, "spec")),
    dict(what="Tenant lookup among N tenants", ours="tenant_registry/lookup/{n}", metric="time",
         size_unit="tenants", goal=("<", 5e3, "ns", None, "spec")),
]

# What the GPU suite compares once it has run on a GPU (its summary.json then fills these rows).
GPU_HEADLINE = [
    ("CUDA launch to completion through the guest ABI", "raw cudarc launch + sync"),
    ("Kernel throughput: vector add, matmul, conv2d", "PyTorch on the same GPU"),
    ("Cold start to the first kernel from a snapshot", "fresh instance + init"),
    ("Guest unified memory, first-touch kernel", "the same kernel, prefetched"),
]


def family(row):
    """ids_of for a HEADLINE row: [(size or None, ours id, peer id or None)] present in a run file."""
    def ids_of(benches):
        if "{n}" not in row["ours"]:
            ok = row["ours"] in benches and (not row.get("peer") or row["peer"] in benches)
            return [(None, row["ours"], row.get("peer"))] if ok else []
        head, tail = row["ours"].split("{n}")
        found = []
        for key in benches:
            n = key[len(head):len(key) - len(tail)] if key.startswith(head) and key.endswith(tail) else ""
            if n.isdigit():
                peer = row["peer"].replace("{n}", n) if row.get("peer") else None
                if peer is None or peer in benches:
                    found.append((int(n), key, peer))
        return sorted(found)
    return ids_of


def headline_figure(row, benches, size, key):
    """(value, text) of one bench: seconds-like time or GB/s."""
    ns = benches[key]["median_ns"]
    if row["metric"] == "time":
        return ns, fmt_ns(ns)
    moved = size // 4096 * 64 if row["metric"] == "strided" else size
    return moved / ns, f"{moved / ns:.2f} GB/s"


def fmt_size(row, n):
    return f"N = {n}" if row.get("size_unit") == "tenants" else fmt_bytes(n)


def goal_holds(goal, value):
    op, limit = goal[0], goal[1]
    return {"<": value < limit, "≤": value <= limit, "≥": value >= limit}[op]


def fmt_goal(goal):
    op, limit, unit, at, _ = goal
    text = f"{op} {fmt_time_tick(limit)}" if unit == "ns" else f"{op} {limit:g} {unit}"
    return text + (f" at {fmt_bytes(at)}" if at else "")


def criterion_headline_row(row, cited):
    path, doc, found = newest_having(family(row))
    if not path:
        return f"| {row['what']} — `{row['ours']}` | not measured: no run file has it | | | " \
               f"{fmt_goal(row['goal']) if row.get('goal') else '—'} | — | — |"
    cited.setdefault(path, set()).add("headline")
    benches = doc["benches"]
    better = "time: lower is better" if row["metric"] == "time" else "GB/s: higher is better"
    figs = []  # (size, ours value, ours text, peer text, ratio)
    for size, ours, peer in found:
        value, text = headline_figure(row, benches, size, ours)
        peer_text, ratio = "", None
        if peer:
            pv, peer_text = headline_figure(row, benches, size, peer)
            ratio = value / pv
        figs.append((size, value, text, peer_text, ratio))
    size, value, text, peer_text, ratio = figs[-1]
    at = f" at {fmt_size(row, size)}" if size is not None else ""
    ours_cell = text + at
    ratio_cell = f"{ratio:.2f}×{at}" if ratio is not None else "—"
    if len(figs) > 1:
        unit = "" if row["metric"] == "time" else " GB/s"
        values = [f[1] for f in figs]
        lo, hi = (fmt_ns(min(values)), fmt_ns(max(values))) if row["metric"] == "time" \
            else (f"{min(values):.2f}", f"{max(values):.2f}")
        span = f"{fmt_size(row, figs[0][0])} … {fmt_size(row, figs[-1][0])}"
        ours_cell += f" ({lo} … {hi}{unit} over {span})"
        if ratio is not None:
            ratios = [f[4] for f in figs]
            ratio_cell += f" ({min(ratios):.2f} … {max(ratios):.2f}×)"
    if ratio is not None:
        ratio_cell += f"; {better}"
        peer_cell = f"{row['peer_what']}: {peer_text}{at}"
    else:
        peer_cell = "—"
    goal, holds = row.get("goal"), "—"
    if goal:
        checked = [(f[0], goal_holds(goal, f[1])) for f in figs if goal[3] is None or f[0] == goal[3]]
        if not checked:
            holds = f"not measured at {fmt_bytes(goal[3])}"
        elif len(checked) == 1:
            holds = "yes" if checked[0][1] else "**no**"
        else:
            met = [s for s, ok in checked if ok]
            holds = (f"yes, all {len(checked)} sizes" if len(met) == len(checked) else
                     f"**no**, at none of {len(checked)} sizes" if not met else
                     f"at {len(met)} of {len(checked)} sizes ({', '.join(fmt_size(row, s) for s in met)})")
    ids = row["ours"].replace("{n}", "<N>" if row.get("size_unit") == "tenants" else "<bytes>")
    return (f"| {row['what']} — `{ids}` | {ours_cell} | {peer_cell} | {ratio_cell} | "
            f"{fmt_goal(goal) if goal else '—'} | {holds} | {link(rel(path))} |")


# ---------------------------------------------------------------------- CPU backend kernels

# The goals per kernel family (the peer's operation on the same shapes and cores).
CPU_KERNEL_GOALS = [
    (re.compile(r"^(vector_add|elementwise|reduce|concat|permute|gather|softmax|layernorm|maxpool|avgpool)\["), 0.8,
     "memory-bound blueprints"),
    (re.compile(r"^(builtin )?matmul.*(f32|\^3)$"), 0.35, "f32 matmul"),
    (re.compile(r"^conv2d\["), 0.35, "conv2d"),
]


def cpu_kernel_goal(kernel):
    if ":i32 " in kernel and kernel.startswith("matmul"):
        return None  # i32 matmul: reported, no goal
    for pattern, goal, _ in CPU_KERNEL_GOALS:
        if pattern.search(kernel):
            return goal
    return None


def cpu_kernels_section(out, cited):
    """The CPU backend against numpy / OpenBLAS, from the newest `make cpu-kernels` run file."""
    runs = [(p, load(p)) for p in glob.glob(os.path.join(RESULTS, "cpu-kernels", "*.json"))]
    if not runs:
        return
    # The newest run with the widest ISA its CPU has; runs narrowed with `--isa` are comparisons.
    widest = [r for r in runs if not r[1]["commands"]["tensor_wasm"].startswith("TENSOR_WASM_CPU_ISA=")]
    path, doc = max(widest or runs, key=lambda r: (r[1].get("date", ""), r[0]))
    cited.setdefault(path, set()).add("CPU kernels")
    peer = doc.get("peer", {})
    # Commands as run from the repository root, wherever the checkout was.
    commands = {k: re.sub(r"\S*/(target/release/|scripts/)", r"\1", v) for k, v in doc["commands"].items()}
    blas = ", ".join(f"{t.get('internal_api')} {t.get('version')} ({t.get('num_threads')} threads, "
                     f"{t.get('architecture')})" for t in peer.get("threadpools", []))
    out.append("## CPU backend kernels vs numpy / OpenBLAS\n")
    out.append(f"From {link(rel(path), rel(path))} — machine: {doc['machine'].get('cpu')}, "
               f"{doc['machine'].get('cpus')} cores, {doc['machine'].get('platform')}; date: {doc.get('date')}; "
               f"commit: `{doc.get('commit')}`; command: `make cpu-kernels` (`{commands['tensor_wasm']}` "
               f"and `{commands['peer']}`, one after the other). Peer: numpy {peer.get('numpy')}, {blas}. "
               f"Matmul and conv2d tiles: {doc.get('gemm_isa') or 'avx2 (runs before the ISA was recorded)'}.\n")
    out.append("Each kernel launched as the guest ABI launches it on the CPU backend, against numpy's equivalent "
               "operation on the same shapes and cores (memory-bound: 16 Mi elements, GB/s of bytes read and "
               "written; matmul and conv2d: GFLOP/s). Goals: memory-bound ≥ 0.8×, f32 matmul and "
               "conv2d ≥ 0.35×; what was tried is in docs/perf-experiments.md.\n")
    out.append("| kernel | TensorWasm CPU | numpy / OpenBLAS (operation) | ratio | goal | holds |")
    out.append("|---|---|---|---|---|---|")
    for row in doc.get("ratios", []):
        unit = "GB/s" if row["unit"] == "gb_per_s" else "GFLOP/s"
        goal = cpu_kernel_goal(row["kernel"])
        ratio = row.get("ratio")
        theirs = f"{row['numpy']:.2f} {unit}" if row.get("numpy") else "—"
        holds = "—" if goal is None or ratio is None else ("yes" if ratio >= goal else "no")
        out.append(f"| `{row['kernel']}` | {row['tensor_wasm']:.2f} {unit} | {theirs} (`{row['peer']}`) | "
                   f"{f'{ratio:.2f}×' if ratio else '—'} | {f'≥ {goal}×' if goal else '—'} | {holds} |")
    out.append("")


def headline_section(out, cited):
    out.append("## Headline figures\n")
    out.append("| figure | ours | peer, same run | ours ÷ peer | goal | holds | run file |")
    out.append("|---|---|---|---|---|---|---|")
    for row in HEADLINE:
        out.append(criterion_headline_row(row, cited))
    # HTTP throughput: the newest A/B run.
    path = os.path.join(RESULTS, "http-throughput", "latest.json")
    if os.path.exists(path):
        doc = load(path)
        cited.setdefault(path, set()).add("headline")
        s = doc["summary"]
        ratio = doc.get("ratio_req_per_s_tensor_wasm_over_minimal")
        ratio = ratio.get("median") if isinstance(ratio, dict) else ratio
        if ratio is None:
            ratio = s["tensor_wasm"]["req_per_s"]["median"] / s["minimal"]["req_per_s"]["median"]
        target = (doc.get("target") or {}).get("ratio_at_least")
        knobs = " ".join(re.findall(r"\b(?:AUTH|INLINE)=\w+", doc.get("command", "")))
        peer = PEER_LABELS.get(doc.get("peer_mode", "minimal"))

        def cpu(side):
            c = s[side].get("cpu_us_per_req")
            return f", server CPU {c['median']:.2f} µs/request" if c else ""
        per_round = (doc.get("ratio_req_per_s_tensor_wasm_over_minimal") or {}).get("per_round")
        spread = f" (rounds {min(per_round):.2f}-{max(per_round):.2f}×)" if per_round else ""
        out.append(f"| HTTP invoke throughput, `tensor-wasm serve`{' (' + knobs + ')' if knobs else ''} | "
                   f"{s['tensor_wasm']['req_per_s']['median']:.0f} req/s (p50 {s['tensor_wasm']['p50_us']['median']} µs, "
                   f"p99 {s['tensor_wasm']['p99_us']['median']} µs{cpu('tensor_wasm')}) | {peer}: "
                   f"{s['minimal']['req_per_s']['median']:.0f} req/s (p50 {s['minimal']['p50_us']['median']} µs, "
                   f"p99 {s['minimal']['p99_us']['median']} µs{cpu('minimal')}) | {float(ratio):.2f}×{spread}; req/s: higher is better | "
                   f"{'≥ ' + format(target, '.2f') + '×' if target is not None else '—'} | "
                   f"{('yes' if float(ratio) >= target else '**no**') if target is not None else '—'} | "
                   f"{link(rel(path))} |")
    else:
        out.append("| HTTP invoke throughput vs the minimal axum + wasmtime server | not measured: no run file | | | — | — | — |")
    # HTTP handlers (wasi:http components): the newest `make serve-compare` run.
    runs = [(p, load(p)) for p in glob.glob(os.path.join(RESULTS, "serve-compare", "*.json"))]
    if runs:
        path, doc = max(runs, key=lambda r: r[1].get("timestamp_utc") or "")
        cited.setdefault(path, set()).add("headline")
        t = doc["throughput"]
        goal = (t.get("target") or {}).get("ratio_at_least", 1.0)
        r = t["ratio_tensor_wasm_over_wasmtime_serve"]
        out.append(f"| HTTP handler (`wasi:http` component, hello world in C), `tensor-wasm serve` | "
                   f"{t['median_req_per_s']['tensor_wasm']:.0f} req/s | `wasmtime serve` (wasmtime-cli of the "
                   f"embedded wasmtime version), same component: {t['median_req_per_s']['wasmtime_serve']:.0f} req/s | "
                   f"{r:.2f}× (rounds {min(t['per_round_ratio']):.2f}-{max(t['per_round_ratio']):.2f}×); "
                   f"req/s: higher is better | ≥ {goal:.2f}× | {'yes' if r >= goal else '**no**'} | {link(rel(path))} |")
    # Tail latency: p99 against the p50 of the same path and run.
    path = os.path.join(RESULTS, "tail-latency.json")
    if os.path.exists(path):
        doc = load(path)
        cited.setdefault(path, set()).add("headline")
        for key, r in doc["results"].items():
            out.append(f"| Tail latency, `{key}` (p99) | {fmt_ns(r['p99_ns'])} | p50 of the same path: "
                       f"{fmt_ns(r['p50_ns'])} | {r['p99_ns'] / r['p50_ns']:.2f}×; time: lower is better | — | — | "
                       f"{link(rel(path))} |")
    # GPU: the newest CUDA run of the GPU suite, else rows saying so.
    runs = [(p, load(p)) for p in sorted(glob.glob(os.path.join(RESULTS, "gpu", "*", "summary.json")))]
    runs = [(p, d) for p, d in runs if d.get("backend") == "cuda" and d.get("gpu_measurement")]
    if runs:
        path, doc = max(runs, key=lambda pd: (pd[1].get("date") or "", pd[0]))
        cited.setdefault(path, set()).add("headline")
        for c in doc.get("comparisons", []):
            better = "lower is better" if c.get("comparison") == "at_most" else "higher is better"
            ratio = f"{c['ratio']:.3f}×; {better}" if c.get("ratio") is not None else "n/a"
            target = "—" if c.get("target") is None else \
                ("≤ " if c.get("comparison") == "at_most" else "≥ ") + f"{c['target']}×"
            met = {True: "yes", False: "**no**"}.get(c.get("met"), "—")
            out.append(f"| GPU: {c['name']} | {c['ours_text']} | {c['peer_text']} | {ratio} | {target} | {met} | "
                       f"{link(rel(path), rel(path).split('/')[-2] + '/summary.json')} |")
    else:
        for what, peer in GPU_HEADLINE:
            out.append(f"| GPU: {what} | not measured: no GPU run file | {peer} | — | — | — | — |")
    out.append("")
    out.append("- Each row's figures and ratio come from the one run file it links (one Criterion run, or one "
               "interleaved script); for Criterion rows, the newest run file that has the bench and its peer. "
               "Absolute times are those of that file's machine.")
    out.append("- Criterion figures are medians; GB/s is bytes ÷ median. For a bench family the headline is its "
               "largest size, with the range over all sizes of the same run in brackets.")
    out.append("- Goals, \"—\" where none is set: " + "; ".join(GOAL_SOURCES.values()) + ".")
    out.append("- Every other tracked figure is in the wall-clock baseline and instruction-count tables below; "
               "every run file is listed under \"Run files\" at the end.\n")


def run_index_section(out, cited):
    out.append("## Run files\n")
    out.append("Every committed run, linked rather than copied here; \"cited\" says where this document uses it.\n")
    out.append("### Criterion (`scripts/criterion_summary.py` output)\n")
    out.append("| run file | date | commit | command | benches | cited |")
    out.append("|---|---|---|---|---|---|")
    for path in criterion_files():
        doc = load(path)
        out.append(f"| {link(rel(path))} | {doc.get('date')} | `{(doc.get('commit') or '')[:8]}` | "
                   f"`{doc.get('command')}` | {len(doc.get('benches', {}))} | "
                   f"{', '.join(sorted(cited.get(path, ()))) or '—'} |")
    out.append("")
    files = [p for p in glob.glob(os.path.join(RESULTS, "http-throughput", "*.json"))]
    if files:
        docs = sorted(((load(p).get("timestamp_utc") or "", p) for p in files))
        out.append("### HTTP throughput (`scripts/http-throughput.sh` output)\n")
        out.append("| run file | date | commit | command | tensor-wasm ÷ minimal (req/s) | cited |")
        out.append("|---|---|---|---|---|---|")
        for _, path in docs:
            doc = load(path)
            r = doc.get("ratio_req_per_s_tensor_wasm_over_minimal")
            r = r.get("median") if isinstance(r, dict) else r
            out.append(f"| {link(rel(path))} | {doc.get('timestamp_utc')} | `{(doc.get('git_commit') or '')[:8]}` | "
                       f"`{doc.get('command')}` | {'' if r is None else format(float(r), '.3f')} | "
                       f"{', '.join(sorted(cited.get(path, ()))) or '—'} |")
        out.append("")
    files = sorted(glob.glob(os.path.join(RESULTS, "scale-out", "*.json")))
    if files:
        out.append("### Scale-out (`scripts/scale-out-bench.sh` output)\n")
        out.append("HTTP invoke throughput over the shared store (PostgreSQL + S3) ÷ the same server over "
                   "its local data dir, interleaved rounds in one run (goal ≥ 0.95); deploy "
                   "latency in both modes; invalidation lag from a deploy acknowledged by one replica until "
                   "another serves it.\n")
        out.append("| run file | date | commit | shared ÷ local req/s (median, min-max) | deploy p50 / p99 local | "
                   "deploy p50 / p99 shared | invalidation lag p50 / p99 |")
        out.append("|---|---|---|---|---|---|---|")
        ms = lambda s: f"{s * 1000:.1f} ms"
        for path in files:
            doc = load(path)
            r = doc["ratio_req_per_s_shared_over_local"]
            dl, dsh = doc["deploy_latency"]["local"], doc["deploy_latency"]["shared"]
            lag = doc["invalidation_lag_s"]
            out.append(f"| {link(rel(path))} | {doc.get('timestamp_utc')} | `{(doc.get('git_commit') or '')[:8]}` | "
                       f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}) | {ms(dl['p50_s'])} / {ms(dl['p99_s'])} | "
                       f"{ms(dsh['p50_s'])} / {ms(dsh['p99_s'])} | {ms(lag['p50_s'])} / {ms(lag['p99_s'])} |")
        out.append("")
    files = sorted(glob.glob(os.path.join(RESULTS, "serve-compare", "*.json")))
    if files:
        out.append("### Side by side with `wasmtime serve` (`make serve-compare` output)\n")
        out.append("The same `wasi:http` components under `wasmtime serve` (wasmtime-cli of the embedded "
                   "wasmtime version) and `tensor-wasm serve`: the answers to a list of requests (status, "
                   "content type, body) compared, and the throughput of a hello-world handler in C, "
                   "interleaved rounds in one run (goal ≥ 1.0).\n")
        out.append("| run file | date | commit | answers identical | tensor-wasm req/s (median) | "
                   "wasmtime serve req/s (median) | ratio (per round) | load-generator errors |")
        out.append("|---|---|---|---|---|---|---|---|")
        for path in files:
            doc = load(path)
            t = doc["throughput"]
            rows = doc["requests"]["python"] + doc["requests"]["c"]
            same = sum(1 for r in rows if r["identical"])
            errors = t.get("errors_total", {})
            out.append(f"| {link(rel(path))} | {doc.get('timestamp_utc')} | `{(doc.get('git_commit') or '')[:8]}` | "
                       f"{same} of {len(rows)} | {t['median_req_per_s']['tensor_wasm']:.0f} | "
                       f"{t['median_req_per_s']['wasmtime_serve']:.0f} | "
                       f"{t['ratio_tensor_wasm_over_wasmtime_serve']:.3f} "
                       f"({min(t['per_round_ratio']):.3f}-{max(t['per_round_ratio']):.3f}) | "
                       f"{sum(errors.values()) if errors else '—'} |")
        out.append("")
    files = sorted(glob.glob(os.path.join(RESULTS, "component-release", "*.json")))
    if files:
        out.append("### Components released at their deadline (`make component-release` output)\n")
        out.append("How long after its deadline a component held in a host wait that never ends (a "
                   "test-only pollable) returns and frees its instance slot, per style and wait, "
                   "100 invocations each with a 50 ms deadline (goal p99 ≤ 100 ms).\n")
        out.append("| run file | date | commit | style | wait | p50 | p99 | max |")
        out.append("|---|---|---|---|---|---|---|---|")
        for path in files:
            doc = load(path)
            for c in doc["cases"]:
                out.append(f"| {link(rel(path))} | {doc.get('date')} | `{(doc.get('commit') or '')[:8]}` | "
                           f"{c['style']} | {c['wait']} | {c['p50_ms']:.2f} ms | {c['p99_ms']:.2f} ms | "
                           f"{c['max_ms']:.2f} ms |")
        out.append("")
    texts = sorted(glob.glob(os.path.join(RESULTS, "**", "*.txt"), recursive=True))
    if texts:
        out.append("Raw tool output kept as text: " + ", ".join(link(rel(p), rel(p)[len("bench-results/"):])
                                                           for p in texts) + ".\n")


# ---------------------------------------------------------------------- sections

def icount_section(out):
    path = os.path.join(RESULTS, "icount", "baseline.json")
    out.append("## Instruction counts of the hot paths (deterministic gate)\n")
    if not os.path.exists(path):
        out.append("No instruction-count baseline is committed yet.\n")
        return
    doc = load(path)
    pct = doc["policy"]["max_increase_pct"]
    tools = ", ".join(f"{k}: {v}" for k, v in sorted(doc.get("tools", {}).items()))
    out.append(f"From {provenance(path, doc)}. Tools: {tools}.\n")
    out.append("One call of each path under callgrind (gungraun), its fixture built and warmed outside the "
               "counted region (`crates/tensor-wasm-icount`). Counts do not move with machine load; "
               f"`make icount` (in `make test`) fails when a path executes more than +{pct:g} % instructions.\n")
    out.append("| hot path | what one call does | instructions | max allowed |")
    out.append("|---|---|---|---|")
    for key, m in doc["metrics"].items():
        limit = math.floor(m["instructions"] * (1 + pct / 100.0))
        out.append(f"| `{key}` | {ICOUNT_PATHS.get(key, '')} | {m['instructions']} | {limit} |")
    out.append("")


def baseline_section(out, cited):
    path = os.path.join(RESULTS, "baseline.json")
    out.append("## Wall-clock baseline (Criterion gate)\n")
    if not os.path.exists(path):
        out.append("No baseline is committed yet.\n")
        return
    doc = load(path)
    thr = doc["policy"]["regress_pct_threshold"]
    runs = doc.get("runs", [])
    out.append(f"From {link(rel(path), rel(path))} — machine: {machine_line(doc.get('machine'))}; generated {doc.get('generated')} "
               f"from {len(runs)} runs:")
    for r in runs:
        cited.setdefault(os.path.join(ROOT, r.get("file", "")), set()).add("baseline")
        out.append(f"- {link(r.get('file', ''), r.get('file'))} ({r.get('date')}, commit `{r.get('commit')}`)")
    out.append("")
    out.append(f"Method, as recorded in the file: {doc.get('method')}.\n")
    cvs = {}
    for r in runs:
        f = os.path.join(ROOT, r.get("file", ""))
        if os.path.exists(f):
            for key, b in load(f)["benches"].items():
                if b.get("mean_ns"):
                    cvs[key] = max(cvs.get(key, 0.0), b["std_dev_ns"] / b["mean_ns"] * 100.0)
    out.append(f"A metric is over its limit in `make ci-bench` above median × (1 + (tolerance + {thr:g}) / 100), "
               "and fails the gate when its one confirmation re-run is over it too. "
               "CV is the largest std dev ÷ mean of the metric over those runs.\n")
    out.append("| metric | median | spread of the runs | CV | tolerance | limit |")
    out.append("|---|---|---|---|---|---|")
    for key, m in doc["metrics"].items():
        limit = m["median_ns"] * (1 + (m["tolerance_pct"] + thr) / 100.0)
        cv = f"{cvs[key]:.1f} %" if key in cvs else "–"
        out.append(f"| `{key}` | {fmt_ns(m['median_ns'])} | {m.get('spread_pct', 0):.1f} % | {cv} | "
                   f"{m['tolerance_pct']} % | {fmt_ns(limit)} |")
    out.append("")


def policy_section(out):
    base = os.path.join(RESULTS, "baseline.json")
    icount = os.path.join(RESULTS, "icount", "baseline.json")
    thr = load(base)["policy"]["regress_pct_threshold"] if os.path.exists(base) else None
    pct = load(icount)["policy"]["max_increase_pct"] if os.path.exists(icount) else None
    out.append("## Regression policy and re-baselining\n")
    out.append("Two gates, both small Rust tools in `crates/tensor-wasm-gates` that print a table of every tracked metric:\n")
    if thr is not None:
        out.append(f"- **Wall clock** (`make ci-bench`: the Criterion benches with CI flags, then `bench-gate`): a tracked "
                   f"median is over its limit above `median_ns × (1 + (tolerance_pct + {thr:g}) / 100)` of "
                   "`bench-results/baseline.json`; the gate then re-runs exactly the regressed ids once (the same bench "
                   "command with a Criterion filter) and fails only for those over the limit again, since a real "
                   "slowdown regresses both times and a one-run spike does not. A tracked metric missing from the run "
                   "fails at once; an untracked one is listed. Each run starts from an empty results directory "
                   "(`target/ci-bench/criterion`), so results of other bench runs are not listed. Tolerances come from "
                   "the spread of recorded runs (see `bench-results/baseline-notes.md`), because wall-clock time on a "
                   "shared 2-core machine is noisy.")
    if pct is not None:
        out.append(f"- **Instruction counts** (`make icount`, part of `make test`): callgrind counts of the hot paths; a "
                   f"path fails above +{pct:g} % of `bench-results/icount/baseline.json`, a missing path fails, an "
                   "untracked one is listed. Deterministic, so the threshold is tight.")
    out.append("")
    out.append("Re-baselining, always in a commit of its own that says why the numbers moved:\n")
    out.append("- wall clock: run the CI flags several times on a quiet machine (`make bench-record`), then "
               "`python3 scripts/make_baseline.py [--min-runs N] [--spread-factor K] bench-results/baseline.json "
               "<runs>` (the exact command of the current file is in `bench-results/baseline-notes.md`); new "
               "benches enter the baseline only after a clean run; then five consecutive `make ci-bench` runs "
               "on the unchanged tree must pass, recorded in the notes;")
    out.append("- instruction counts: `make icount-baseline` (records machine, tools, date, commit, command); "
               "needed after a deliberate change of a hot path, a toolchain or dependency upgrade, or on "
               "another machine class;")
    out.append("- then `make perf-doc` and commit `PERFORMANCE.md` and `docs/charts/` with the run files; "
               "`make perf-doc-check` (in `make test`) fails when they are out of date.\n")
    out.append("Reading the Criterion HTML: after any `cargo bench`, `target/criterion/report/index.html` lists "
               "every group; `target/criterion/<group>/<id>/report/index.html` shows one metric's sample "
               "distribution (PDF), the iteration-time scatter (look for drift and outliers) and, when an earlier "
               "run is on disk, the comparison with it. `make ci-bench` writes the same tree to "
               "`target/ci-bench/criterion/` instead (emptied at its start), and `bench.yml` uploads that as the "
               "`criterion` artifact of each pull-request run. The numbers the gate uses are in "
               "`<group>/<id>/new/estimates.json` (`median.point_estimate`) of that tree.\n")


def tail_latency_section(out):
    path = os.path.join(RESULTS, "tail-latency.json")
    out.append("## Tail latency\n")
    if not os.path.exists(path):
        out.append("No tail-latency run file is committed yet (`make tail-latency` writes `bench-results/tail-latency.json`).\n")
        return
    doc = load(path)
    load_avg = doc.get("load_average_before_after")
    out.append(f"From {provenance(path, doc)}."
               + (f" Load average (1, 5, 15 min) before / after: {load_avg[0]} / {load_avg[1]}." if load_avg else "")
               + "\n")
    out.append(f"Method, as recorded: {doc.get('method')}. Diagnostic, not gated: tails on a shared machine "
               "measure the machine as much as the code.\n")
    out.append("| path | samples | p50 | p95 | p99 | p99.9 | max |")
    out.append("|---|---|---|---|---|---|---|")
    for key, r in doc["results"].items():
        out.append(f"| `{key}` | {r['samples']} | {fmt_ns(r['p50_ns'])} | {fmt_ns(r['p95_ns'])} | "
                   f"{fmt_ns(r['p99_ns'])} | {fmt_ns(r['p99_9_ns'])} | {fmt_ns(r['max_ns'])} |")
    out.append("")


def fence_overhead_section(out):
    """Instruction counts of fenced tenant kernels in the interpreter (`make fence-overhead`)."""
    runs = sorted(glob.glob(os.path.join(RESULTS, "fence-overhead", "*.json")))
    out.append("## Fenced tenant kernels: instruction overhead\n")
    if not runs:
        out.append("No fence-overhead run file is committed yet (`make fence-overhead`).\n")
        return
    path = runs[-1]
    doc = load(path)
    target = doc["target"]["geomean_overhead_at_most"]
    geomean = doc["geomean_overhead"]
    out.append(f"From {provenance(path, doc)}. Method, as recorded: {doc['method']}. The GPU's wall "
               "clock for the same rewrite is in the GPU runs (fence section).\n")
    if "checked_instructions" not in doc["kernels"][0]:
        # Runs before the launch-time proof: every launch ran fenced.
        out.append("| kernel | fences | grouped | polls | proven | unfenced | fenced | overhead |")
        out.append("|---|---|---|---|---|---|---|---|")
        for k in doc["kernels"]:
            out.append(f"| `{k['kernel']}` | {k['fences']} | {k['grouped']} | {k['polls']} | "
                       f"{k['proven']} | {k['unfenced_instructions']} | {k['fenced_instructions']} | "
                       f"{100 * k['overhead']:+.1f} % |")
        met = "met" if geomean <= target else "**not met**"
        out.append(f"| geometric mean | | | | | | | {100 * geomean:+.1f} % (goal ≤ {100 * target:.0f} %: {met}) |")
        out.append("")
        return
    out.append("`fenced` is the fenced entry, which runs when the launch-time proof cannot clear a "
               "launch; `runs` is the entry a backend chose for this launch (`lean`: the tenant's own "
               "code, proven) and `overhead` its count against the tenant's module. The proof's cost is "
               "host time per launch, not kernel instructions (cached per launch description).\n")
    out.append("| kernel | fences | polls | unfenced | fenced | runs | overhead | proof (host, debug build) |")
    out.append("|---|---|---|---|---|---|---|---|")
    for k in doc["kernels"]:
        runs_as = "lean" if k["lean"] else "fenced"
        out.append(f"| `{k['kernel']}` | {k['fences']} | {k['polls']} | {k['unfenced_instructions']} | "
                   f"{k['fenced_instructions']} ({100 * k['fenced_overhead']:+.1f} %) | {runs_as} | "
                   f"{100 * k['overhead']:+.1f} % | {k['proof']}; {k['proof_microseconds_median']:.0f} µs |")
    met = "met" if geomean <= target else "**not met**"
    fenced = doc["geomean_fenced_overhead"]
    out.append(f"| geometric mean | | | | {100 * fenced:+.1f} % | | {100 * geomean:+.1f} % "
               f"(goal ≤ {100 * target:.0f} %: {met}) | |")
    out.append("")


def otel_cost_section(out):
    """What exporting every request's spans costs an invoke (scripts/otel-cost.sh)."""
    # <date>.json, then <date>-2.json, <date>-3.json, ... the same day.
    def order(path):
        name = os.path.basename(path)[:-len(".json")]
        parts = name.split("-")
        return (name[:10], int(parts[3]) if len(parts) > 3 else 1)
    runs = sorted(glob.glob(os.path.join(RESULTS, "otel-cost", "*.json")), key=order)
    out.append("## Trace export: what it costs an invoke\n")
    if not runs:
        out.append("No otel-cost run file is committed yet (`bash scripts/otel-cost.sh`).\n")
        return
    path = runs[-1]
    doc = load(path)
    summary = doc["summary"]
    out.append(f"From {provenance(path, doc)}. Method, as recorded: {doc['description']} "
               f"{doc['config']['rounds']} rounds of {doc['config']['round_seconds']} s, "
               f"{doc['config']['connections']} connections. With export off no span is made "
               "(docs/observability.md).\n")
    out.append("| | req/s, median [min … max] | p50 µs, median | p99 µs, median | server CPU µs/req, median |")
    out.append("|---|---|---|---|---|")
    for key, label in (("off", "traces off"), ("on", "every request traced and exported")):
        side = summary[key]
        rps = side["req_per_s"]
        cpu = side["cpu_us_per_req"]
        cpu_text = "n/a" if cpu is None else f"{cpu['median']:.1f}"
        out.append(f"| {label} | {rps['median']:.0f} [{rps['min']:.0f} … {rps['max']:.0f}] | "
                   f"{side['p50_us']['median']:.0f} | {side['p99_us']['median']:.0f} | {cpu_text} |")
    ratio = summary["ratio_req_per_s_on_over_off"]
    out.append("")
    out.append(f"On/off throughput, median of the per-round ratios: {ratio['median']:.3f} "
               f"(per round: {', '.join(f'{r:.3f}' for r in ratio['per_round'])}); p50 on/off "
               f"{summary['ratio_p50_on_over_off']:.3f}. Spans exported {summary['spans_exported']}, "
               f"dropped {summary['spans_dropped']}.\n")


def interp_speed_section(out):
    """How fast the PTX interpreter runs tenant kernels (`make interp-speed`)."""
    runs = sorted(glob.glob(os.path.join(RESULTS, "interp-speed", "*.json")))
    out.append("## Tenant kernels on a CPU host: the PTX interpreter's speed\n")
    if not runs:
        out.append("No interp-speed run file is committed yet (`make interp-speed`).\n")
        return
    path = runs[-1]
    doc = load(path)
    out.append(f"From {provenance(path, doc)}. Method, as recorded: {doc['method']}. Absolute times "
               "are this machine's; one interpreter thread per launch.\n")
    out.append("| kernel | instructions (plain) | plain, median [min … max] | fenced, median [min … max] "
               "| fenced / plain | fenced Minstr/s |")
    out.append("|---|---|---|---|---|---|")
    for k in doc["kernels"]:
        p, f = k["unfenced_seconds"], k["fenced_seconds"]
        span = lambda s: f"{1e6 * s['median']:.0f} µs [{1e6 * s['min']:.0f} … {1e6 * s['max']:.0f}]"
        out.append(f"| `{k['kernel']}` | {k['unfenced_instructions']} | {span(p)} | {span(f)} | "
                   f"{f['median'] / p['median']:.2f} | {k['fenced_minstr_per_s']:.0f} |")
    out.append("")


# The HTTP peers of scripts/http-throughput.sh (`peer_mode` of a run file; older runs: minimal).
PEER_LABELS = {
    "floor": "floor axum + wasmtime server (`minimal-server --floor`: the server's engine "
             "configuration, epochs, a fresh instance per call, the call inline)",
    "minimal": "minimal axum + wasmtime server (plain pooling engine, `InstancePre`, each call in "
               "`spawn_blocking`)",
}


def throughput_section(out, cited):
    path = os.path.join(RESULTS, "http-throughput", "latest.json")
    out.append("## HTTP throughput: tensor-wasm vs a bare axum + wasmtime server\n")
    if not os.path.exists(path):
        out.append("No run file is committed yet.\n")
        return
    doc = load(path)
    s = doc["summary"]
    out.append(f"From {link(rel(path), rel(path))} — machine: {machine_line(doc.get('machine'))}; "
               f"date: {doc.get('timestamp_utc', doc.get('date'))}; commit: `{doc.get('git_commit')}`; "
               f"command: `{doc.get('command')}`.\n")
    out.append("Both servers run on the same machine as the load generator, interleaved A B A B; "
               "figures are medians over the rounds (min … max in brackets).\n")
    out.append("| server | req/s | p50 | p99 |")
    out.append("|---|---|---|---|")
    rows = [("tensor_wasm", "tensor-wasm serve (limits, metrics, request ids on)"),
            ("minimal", PEER_LABELS.get(doc.get("peer_mode", "minimal")))]
    if doc.get("baseline"):
        s = {**s, "baseline": doc["baseline"]}
        rows.append(("baseline", f"tensor-wasm serve, baseline build `{doc['baseline'].get('binary')}`"))
    for name, label in rows:
        r = s[name]
        rps = r["req_per_s"]
        out.append(f"| {label} | {rps['median']:.0f} [{rps['min']:.0f} … {rps['max']:.0f}] | "
                   f"{r['p50_us']['median']} µs | {r['p99_us']['median']} µs |")
    ratio = doc.get("ratio_req_per_s_tensor_wasm_over_minimal")
    if isinstance(ratio, dict):
        ratio = ratio.get("median")
    target = (doc.get("target") or {}).get("ratio_at_least")
    if ratio is not None:
        out.append(f"\nRatio tensor-wasm ÷ minimal (req/s, medians): **{float(ratio):.2f}×**"
                   + (f" (target ≥ {target:.2f}×, recorded in the run file)" if target is not None else "") + ".\n")
    against = doc.get("ratio_req_per_s_tensor_wasm_over_baseline")
    if against:
        out.append(f"Same-run A/B against the baseline build: per-round ratios {against.get('per_round')}, "
                   f"median {against.get('per_round_median')}.\n")
    # Every run of the same commit, so one run never stands alone (knobs from its command line).
    same = []
    for other in sorted(glob.glob(os.path.join(RESULTS, "http-throughput", "*.json"))):
        if os.path.basename(other) == "latest.json":
            continue
        o = load(other)
        if o.get("git_commit") != doc.get("git_commit"):
            continue
        knobs = dict(re.findall(r"\b(AUTH|INLINE)=(\w+)", o.get("command", "")))
        r = o.get("ratio_req_per_s_tensor_wasm_over_minimal")
        if isinstance(r, dict):
            r = r.get("median")
        cited.setdefault(other, set()).add("HTTP throughput")
        same.append((rel(other), knobs.get("AUTH", "on"), knobs.get("INLINE", "on"), r))
    if len(same) > 1:
        out.append(f"All runs of commit `{doc.get('git_commit')}` (INLINE=off: `serve --no-inline-calls`, "
                   "every call handed to the blocking pool as the minimal server does):\n")
        out.append("| run file | auth | inline calls | ratio |")
        out.append("|---|---|---|---|")
        for name, auth, inline, r in same:
            out.append(f"| {link(name)} | {auth} | {inline} | {float(r):.3f} |")
        out.append("")


def gpu_section(out):
    """The GPU suite's runs (bench-results/gpu/<date>-<gpu>/summary.json, written by
    scripts/gpu-suite/summarize.py on the GPU machine): only runs whose backend is CUDA."""
    out.append("## GPU\n")
    runs, ignored = [], []
    for path in sorted(glob.glob(os.path.join(RESULTS, "gpu", "*", "summary.json"))):
        doc = load(path)
        (runs if doc.get("backend") == "cuda" and doc.get("gpu_measurement") else ignored).append((path, doc))
    if not runs:
        out.append("No GPU run has been recorded yet: no figure for CUDA launches, unified memory, JIT")
        out.append("loads, cold starts or kernel throughput is published until the GPU suite has run on an")
        out.append("H100/H200. `make gpu-suite` builds the suite and BUILD.md (\"GPU validation suite\") says how")
        out.append("to run it there; its results land in `bench-results/gpu/<date>-<gpu>/` and appear here.\n")
    for path, doc in runs:
        d = os.path.dirname(path)
        gpu = doc.get("gpu") or {}
        m = doc.get("machine") or {}
        out.append(f"### {os.path.basename(d)}\n")
        out.append(f"From `{rel(d)}/` — GPU: {gpu.get('name')} ({gpu.get('memory_total')}); driver "
                   f"{doc.get('driver')}; CUDA {doc.get('cuda_version')}; machine: {m.get('cpu')}, "
                   f"{m.get('cores')} cores, {m.get('kernel')}; date: {doc.get('date')}; commit: "
                   f"`{doc.get('commit')}`; command: `{doc.get('command')}`.\n")
        failed = doc.get("checks_failed") or []
        out.append(f"Correctness: {doc.get('checks_total', 0) - len(failed)} of {doc.get('checks_total', 0)} checks "
                   f"passed{' (failed: ' + '; '.join(failed) + ')' if failed else ''}; compute-sanitizer memcheck "
                   f"clean: {doc.get('correctness', {}).get('sanitizer')}; zero copy: "
                   f"{(doc.get('correctness', {}).get('zero_copy') or {}).get('passed')}.\n")
        bits = doc.get("correctness", {}).get("bit_identity_summary")
        if bits:
            out.append(f"Bit identity (the conformance set on the GPU against the CPU backend's record): "
                       f"{bits.get('generated_equal')} of {bits.get('generated_cases')} launches of generated kernels "
                       f"equal, {bits.get('generated_mismatches')} mismatches; CUDA C++ test kernels: "
                       f"{bits.get('cuda_cpp_equal')} of {bits.get('cuda_cpp_cases')} equal"
                       f"{' (' + '; '.join(bits.get('cuda_cpp_differences') or []) + ')' if bits.get('cuda_cpp_differences') else ''}.\n")
        prov = doc.get("provenance") or {}
        if prov.get("gpu_state") or prov.get("torch"):
            state = prov.get("gpu_state") or {}
            out.append("GPU state at the start: " + ", ".join(f"{k} {v}" for k, v in state.items())
                       + f"; PyTorch {prov.get('torch')}.\n")
        out.append("| measurement | ours | peer | ratio | target | met |")
        out.append("|---|---|---|---|---|---|")
        for c in doc.get("comparisons", []):
            ratio = f"{c['ratio']:.3f}" if c.get("ratio") is not None else "n/a"
            target = "" if c.get("target") is None else ("≤ " if c.get("comparison") == "at_most" else "≥ ") + str(c["target"])
            met = {True: "yes", False: "**no**"}.get(c.get("met"), "")
            out.append(f"| {c['name']} | {c['ours_text']} | {c['peer_text']} | {ratio} | {target} | {met} |")
        out.append("")
    if ignored:
        out.append("Not shown (not GPU measurements): " + ", ".join(f"`{rel(os.path.dirname(p))}`" for p, _ in ignored) + ".\n")


def render():
    """The document text and the charts {file name: svg text}."""
    charts = {}
    cited = {}  # run file path -> {"headline", "baseline", "chart"}
    out = [
        "# Performance",
        "",
        "<!-- Generated by `make perf-doc` (scripts/perf_doc.py) from bench-results/. Do not edit by hand; "
        "`make perf-doc-check` fails when this file, docs/perf/ or docs/charts/ is out of date. -->",
        "",
        "Generated from the run files under `bench-results/` by `make perf-doc`; every figure links the run",
        "file it comes from.",
        "",
    ]
    headline_section(out, cited)
    pages = {}

    def page(name, title, what, fill):
        """Renders a section into docs/perf/<name>.md and links it from PERFORMANCE.md."""
        body = []
        fill(body)
        text = re.sub(r"\A## [^\n]*\n+", "", "\n".join(body))
        # The section's links are relative to the repository root; the page is two levels down.
        text = re.sub(r"\]\((?!https?:|#|\.\./|/)([^)]+)\)", r"](../../\1)", text)
        pages[f"{PAGES_DIR}/{name}.md"] = (
            f"# {title}\n\n<!-- Generated by `make perf-doc` (scripts/perf_doc.py) from bench-results/; "
            f"do not edit by hand. -->\n\nPart of [PERFORMANCE.md](../../PERFORMANCE.md).\n\n"
            + text.rstrip() + "\n")
        out.append(f"- [{title}]({PAGES_DIR}/{name}.md): {what}")

    out += ["## More tables, on their own pages", ""]
    page("cpu-kernels", "CPU backend kernels vs numpy / OpenBLAS",
         "every blueprint and builtin on the CPU backend next to numpy on the same cores.",
         lambda o: cpu_kernels_section(o, cited))
    page("baseline", "Wall-clock baseline (Criterion gate)",
         "the medians and tolerances `make ci-bench` gates against, and the runs they come from.",
         lambda o: baseline_section(o, cited))
    page("gpu", "GPU runs", "every committed GPU validation run, measurement by measurement.",
         gpu_section)
    out.append("")
    out += [
        "## How we measure",
        "",
        "Every number here comes from a committed run file under `bench-results/`, named next to",
        "its table or chart with the machine, date, commit and command that produced it. Absolute times are",
        "only meaningful on their machine; comparisons are made as ratios of runs interleaved in the",
        "same script or the same Criterion run. GPU figures appear only once measured on a GPU.",
        "",
        "- Criterion benches (`crates/tensor-wasm-bench/benches/`, `crates/tensor-wasm-tenant/benches/`,",
        "  `crates/tensor-wasm-snapshot/benches/`, `harness = false`): a warm-up, then Criterion's samples;",
        "  the median and its confidence interval are reported (each run file names the flags it ran with).",
        "  Each bench that has a peer (raw wasmtime, `memcpy`) measures it in the same run so the ratio is",
        "  what we track. Noise policy: per-metric tolerances derived from the spread of repeated runs, and",
        "  noisy hot paths gated by instruction counts instead (below); the CV column of the baseline",
        "  table shows which metrics are noisy on the reference machine.",
        "- Instruction counts (`crates/tensor-wasm-icount`, gungraun + valgrind callgrind): one call per",
        "  hot path, exact and repeatable; this is the tight gate.",
        "- Tail latency (`benches/tail_latency.rs`, `make tail-latency`): timed samples of four paths,",
        "  interleaved, reported as percentiles.",
        "- HTTP throughput: `make http-throughput` (scripts/http-throughput.sh) runs the real server and",
        "  a minimal reference server alternately under the in-repo load generator (closed loop,",
        "  keep-alive connections, loopback, bounded in time).",
        "- Run files: `scripts/criterion_summary.py` turns Criterion's `estimates.json` into",
        "  `bench-results/criterion/*.json`; the throughput script writes `bench-results/http-throughput/`;",
        "  `icount-gate record` writes `bench-results/icount/baseline.json`; the tail-latency bench writes",
        "  `bench-results/tail-latency.json`.",
        "",
        "## Bench inventory",
        "",
        "| bench id | crate | file | what it measures | unit |",
        "|---|---|---|---|---|",
    ]
    for row in INVENTORY:
        out.append("| `{}` | {} | `{}` | {} | {} |".format(*row))
    for key, what in ICOUNT_PATHS.items():
        out.append(f"| `{key}` (instruction count) | tensor-wasm-icount | `benches/icount.rs` | {what} | instructions per call |")
    out.append("")
    policy_section(out)
    icount_section(out)
    charts_section(out, charts, cited)
    tail_latency_section(out)
    fence_overhead_section(out)
    interp_speed_section(out)
    otel_cost_section(out)
    throughput_section(out, cited)
    out += ["## Run files", "",
            f"Every committed run file, and which figures cite it: [{PAGES_DIR}/run-files.md]"
            f"({PAGES_DIR}/run-files.md).", ""]
    page_out = []
    run_index_section(page_out, cited)
    index = "\n".join(page_out)
    index = re.sub(r"\]\((?!https?:|#|\.\./|/)([^)]+)\)", r"](../../\1)", index)
    index = re.sub(r"(?m)^## Run files\n", "", index)
    pages[f"{PAGES_DIR}/run-files.md"] = (
        "# Run files\n\n<!-- Generated by `make perf-doc` (scripts/perf_doc.py) from bench-results/; "
        "do not edit by hand. -->\n\nPart of [PERFORMANCE.md](../../PERFORMANCE.md).\n\n"
        + index.strip() + "\n")
    return "\n".join(out).rstrip() + "\n", charts, pages


def write_pages(pages, root):
    for relpath, text in pages.items():
        path = os.path.join(root, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)


def write_charts(charts, root):
    d = os.path.join(root, CHARTS_DIR)
    os.makedirs(d, exist_ok=True)
    for name, svg in charts.items():
        with open(os.path.join(d, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(svg)


def check():
    """Renders into a temporary directory and compares with the committed files."""
    doc, charts, pages = render()
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "PERFORMANCE.md"), "w", encoding="utf-8", newline="\n") as f:
            f.write(doc)
        write_charts(charts, tmp)
        write_pages(pages, tmp)
        expected = {"PERFORMANCE.md": os.path.join(tmp, "PERFORMANCE.md")}
        for relpath in pages:
            expected[relpath] = os.path.join(tmp, relpath)
        for name in charts:
            expected[f"{CHARTS_DIR}/{name}"] = os.path.join(tmp, CHARTS_DIR, name)
        for relpath, fresh in sorted(expected.items()):
            committed = os.path.join(ROOT, relpath)
            with open(fresh, "rb") as f:
                want = f.read()
            have = None
            if os.path.exists(committed):
                with open(committed, "rb") as f:
                    have = f.read()
            if have != want:
                problems.append(relpath)
                diff = difflib.unified_diff(
                    (have or b"").decode("utf-8", "replace").splitlines(keepends=True),
                    want.decode("utf-8").splitlines(keepends=True),
                    fromfile=f"{relpath} (committed)", tofile=f"{relpath} (rendered)", n=1)
                sys.stdout.writelines(list(diff)[:60])
        stale = sorted(set(os.listdir(os.path.join(ROOT, CHARTS_DIR))) - set(charts)) \
            if os.path.isdir(os.path.join(ROOT, CHARTS_DIR)) else []
        for name in stale:
            problems.append(f"{CHARTS_DIR}/{name} (no longer rendered)")
        pages_dir = os.path.join(ROOT, PAGES_DIR)
        for name in sorted(os.listdir(pages_dir)) if os.path.isdir(pages_dir) else []:
            if f"{PAGES_DIR}/{name}" not in pages:
                problems.append(f"{PAGES_DIR}/{name} (no longer rendered)")
        if len(doc.encode("utf-8")) > MAX_DOC_BYTES:
            problems.append(f"PERFORMANCE.md is {len(doc.encode('utf-8'))} bytes, over {MAX_DOC_BYTES}: "
                            "move a section to its own page")
    if problems:
        print("perf-doc-check: out of date, run `make perf-doc` and commit: " + ", ".join(problems))
        return 1
    print(f"perf-doc-check: PERFORMANCE.md ({len(doc.encode('utf-8'))} bytes), {len(pages)} pages and "
          f"{len(charts)} charts match the run files")
    return 0


def main():
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    if sys.argv[1:]:
        sys.exit(__doc__)
    doc, charts, pages = render()
    write_charts(charts, ROOT)
    write_pages(pages, ROOT)
    sys.stdout.reconfigure(encoding="utf-8", newline="\n")
    sys.stdout.write(doc)


if __name__ == "__main__":
    main()
