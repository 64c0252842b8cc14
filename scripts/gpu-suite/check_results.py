#!/usr/bin/env python3
"""Checks a GPU-suite results directory (and the runner's --out directory): every expected
file exists, every JSON file carries machine, driver, CUDA version, commit, date and command,
the backend is the one asked for (and CPU results are labelled as such, never as GPU), and
every section ran and passed its checks. Exit status 1 with a list of problems otherwise.

Usage: check_results.py --device cpu|cuda RESULTS_DIR [OUT_DIR]
"""
import glob
import json
import os
import sys

EXPECTED = ["provenance.json", "bit-identity.json", "correctness.json", "http-check.json", "wasi-nn.json", "latency.json",
            "throughput.json", "torch.json", "unified-memory.json", "jit.json",
            "cold-start.json", "concurrency.json", "sanitizer.json", "summary.json", "SUMMARY.md"]
PROVENANCE = ["machine", "driver", "cuda_version", "commit", "date", "command"]


def main():
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--device":
        sys.exit(__doc__)
    device, r = args[1], args[2]
    out = args[3] if len(args) > 3 else None
    problems = []
    for name in EXPECTED:
        if not os.path.exists(os.path.join(r, name)):
            problems.append(f"missing {name}")
    for path in sorted(glob.glob(os.path.join(r, "*.json"))):
        name = os.path.basename(path)
        try:
            doc = json.load(open(path))
        except ValueError as e:
            problems.append(f"{name}: not JSON ({e})")
            continue
        for key in PROVENANCE:
            if doc.get(key) in (None, "", {}):
                problems.append(f"{name}: no {key}")
        if name == "provenance.json":
            continue
        # http-check-cpu is the CPU backend's record made on the GPU machine itself.
        wanted = "cpu" if name == "http-check-cpu.json" else device
        if doc.get("backend") != wanted:
            problems.append(f"{name}: backend {doc.get('backend')!r}, expected {wanted!r}")
        if wanted == "cpu":
            if doc.get("gpu_measurement") is not False:
                problems.append(f"{name}: a CPU run must say gpu_measurement: false")
            label = doc.get("label")
            if label is not None and "NOT a GPU" not in label:
                problems.append(f"{name}: CPU label does not say it is not a GPU measurement: {label!r}")
        if doc.get("error"):
            problems.append(f"{name}: section error: {doc['error']}")
        for check in doc.get("checks", []):
            if not check.get("pass"):
                problems.append(f"{name}: failed check {check.get('name')}: {check.get('detail')}")
    summary_path = os.path.join(r, "summary.json")
    if os.path.exists(summary_path):
        summary = json.load(open(summary_path))
        sanitizer = {}
        if os.path.exists(os.path.join(r, "sanitizer.json")):
            sanitizer = json.load(open(os.path.join(r, "sanitizer.json"))).get("results", {})
        for sec in summary.get("sections", []):
            # compute-sanitizer exits 86 on any report, the backend's tenant parameter probes
            # included; sanitizer.json says whether anything else was reported.
            if sec["section"] == "sanitizer" and sec["exit"] == "86" and sanitizer.get("clean"):
                continue
            if sanitizer and sec["section"] == "sanitizer" and not sanitizer.get("clean"):
                problems.append(f"sanitizer: not clean: {sanitizer.get('other_reports')} reports "
                                f"besides {sanitizer.get('tenant_parameter_probes')} tenant parameter probes")
            if sec["exit"] != "0":
                problems.append(f"section {sec['section']} exited {sec['exit']}")
        if not summary.get("sections"):
            problems.append("summary.json lists no sections")
    md = os.path.join(r, "SUMMARY.md")
    if os.path.exists(md):
        text = open(md).read()
        for word in ("commit:", "driver:", "CUDA:", "command:", "machine:"):
            if word not in text:
                problems.append(f"SUMMARY.md does not state {word}")
        if device == "cpu" and "NOT a GPU measurement" not in text:
            problems.append("SUMMARY.md of a CPU run does not say it is not a GPU measurement")
    if out:
        for name in ("gpu-results.tar.gz", "SUMMARY.md", "run.log"):
            if not os.path.exists(os.path.join(out, name)):
                problems.append(f"--out is missing {name}")
        if len(os.listdir(out)) > 8:
            problems.append(f"--out holds {len(os.listdir(out))} entries; the device tool returns at most 8 files")
    if problems:
        print("check_results: PROBLEMS")
        for p in problems:
            print("  -", p)
        sys.exit(1)
    n = len(glob.glob(os.path.join(r, "*.json")))
    print(f"check_results: {r}: {n} JSON files with provenance, backend {device}, every section passed")


if __name__ == "__main__":
    main()
