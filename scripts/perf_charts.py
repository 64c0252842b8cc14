"""The SVG charts of PERFORMANCE.md (docs/charts/), drawn from the run files by scripts/perf_doc.py:
restore time vs image size, dispatch latency distribution, copy throughput vs its peer."""
import math
import os

from perf_runs import RESULTS, fmt_bytes, load, machine_line, newest_with, provenance, rel

CHARTS_DIR = "docs/charts"  # relative to ROOT; PERFORMANCE.md links to it


# --------------------------------------------------------------------------- SVG

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
W, H = 860, 440
ML, MR, MT, MB = 84, 240, 106, 58  # margins: left, right (legend), top (title), bottom


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def num(v):
    """Fixed formatting of a coordinate, so output bytes never depend on float repr."""
    return f"{v:.1f}"


def svg_open(title, subtitle_lines):
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">',
        f"<title>{esc(title)}</title>",
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="{ML}" y="22" font-size="15" font-weight="bold">{esc(title)}</text>',
    ]
    for i, line in enumerate(subtitle_lines):
        out.append(f'<text x="{ML}" y="{40 + 14 * i}" font-size="10" fill="#555555">{esc(line)}</text>')
    return out


def log_ticks(lo, hi):
    """Decades covering [lo, hi] (powers of ten)."""
    a = math.floor(math.log10(lo))
    b = math.ceil(math.log10(hi))
    return [10.0 ** e for e in range(a, b + 1)]


def y_axis_log(out, lo, hi, label, fmt):
    ticks = log_ticks(lo, hi)
    y0, y1 = math.log10(ticks[0]), math.log10(ticks[-1])
    top, bottom = MT, H - MB

    def y(v):
        return bottom - (math.log10(v) - y0) / (y1 - y0) * (bottom - top)

    for t in ticks:
        out.append(f'<line x1="{ML}" y1="{num(y(t))}" x2="{W - MR}" y2="{num(y(t))}" stroke="#dddddd"/>')
        out.append(f'<text x="{ML - 6}" y="{num(y(t) + 4)}" text-anchor="end">{esc(fmt(t))}</text>')
    out.append(f'<line x1="{ML}" y1="{top}" x2="{ML}" y2="{bottom}" stroke="#333333"/>')
    out.append(f'<line x1="{ML}" y1="{bottom}" x2="{W - MR}" y2="{bottom}" stroke="#333333"/>')
    out.append(f'<text x="18" y="{num((top + bottom) / 2)}" text-anchor="middle" '
               f'transform="rotate(-90 18 {num((top + bottom) / 2)})">{esc(label)}</text>')
    return y


def legend(out, names):
    x = W - MR + 16
    for i, name in enumerate(names):
        y = MT + 8 + 18 * i
        out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
        out.append(f'<text x="{x + 18}" y="{y}">{esc(name)}</text>')


def line_chart(title, subtitle, x_label, y_label, series, x_fmt, y_fmt):
    """Log-log chart; series = [(name, [(x, y), ...])]."""
    xs = sorted({x for _, pts in series for x, _ in pts})
    ys = [y for _, pts in series for _, y in pts]
    out = svg_open(title, subtitle)
    y = y_axis_log(out, min(ys), max(ys), y_label, y_fmt)
    lx0, lx1 = math.log2(xs[0]), math.log2(xs[-1])
    left, right = ML + 20, W - MR - 20

    def x(v):
        return left if lx1 == lx0 else left + (math.log2(v) - lx0) / (lx1 - lx0) * (right - left)

    for v in xs:
        out.append(f'<line x1="{num(x(v))}" y1="{H - MB}" x2="{num(x(v))}" y2="{H - MB + 5}" stroke="#333333"/>')
        out.append(f'<text x="{num(x(v))}" y="{H - MB + 18}" text-anchor="middle">{esc(x_fmt(v))}</text>')
    out.append(f'<text x="{num((left + right) / 2)}" y="{H - 12}" text-anchor="middle">{esc(x_label)}</text>')
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(pts)
        path = " ".join(f"{num(x(a))},{num(y(b))}" for a, b in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b in pts:
            out.append(f'<circle cx="{num(x(a))}" cy="{num(y(b))}" r="3.5" fill="{color}">'
                       f"<title>{esc(name)} {esc(x_fmt(a))}: {esc(y_fmt(b))}</title></circle>")
    legend(out, [name for name, _ in series])
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bar_chart(title, subtitle, y_label, groups, names, y_fmt):
    """Grouped bars on a log axis; groups = [(label, [value or None per name])]."""
    values = [v for _, vals in groups for v in vals if v]
    out = svg_open(title, subtitle)
    y = y_axis_log(out, min(values), max(values), y_label, y_fmt)
    bottom = H - MB
    left, right = ML + 10, W - MR - 10
    slot = (right - left) / len(groups)
    bar = min(28.0, slot * 0.8 / len(names))
    for g, (label, vals) in enumerate(groups):
        start = left + g * slot + (slot - bar * len(names)) / 2
        for i, v in enumerate(vals):
            if not v:
                continue
            top = y(v)
            out.append(f'<rect x="{num(start + i * bar)}" y="{num(top)}" width="{num(bar - 2)}" '
                       f'height="{num(bottom - top)}" fill="{PALETTE[i % len(PALETTE)]}">'
                       f"<title>{esc(label.replace(chr(10), ' '))} {esc(names[i])}: {esc(y_fmt(v))}</title></rect>")
        for k, part in enumerate(label.split("\n")):
            out.append(f'<text x="{num(left + g * slot + slot / 2)}" y="{bottom + 16 + 13 * k}" '
                       f'text-anchor="middle" font-size="11">{esc(part)}</text>')
    legend(out, names)
    out.append("</svg>")
    return "\n".join(out) + "\n"


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
    out.append(f"Rendered by the same script from the same run files (`{CHARTS_DIR}/`); hover a point or bar for its value.\n")
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
