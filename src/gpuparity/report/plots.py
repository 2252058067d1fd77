"""Plots: error along depth for trace comparisons and replays, loss curves for workload runs,
bars of `gpuparity bench` results. PNG files need matplotlib (optional: the plot extra, or pip install matplotlib); the inline SVG used in
HTML reports does not."""
from __future__ import annotations

import html
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple


class PlotUnavailable(RuntimeError):
    """--plot was asked for and matplotlib is not installed."""


def require_matplotlib():
    """pyplot with a file-only backend, or PlotUnavailable with what to install."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed here: "
                              "pip install matplotlib; "
                              "--html works without it") from exc
    return plt


def _savefig(fig, path: str, **options) -> None:
    """Save a figure, creating missing folders as --json, --html and --out do."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, **options)


def _series(rows: Sequence[Dict[str, Any]]) -> Tuple[List[int], List[float], List[float], List[bool]]:
    xs, errs, allowed, bad = [], [], [], []
    for index, row in enumerate(rows):
        err = row.get("err")
        if err is None:
            continue
        xs.append(index)
        errs.append(err if math.isfinite(err) else 1e3)
        allowed.append(row.get("allowed") or float("nan"))
        bad.append(not row.get("passed", row.get("status") in ("ok", None)))
    return xs, errs, allowed, bad


def _label(row: Optional[Dict[str, Any]]) -> str:
    if not row:
        return ""
    return f"{row['key']}" + (" (own code)" if row.get("what") == "own code" else "")


