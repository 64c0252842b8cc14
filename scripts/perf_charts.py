"""The SVG charts of PERFORMANCE.md (docs/charts/), drawn from the run files by scripts/perf_doc.py
with matplotlib: restore time vs image size, dispatch latency distribution, copy throughput vs its
peer. matplotlib is pinned (scripts/install-deps.sh installs it into .tools/perf-doc; the Makefile
runs this with that venv's python), and the SVG is made byte-stable: fixed figure size, fixed hash
salt for the ids, text kept as text (no glyph outlines from the fonts installed), no date or version
in the metadata."""
import io
import math
import os
from xml.sax.saxutils import escape

try:
    import matplotlib
except ImportError:
    raise SystemExit("perf_charts.py needs the pinned matplotlib: run it with .tools/perf-doc/bin/python "
                     "(`make deps` installs it), as `make perf-doc` does")
matplotlib.use("svg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from perf_runs import RESULTS, fmt_bytes, load, machine_line, newest_with, provenance, rel  # noqa: E402

CHARTS_DIR = "docs/charts"  # relative to ROOT; PERFORMANCE.md links to it

# ----------------------------------------------------------------------- drawing

matplotlib.rcParams.update({
    "svg.hashsalt": "tensor-wasm-perf-charts",  # clip-path and marker ids: the same every run
    "svg.fonttype": "none",  # <text> elements, not glyph paths
    "font.family": "sans-serif",  # the SVG asks for 'DejaVu Sans', sans-serif
    "font.sans-serif": ["DejaVu Sans"],  # layout measured with matplotlib's own copy (found first)
    "font.size": 9,
})
SIZE = (10.0, 5.2)  # inches; 72 pt per inch in the SVG
DPI = 72
MARKERS = "os^Dv<>"  # 7 markers against 10 colours: no two series of a chart look alike


def figure(title, subtitle_lines):
    """A figure with the title and grey provenance lines on top, the axes left, the legend right."""
    fig = Figure(figsize=SIZE, dpi=DPI)
    height = SIZE[1]
    fig.text(0.06, 1 - 0.3 / height, title, fontsize=12, fontweight="bold")
    for i, line in enumerate(subtitle_lines):
        fig.text(0.06, 1 - (0.52 + 0.17 * i) / height, line, fontsize=7.5, color="#555555")
    top = 1 - (0.6 + 0.17 * len(subtitle_lines)) / height
    ax = fig.add_axes((0.09, 0.13, 0.62, top - 0.13))
    ax.grid(True, axis="y", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def log_y(ax, values, label, fmt):
    """Log y axis over whole decades covering the values, ticks at each decade."""
    lo = math.floor(math.log10(min(values)))
    hi = max(math.ceil(math.log10(max(values))), lo + 1)
    ax.set_yscale("log")
    ax.set_ylim(10.0 ** lo, 10.0 ** hi)
    ax.yaxis.set_major_locator(FixedLocator([10.0 ** e for e in range(lo, hi + 1)]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylabel(label)


def to_svg(fig, title, tips):
    """The legend (right of the axes), then the figure as SVG text, each tipped artist's group
    given a <title> (its hover text)."""
    ax = fig.axes[0]
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=8)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Title": title, "Date": None, "Creator": None})
    svg = buf.getvalue()
    for gid, text in tips.items():
        opening = f'<g id="{gid}">'
        assert svg.count(opening) == 1, gid
        svg = svg.replace(opening, f"{opening}\n   <title>{escape(text)}</title>")
    return svg


def line_chart(title, subtitle, x_label, y_label, series, x_fmt, y_fmt):
    """Log-log chart (x in powers of two); series = [(name, [(x, y), ...])]."""
    fig, ax = figure(title, subtitle)
    xs = sorted({x for _, pts in series for x, _ in pts})
    log_y(ax, [y for _, pts in series for _, y in pts], y_label, y_fmt)
    tips = {}
    for i, (name, pts) in enumerate(series):
        pts = sorted(pts)
        gid = f"series-{i}"
        ax.plot([a for a, _ in pts], [b for _, b in pts], color=f"C{i % 10}", marker=MARKERS[i % len(MARKERS)],
                markersize=4.5, linewidth=1.6, label=name, gid=gid)
        tips[gid] = f"{name}: " + ", ".join(f"{x_fmt(a)} {y_fmt(b)}" for a, b in pts)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(xs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: x_fmt(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(xs) > 1:
        pad = (math.log2(xs[-1]) - math.log2(xs[0])) * 0.04
        ax.set_xlim(xs[0] / 2 ** pad, xs[-1] * 2 ** pad)
    ax.set_xlabel(x_label)
    return to_svg(fig, title, tips)


def bar_chart(title, subtitle, y_label, groups, names, y_fmt):
    """Grouped bars on a log axis; groups = [(label, [value or None per name])]."""
    fig, ax = figure(title, subtitle)
    log_y(ax, [v for _, vals in groups for v in vals if v], y_label, y_fmt)
    width = 0.8 / len(names)
    tips = {}
    for i, name in enumerate(names):
        at = [(g, vals[i]) for g, (_, vals) in enumerate(groups) if vals[i]]
        bars = ax.bar([g - 0.4 + width * (i + 0.5) for g, _ in at], [v for _, v in at], width * 0.92,
                      color=f"C{i % 10}", label=name)
        for bar, (g, v) in zip(bars, at):
            gid = f"bar-{g}-{i}"
            bar.set_gid(gid)
            tips[gid] = f"{groups[g][0].replace(chr(10), ' ')} {name}: {y_fmt(v)}"
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.tick_params(axis="x", length=0)
    return to_svg(fig, title, tips)


def fmt_time_tick(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:g} s"
    if ns >= 1e6:
        return f"{ns / 1e6:g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:g} µs"
    return f"{ns:g} ns"


def fmt_gbps_tick(v):
    return f"{v:g} GB/s"


# ------------------------------------------------------------------------ charts

def chart_restore(charts):
    """Restore time vs image size: the snapshot crate's benches (newest cold-start run file) and
    the runtime's whole-instance restore (newest snapshot-restore run file), when committed."""
    sources = []
    for pattern, prefix, labels in (
        ("*cold-start*.json", "snapshot: ", {
            "restore": "restore (portable)", "restore_lazy": "restore_lazy (mmap)",
            "map_lazy": "map_lazy (mmap)",
            "disk_round_trip": "disk round trip", "capture": "capture", "memcpy": "memcpy peer"}),
        ("*snapshot-restore*.json", "instance: ", {}),
    ):
        path, doc = newest_with("cold_start/", pattern)
        if path:
            sources.append((path, doc, prefix, labels))
    if not sources:
        return None
    series = []
    for path, doc, prefix, labels in sources:
        found = {}
        for key, b in doc["benches"].items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "cold_start" and parts[2].isdigit():
                found.setdefault(parts[1], []).append((int(parts[2]), b["median_ns"]))
        for name in sorted(found):
            series.append((prefix + labels.get(name, name), found[name]))
    subtitle = [f"{rel(p)}: {d.get('date')}, commit {d.get('commit')}" for p, d, _, _ in sources]
    subtitle += sorted({f"machine: {machine_line(d.get('machine'))}" for _, d, _, _ in sources})
    svg = line_chart(
        "Snapshot restore time vs image size (Criterion medians)",
        subtitle + ["snapshot: the snapshot crate's encode/decode of a memory image; "
                    "instance: the runtime's whole restore of an instance"],
        "image size (log scale)", "median time per operation (log scale)",
        series, fmt_bytes, fmt_time_tick)
    name = "restore-vs-size.svg"
    charts[name] = svg
    return name, [(p, d) for p, d, _, _ in sources]


def chart_dispatch(charts):
    """Dispatch latency distribution: tail-latency.json, else Criterion dispatch medians."""
    path = os.path.join(RESULTS, "tail-latency.json")
    name = "dispatch-latency.svg"
    if os.path.exists(path):
        doc = load(path)
        res = doc["results"]
        ids = [i for i in ("dispatch/serial/100", "dispatch/concurrent_cap64/100",
                           "e2e/healthz/get", "e2e/invoke_not_found/post") if i in res]
        keys = [("p50_ns", "p50"), ("p95_ns", "p95"), ("p99_ns", "p99"), ("p99_9_ns", "p99.9"), ("max_ns", "max")]
        groups = [(i.replace("/", "\n", 1), [res[i].get(k) for k, _ in keys]) for i in ids]
        svg = bar_chart(
            "Latency distribution per sample (tail-latency run)",
            [f"{rel(path)}: {machine_line(doc.get('machine'))}",
             f"date {doc.get('date')}, commit {doc.get('commit')}",
             "load average (1, 5, 15 min) before / after: "
             f"{' / '.join(str(x) for x in doc.get('load_average_before_after', []))}; "
             "one dispatch sample = 100 dispatches"],
            "latency (log scale)", groups, [label for _, label in keys], fmt_time_tick)
        charts[name] = svg
        return name, [(path, doc)]
    path, doc = newest_with("dispatch/")
    if not path:
        return None
    series = {}
    for key, b in doc["benches"].items():
        parts = key.split("/")
        if parts[0] == "dispatch" and len(parts) == 3:
            series.setdefault(parts[1], []).append((int(parts[2]), b["median_ns"] / int(parts[2])))
    svg = line_chart(
        "Dispatch cost per dispatch vs batch size (Criterion medians ÷ N)",
        [f"{rel(path)}: {machine_line(doc.get('machine'))}",
         f"date {doc.get('date')}, commit {doc.get('commit')}"],
        "dispatches per iteration (N)", "time per dispatch (log scale)",
        sorted(series.items()), lambda v: f"{v:g}", fmt_time_tick)
    charts[name] = svg
    return name, [(path, doc)]


def chart_throughput(charts):
    """Copy throughput into guest memory vs the Vec peer, from the newest run file with both."""
    path, doc = newest_with("memory_bandwidth/")
    if not path:
        return None
    benches = doc["benches"]
    groups = []
    for kind, moved in (("sequential", lambda n: n), ("strided", lambda n: n // 4096 * 64)):
        sizes = sorted(int(k.split("/")[2]) for k in benches if k.startswith(f"memory_bandwidth/{kind}/"))
        for n in sizes:
            ours = benches.get(f"memory_bandwidth/{kind}/{n}")
            peer = benches.get(f"memory_bandwidth/{kind}_vec_peer/{n}")
            if ours and peer:
                groups.append((f"{kind}\n{fmt_bytes(n)}",
                               [moved(n) / ours["median_ns"], moved(n) / peer["median_ns"]]))
    if not groups:
        return None
    svg = bar_chart(
        "Host copy throughput into guest memory vs a Vec peer (same run)",
        [f"{rel(path)}: {machine_line(doc.get('machine'))}",
         f"date {doc.get('date')}, commit {doc.get('commit')}",
         "bytes moved ÷ Criterion median; strided moves 64 B per 4 KiB"],
        "GB/s (log scale)", groups, ["GuardedHostBuffer (ours)", "Vec peer (memcpy)"], fmt_gbps_tick)
    name = "copy-throughput-vs-peer.svg"
    charts[name] = svg
    return name, [(path, doc)]


def charts_section(out, charts, cited):
    out.append("## Charts\n")
    out.append(f"Drawn with matplotlib by the same script from the same run files (`{CHARTS_DIR}/`); "
               "hover a line or bar for its values.\n")
    made = [
        ("Restore time vs image size", chart_restore(charts)),
        ("Dispatch latency distribution", chart_dispatch(charts)),
        ("Kernel-path throughput vs peer", chart_throughput(charts)),
    ]
    for title, made_chart in made:
        out.append(f"### {title}\n")
        if not made_chart:
            out.append("No run file with these benches is committed yet.\n")
            continue
        name, sources = made_chart
        out.append(f"![{title}]({CHARTS_DIR}/{name})\n")
        for path, doc in sources:
            cited.setdefault(path, set()).add("chart")
            out.append(f"From {provenance(path, doc)}.\n")
    out.append("No GPU kernel has been timed yet, so the throughput chart compares the host-side copy into "
               "guest memory with its `memcpy` peer; kernel-versus-cuBLAS/PyTorch figures will come from a GPU run file.\n")
