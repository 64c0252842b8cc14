#!/usr/bin/env python3
"""`make models-bench`: the real models of scripts/onnx/models.py through TensorWasm's ONNX
executor (CPU backend, every core; crates/tensor-wasm-bench/src/bin/models-bench.rs, release)
and through ONNX Runtime (CPU execution provider, the faster of every core and one thread; scripts/onnx/ort_bench.py), the
same model, inputs and batch, one after the other in interleaved rounds on the same machine.
Writes one run file with the machine, date, commit, every round's raw lines, and per case the
median throughput of each side over the rounds and their ratio (ours / ONNX Runtime's).

Usage: scripts/models_bench.py [--rounds N] [--out PATH]
Default run file: bench-results/models/<YYYY-MM-DD>.json (-N when the day has one).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".tools", "onnx", "bin", "python")
CASES = ["digits_cnn@1", "digits_cnn@32", "transformer@1", "transformer@32", "pretrained@1"]


def lines(command):
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "tensor-wasm-bench", "--bin", "models-bench"],
                   check=True, cwd=ROOT)
    ours_bin = os.path.join(ROOT, "target", "release", "models-bench")
    with tempfile.TemporaryDirectory() as cases:
        subprocess.run([PY, os.path.join(ROOT, "scripts", "onnx", "models.py"), cases], check=True,
                       capture_output=True)
        rounds = []
        for r in range(args.rounds):
            ours = lines([ours_bin, cases, *CASES, "--runs", "20", "--min-seconds", "1"])
            theirs = lines([PY, os.path.join(ROOT, "scripts", "onnx", "ort_bench.py"), cases, *CASES])
            rounds.append({"round": r, "ours": ours, "onnxruntime": theirs})
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    results = []
    for case in CASES:
        ours = [next(x for x in rd["ours"] if x["case"] == case)["items_per_s"] for rd in rounds]
        theirs = [next(x for x in rd["onnxruntime"] if x["case"] == case)["items_per_s"] for rd in rounds]
        o, t = statistics.median(ours), statistics.median(theirs)
        results.append({"case": case, "ours_items_per_s": o, "onnxruntime_items_per_s": t, "ratio": o / t,
                        "goal": 0.5 if not case.startswith("pretrained") else None})
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "crates", "scripts"], cwd=ROOT).returncode != 0
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    doc = {
        "what": "real models (scripts/onnx/models.py) through the ONNX executor on the CPU backend vs ONNX Runtime "
                "(CPU EP, the faster of every core and one thread), same model, inputs, batch and cores; items per second, median over interleaved rounds",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit + ("-dirty" if dirty else ""),
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release()},
        "command": "make models-bench (scripts/models_bench.py)",
        "results": results,
        "rounds": rounds,
    }
    out = args.out
    if not out:
        base = os.path.join(ROOT, "bench-results", "models", datetime.date.today().isoformat())
        out, n = base + ".json", 2
        while os.path.exists(out):
            out, n = f"{base}-{n}.json", n + 1
    os.makedirs(os.path.dirname(out), exist_ok=True)
    json.dump(doc, open(out, "w"), indent=2)
    print("| case | ours (items/s) | ONNX Runtime (items/s) | ratio | goal |")
    print("|---|---|---|---|---|")
    for r in results:
        goal = f"≥ {r['goal']}×" if r["goal"] else "reported"
        print(f"| {r['case']} | {r['ours_items_per_s']:.0f} | {r['onnxruntime_items_per_s']:.0f} | {r['ratio']:.3f}× | {goal} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
