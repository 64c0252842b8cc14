#!/usr/bin/env python3
"""`make cpu-kernels`: the CPU backend's kernels next to their numpy / OpenBLAS peer, one run.

Builds `cpu-kernels` (crates/tensor-wasm-bench/src/bin/cpu-kernels.rs, release), creates the
venv `.tools/cpu-peer` with pinned numpy, scipy (the peer of erf and GELU) and threadpoolctl
from PyPI when missing, then runs the peer (scripts/cpu_peer.py) and the backend one after
the other on the same cores, and writes one run file: machine, date, commit, both raw
reports, and per kernel the backend's rate, the peer's rate and their ratio. Prints the ratio table (markdown).

Usage: scripts/cpu_kernels.py [--quick] [--only NAME,...] [--isa portable|avx2|avx512]
       [--peer-coretype auto|Haswell|SkylakeX|...] [--out PATH]
`--isa` narrows the backend's matmul and conv2d tiles (TENSOR_WASM_CPU_ISA); the run file names
the ISA used (`gemm_isa`).
Default run file: bench-results/cpu-kernels/<YYYY-MM-DD>.json (-N when the day has one).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".tools", "cpu-peer")
PINS = ["numpy==2.3.5", "scipy==1.16.3", "threadpoolctl==3.6.0"]


def venv_python():
    python = os.path.join(VENV, "bin", "python")
    stamp = os.path.join(VENV, "pins.txt")
    if not (os.path.exists(python) and os.path.exists(stamp) and open(stamp).read().split() == PINS):
        print(f"installing {' '.join(PINS)} into {VENV} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True)
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS],
            check=True,
            env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"},
        )
        with open(stamp, "w") as f:
            f.write("\n".join(PINS) + "\n")
    return python


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()


def out_path(given):
    if given:
        return given
    directory = os.path.join(ROOT, "bench-results", "cpu-kernels")
    day = datetime.date.today().isoformat()
    path, n = os.path.join(directory, f"{day}.json"), 2
    while os.path.exists(path):
        path, n = os.path.join(directory, f"{day}-{n}.json"), n + 1
    return path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small shapes, short runs")
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default=None,
                        help="comma-separated kernel names of ours; the peer runs their peers")
    parser.add_argument("--isa", default=None, help="TENSOR_WASM_CPU_ISA for the backend")
    parser.add_argument("--peer-coretype", default="auto",
                        help="OpenBLAS kernel of the peer: auto (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE "
                             "removed from its environment, so OpenBLAS picks the host's widest) or a "
                             "core type to force, e.g. Haswell (AVX2) beside --isa avx2")
    args = parser.parse_args()
    quick = ["--quick"] if args.quick else []

    cargo = os.environ.get("CARGO", "cargo")
    subprocess.run([cargo, "build", "--quiet", "--release", "-p", "tensor-wasm-bench", "--bin", "cpu-kernels"],
                   cwd=ROOT, check=True)
    python = venv_python()
    peer_cmd = [python, os.path.join(ROOT, "scripts", "cpu_peer.py"), *quick]
    ours_cmd = [os.path.join(ROOT, "target", "release", "cpu-kernels"), *quick]
    if args.quick:
        ours_cmd += ["--seconds", "0.1"]
    if args.only:
        ours_cmd += ["--only", args.only]
    # Some hosts set these for everything; the peer's kernel is chosen here, and recorded.
    peer_env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if args.peer_coretype != "auto":
        peer_env["OPENBLAS_CORETYPE"] = args.peer_coretype
    ours_env = dict(os.environ)
    if args.isa:
        ours_env["TENSOR_WASM_CPU_ISA"] = args.isa
    if args.only:
        # Ours first, so that the peer runs only the kernels ours compared against.
        ours = json.loads(subprocess.run(ours_cmd, check=True, capture_output=True, text=True,
                                         env=ours_env).stdout)
        peer_cmd += ["--only", ",".join(sorted({r["peer"] for r in ours["results"]}))]
        peer = json.loads(subprocess.run(peer_cmd, check=True, capture_output=True, text=True,
                                         env=peer_env).stdout)
    else:
        peer = json.loads(subprocess.run(peer_cmd, check=True, capture_output=True, text=True,
                                         env=peer_env).stdout)
        ours = json.loads(subprocess.run(ours_cmd, check=True, capture_output=True, text=True,
                                         env=ours_env).stdout)

    peer_by_name = {r["kernel"]: r for r in peer["results"]}
    rows = []
    for result in ours["results"]:
        unit = "gb_per_s" if "gb_per_s" in result else "gflop_per_s"
        match = peer_by_name.get(result["peer"])
        peer_rate = match.get(unit) if match else None
        rows.append({
            "kernel": result["kernel"],
            "peer": result["peer"],
            "unit": unit,
            "tensor_wasm": result[unit],
            "numpy": peer_rate,
            "ratio": result[unit] / peer_rate if peer_rate else None,
        })

    dirty = git("status", "--porcelain", "--untracked-files=no")
    run = {
        "what": "make cpu-kernels: CPU backend kernels vs numpy/OpenBLAS on the same cores, one run",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"),
        "uncommitted": dirty.splitlines() if dirty else [],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "cpu": peer.get("cpu")},
        "gemm_isa": ours.get("gemm_isa"),
        "peer_openblas_coretype": args.peer_coretype,
        "commands": {"peer": (f"OPENBLAS_CORETYPE={args.peer_coretype} " if args.peer_coretype != "auto"
                              else "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ") + " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in peer_cmd[1:]),
                     "tensor_wasm": (f"TENSOR_WASM_CPU_ISA={args.isa} " if args.isa else "")
                     + " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in ours_cmd)},
        "ratios": rows,
        "peer": peer,
        "tensor_wasm": ours,
    }
    path = out_path(args.out)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(run, f, indent=1)
        f.write("\n")
    print("| kernel | TensorWasm CPU | numpy / OpenBLAS | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        unit = "GB/s" if row["unit"] == "gb_per_s" else "GFLOP/s"
        theirs = f"{row['numpy']:.2f} {unit}" if row["numpy"] else "-"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
        print(f"| {row['kernel']} | {row['tensor_wasm']:.2f} {unit} | {theirs} ({row['peer']}) | {ratio} |")
    print(f"run file: {path}")


if __name__ == "__main__":
    main()
