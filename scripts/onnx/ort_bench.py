#!/usr/bin/env python3
"""ONNX Runtime's side of `make models-bench` (scripts/models_bench.py): each named case of a
scripts/onnx/models.py directory through an InferenceSession on the CPU execution provider,
with every core (intra-op threads = the core count) and with one, one JSON line per case: the
faster configuration's median seconds of one run over at least 20 timed runs and 1 s, after 3
warm-up runs, and both medians.

Usage: .tools/onnx/bin/python scripts/onnx/ort_bench.py DIR CASE...
"""

import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort


def median_seconds(session, feeds):
    """The median of at least 20 timed runs and 1 s, after 3 warm-up runs."""
    for _ in range(3):
        session.run(None, feeds)
    times = []
    started = time.perf_counter()
    while len(times) < 20 or time.perf_counter() - started < 1.0:
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def main(argv):
    d = argv[1]
    for name in argv[2:]:
        case = json.load(open(f"{d}/{name}/case.json"))
        feeds = {}
        for spec in case["inputs"]:
            dtype = np.int64 if spec["dtype"] == "int64" else np.float32
            feeds[spec["name"]] = np.fromfile(f"{d}/{name}/{spec['file']}", dtype=dtype).reshape(spec["dims"])
        # Every core, and one: on this machine ONNX Runtime's thread pool sometimes runs a model
        # two or three times slower than one thread does (its workers spin for each other), so
        # the faster of the two is its speed on these cores.
        by_threads = {}
        for threads in sorted({os.cpu_count(), 1}, reverse=True):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(f"{d}/{name}/model.onnx", options,
                                           providers=["CPUExecutionProvider"])
            by_threads[threads] = median_seconds(session, feeds)
        threads, median = min(by_threads.items(), key=lambda kv: kv[1])
        batch = case["inputs"][0]["dims"][0]
        print(json.dumps({"case": name, "batch": batch, "median_s": median, "items_per_s": batch / median,
                          "threads": threads,
                          "median_s_by_threads": {str(k): v for k, v in by_threads.items()},
                          "onnxruntime": ort.__version__}), flush=True)


if __name__ == "__main__":
    main(sys.argv)
