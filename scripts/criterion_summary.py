#!/usr/bin/env python3
"""Collects Criterion estimates into one committed run file.

Usage: SINCE=<unix seconds> criterion_summary.py OUT.json COMMAND...

Only estimates written at or after SINCE (default: all) are taken, so stale
results of earlier runs under target/criterion do not leak in.

Reads $CRITERION_HOME (default target/criterion)/<group>/<id>/new/estimates.json for every bench that
ran and writes OUT.json with machine, date, commit, the command that produced
the run, and per bench id: median, mean, their confidence bounds and the
standard deviation, in nanoseconds.
"""
import datetime
import json
import os
import platform
import subprocess
import sys


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": " ".join(platform.uname()[0:3:2]),
        "arch": platform.machine(),
    }


def commit():
    try:
        rev = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "crates"]).returncode != 0
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def estimates():
    root = os.environ.get("CRITERION_HOME") or "target/criterion"
    since = float(os.environ.get("SINCE", "0"))
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
            continue
        bench_dir = os.path.dirname(dirpath)
        if os.path.getmtime(os.path.join(dirpath, "estimates.json")) < since:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        key = bench.get("full_id") or os.path.relpath(bench_dir, root)
        out[key] = {
            "median_ns": est["median"]["point_estimate"],
            "median_lo_ns": est["median"]["confidence_interval"]["lower_bound"],
            "median_hi_ns": est["median"]["confidence_interval"]["upper_bound"],
            "mean_ns": est["mean"]["point_estimate"],
            "std_dev_ns": est["std_dev"]["point_estimate"],
        }
    return dict(sorted(out.items()))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    doc = {
        "kind": "criterion",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit(),
        "machine": machine(),
        "command": " ".join(sys.argv[2:]),
        "benches": estimates(),
    }
    if not doc["benches"]:
        sys.exit("no Criterion estimates under $CRITERION_HOME (default target/criterion)")
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"wrote {sys.argv[1]} ({len(doc['benches'])} benches)")


if __name__ == "__main__":
    main()
