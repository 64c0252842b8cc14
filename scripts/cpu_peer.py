#!/usr/bin/env python3
"""The numpy / OpenBLAS peer of the CPU backend's kernels, on the same cores.

Prints one JSON document: for each kernel the CPU-backend benchmark measures, the time of
numpy's equivalent operation on the same shapes (median of repeats after a warm-up) and its
rate (GB/s of bytes read and written for memory-bound kernels, GFLOP/s for matmul, bmm and
conv2d), plus the BLAS library, its kernel (architecture) and thread count as threadpoolctl
reports them, numpy's version and the CPU. Run in the venv `make cpu-peer` creates
(numpy + threadpoolctl from PyPI).

Usage: cpu_peer.py [--quick] [--only NAME[,NAME...]]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_info

MI = 1 << 20


def timed(fn, min_seconds, min_runs=3):
    fn()  # warm-up: first touch of the output, BLAS thread start
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def elementwise(n, dtype, rng):
    """Memory-bound peers: name -> (callable, bytes moved per call)."""
    if dtype == "f32":
        a = rng.standard_normal(n, dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        c = rng.standard_normal(n, dtype=np.float32)
    else:
        a = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int32)
        b = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int32)
        c = rng.integers(-(1 << 31), 1 << 31, n, dtype=np.int32)
    out = np.empty_like(a)
    two, three = 2 * 4 * n, 3 * 4 * n
    alpha = a.dtype.type(3)
    zero = a.dtype.type(0)
    ops = {
        f"vector_add {dtype}": (lambda: np.add(a, b, out=out), three),
        f"elementwise[add] {dtype}": (lambda: np.add(a, b, out=out), three),
        f"elementwise[sub] {dtype}": (lambda: np.subtract(a, b, out=out), three),
        f"elementwise[mul] {dtype}": (lambda: np.multiply(a, b, out=out), three),
        f"elementwise[max] {dtype}": (lambda: np.maximum(a, b, out=out), three),
        f"elementwise[min] {dtype}": (lambda: np.minimum(a, b, out=out), three),
        f"elementwise[relu] {dtype}": (lambda: np.maximum(a, zero, out=out), two),
        f"elementwise[scale] {dtype}": (lambda: np.multiply(a, alpha, out=out), two),
        # numpy has no fused multiply-add: its best equivalent is two passes over `out`.
        f"elementwise[fma] {dtype}": (
            lambda: np.add(np.multiply(a, b, out=out), c, out=out),
            4 * 4 * n,
        ),
        f"reduce[sum] {dtype}": (lambda: a.sum(), 4 * n),
        f"reduce[max] {dtype}": (lambda: a.max(), 4 * n),
    }
    if dtype == "f32":
        ops[f"elementwise[div] {dtype}"] = (lambda: np.divide(a, b, out=out), three)
    return ops


def matmul_peer(n, dtype, rng):
    if dtype == "f32":
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
    else:
        a = rng.integers(-100, 100, (n, n), dtype=np.int32)
        b = rng.integers(-100, 100, (n, n), dtype=np.int32)
    out = np.empty((n, n), dtype=a.dtype)
    return (lambda: np.matmul(a, b, out=out)), 2.0 * n**3


def conv2d_peer(stride, rng, batch=8, channels=64, size=56, kernels=64):
    """im2col + one sgemm: the usual CPU lowering of a 3x3 convolution, padding 1."""
    x = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    w = rng.standard_normal((kernels, channels * 9), dtype=np.float32)
    out_size = (size + 2 - 3) // stride + 1

    def run():
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
        windows = windows[:, :, ::stride, ::stride]  # N, C, OH, OW, 3, 3
        cols = np.ascontiguousarray(windows.transpose(0, 2, 3, 1, 4, 5)).reshape(
            batch * out_size * out_size, channels * 9
        )
        return cols @ w.T

    flops = 2.0 * batch * kernels * out_size * out_size * channels * 9
    return run, flops


def bmm_peer(layout, rng, batch=32, m=128, n=128, k=64):
    """Batched matmul; a `t` operand is stored transposed and passed as a transposed view."""
    a = rng.standard_normal((batch, k, m) if layout[0] == "t" else (batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, n, k) if layout[1] == "t" else (batch, k, n), dtype=np.float32)
    op_a = a.transpose(0, 2, 1) if layout[0] == "t" else a
    op_b = b.transpose(0, 2, 1) if layout[1] == "t" else b
    out = np.empty((batch, m, n), dtype=np.float32)
    return (lambda: np.matmul(op_a, op_b, out=out)), 2.0 * batch * m * n * k


def pool_peer(op, rng, batch=8, channels=64, size=112):
    """3x3, stride 2, padding 1 pooling over windows of a padded copy: max with -inf padding,
    mean over the in-range taps (count_include_pad = 0)."""
    x = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    out_size = (size + 2 - 3) // 2 + 1
    pad = ((0, 0), (0, 0), (1, 1), (1, 1))

    def windows(array):
        view = np.lib.stride_tricks.sliding_window_view(array, (3, 3), axis=(2, 3))
        return view[:, :, ::2, ::2]  # N, C, OH, OW, 3, 3

    ones = np.pad(np.ones((1, 1, size, size), dtype=np.float32), pad)
    counts = windows(ones).sum(axis=(4, 5))

    def run():
        if op == "max":
            return windows(np.pad(x, pad, constant_values=-np.inf)).max(axis=(4, 5))
        return windows(np.pad(x, pad)).sum(axis=(4, 5)) / counts

    moved = 4 * (x.size + batch * channels * out_size * out_size)
    return run, moved


def model_peers(n, rng):
    """The operations networks need, as numpy (and scipy for erf) computes them: name ->
    (callable, bytes of input read and output written per call)."""
    from scipy.special import erf

    x = rng.standard_normal(n, dtype=np.float32)
    positive = np.abs(x) + np.float32(0.5)
    out = np.empty_like(x)
    two = 2 * 4 * n
    half = np.float32(0.5)
    root_half = np.float32(np.sqrt(0.5))

    def sigmoid():
        np.negative(x, out=out)
        np.exp(out, out=out)
        np.add(out, 1, out=out)
        np.reciprocal(out, out=out)

    def rsqrt():
        np.sqrt(positive, out=out)
        np.reciprocal(out, out=out)

    def gelu():
        np.multiply(x, root_half, out=out)
        erf(out, out=out)
        np.add(out, 1, out=out)
        np.multiply(out, x, out=out)
        np.multiply(out, half, out=out)

    rows = x.reshape(-1, 1024)
    matrix = out.reshape(-1, 1024)
    scale = rng.standard_normal(1024, dtype=np.float32)
    bias = rng.standard_normal(1024, dtype=np.float32)

    def softmax():
        np.subtract(rows, rows.max(axis=1, keepdims=True), out=matrix)
        np.exp(matrix, out=matrix)
        np.divide(matrix, matrix.sum(axis=1, keepdims=True), out=matrix)

    def layernorm():
        np.subtract(rows, rows.mean(axis=1, keepdims=True), out=matrix)
        r = 1 / np.sqrt(np.square(matrix).mean(axis=1, keepdims=True) + np.float32(1e-5))
        np.multiply(matrix, r, out=matrix)
        np.multiply(matrix, scale, out=matrix)
        np.add(matrix, bias, out=matrix)

    return {
        "elementwise[exp] f32": (lambda: np.exp(x, out=out), two),
        "elementwise[tanh] f32": (lambda: np.tanh(x, out=out), two),
        "elementwise[sigmoid] f32": (sigmoid, two),
        "elementwise[rsqrt] f32": (rsqrt, two),
        "elementwise[erf] f32": (lambda: erf(x, out=out), two),
        "elementwise[gelu] f32": (gelu, two),
        "softmax last axis f32": (softmax, two),
        "layernorm rows f32": (layernorm, two),
    }


def data_movement(quick, rng):
    """Permute and gather peers (f32), into preallocated outputs as the backend writes:
    name -> (callable, bytes moved per call)."""
    batch, square = (2, 1024) if quick else (32, 4096)
    heads = rng.standard_normal((batch, 512, 16, 64), dtype=np.float32)
    heads_out = np.empty((batch, 16, 512, 64), dtype=np.float32)
    matrix = rng.standard_normal((square, square), dtype=np.float32)
    matrix_out = np.empty_like(matrix)
    rows, cols, count = (5000 if quick else 50000), 768, 8192
    table = rng.standard_normal((rows, cols), dtype=np.float32)
    indices = rng.integers(0, rows, count, dtype=np.int32)
    rows_out = np.empty((count, cols), dtype=np.float32)
    return {
        f"permute[0213] {batch}x512x16x64 f32": (
            lambda: np.copyto(heads_out, heads.transpose(0, 2, 1, 3)),
            2 * 4 * heads.size,
        ),
        f"permute[10] {square}x{square} f32": (
            lambda: np.copyto(matrix_out, matrix.T),
            2 * 4 * matrix.size,
        ),
        # mode="wrap" takes negative indices as ONNX does and, unlike the default "raise",
        # writes into `out` without an extra buffer.
        f"gather[rows] {rows}x{cols} by {count} f32": (
            lambda: np.take(table, indices, axis=0, out=rows_out, mode="wrap"),
            2 * 4 * rows_out.size + 4 * count,
        ),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small shapes, short runs")
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    args = parser.parse_args()
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    rng = np.random.default_rng(7)
    n = MI if args.quick else 16 * MI
    min_seconds = 0.1 if args.quick else 1.0
    results = []

    def record(name, fn, work, unit):
        if only and name not in only:
            return
        seconds, runs = timed(fn, min_seconds)
        rate = work / seconds / 1e9
        results.append({"kernel": name, "seconds": seconds, "runs": runs, unit: rate})
        print(f"{name}: {seconds * 1e3:.3f} ms, {rate:.2f} {unit}", file=sys.stderr)

    for dtype in ("f32", "i32"):
        for name, (fn, moved) in elementwise(n, dtype, rng).items():
            record(name, fn, moved, "gb_per_s")
    for size in (256,) if args.quick else (1024, 2048):
        fn, flops = matmul_peer(size, "f32", rng)
        record(f"matmul {size}^3 f32", fn, flops, "gflop_per_s")
    fn, flops = matmul_peer(256 if args.quick else 1024, "i32", rng)
    record(f"matmul {256 if args.quick else 1024}^3 i32", fn, flops, "gflop_per_s")
    for name, (fn, moved) in model_peers(n, rng).items():
        record(name, fn, moved, "gb_per_s")
    a = rng.standard_normal((4096, n // 4096 // 2), dtype=np.float32)
    b = rng.standard_normal((4096, n // 4096 // 2), dtype=np.float32)
    joined = np.empty((4096, 2 * a.shape[1]), dtype=np.float32)
    record("concat axis 1 f32", lambda: np.concatenate((a, b), axis=1, out=joined), 2 * 4 * n, "gb_per_s")
    for name, (fn, moved) in data_movement(args.quick, rng).items():
        record(name, fn, moved, "gb_per_s")
    for stride in (1, 2):
        fn, flops = conv2d_peer(stride, rng, batch=1 if args.quick else 8)
        record(f"conv2d 3x3 stride {stride} f32", fn, flops, "gflop_per_s")

    batch = 4 if args.quick else 32
    for layout in ("nn", "nt", "tn", "tt"):
        fn, flops = bmm_peer(layout, rng, batch=batch)
        record(f"bmm {batch}x128x128x64 {layout} f32", fn, flops, "gflop_per_s")
    for op in ("max", "avg"):
        fn, moved = pool_peer(op, rng, batch=1 if args.quick else 8)
        record(f"{op}pool 3x3 stride 2 f32", fn, moved, "gb_per_s")

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(l.split(":", 1)[1].strip() for l in info if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    json.dump(
        {
            "peer": "numpy",
            "numpy": np.__version__,
            "python": platform.python_version(),
            "cpu": cpu,
            "cores": os.cpu_count(),
            "threadpools": threadpool_info(),
            "elements": n,
            "results": results,
        },
        sys.stdout,
        indent=1,
    )
    print()


if __name__ == "__main__":
    main()
