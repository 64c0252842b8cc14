#!/usr/bin/env python3
"""PyTorch peer of the GPU suite's `throughput` section.

Reads the shapes the suite measured (`results.torch_cases` of throughput.json) and times
PyTorch on the same GPU with the same shapes, f32 with TF32 off everywhere:

- `add`:    torch.add(a, b, out=c) over n floats (12 n bytes moved);
- `mm`:     torch.mm(A, B, out=C), m x k times k x n (2 m n k FLOP);
- `conv2d`: torch.nn.functional.conv2d, NCHW input, KCRS weights, stride 1, padding 1.

Each op: 3 warm-up calls, then R calls timed with CUDA events (kernel time) and R calls
timed by the wall clock around the call and torch.cuda.synchronize() (launch included).
Without torch, or without a CUDA device, or in the CPU dry run, it writes why instead.

Usage: torch_peer.py --throughput FILE --provenance FILE --device cuda|cpu --out FILE
"""
import argparse
import json
import math
import statistics
import sys
import time


def stats(samples_ns):
    s = sorted(samples_ns)
    if not s:
        return {"n": 0}
    rank = lambda p: s[max(1, min(len(s), math.ceil(p * len(s)))) - 1]
    return {"n": len(s), "min_ns": s[0], "p50_ns": statistics.median_low(s), "p99_ns": rank(0.99),
            "max_ns": s[-1], "mean_ns": sum(s) / len(s)}


def measure(torch, fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        events.append(start.elapsed_time(end) * 1e6)
    wall = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        wall.append(time.perf_counter_ns() - t)
    return events, wall


def run_cases(torch, cases, quick):
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda")
    rows = []
    for case in cases:
        op = case["op"]
        if op == "add":
            n = case["n"]
            a, b = torch.rand(n, device=dev), torch.rand(n, device=dev)
            c = torch.empty(n, device=dev)
            fn = lambda: torch.add(a, b, out=c)
            amount, unit, reps = 12.0 * n, "bytes", 20
        elif op == "mm":
            m, n, k = case["m"], case["n"], case["k"]
            A, B = torch.rand(m, k, device=dev), torch.rand(k, n, device=dev)
            C = torch.empty(m, n, device=dev)
            fn = lambda: torch.mm(A, B, out=C)
            amount, unit, reps = 2.0 * m * n * k, "flop", 10
        elif op == "conv2d":
            x = torch.rand(case["n"], case["c"], case["h"], case["w"], device=dev)
            w = torch.rand(case["k"], case["c"], case["r"], case["s"], device=dev)
            fn = lambda: F.conv2d(x, w, stride=case["stride"], padding=case["pad"])
            amount = 2.0 * case["n"] * case["k"] * case["h"] * case["w"] * case["c"] * case["r"] * case["s"]
            unit, reps = "flop", 20
        else:
            continue
        if quick:
            reps = 3
        events, wall = measure(torch, fn, reps)
        rows.append({
            "case": case, "op": op, "amount_per_call": amount, "unit": unit,
            "rate_unit": f"{unit}/s",
            "events": stats(events), "wall": stats(wall),
            "events_rate_p50": amount / (statistics.median_low(events) * 1e-9),
            "wall_rate_p50": amount / (statistics.median_low(wall) * 1e-9),
        })
        del fn
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--throughput", required=True)
    ap.add_argument("--provenance", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    prov = json.load(open(args.provenance))
    doc = {
        "schema": "tensor-wasm/gpu-suite/1", "section": "torch", "backend": args.device,
        "gpu_measurement": args.device == "cuda",
        "machine": prov["machine"], "gpu": prov["gpu"], "driver": prov["driver"],
        "cuda_version": prov["cuda_version"], "commit": prov["commit"], "date": prov["date"],
        "command": prov["command"] + " :: " + " ".join(sys.argv),
        "provenance": prov,
    }
    result = {"available": False}
    try:
        if args.device != "cuda":
            raise RuntimeError("CPU dry run: the torch peer runs on the GPU only")
        try:
            import torch
        except Exception as e:  # noqa: BLE001 (any import failure means: no torch here)
            raise RuntimeError(f"python3 -c 'import torch' failed: {e!r}")
        result["torch_version"] = torch.__version__
        result["torch_cuda"] = torch.version.cuda
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        result["cudnn"] = torch.backends.cudnn.version()
        result["device_name"] = torch.cuda.get_device_name(0)
        tp = json.load(open(args.throughput))
        cases = tp["results"]["torch_cases"]
        result["cases"] = run_cases(torch, cases, tp.get("quick", False))
        result["available"] = True
        result["settings"] = "float32, torch.backends.cuda.matmul.allow_tf32=False, cudnn.allow_tf32=False, set_float32_matmul_precision('highest')"
    except Exception as e:  # noqa: BLE001 (recorded, never hidden)
        result["why"] = str(e)
    doc["results"] = result
    json.dump(doc, open(args.out, "w"), indent=2)
    print("torch peer:", "measured" if result["available"] else f"absent ({result.get('why')})")


if __name__ == "__main__":
    main()
