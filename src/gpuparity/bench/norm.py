"""`gpuparity bench norm`: RMSNorm and LayerNorm, gpuparity's Triton kernels against the peers a
user would pick instead (torch F.*, the eager composition, torch.compile, Liger-Kernel when
installed); effective GB/s and % of the copy bandwidth measured in the same run.

Bytes counted (ANCHORS.md): forward reads x and writes y; forward+backward adds reading x and
dy and writing dx. Weights and statistics are too small to count.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import common
from .common import BenchRow

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_SHAPES = "16384x4096,65536x1024,131072x128"
NORM_BACKENDS = ("triton", "torch", "eager", "compile", "liger")
OURS = "triton"


# ----------------------------------------------------------------------------- shared pieces
def parse_list(text: str, allowed: Optional[Sequence[str]] = None, what: str = "value") -> List[str]:
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if allowed is not None:
        bad = [item for item in items if item not in allowed]
        if bad:
            raise ValueError(f"{what}: expected a comma-separated subset of {list(allowed)}, got {bad}")
    if not items:
        raise ValueError(f"{what}: expected at least one entry, got {text!r}")
    return items


def pick_device(name: Optional[str]) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {name} requested but no CUDA or ROCm GPU is visible")
    return device


MODES = ("fwd", "fwd+bwd", "fwd" + common.GRAPH, "fwd+bwd" + common.GRAPH)


def timed(fn: Callable[[], object], rep_ms: float, graph: bool = False) -> float:
    """Median ms of fn(); graph=True captures fn in a CUDA graph and times its replays."""
    if graph:
        fn = common.graphed(fn)
    fn()  # compile / autotune / first-launch work stays out of the timing
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return common.time_ms(fn, warmup_ms=max(10.0, rep_ms / 4), rep_ms=rep_ms)


def fwd_bwd_step(forward: Callable[[], torch.Tensor], grad_out: torch.Tensor, leaves: Sequence[torch.Tensor]):
    """One forward+backward; gradients are dropped first so no accumulation kernel is timed."""
    def step():
        for leaf in leaves:
            leaf.grad = None
        forward().backward(grad_out)
    return step


def add_common_arguments(parser: argparse.ArgumentParser, default_shapes: str, backends: Sequence[str]) -> None:
    parser.add_argument("--shapes", default=default_shapes, help=f"comma-separated shapes (default {default_shapes})")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="input dtype (default bf16)")
    parser.add_argument("--backends", default=",".join(backends),
                        help=f"comma-separated subset of {','.join(backends)}")
    parser.add_argument("--modes", default="fwd,fwd+bwd",
                        help="comma-separated fwd, fwd+bwd, fwd:graph, fwd+bwd:graph (default fwd,fwd+bwd); "
                             "':graph' times the same step captured in a CUDA graph: the kernels without "
                             "per-call host overhead")
    parser.add_argument("--device", default=None, help="cuda (default when a GPU is visible) or cpu")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timing budget per measurement, ms")
    parser.add_argument("--json", dest="json_path", default=None, help="write rows + metadata as JSON")
    parser.add_argument("--md", dest="md_path", default=None, help="write a Markdown table")
    parser.add_argument("--plot", dest="plot_path", default=None, help="write a bar plot (PNG, needs matplotlib)")
    parser.add_argument("--no-ceilings", action="store_true", help="skip measuring the copy bandwidth")


def command_line(name: str, args, extra: Sequence[str] = ()) -> str:
    """The canonical `gpuparity bench NAME ...` that reproduces this run."""
    parts = [f"gpuparity bench {name}"]
    for key in tuple(extra) + ("shapes", "dtype", "backends", "modes", "device", "rep_ms"):
        value = getattr(args, key, None)
        if value is not None:
            parts.append(f"--{key.replace('_', '-')} {value}")
    for key, flag in (("json_path", "--json"), ("md_path", "--md"), ("plot_path", "--plot")):
        if getattr(args, key, None):
            parts.append(f"{flag} {getattr(args, key)}")
    return " ".join(parts)


def summarise(rows: List[BenchRow], ours: str = OURS) -> List[Dict[str, object]]:
    """Per (shape, mode): our GB/s, the best peer and the ratio."""
    groups: Dict[Tuple[str, str], List[BenchRow]] = {}
    for row in rows:
        if row.status == "ok" and row.gbps:
            groups.setdefault((row.shape, row.mode), []).append(row)
    out = []
    for (shape, mode), members in groups.items():
        mine = [r for r in members if r.backend == ours]
        peers = [r for r in members if r.backend != ours]
        best = max(peers, key=lambda r: r.gbps) if peers else None
        out.append({"shape": shape, "mode": mode, "ours_gbps": mine[0].gbps if mine else None,
                    "best_peer": best.backend if best else None, "best_peer_gbps": best.gbps if best else None,
                    "ratio": (mine[0].gbps / best.gbps) if (mine and best) else None})
    return out


def markdown(title: str, rows: List[BenchRow], meta: Dict[str, object], backends: Sequence[str]) -> str:
    copy = (meta.get("ceilings") or {}).get("copy_tbps")
    lines = [f"# {title}", "", f"- machine: {meta.get('machine')}", f"- date: {meta.get('date')}",
             f"- command: `{meta.get('command')}`"]
    versions = meta.get("versions") or {}
    if versions:
        lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if copy:
        lines.append(f"- measured copy bandwidth: {copy * 1000:.0f} GB/s (bytes read + written)")
    lines += ["", "Effective GB/s (time in ms); % of copy bandwidth for ours.", ""]
    header = "| shape | mode | " + " | ".join(backends) + " | ours / best peer |"
    lines += [header, "|" + "---|" * (len(backends) + 3)]
    index = {(r.shape, r.mode, r.backend): r for r in rows}
    summary = {(s["shape"], s["mode"]): s for s in summarise(rows)}
    for shape in dict.fromkeys(r.shape for r in rows):
        for mode in dict.fromkeys(r.mode for r in rows if r.shape == shape):
            cells = []
            for backend in backends:
                row = index.get((shape, mode, backend))
                if row is None:
                    cells.append("")
                elif row.status != "ok":
                    cells.append(row.status)
                else:
                    cell = f"{row.gbps:.0f} ({row.time_ms:.3f})"
                    if backend == OURS and copy:
                        cell += f" {100 * row.gbps / (copy * 1000):.0f}%"
                    cells.append(cell)
            ratio = summary.get((shape, mode), {}).get("ratio")
            best = summary.get((shape, mode), {}).get("best_peer")
            lines.append(f"| {shape} | {mode} | " + " | ".join(cells) +
                         f" | {'' if ratio is None else f'{ratio:.2f}x vs {best}'} |")
    skipped = {(r.backend, r.reason) for r in rows if r.status != "ok"}
    if skipped:
        lines += ["", "Not measured:"]
        lines += [f"- {backend}: {reason}" for backend, reason in sorted(skipped)]
    return "\n".join(lines) + "\n"


def plot(path: str, title: str, rows: List[BenchRow], backends: Sequence[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


def versions() -> Dict[str, str]:
    out = {"torch": torch.__version__}
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        out["triton"] = "not importable"
    try:
        import liger_kernel  # noqa: F401
        from importlib.metadata import version
        out["liger-kernel"] = version("liger-kernel")
    except Exception:  # noqa: BLE001
        out["liger-kernel"] = "not installed"
    return out


def render(rows: List[BenchRow], meta: Dict[str, object], backends: Sequence[str], title: str) -> None:
    """Print the table with rich (commands render; the library does not print)."""
    from rich.console import Console
    from rich.table import Table
    console = Console()
    copy = (meta.get("ceilings") or {}).get("copy_tbps")
    table = Table(title=title + (f" - copy {copy * 1000:.0f} GB/s" if copy else ""))
    table.add_column("shape")
    table.add_column("mode")
    for backend in backends:
        table.add_column(backend + " GB/s", justify="right")
    table.add_column("ours / best peer", justify="right")
    index = {(r.shape, r.mode, r.backend): r for r in rows}
    summary = {(s["shape"], s["mode"]): s for s in summarise(rows)}
    for shape in dict.fromkeys(r.shape for r in rows):
        for mode in dict.fromkeys(r.mode for r in rows if r.shape == shape):
            cells = []
            for backend in backends:
                row = index.get((shape, mode, backend))
                cells.append("" if row is None else (f"{row.gbps:.0f}" if row.status == "ok" else row.status))
            ratio = summary.get((shape, mode), {}).get("ratio")
            cells.append("" if ratio is None else f"{ratio:.2f}x")
            table.add_row(shape, mode, *cells)
    console.print(table)
    for backend, reason in sorted({(r.backend, r.reason) for r in rows if r.status != "ok"}):
        console.print(f"[yellow]{backend}[/]: {reason}")


def finish(args, rows: List[BenchRow], meta: Dict[str, object], backends: Sequence[str], title: str) -> int:
    render(rows, meta, backends, title)
    if args.json_path:
        common.write_json(args.json_path, rows, meta)
    if args.md_path:
        with open(args.md_path, "w", encoding="utf-8") as handle:
            handle.write(markdown(title, rows, meta, backends))
    if args.plot_path:
        try:
            plot(args.plot_path, title, rows, backends)
        except ImportError:
            print("gpuparity bench: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
    return 1 if any(r.status == "error" for r in rows) else 0


# ----------------------------------------------------------------------------- norm peers
def _liger_norm(op: str):
    """Liger-Kernel's RMSNorm / LayerNorm function, or the reason it cannot be used."""
    try:
        if op == "rms":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            def run(x, weight, bias, eps):
                return LigerRMSNormFunction.apply(x, weight, eps)
        else:
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            def run(x, weight, bias, eps):
                return LigerLayerNormFunction.apply(x, weight, bias, eps)
        return run, ""
    except Exception as exc:  # noqa: BLE001
        return None, f"Liger-Kernel is not importable here ({type(exc).__name__})"


