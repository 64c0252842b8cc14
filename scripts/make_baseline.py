#!/usr/bin/env python3
"""Derives bench-results/baseline.json from several recorded clean runs.

Usage: python3 scripts/make_baseline.py OUT.json RUN.json [RUN.json ...]

For every bench id present in all runs:
  median_ns     = the median of the runs' medians
  spread_pct    = the largest deviation of a run's median from that, in %
  tolerance_pct = max(20, ceil(4 * spread_pct)), at most 100

Peers measured only for ratios (ids containing `_vec_peer`, `raw_wasmtime`,
`/memcpy/`) are not tracked: they time the host and wasmtime, not us.

The gate then fails a metric above median_ns * (1 + (tolerance_pct +
regress_pct_threshold) / 100) with regress_pct_threshold = 10. The inputs,
machine, date and commits are recorded in the output.
"""
import datetime
import json
import math
import statistics
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    runs = [json.load(open(p)) for p in paths]
    ids = set(runs[0]["benches"])
    for r in runs[1:]:
        ids &= set(r["benches"])
    metrics = {}
    peers = ("_vec_peer", "raw_wasmtime", "/memcpy/")
    for bench_id in sorted(i for i in ids if not any(p in i for p in peers)):
        medians = [r["benches"][bench_id]["median_ns"] for r in runs]
        mid = statistics.median(medians)
        spread = max(abs(m / mid - 1.0) for m in medians) * 100.0
        tolerance = min(100, max(20, math.ceil(4 * spread)))
        metrics[bench_id] = {
            "median_ns": round(mid, 3),
            "tolerance_pct": tolerance,
            "spread_pct": round(spread, 2),
        }
    doc = {
        "description": "Criterion medians measured on the reference machine class (2 cores); see baseline-notes.md",
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": runs[0].get("machine"),
        "runs": [{"file": p, "date": r.get("date"), "commit": r.get("commit")} for p, r in zip(paths, runs)],
        "method": "median of the runs' medians; tolerance_pct = max(20, ceil(4 x largest deviation of a run from it)), capped at 100; ratio peers (_vec_peer, raw_wasmtime, memcpy) not tracked",
        "policy": {"regress_pct_threshold": 10},
        "metrics": metrics,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"wrote {out}: {len(metrics)} metrics from {len(runs)} runs")


if __name__ == "__main__":
    main()
