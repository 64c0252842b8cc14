#!/usr/bin/env python3
"""Summarises one GPU-suite results directory into summary.json and SUMMARY.md.

Reads the section files the runner wrote (provenance.json, bit-identity.json, correctness.json, fence.json, http-check.json,
latency.json, throughput.json, torch.json, unified-memory.json, jit.json, cold-start.json,
concurrency.json, sanitizer.json, sections.tsv) and puts every measurement next to its peer
with the issue's target. Standard library only. Usage: summarize.py RESULTS_DIR
"""
import json
import os
import sys

SECTIONS = ["bit-identity", "correctness", "fence", "http-check-cpu", "http-check", "latency", "throughput", "torch",
            "unified-memory", "jit", "cold-start", "concurrency", "bit-identity-sanitized",
            "sanitizer"]


def load(r, name):
    path = os.path.join(r, name + ".json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        return {"error": f"unreadable {name}.json: {e}"}


def res(doc, *keys):
    v = (doc or {}).get("results", {})
    for k in keys:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v


def fmt_ns(ns):
    if ns is None:
        return "n/a"
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def fmt_rate(v, unit):
    if v is None:
        return "n/a"
    if unit.startswith("bytes"):
        return f"{v / 1e9:.1f} GB/s"
    return f"{v / 1e12:.2f} TFLOP/s"


def comparison(name, ours, peer, target, at_most, ours_text, peer_text, note=""):
    ratio = ours / peer if ours is not None and peer not in (None, 0) else None
    met = None
    if ratio is not None and target is not None:
        met = ratio <= target if at_most else ratio >= target
    return {"name": name, "ours": ours, "peer": peer, "ratio": ratio, "target": target,
            "comparison": "at_most" if at_most else "at_least", "met": met,
            "ours_text": ours_text, "peer_text": peer_text, "note": note}


def build(r):
    prov = load(r, "provenance") or {}
    device = prov.get("device", "?")
    docs = {name: load(r, name) for name in SECTIONS}
    status = []
    tsv = os.path.join(r, "sections.tsv")
    if os.path.exists(tsv):
        for line in open(tsv):
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3:
                status.append({"section": parts[0], "exit": parts[1], "seconds": int(parts[2])})
    # Sections of an earlier invocation into the same directory (run.sh --only) stay listed.
    earlier = load(r, "summary") or {}
    ran = {s["section"] for s in status}
    for s in earlier.get("sections", []):
        if s["section"] not in ran:
            status.append({k: s[k] for k in ("section", "exit", "seconds")})
    sections = []
    for s in status:
        doc = docs.get(s["section"]) or docs.get({"sanitizer": "bit-identity-sanitized"}.get(s["section"], ""))
        checks = (doc or {}).get("checks", [])
        sections.append(dict(s, checks=len(checks),
                             failed=[c["name"] for c in checks if not c.get("pass")],
                             error=(doc or {}).get("error")))

    comps = []
    # Latency: the guest ABI vs raw cudarc.
    lat = docs["latency"]
    raw = res(lat, "raw")
    if raw and raw.get("n"):
        for p in ("p50", "p99"):
            a, b = res(lat, "abi", f"{p}_ns"), raw.get(f"{p}_ns")
            comps.append(comparison(f"launch-to-completion {p}: guest ABI vs raw cudarc launch+sync",
                                    a, b, 1.25, True, fmt_ns(a), fmt_ns(b)))
        for p in ("p50", "p99"):
            a, b = res(lat, "backend", f"{p}_ns"), raw.get(f"{p}_ns")
            comps.append(comparison(f"launch-to-completion {p}: backend launch() vs raw cudarc",
                                    a, b, None, True, fmt_ns(a), fmt_ns(b)))
        blocking = res(lat, "raw_blocking")
        for p in ("p50", "p99") if blocking else ():
            a, b = blocking.get(f"{p}_ns"), raw.get(f"{p}_ns")
            comps.append(comparison(f"launch-to-completion {p}: raw launch + blocking-sync event wait vs raw stream sync",
                                    a, b, None, True, fmt_ns(a), fmt_ns(b),
                                    note="how the backend's lanes wait, on the calling thread: the cost of the wait alone"))
    # Throughput vs torch.
    tp, torch = docs["throughput"], docs["torch"]
    torch_rows = {row["op"]: row for row in (res(torch, "cases") or [])}
    families = [("add", "vector add", lambda c: c["unit"] == "bytes", 0.85),
                ("mm", "matmul f32", lambda c: c["case"].startswith("matmul"), 0.5),
                ("conv2d", "conv2d 3x3", lambda c: c["case"].startswith("conv2d"), 0.5)]
    for op, label, pick, target in families:
        cases = [c for c in (res(tp, "cases") or []) if pick(c)]
        if not cases:
            continue
        unit = cases[0]["unit"]
        peer = torch_rows.get(op)
        for key, peer_key, how in (("kernel_events_rate_p50", "events_rate_p50", "kernel time (CUDA events)"),
                                   ("backend_wall_rate_p50", "wall_rate_p50", "wall clock, launch + sync")):
            have = [c for c in cases if c.get(key) is not None]
            if not have:
                continue
            best = max(have, key=lambda c: c[key])
            theirs = peer.get(peer_key) if peer else None
            peer_text = fmt_rate(theirs, unit) if peer else ("torch absent: " + str(res(torch, "why")))
            comps.append(comparison(
                f"{label} ({best['work']}), {how}: ours best = {best['case']} vs torch",
                best[key], theirs, target if peer else None, False,
                fmt_rate(best[key], unit), peer_text,
                note="; ".join(f"{c['case']}: {fmt_rate(c[key], unit)}" for c in have)))
        if unit == "bytes" and res(tp, "device_peak_bandwidth_bytes_per_s"):
            peak = res(tp, "device_peak_bandwidth_bytes_per_s")
            best = max(cases, key=lambda c: c.get("kernel_events_rate_p50") or c.get("backend_wall_rate_p50") or 0)
            v = best.get("kernel_events_rate_p50") or best.get("backend_wall_rate_p50")
            comps.append(comparison(f"vector add ({best['case']}) as a fraction of the device's theoretical bandwidth",
                                    v, peak, None, False, fmt_rate(v, unit), fmt_rate(peak, unit)))
    # Unified memory.
    bw = res(docs["unified-memory"], "bandwidth") or {}
    if bw.get("first_touch_gb_per_s") is not None:
        comps.append(comparison("guest memory: first-touch kernel vs the same kernel prefetched",
                                bw.get("first_touch_gb_per_s"), bw.get("prefetched_kernel_gb_per_s") or bw.get("resident_gb_per_s"),
                                None, False, f"{bw.get('first_touch_gb_per_s', 0):.1f} GB/s",
                                f"{(bw.get('prefetched_kernel_gb_per_s') or bw.get('resident_gb_per_s') or 0):.1f} GB/s",
                                note=f"prefetch migration alone {bw.get('prefetch_migration_gb_per_s')} GB/s; "
                                     f"resident {bw.get('resident_gb_per_s')} GB/s"))
    # JIT.
    nv = res(docs["jit"], "nvrtc") or {}
    if isinstance(nv.get("ptx_load"), dict) and nv["ptx_load"].get("n"):
        a, b = nv["ptx_load"]["p50_ns"], nv["cubin_load"]["p50_ns"]
        comps.append(comparison("kernel load: PTX (driver JIT) vs cubin", a, b, None, True,
                                fmt_ns(a), fmt_ns(b), note=f"NVRTC compile p50 {fmt_ns(nv['compile']['p50_ns'])}"))
    for bp in res(docs["jit"], "blueprints") or []:
        a, b = bp["cold_load_program"]["p50_ns"], bp["warm_same_backend"]["p50_ns"]
        comps.append(comparison(f"blueprint {bp['blueprint']}: cold compile+load vs warm cache", a, b, None, True,
                                fmt_ns(a), fmt_ns(b),
                                note=f"fresh backend, PTX from the disk cache: {fmt_ns(bp['fresh_backend_disk_cache']['p50_ns'])}"))
    # Cold start.
    for row in res(docs["cold-start"], "sizes") or []:
        a = row["restored_to_first_kernel"]["p50_ns"]
        b = row["fresh_plus_init_to_first_kernel"]["p50_ns"]
        c = row["fresh_no_init_to_first_kernel"]["p50_ns"]
        comps.append(comparison(f"cold start {row['weights_bytes'] >> 20} MiB: snapshot restore vs fresh instance + init, to first kernel",
                                a, b, None, True, fmt_ns(a), fmt_ns(b),
                                note=f"fresh instance without init: {fmt_ns(c)}"))
    # Concurrency.
    levels = res(docs["concurrency"], "levels") or []
    one = next((l for l in levels if l["guests"] == 1), None)
    for l in levels:
        comps.append(comparison(f"dispatch with {l['guests']} concurrent guests: launches/s (p99 launch {fmt_ns(l['launch_latency'].get('p99_ns'))})",
                                l["launches_per_s"], one["launches_per_s"] if one else None, None, False,
                                f"{l['launches_per_s']:.0f}/s", f"{one['launches_per_s']:.0f}/s (1 guest)" if one else "n/a",
                                note=f"p50 {fmt_ns(l['launch_latency'].get('p50_ns'))}, invocation p99 {fmt_ns(l['invocation_latency'].get('p99_ns'))}"))

    # Tenant kernels: wall clock against the same kernels unfenced, fenced and as a backend runs
    # them (checked: the lean entry when the launch-time proof admits the launch).
    for kind, note in (("fenced", lambda t: f"{t['fences']} fences, median of {t['repetitions']} interleaved launches"),
                       ("checked", lambda t: f"{t['proof']}; proof {t['proof_host_microseconds']:.0f} µs on the host")):
        for t in res(docs["fence"], "wall_clock") or []:
            if f"{kind}_median_ns" in t:
                comps.append(comparison(f"{kind} tenant kernel {t['kernel']} ({t['size']}): launch + wait vs unfenced",
                                        t[f"{kind}_median_ns"], t["unfenced_median_ns"], None, True,
                                        fmt_ns(t[f"{kind}_median_ns"]), fmt_ns(t["unfenced_median_ns"]), note=note(t)))
        key = "wall_clock_geomean_overhead" if kind == "fenced" else "wall_clock_geomean_checked_overhead"
        geomean = res(docs["fence"], key)
        if geomean is not None:
            comps.append(comparison(f"{kind} tenant kernels: geometric mean of {kind} / unfenced wall clock",
                                    1.0 + geomean, 1.0, 1.03, True, f"{100 * geomean:+.1f} %", "unfenced"))

    correctness = {
        "fence": [c for c in (docs["fence"] or {}).get("checks", [])],
        "bit_identity": [c for c in (docs["bit-identity"] or {}).get("checks", [])],
        "bit_identity_summary": res(docs["bit-identity"], "summary"),
        "runtime_api": [c for c in (docs["correctness"] or {}).get("checks", [])],
        "http": [c for c in (docs["http-check"] or {}).get("checks", [])],
        "sanitizer": res(docs["sanitizer"], "clean"),
        "sanitizer_detail": {k: v for k, v in ((docs["sanitizer"] or {}).get("results") or {}).items() if k != "log_tail"},
        "zero_copy": res(docs["unified-memory"], "zero_copy"),
    }
    all_checks = [c for d in docs.values() if d for c in d.get("checks", [])]
    cuda = device == "cuda"
    return {
        "schema": "tensor-wasm/gpu-suite/1", "section": "summary", "run": os.path.basename(os.path.normpath(r)),
        "backend": device, "gpu_measurement": cuda,
        "label": "GPU (CUDA backend)" if cuda else "CPU backend dry run: NOT a GPU measurement",
        "machine": prov.get("machine"), "gpu": prov.get("gpu"), "driver": prov.get("driver"),
        "cuda_version": prov.get("cuda_version"), "commit": prov.get("commit"), "date": prov.get("date"),
        "command": prov.get("command"), "provenance": prov,
        "sections": sections, "checks_total": len(all_checks),
        "checks_failed": [c["name"] for c in all_checks if not c.get("pass")],
        "section_errors": {n: d.get("error") for n, d in docs.items() if d and d.get("error")},
        "correctness": correctness, "comparisons": comps,
        "targets": [t for d in docs.values() if d for t in d.get("targets", [])],
    }


def markdown(s):
    out = [f"# GPU suite run `{s['run']}`", ""]
    if not s["gpu_measurement"]:
        out += ["> **CPU backend dry run: NOT a GPU measurement.** Every number below was taken on the CPU",
                "> backend; it tests the suite's pipeline, not the GPU.", ""]
    gpu = s.get("gpu") or {}
    m = s.get("machine") or {}
    out += [f"- machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('kernel')}",
            f"- GPU: {gpu.get('name', 'none')} ({gpu.get('memory_total', '')}); driver: {s['driver']}; CUDA: {s['cuda_version']}",
            f"- GPU state at the start: {json.dumps((s.get('provenance') or {}).get('gpu_state'))}; PyTorch: {(s.get('provenance') or {}).get('torch')}",
            f"- commit: `{s['commit']}`; date: {s['date']}",
            f"- command: `{s['command']}`", "",
            "## Sections", "", "| section | exit | seconds | checks | failed |", "|---|---|---|---|---|"]
    for sec in s["sections"]:
        out.append(f"| {sec['section']} | {sec['exit']} | {sec['seconds']} | {sec['checks']} | {', '.join(sec['failed']) or '-'} |")
    out += ["", "## Correctness", ""]
    for group in ("bit_identity", "fence", "runtime_api", "http"):
        for c in s["correctness"][group]:
            out.append(f"- [{'pass' if c['pass'] else 'FAIL'}] {c['name']}: {c['detail'][:300]}")
    san = s["correctness"]["sanitizer_detail"]
    out.append(f"- compute-sanitizer memcheck: {json.dumps(san)}")
    zc = s["correctness"]["zero_copy"] or {}
    out.append(f"- zero copy: applicable {zc.get('applicable')}, passed {zc.get('passed')}, probe results {zc.get('results')}")
    out += ["", "## Measurements next to their peers", "",
            "| measurement | ours | peer | ratio | target | met |", "|---|---|---|---|---|---|"]
    for c in s["comparisons"]:
        ratio = f"{c['ratio']:.3f}" if c["ratio"] is not None else "n/a"
        target = "" if c["target"] is None else ("≤ " if c["comparison"] == "at_most" else "≥ ") + str(c["target"])
        met = {True: "yes", False: "**no**", None: ""}[c["met"]]
        out.append(f"| {c['name']} | {c['ours_text']} | {c['peer_text']} | {ratio} | {target} | {met} |")
    notes = [c for c in s["comparisons"] if c.get("note")]
    if notes:
        out += ["", "Details:", ""]
        out += [f"- {c['name']}: {c['note']}" for c in notes]
    if s["checks_failed"] or s["section_errors"]:
        out += ["", "## Problems", ""]
        out += [f"- failed check: {n}" for n in s["checks_failed"]]
        out += [f"- section {n} error: {e}" for n, e in s["section_errors"].items()]
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    r = sys.argv[1]
    s = build(r)
    with open(os.path.join(r, "summary.json"), "w") as f:
        json.dump(s, f, indent=2)
    with open(os.path.join(r, "SUMMARY.md"), "w") as f:
        f.write(markdown(s))
    tsv = os.path.join(r, "sections.tsv")
    if os.path.exists(tsv):
        os.remove(tsv)  # embedded in summary.json (with provenance)
    print(markdown(s))


if __name__ == "__main__":
    main()