def norm_peers(op: str, device: torch.device) -> Dict[str, Tuple[Optional[Callable], str]]:
    """backend -> (fn(x, weight, bias, eps) or None, reason when None)."""
    import torch.nn.functional as F
    from ..backends import torch_ops
    peers: Dict[str, Tuple[Optional[Callable], str]] = {}
    from ..backends import triton_norms
    reason = triton_norms._availability() or triton_norms.triton_unavailable_reason(device.type)
    if op == "rms":
        peers["triton"] = (None, reason) if reason else (
            lambda x, w, b, eps: triton_norms.triton_rms_norm(x, x.shape[-1:], w, eps), "")
        peers["torch"] = (lambda x, w, b, eps: F.rms_norm(x, x.shape[-1:], w, eps), "")
        peers["eager"] = (lambda x, w, b, eps: torch_ops.rms_norm_composition(x, x.shape[-1:], w, eps), "")
    else:
        peers["triton"] = (None, reason) if reason else (
            lambda x, w, b, eps: triton_norms.triton_layer_norm(x, x.shape[-1:], w, b, eps), "")
        peers["torch"] = (lambda x, w, b, eps: F.layer_norm(x, x.shape[-1:], w, b, eps), "")
        peers["eager"] = (lambda x, w, b, eps: torch_ops.layer_norm_composition(x, x.shape[-1:], w, b, eps), "")
    from ..backends import compiled
    reason = compiled.compile_unavailable_reason(device.type)
    if reason:
        peers["compile"] = (None, reason)
    elif op == "rms":
        peers["compile"] = (lambda x, w, b, eps: compiled.compiled_rms_norm(x, x.shape[-1:], w, eps), "")
    else:
        peers["compile"] = (lambda x, w, b, eps: compiled.compiled_layer_norm(x, x.shape[-1:], w, b, eps), "")
    peers["liger"] = _liger_norm(op)
    return peers


