"""Reading the run files under bench-results/ for scripts/perf_doc.py: loading, formatting,
provenance lines, links, and picking the newest Criterion run file that has given benches."""
import glob
import json
import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RESULTS = os.path.join(ROOT, "bench-results")


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt_ns(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns"


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def machine_line(m):
    if not m:
        return "unknown machine"
    if "cpu" in m:
        return f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('kernel', '')}".strip(", ")
    return f"{m.get('cpu_model', 'unknown CPU')}, {m.get('nproc')} cores, {m.get('uname', '')}".strip(", ")


def rel(path):
    return os.path.relpath(path, ROOT)


def provenance(path, doc):
    """One line naming a run file's machine, date, commit and command."""
    return (f"{link(rel(path), rel(path))} — machine: {machine_line(doc.get('machine'))}; date: {doc.get('date')}; "
            f"commit: `{doc.get('commit')}`; command: `{doc.get('command')}`")


def criterion_files():
    return sorted(glob.glob(os.path.join(RESULTS, "criterion", "*.json")))


def newest_with(prefix, pattern="*.json"):
    """The Criterion run file with the latest `date` (then name) that has a bench id under `prefix`."""
    best = None
    for path in sorted(glob.glob(os.path.join(RESULTS, "criterion", pattern))):
        doc = load(path)
        if any(k.startswith(prefix) for k in doc.get("benches", {})):
            key = (doc.get("date") or "", path)
            if best is None or key > best[0]:
                best = (key, path, doc)
    return (best[1], best[2]) if best else (None, None)


def link(relpath, text=None):
    """A relative Markdown link to a file of the repository (code text when it does not exist)."""
    if os.path.isfile(os.path.join(ROOT, relpath)):
        return f"[{text or os.path.basename(relpath)}]({relpath})"
    return f"`{relpath}`"


def newest_having(ids_of):
    """The Criterion run file with the latest `date` (then name) for which ids_of(benches)
    is non-empty, with that result; (None, None, None) when none has."""
    best = None
    for path in criterion_files():
        doc = load(path)
        found = ids_of(doc.get("benches", {}))
        if found:
            key = (doc.get("date") or "", path)
            if best is None or key > best[0]:
                best = (key, path, doc, found)
    return best[1:] if best else (None, None, None)