def error_along_depth_png(panels: Sequence[Tuple[str, Sequence[Dict[str, Any]], Optional[Dict[str, Any]]]],
                          path: str, title: str) -> str:
    """panels: (title, rows in order, first failing row or None). Rows need err, allowed and
    passed (or status)."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for axis, (name, rows, first) in zip(axes[:, 0], panels):
        xs, errs, allowed, bad = _series(rows)
        if not xs:
            axis.set_title(f"{name}: nothing compared")
            continue
        floor = 1e-12
        axis.semilogy(xs, [max(e, floor) for e in errs], "-", color="#4a6fa5", lw=1, label="relative error")
        axis.semilogy(xs, [max(a, floor) for a in allowed], ":", color="#888", lw=1, label="allowed")
        axis.scatter([x for x, b in zip(xs, bad) if b], [max(e, floor) for e, b in zip(errs, bad) if b],
                     color="#c62828", zorder=3, s=18, label="diverges")
        if first is not None:
            index = rows.index(first) if first in rows else None
            if index is not None:
                axis.axvline(index, color="#c62828", lw=0.8, alpha=0.6)
                axis.annotate(f"first: {_label(first)}", (index, max(first.get("err") or floor, floor)),
                              textcoords="offset points", xytext=(6, 6), fontsize=8, color="#c62828")
        axis.set_title(name, fontsize=10)
        axis.set_xlabel("module call, in execution order" if "forward" in name.lower()
                        else "module call, in backward order")
        axis.set_ylabel("relative error")
        axis.grid(True, which="major", alpha=0.3)
        axis.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    _savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def loss_curves_png(a: Dict[str, Any], b: Dict[str, Any], comparison: Dict[str, Any], path: str) -> str:
    """Both runs' training loss (raw and smoothed) and the final metrics."""
    plt = require_matplotlib()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    for run, smoothed, color, name in ((a, comparison["smoothed_a"], "#4a6fa5", "a"),
                                       (b, comparison["smoothed_b"], "#d9822b", "b")):
        label = f"{name}: {run.get('attn') or run.get('workload')} {run.get('device')} {run.get('dtype')}"
        losses = [row["loss"] for row in run.get("metrics", [])]
        left.plot(range(len(losses)), losses, color=color, alpha=0.25, lw=0.8)
        left.plot(range(len(smoothed)), smoothed, color=color, lw=1.6, label=label)
    left.axvspan(0, comparison["warmup"], color="#eee", label="not compared (warm-up)")
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    left.legend(fontsize=8)
    left.grid(True, alpha=0.3)
    verdict = "agree" if comparison["passed"] else "DIVERGE"
    left.set_title(f"{a.get('workload')}: runs {verdict}", fontsize=10)
    names = [m["name"] for m in comparison["final"] if m["a"] is not None and m["b"] is not None]
    values_a = [m["a"] for m in comparison["final"] if m["name"] in names]
    values_b = [m["b"] for m in comparison["final"] if m["name"] in names]
    positions = range(len(names))
    right.barh([p - 0.2 for p in positions], values_a, height=0.4, color="#4a6fa5", label="a")
    right.barh([p + 0.2 for p in positions], values_b, height=0.4, color="#d9822b", label="b")
    right.set_yticks(list(positions))
    right.set_yticklabels([f"{n}{' *' if not m['passed'] else ''}" for n, m in
                           zip(names, [m for m in comparison["final"] if m["name"] in names])], fontsize=8)
    right.set_title("final metrics (* > 5% apart)", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    _savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def error_along_depth_svg(rows: Sequence[Dict[str, Any]], title: str, width: int = 900, height: int = 220) -> str:
    """The same plot as inline SVG (log scale), for self-contained HTML without matplotlib."""
    xs, errs, allowed, bad = _series(rows)
    if not xs:
        return f"<p>{html.escape(title)}: nothing compared.</p>"
    values = [v for v in errs + allowed if v and math.isfinite(v) and v > 0]
    low = math.floor(math.log10(min(values))) if values else -12
    high = math.ceil(math.log10(max(values))) if values else 0
    high = max(high, low + 1)
    pad_left, pad_bottom, pad_top = 56, 24, 22
    plot_w, plot_h = width - pad_left - 10, height - pad_bottom - pad_top
    span = max(len(rows) - 1, 1)

    def point(index: int, value: float) -> Tuple[float, float]:
        value = min(max(value, 10.0 ** low), 10.0 ** high)
        x = pad_left + plot_w * index / span
        y = pad_top + plot_h * (1 - (math.log10(value) - low) / (high - low))
        return x, y

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             f"style='font:11px sans-serif;background:#fff'>",
             f"<text x='{pad_left}' y='14'>{html.escape(title)}</text>"]
    for exponent in range(low, high + 1):
        _, y = point(0, 10.0 ** exponent)
        parts.append(f"<line x1='{pad_left}' x2='{width - 10}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eee'/>"
                     f"<text x='4' y='{y + 4:.1f}' fill='#666'>1e{exponent}</text>")
    line = " ".join("%.1f,%.1f" % point(x, e) for x, e in zip(xs, errs) if e > 0)
    bar = " ".join("%.1f,%.1f" % point(x, a) for x, a in zip(xs, allowed) if a and a > 0 and math.isfinite(a))
    parts.append(f"<polyline fill='none' stroke='#999' stroke-dasharray='3,3' points='{bar}'/>")
    parts.append(f"<polyline fill='none' stroke='#4a6fa5' points='{line}'/>")
    for x, e, b in zip(xs, errs, bad):
        if b:
            cx, cy = point(x, max(e, 10.0 ** low))
            name = html.escape(str(rows[x].get("key", "")))
            parts.append(f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='3.5' fill='#c62828'><title>{name}</title></circle>")
    parts.append(f"<text x='{pad_left}' y='{height - 6}' fill='#666'>module calls in order; blue: relative error, "
                 f"dashed: allowed, red: diverges</text></svg>")
    return "".join(parts)


def bench_png(result, path: str) -> str:
    """A bench result (gpuparity.bench.common.BenchResult) as bars: attention's time per backend
    (log scale) per shape and pad, or the GB/s benches' effective GB/s per backend."""
    if result.bench == "attention":
        machine = result.meta.get("machine", "")
        return _attention_bars(result.rows, path, f"{result.title}, {machine}")
    return _gbps_bars(result.rows, path, result.title, result.backends)


def _attention_bars(rows, path: str, title: str) -> str:
    from ..bench.attention import BACKENDS
    plt = require_matplotlib()
    mode = "fwd+bwd" if any(r.mode == "fwd+bwd" for r in rows) else "fwd"
    groups: List[Tuple[str, Any]] = []
    for r in rows:
        key = (r.shape, r.params.get("pad"))
        if key not in groups:
            groups.append(key)
    names = [b for b in BACKENDS if any(r.backend == b for r in rows)]
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(groups)), 5))
    for i, name in enumerate(names):
        xs, ys = [], []
        for g, (shape, pad) in enumerate(groups):
            match = [r for r in rows if r.backend == name and r.shape == shape and r.params.get("pad") == pad
                     and r.mode == mode and r.time_ms]
            if match:
                xs.append(g + i * width)
                ys.append(match[0].time_ms)
        ax.bar(xs, ys, width, label=name + (" (no mask)" if name == "flash" else ""))
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{s.split(' ')[0]}\npad {p}" for s, p in groups], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(f"{mode} time, ms (log)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _savefig(fig, path, dpi=120)
    plt.close(fig)
    return path


def _gbps_bars(rows, path: str, title: str, backends: Sequence[str]) -> str:
    plt = require_matplotlib()
    keys = list(dict.fromkeys((r.shape, r.mode) for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(keys) * len(backends) / 3), 4.5))
    width = 0.8 / max(1, len(backends))
    index = {(r.shape, r.mode, r.backend): r for r in rows if r.status == "ok"}
    for i, backend in enumerate(backends):
        values = [index[(s, m, backend)].gbps if (s, m, backend) in index else 0 for s, m in keys]
        ax.bar([k + i * width for k in range(len(keys))], values, width, label=backend)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
    ax.set_xticklabels([f"{s}\n{m}" for s, m in keys], fontsize=7)
    ax.set_ylabel("effective GB/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _savefig(fig, path, dpi=120)
    plt.close(fig)
    return path
