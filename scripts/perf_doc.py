#!/usr/bin/env python3
"""Renders PERFORMANCE.md and its SVG charts from the run files under bench-results/.

Every number in the output comes from a committed file; the document names
the file, machine, date and commit of each table and chart. The output
depends only on those files (no clock, no git, no environment), so running it
twice, or on another checkout of the same commit, gives the same bytes.

Usage:
  python3 scripts/perf_doc.py > PERFORMANCE.md   # prints the document, writes docs/charts/*.svg
  python3 scripts/perf_doc.py --check            # renders into a temporary directory and
                                                 # fails (exit 1, with a diff) when
                                                 # PERFORMANCE.md or a chart differs
"""
import difflib
import glob
import json
import math
import os
import re
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RESULTS = os.path.join(ROOT, "bench-results")
CHARTS_DIR = "docs/charts"  # relative to ROOT; PERFORMANCE.md links to it

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
}


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


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def machine_line(m):
    if not m:
        return "unknown machine"
    if "cpu" in m:
        return f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('kernel', '')}".strip(", ")
    return f"{m.get('cpu_model', 'unknown CPU')}, {m.get('nproc')} cores, {m.get('uname', '')}".strip(", ")


def rel(path):
    return os.path.relpath(path, ROOT)


def provenance(path, doc):
    """One line naming a run file's machine, date, commit and command."""
    return (f"`{rel(path)}` — machine: {machine_line(doc.get('machine'))}; date: {doc.get('date')}; "
            f"commit: `{doc.get('commit')}`; command: `{doc.get('command')}`")


def criterion_files():
    return sorted(glob.glob(os.path.join(RESULTS, "criterion", "*.json")))


def newest_with(prefix, pattern="*.json"):
    """The Criterion run file with the latest `date` (then name) that has a bench id under `prefix`."""
    best = None
    for path in sorted(glob.glob(os.path.join(RESULTS, "criterion", pattern))):
        doc = load(path)
        if any(k.startswith(prefix) for k in doc.get("benches", {})):
            key = (doc.get("date") or "", path)
            if best is None or key > best[0]:
                best = (key, path, doc)
    return (best[1], best[2]) if best else (None, None)


# --------------------------------------------------------------------------- SVG

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
W, H = 860, 440
ML, MR, MT, MB = 84, 240, 106, 58  # margins: left, right (legend), top (title), bottom


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def num(v):
    """Fixed formatting of a coordinate, so output bytes never depend on float repr."""
    return f"{v:.1f}"


def svg_open(title, subtitle_lines):
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{esc(title)}</title>",
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="{ML}" y="22" font-size="15" font-weight="bold">{esc(title)}</text>',
    ]
    for i, line in enumerate(subtitle_lines):
        out.append(f'<text x="{ML}" y="{40 + 14 * i}" font-size="10" fill="#555555">{esc(line)}</text>')
    return out


def log_ticks(lo, hi):
    """Decades covering [lo, hi] (powers of ten)."""
    a = math.floor(math.log10(lo))
    b = math.ceil(math.log10(hi))
    return [10.0 ** e for e in range(a, b + 1)]


def y_axis_log(out, lo, hi, label, fmt):
    ticks = log_ticks(lo, hi)
    y0, y1 = math.log10(ticks[0]), math.log10(ticks[-1])
    top, bottom = MT, H - MB

    def y(v):
        return bottom - (math.log10(v) - y0) / (y1 - y0) * (bottom - top)

    for t in ticks:
        out.append(f'<line x1="{ML}" y1="{num(y(t))}" x2="{W - MR}" y2="{num(y(t))}" stroke="#dddddd"/>')
        out.append(f'<text x="{ML - 6}" y="{num(y(t) + 4)}" text-anchor="end">{esc(fmt(t))}</text>')
    out.append(f'<line x1="{ML}" y1="{top}" x2="{ML}" y2="{bottom}" stroke="#333333"/>')
    out.append(f'<line x1="{ML}" y1="{bottom}" x2="{W - MR}" y2="{bottom}" stroke="#333333"/>')
    out.append(f'<text x="18" y="{num((top + bottom) / 2)}" text-anchor="middle" '
               f'transform="rotate(-90 18 {num((top + bottom) / 2)})">{esc(label)}</text>')
    return y


def legend(out, names):
    x = W - MR + 16
    for i, name in enumerate(names):
        y = MT + 8 + 18 * i
        out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
        out.append(f'<text x="{x + 18}" y="{y}">{esc(name)}</text>')