def fresh_compile() -> None:
    """Forget torch.compile's graphs so each shape gets its own static compile (as a user
    compiling one model would), rather than dynamo's dynamic-shape fallback or, past its
    recompile limit, silent eager."""
    import torch._dynamo
    torch._dynamo.reset()


def parse_norm_shape(text: str) -> Tuple[int, int]:
    try:
        rows, hidden = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shapes: expected ROWSxHIDDEN (e.g. 16384x4096), got {text!r}") from None
    if rows < 1 or hidden < 1:
        raise ValueError(f"--shapes: expected positive sizes, got {text!r}")
    return rows, hidden


def run_norm_bench(ops: Sequence[str], shapes: Sequence[Tuple[int, int]], dtype: torch.dtype,
                   backends: Sequence[str], modes: Sequence[str], device: torch.device,
                   rep_ms: float = 100.0) -> List[BenchRow]:
    rows: List[BenchRow] = []
    dtype_name = str(dtype).replace("torch.", "")
    elem = torch.empty(0, dtype=dtype).element_size()
    for op in ops:
        peers = norm_peers(op, device)
        for n_rows, hidden in shapes:
            label = f"{op} {n_rows}x{hidden}"
            gen = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(n_rows, hidden, generator=gen, dtype=torch.float32).to(device, dtype)
            dy = torch.randn(n_rows, hidden, generator=gen, dtype=torch.float32).to(device, dtype)
            weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device, dtype)
            bias = (0.1 * torch.randn(hidden, generator=gen)).to(device, dtype) if op == "ln" else None
            eps = 1e-6 if op == "rms" else 1e-5
            for backend in backends:
                fn, reason = peers.get(backend, (None, f"unknown backend {backend!r}"))
                if backend == "compile" and fn is not None:
                    fresh_compile()
                for mode in modes:
                    row = BenchRow("norm", label, backend, dtype_name, mode,
                                   params={"op": op, "rows": n_rows, "hidden": hidden})
                    rows.append(row)
                    if fn is None:
                        row.status, row.reason = "skip", reason
                        continue
                    base, graph = common.split_mode(mode)
                    if common.graph_unavailable(row, graph, device):
                        continue
                    try:
                        if base == "fwd":
                            with torch.no_grad():
                                row.time_ms = timed(lambda: fn(x, weight, bias, eps), rep_ms, graph)
                            moved = 2 * x.numel() * elem
                        else:
                            xg = x.detach().requires_grad_()
                            wg = weight.detach().requires_grad_()
                            bg = bias.detach().requires_grad_() if bias is not None else None
                            leaves = [t for t in (xg, wg, bg) if t is not None]
                            row.time_ms = timed(fwd_bwd_step(lambda: fn(xg, wg, bg, eps), dy, leaves), rep_ms, graph)
                            moved = 5 * x.numel() * elem
                        row.gbps = moved / row.time_ms / 1e6
                    except Exception as exc:  # noqa: BLE001 - one failing peer is a row, not the end
                        common.record_failure(row, exc, graph)
            del x, dy
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", default="rms,ln", help="rms, ln or both (default both)")
    add_common_arguments(parser, DEFAULT_SHAPES, NORM_BACKENDS)


def run_cli(args) -> int:
    ops = parse_list(args.ops, ("rms", "ln"), "--ops")
    shapes = [parse_norm_shape(s) for s in parse_list(args.shapes, what="--shapes")]
    backends = parse_list(args.backends, NORM_BACKENDS, "--backends")
    modes = parse_list(args.modes, MODES, "--modes")
    device = pick_device(args.device)
    meta = common.metadata(command_line("norm", args, ("ops",)))
    meta["versions"] = versions()
    meta["ceilings"] = {} if args.no_ceilings or device.type != "cuda" else common.measure_ceilings()
    rows = run_norm_bench(ops, shapes, DTYPES[args.dtype], backends, modes, device, args.rep_ms)
    meta["summary"] = summarise(rows)
    return finish(args, rows, meta, backends, f"RMSNorm / LayerNorm, {args.dtype}, {device.type}")
