#!/usr/bin/env python3
"""Derives bench-results/baseline.json from several recorded clean runs.

Usage: python3 scripts/make_baseline.py [--min-runs N] [--spread-factor K]
       [--merge BASE.json | --refresh BASE.json] OUT.json RUN.json...

For every bench id present in at least N runs (default: all of them), over
the runs that measured it:
  median_ns     = the median of the runs' medians
  spread_pct    = the largest deviation of a run's median from that, in %
  tolerance_pct = max(20, ceil(K * spread_pct)), at most 100 (K: 4 by default;
                  with many runs the largest deviation is itself a wide
                  estimate and a smaller K suffices)

Peers measured only for ratios (ids containing `_vec_peer`, `raw_wasmtime`,
`/memcpy/`, `/memcpy_fresh/`) are not tracked: they time the host and wasmtime, not us.

With --merge, BASE.json (an earlier output) is kept as it is — every metric,
run and the policy — and only the ids it does not track yet are derived from
RUN.json... as above and added; the runs are appended to its list and its
method records the addition. Ids it tracks already are listed and left alone.

With --refresh, BASE.json is kept the same way except that every id the runs
measured (in at least N of them) is derived again from them, replacing what it
had: for code that moved, as the newest committed runs show (the check in
`make test`, crates/tensor-wasm-gates/tests/baseline_freshness.rs, fails when a
bench's newest committed run is 2x faster than its baseline).

The gate then fails a metric above median_ns * (1 + (tolerance_pct +
regress_pct_threshold) / 100) with regress_pct_threshold = 10, twice in a row
(a first run and its confirmation re-run). The inputs,
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
    args = sys.argv[1:]
    min_runs, factor, merge = None, 4.0, None
    refresh = False
    while args[:1] in (["--min-runs"], ["--spread-factor"], ["--merge"], ["--refresh"]):
        if args[0] == "--min-runs":
            min_runs = int(args[1])
        elif args[0] == "--spread-factor":
            factor = float(args[1])
        else:
            merge, refresh = args[1], args[0] == "--refresh"
        args = args[2:]
    if len(args) < 2:
        sys.exit(__doc__)
    out, paths = args[0], args[1:]
    runs = [json.load(open(p)) for p in paths]
    min_runs = len(runs) if min_runs is None else min_runs
    counts = {}
    for r in runs:
        for bench_id in r["benches"]:
            counts[bench_id] = counts.get(bench_id, 0) + 1
    ids = {i for i, n in counts.items() if n >= min_runs}
    metrics = {}
    peers = ("_vec_peer", "raw_wasmtime", "/memcpy/", "/memcpy_fresh/")
    for bench_id in sorted(i for i in ids if not any(p in i for p in peers)):
        medians = [r["benches"][bench_id]["median_ns"] for r in runs if bench_id in r["benches"]]
        mid = statistics.median(medians)
        spread = max(abs(m / mid - 1.0) for m in medians) * 100.0
        tolerance = min(100, max(20, math.ceil(factor * spread)))
        metrics[bench_id] = {
            "median_ns": round(mid, 3),
            "tolerance_pct": tolerance,
            "spread_pct": round(spread, 2),
            "runs": len(medians),
        }
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    run_list = [{"file": p, "date": r.get("date"), "commit": r.get("commit")} for p, r in zip(paths, runs)]
    rule = f"tolerance_pct = max(20, ceil({factor:g} x largest deviation of a run from it)), capped at 100"
    if refresh:
        doc = json.load(open(merge))
        replaced = sorted(i for i in metrics if i in doc["metrics"])
        for i in replaced:
            old = doc["metrics"][i]["median_ns"]
            print(f"refreshed {i}: {old:.1f} -> {metrics[i]['median_ns']:.1f} ns")
        doc["metrics"] = dict(sorted({**doc["metrics"], **metrics}.items()))
        doc["runs"] = doc["runs"] + run_list
        doc["method"] += (f"; refreshed {now[:10]}: {len(replaced)} metrics whose code moved, and "
                          f"{len(metrics) - len(replaced)} added, from {', '.join(paths)} (median "
                          f"of the medians of the runs that measured the metric, at least "
                          f"{min_runs}; {rule}; ratio peers not tracked)")
        with open(out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"wrote {out}: {len(replaced)} refreshed, {len(doc['metrics'])} in all")
        return
    if merge:
        doc = json.load(open(merge))
        kept = sorted(i for i in metrics if i in doc["metrics"])
        added = {i: m for i, m in metrics.items() if i not in doc["metrics"]}
        doc["metrics"] = dict(sorted({**doc["metrics"], **added}.items()))
        doc["runs"] = doc["runs"] + run_list
        doc["method"] += (f"; added {now[:10]}: {len(added)} metrics not tracked before, from "
                          f"{', '.join(paths)} (median of the medians of the runs that measured "
                          f"the metric, at least {min_runs}; {rule}; ratio peers not tracked)")
        with open(out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        for i in kept:
            print(f"already tracked, left as it is: {i}")
        print(f"wrote {out}: {len(added)} metrics added from {len(runs)} runs, {len(doc['metrics'])} in all")
        return
    doc = {
        "description": "Criterion medians measured on the reference machine class (2 cores); see baseline-notes.md",
        "generated": now,
        "machine": runs[0].get("machine"),
        "runs": run_list,
        "method": f"median of the medians of the runs that measured the metric (at least {min_runs}); tolerance_pct = max(20, ceil({factor:g} x largest deviation of a run from it)), capped at 100; ratio peers (_vec_peer, raw_wasmtime, memcpy) not tracked",
        "policy": {"regress_pct_threshold": 10},
        "metrics": metrics,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"wrote {out}: {len(metrics)} metrics from {len(runs)} runs")


if __name__ == "__main__":
    main()