def line_chart(title, subtitle, x_label, y_label, series, x_fmt, y_fmt):
    """Log-log chart; series = [(name, [(x, y), ...])]."""
    xs = sorted({x for _, pts in series for x, _ in pts})
    ys = [y for _, pts in series for _, y in pts]
    out = svg_open(title, subtitle)
    y = y_axis_log(out, min(ys), max(ys), y_label, y_fmt)
    lx0, lx1 = math.log2(xs[0]), math.log2(xs[-1])
    left, right = ML + 20, W - MR - 20

    def x(v):
        return left if lx1 == lx0 else left + (math.log2(v) - lx0) / (lx1 - lx0) * (right - left)

    for v in xs:
        out.append(f'<line x1="{num(x(v))}" y1="{H - MB}" x2="{num(x(v))}" y2="{H - MB + 5}" stroke="#333333"/>')
        out.append(f'<text x="{num(x(v))}" y="{H - MB + 18}" text-anchor="middle">{esc(x_fmt(v))}</text>')
    out.append(f'<text x="{num((left + right) / 2)}" y="{H - 12}" text-anchor="middle">{esc(x_label)}</text>')
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(pts)
        path = " ".join(f"{num(x(a))},{num(y(b))}" for a, b in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b in pts:
            out.append(f'<circle cx="{num(x(a))}" cy="{num(y(b))}" r="3.5" fill="{color}">'
                       f"<title>{esc(name)} {esc(x_fmt(a))}: {esc(y_fmt(b))}</title></circle>")
    legend(out, [name for name, _ in series])
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bar_chart(title, subtitle, y_label, groups, names, y_fmt):
    """Grouped bars on a log axis; groups = [(label, [value or None per name])]."""
    values = [v for _, vals in groups for v in vals if v]
    out = svg_open(title, subtitle)
    y = y_axis_log(out, min(values), max(values), y_label, y_fmt)
    bottom = H - MB
    left, right = ML + 10, W - MR - 10
    slot = (right - left) / len(groups)
    bar = min(28.0, slot * 0.8 / len(names))
    for g, (label, vals) in enumerate(groups):
        start = left + g * slot + (slot - bar * len(names)) / 2
        for i, v in enumerate(vals):
            if not v:
                continue
            top = y(v)
            out.append(f'<rect x="{num(start + i * bar)}" y="{num(top)}" width="{num(bar - 2)}" '
                       f'height="{num(bottom - top)}" fill="{PALETTE[i % len(PALETTE)]}">'
                       f"<title>{esc(label.replace(chr(10), ' '))} {esc(names[i])}: {esc(y_fmt(v))}</title></rect>")
        for k, part in enumerate(label.split("\n")):
            out.append(f'<text x="{num(left + g * slot + slot / 2)}" y="{bottom + 16 + 13 * k}" '
                       f'text-anchor="middle" font-size="11">{esc(part)}</text>')
    legend(out, names)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def fmt_time_tick(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:g} s"
    if ns >= 1e6:
        return f"{ns / 1e6:g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:g} µs"
    return f"{ns:g} ns"


def fmt_gbps_tick(v):
    return f"{v:g} GB/s"


# ------------------------------------------------------------------------ charts

def chart_restore(charts):
    """Restore time vs image size: the snapshot crate's benches (newest cold-start run file) and
    the runtime's whole-instance restore (newest snapshot-restore run file), when committed."""
    sources = []
    for pattern, prefix, labels in (
        ("*cold-start*.json", "snapshot: ", {
            "restore": "restore (portable)", "restore_lazy": "restore_lazy (mmap)",
            "map_lazy": "map_lazy (mmap)",
            "disk_round_trip": "disk round trip", "capture": "capture", "memcpy": "memcpy peer"}),
        ("*snapshot-restore*.json", "instance: ", {}),
    ):
        path, doc = newest_with("cold_start/", pattern)
        if path:
            sources.append((path, doc, prefix, labels))
    if not sources:
        return None
    series = []
    for path, doc, prefix, labels in sources:
        found = {}
        for key, b in doc["benches"].items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "cold_start" and parts[2].isdigit():
                found.setdefault(parts[1], []).append((int(parts[2]), b["median_ns"]))
        for name in sorted(found):
            series.append((prefix + labels.get(name, name), found[name]))
    subtitle = [f"{rel(p)}: {d.get('date')}, commit {d.get('commit')}" for p, d, _, _ in sources]
    subtitle += sorted({f"machine: {machine_line(d.get('machine'))}" for _, d, _, _ in sources})
    svg = line_chart(
        "Snapshot restore time vs image size (Criterion medians)",
        subtitle + ["snapshot: the snapshot crate's encode/decode of a memory image; "
                    "instance: the runtime's whole restore of an instance"],
        "image size (log scale)", "median time per operation (log scale)",
        series, fmt_bytes, fmt_time_tick)
    name = "restore-vs-size.svg"
    charts[name] = svg
    return name, [(p, d) for p, d, _, _ in sources]


def chart_dispatch(charts):
    """Dispatch latency distribution: tail-latency.json, else Criterion dispatch medians."""
    path = os.path.join(RESULTS, "tail-latency.json")
    name = "dispatch-latency.svg"
    if os.path.exists(path):
        doc = load(path)
        res = doc["results"]
        ids = [i for i in ("dispatch/serial/100", "dispatch/concurrent_cap64/100",
                           "e2e/healthz/get", "e2e/invoke_not_found/post") if i in res]
        keys = [("p50_ns", "p50"), ("p95_ns", "p95"), ("p99_ns", "p99"), ("p99_9_ns", "p99.9"), ("max_ns", "max")]
        groups = [(i.replace("/", "\n", 1), [res[i].get(k) for k, _ in keys]) for i in ids]
        svg = bar_chart(
            "Latency distribution per sample (tail-latency run)",
            [f"{rel(path)}: {machine_line(doc.get('machine'))}",
             f"date {doc.get('date')}, commit {doc.get('commit')}",
             "load average (1, 5, 15 min) before / after: "
             f"{' / '.join(str(x) for x in doc.get('load_average_before_after', []))}; "
             "one dispatch sample = 100 dispatches"],
            "latency (log scale)", groups, [label for _, label in keys], fmt_time_tick)
        charts[name] = svg
        return name, [(path, doc)]
    path, doc = newest_with("dispatch/")
    if not path:
        return None
    series = {}
    for key, b in doc["benches"].items():
        parts = key.split("/")
        if parts[0] == "dispatch" and len(parts) == 3:
            series.setdefault(parts[1], []).append((int(parts[2]), b["median_ns"] / int(parts[2])))
    svg = line_chart(
        "Dispatch cost per dispatch vs batch size (Criterion medians ÷ N)",
        [f"{rel(path)}: {machine_line(doc.get('machine'))}",
         f"date {doc.get('date')}, commit {doc.get('commit')}"],
        "dispatches per iteration (N)", "time per dispatch (log scale)",
        sorted(series.items()), lambda v: f"{v:g}", fmt_time_tick)
    charts[name] = svg
    return name, [(path, doc)]


def chart_throughput(charts):
    """Copy throughput into guest memory vs the Vec peer, from the newest run file with both."""
    path, doc = newest_with("memory_bandwidth/")
    if not path:
        return None
    benches = doc["benches"]
    groups = []
    for kind, moved in (("sequential", lambda n: n), ("strided", lambda n: n // 4096 * 64)):
        sizes = sorted(int(k.split("/")[2]) for k in benches if k.startswith(f"memory_bandwidth/{kind}/"))
        for n in sizes:
            ours = benches.get(f"memory_bandwidth/{kind}/{n}")
            peer = benches.get(f"memory_bandwidth/{kind}_vec_peer/{n}")
            if ours and peer:
                groups.append((f"{kind}\n{fmt_bytes(n)}",
                               [moved(n) / ours["median_ns"], moved(n) / peer["median_ns"]]))
    if not groups:
        return None
    svg = bar_chart(
        "Host copy throughput into guest memory vs a Vec peer (same run)",
        [f"{rel(path)}: {machine_line(doc.get('machine'))}",
         f"date {doc.get('date')}, commit {doc.get('commit')}",
         "bytes moved ÷ Criterion median; strided moves 64 B per 4 KiB"],
        "GB/s (log scale)", groups, ["GuardedHostBuffer (ours)", "Vec peer (memcpy)"], fmt_gbps_tick)
    name = "copy-throughput-vs-peer.svg"
    charts[name] = svg
    return name, [(path, doc)]


# ---------------------------------------------------------------------- sections

def charts_section(out, charts):
    out.append("## Charts\n")
    out.append(f"Rendered by the same script from the same run files (`{CHARTS_DIR}/`); hover a point or bar for its value.\n")
    made = [
        ("Restore time vs image size", chart_restore(charts)),
        ("Dispatch latency distribution", chart_dispatch(charts)),
        ("Kernel-path throughput vs peer", chart_throughput(charts)),
    ]
    for title, made_chart in made:
        out.append(f"### {title}\n")
        if not made_chart:
            out.append("No run file with these benches is committed yet.\n")
            continue
        name, sources = made_chart
        out.append(f"![{title}]({CHARTS_DIR}/{name})\n")
        for path, doc in sources:
            out.append(f"From {provenance(path, doc)}.\n")
    out.append("No GPU kernel has been timed yet, so the throughput chart compares the host-side copy into "
               "guest memory with its `memcpy` peer; kernel-versus-cuBLAS/PyTorch figures will come from a GPU run file.\n")


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


def baseline_section(out):
    path = os.path.join(RESULTS, "baseline.json")
    out.append("## Wall-clock baseline (Criterion gate)\n")
    if not os.path.exists(path):
        out.append("No baseline is committed yet.\n")
        return
    doc = load(path)
    thr = doc["policy"]["regress_pct_threshold"]
    runs = doc.get("runs", [])
    out.append(f"From `{rel(path)}` — machine: {machine_line(doc.get('machine'))}; generated {doc.get('generated')} "
               f"from {len(runs)} runs:")
    for r in runs:
        out.append(f"- `{r.get('file')}` ({r.get('date')}, commit `{r.get('commit')}`)")
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
    out.append("Two gates, both small Rust tools in `crates/tensor-wasm-bench` that print a table of every tracked metric:\n")
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


def criterion_section(out):
    files = criterion_files()
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
            ("call_export/args/two_i32", "call_export/noargs/call_export_with_args_empty", "invoke with two i32 arguments ÷ invoke with none"),
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
                out.append(f"| `{ours}` ÷ `{peer}` | {benches[ours]['median_ns'] / benches[peer]['median_ns']:.2f}× |")
            out.append("")


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
        same.append((rel(other), knobs.get("AUTH", "on"), knobs.get("INLINE", "on"), r))
    if len(same) > 1:
        out.append(f"All runs of commit `{doc.get('git_commit')}` (INLINE=off: `serve --no-inline-calls`, "
                   "every call handed to the blocking pool as the minimal server does):\n")
        out.append("| run file | auth | inline calls | ratio |")
        out.append("|---|---|---|---|")
        for name, auth, inline, r in same:
            out.append(f"| `{name}` | {auth} | {inline} | {float(r):.3f} |")
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
        out.append(f"### {doc.get('run')}\n")
        out.append(f"From `{rel(d)}/` — GPU: {gpu.get('name')} ({gpu.get('memory_total')}); driver "
                   f"{doc.get('driver')}; CUDA {doc.get('cuda_version')}; machine: {m.get('cpu')}, "
                   f"{m.get('cores')} cores, {m.get('kernel')}; date: {doc.get('date')}; commit: "
                   f"`{doc.get('commit')}`; command: `{doc.get('command')}`.\n")
        failed = doc.get("checks_failed") or []
        out.append(f"Correctness: {doc.get('checks_total', 0) - len(failed)} of {doc.get('checks_total', 0)} checks "
                   f"passed{' (failed: ' + '; '.join(failed) + ')' if failed else ''}; compute-sanitizer memcheck "
                   f"clean: {doc.get('correctness', {}).get('sanitizer')}; zero copy: "
                   f"{(doc.get('correctness', {}).get('zero_copy') or {}).get('passed')}.\n")
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
    out = [
        "# Performance",
        "",
        "<!-- Generated by `make perf-doc` (scripts/perf_doc.py) from bench-results/. Do not edit by hand; "
        "`make perf-doc-check` fails when this file or docs/charts/ is out of date. -->",
        "",
        "Every number here comes from a committed run file under `bench-results/`, named next to",
        "its table or chart with the machine, date, commit and command that produced it. Absolute times are",
        "only meaningful on their machine; comparisons are made as ratios of runs interleaved in the",
        "same script or the same Criterion run. GPU figures appear only once measured on a GPU.",
        "",
        "## How we measure",
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
    baseline_section(out)
    charts_section(out, charts)
    tail_latency_section(out)
    criterion_section(out)
    throughput_section(out)
    gpu_section(out)
    return "\n".join(out).rstrip() + "\n", charts


def write_charts(charts, root):
    d = os.path.join(root, CHARTS_DIR)
    os.makedirs(d, exist_ok=True)
    for name, svg in charts.items():
        with open(os.path.join(d, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(svg)


def check():
    """Renders into a temporary directory and compares with the committed files."""
    doc, charts = render()
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "PERFORMANCE.md"), "w", encoding="utf-8", newline="\n") as f:
            f.write(doc)
        write_charts(charts, tmp)
        expected = {"PERFORMANCE.md": os.path.join(tmp, "PERFORMANCE.md")}
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
    if problems:
        print("perf-doc-check: out of date, run `make perf-doc` and commit: " + ", ".join(problems))
        return 1
    print(f"perf-doc-check: PERFORMANCE.md and {len(charts)} charts match the run files")
    return 0


def main():
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    if sys.argv[1:]:
        sys.exit(__doc__)
    doc, charts = render()
    write_charts(charts, ROOT)
    sys.stdout.reconfigure(encoding="utf-8", newline="\n")
    sys.stdout.write(doc)


if __name__ == "__main__":
    main()
