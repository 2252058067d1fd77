"""`gpuparity bench attention`: every attention backend side by side on the ANCHORS.md shape
suite (or user shapes) with key-padding masks: forward and forward+backward time,
dense-equivalent TFLOP/s, peak memory, speedup over SDPA math and error against float64.

Peers are timed as a user would call them (torch SDPA under one forced backend with a
broadcast bool mask; FlexAttention compiled, with a key-padding block mask built once);
gpuparity's kernel is timed through `gpuparity.attention(..., backend="triton")`.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .common import GRAPH, BenchRow, graphed, measure_ceilings, metadata, peak_memory_bytes, time_ms, write_json

# name -> (B, H, S, D), from ../shared/ANCHORS.md
SHAPES: Dict[str, Tuple[int, int, int, int]] = {
    "aam-nuc": (512, 4, 150, 32),
    "aam-asv": (16, 4, 1024, 32),
    "bert": (32, 12, 512, 64),
    "llm-4k": (4, 16, 4096, 64),
    "llm-8k": (2, 16, 8192, 128),
}
BACKENDS = ("math", "efficient", "cudnn", "flex", "flash", "triton")
PEERS = ("cudnn", "flex")            # the targets: at least as fast as the best of these
SDPA_NAMES = {"math": "MATH", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
              "flash": "FLASH_ATTENTION"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NOTES = {"flash": "ignores the mask: a speed reference only, wrong for padded inputs"}


# --------------------------------------------------------------------------- arguments
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help="comma-separated names (%s) or B,H,S,D groups separated by ';' or spaces "
                             "(default: all named shapes)" % ", ".join(SHAPES))
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--pad", default="0,0.25",
                        help="mean fractions of padded keys per batch item, comma-separated (default 0,0.25)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated subset of %s" % ", ".join(BACKENDS))
    parser.add_argument("--fwd-only", action="store_true", help="time the forward only")
    parser.add_argument("--graph", action="store_true",
                        help="also time forward+backward captured in a CUDA graph (the kernels without "
                             "per-call host overhead, as under torch.cuda.graphs)")
    parser.add_argument("--no-error", action="store_true", help="skip the float64 error column")
    parser.add_argument("--json", dest="json_path", default=None, help="write the rows and the platform here")
    parser.add_argument("--markdown", "--md", dest="markdown_path", default=None, help="write a markdown table here")
    parser.add_argument("--plot", dest="plot_path", default=None, help="write a bar chart (PNG) here")
    parser.add_argument("--device", default=None, help="device (default: cuda if available, else cpu)")
    parser.add_argument("--seed", type=int, default=0)


def parse_shapes(text: str) -> List[Tuple[str, Tuple[int, int, int, int]]]:
    """'bert,llm-4k' or '2,4,128,64' or 'bert;2,4,128,64' -> [(label, (B, H, S, D))]."""
    shapes = []
    tokens = [t for t in text.replace(";", " ").split() if t]
    for token in tokens:
        parts = [p for p in token.split(",") if p]
        if all(p.strip().isdigit() for p in parts):
            if len(parts) % 4:
                raise ValueError(f"--shapes: expected names or B,H,S,D groups of 4 integers, got {token!r}")
            for i in range(0, len(parts), 4):
                dims = tuple(int(p) for p in parts[i:i + 4])
                if min(dims) < 1:
                    raise ValueError(f"--shapes: dimensions must be >= 1, got {dims}")
                shapes.append((f"({','.join(map(str, dims))})", dims))
            continue
        for name in parts:
            if name not in SHAPES:
                raise ValueError(f"--shapes: unknown shape {name!r}; expected one of {sorted(SHAPES)} or B,H,S,D")
            shapes.append((f"{name} ({','.join(map(str, SHAPES[name]))})", SHAPES[name]))
    if not shapes:
        raise ValueError("--shapes: expected at least one shape")
    return shapes


def parse_pads(text: str) -> List[float]:
    try:
        pads = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--pad: expected comma-separated fractions in [0, 1), got {text!r}") from None
    if not pads or any(not 0.0 <= p < 1.0 for p in pads):
        raise ValueError(f"--pad: expected comma-separated fractions in [0, 1), got {text!r}")
    return pads


def parse_backends(text: str) -> List[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names:
        raise ValueError(f"--backends: expected a comma-separated subset of {list(BACKENDS)}, got {text!r}")
    return names


# --------------------------------------------------------------------------- inputs
def key_lengths(batch: int, seq: int, pad: float, seed: int) -> torch.Tensor:
    """Per-item valid lengths whose padded fractions average `pad` (evenly spread over
    [0, 2 * pad], shuffled), each at least one key."""
    if pad == 0.0:
        return torch.full((batch,), seq, dtype=torch.long)
    fractions = torch.linspace(0.0, min(2 * pad, 1.0), batch) if batch > 1 else torch.tensor([pad])
    fractions = fractions[torch.randperm(batch, generator=torch.Generator().manual_seed(seed))]
    return (seq - torch.round(fractions * seq).long()).clamp(1, seq)


@dataclasses.dataclass
class Case:
    label: str
    dims: Tuple[int, int, int, int]
    pad: float
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    key_padding_mask: torch.Tensor      # (B, S) True = padding


def make_case(label, dims, pad, dtype, device, seed) -> Case:
    batch, heads, seq, head_dim = dims
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, dout = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, generator=gen)
                     for _ in range(4))
    lengths = key_lengths(batch, seq, pad, seed).to(device)
    kpm = torch.arange(seq, device=device).view(1, seq) >= lengths.view(batch, 1)
    return Case(label, dims, pad, q, k, v, dout, kpm)


# --------------------------------------------------------------------------- backends
def _sdpa_runner(name: str, case: Case) -> Callable:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    member = getattr(SDPBackend, SDPA_NAMES[name])
    mask = None if name == "flash" else (~case.key_padding_mask).view(case.dims[0], 1, 1, case.dims[2])

    def run(q, k, v):
        with sdpa_kernel([member]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return run


def _flex_runner(case: Case) -> Callable:
    from ..backends import flex as flex_backend
    reason = flex_backend._availability()
    if reason:
        raise RuntimeError(reason)
    from torch.nn.attention.flex_attention import create_block_mask
    padding = case.key_padding_mask
    batch, _, seq, _ = case.dims

    def mask_mod(b, h, q_idx, kv_idx):
        return ~padding[b, kv_idx]
    block_mask = create_block_mask(mask_mod, batch, None, seq, seq, device=case.q.device, _compile=True)
    compiled = flex_backend._compiled_flex()

    def run(q, k, v):
        return compiled(q, k, v, block_mask=block_mask)
    return run


def _triton_runner(case: Case) -> Callable:
    from ..ops.attention import attention
    kpm = case.key_padding_mask

    def run(q, k, v):
        return attention(q, k, v, key_padding_mask=kpm, backend="triton")
    return run


def runner(name: str, case: Case) -> Callable:
    if name in SDPA_NAMES:
        return _sdpa_runner(name, case)
    if name == "flex":
        return _flex_runner(case)
    if name == "triton":
        return _triton_runner(case)
    raise ValueError(f"backend: unknown {name!r}")


def relative_error(out: torch.Tensor, case: Case, masked: bool) -> float:
    """Relative L2 error of a forward output on the first batch item (up to 4 heads) against
    the float64 reference (every item keeps at least one key, so no row is empty)."""
    from .. import reference
    heads = min(4, case.dims[1])
    ref_device = case.q.device
    q, k, v = (t[:1, :heads].to(ref_device, torch.float64) for t in (case.q, case.k, case.v))
    with torch.no_grad():
        ref = reference.attention(q, k, v, key_padding_mask=case.key_padding_mask[:1] if masked else None)
        got = out[:1, :heads].double()
        return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


def flops(dims: Tuple[int, int, int, int], mode: str) -> float:
    """Dense-equivalent FLOPs (padding and skipped blocks still count): 4*B*H*S^2*D forward,
    2.5x that for the backward (FlashAttention's convention)."""
    batch, heads, seq, head_dim = dims
    forward = 4.0 * batch * heads * seq * seq * head_dim
    return forward if mode == "fwd" else 3.5 * forward


GRAPH_MODE = "fwd+bwd" + GRAPH


def bench_case(name: str, case: Case, dtype_name: str, *, fwd_only=False, with_error=True,
               graph=False) -> List[BenchRow]:
    params = {"shape": list(case.dims), "pad": case.pad}
    if name in NOTES:
        params["note"] = NOTES[name]
    base = dict(bench="attention", shape=case.label, backend=name, dtype=dtype_name)
    modes = ("fwd",) if fwd_only else ("fwd", "fwd+bwd") + ((GRAPH_MODE,) if graph else ())
    try:
        run = runner(name, case)
        q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
        with torch.no_grad():
            out = run(case.q, case.k, case.v)    # compile / warm up; raise here if unsupported
        if with_error:
            params["rel_err"] = relative_error(out, case, masked=name != "flash")
        del out
    except Exception as exc:  # noqa: BLE001 - a backend that cannot run is a row that says why
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        return [BenchRow(**base, mode=m, params=dict(params), status="skip", reason=reason) for m in modes]

    rows = []
    for mode in modes:
        if mode == "fwd":
            def step():
                with torch.no_grad():
                    run(case.q, case.k, case.v)
        else:
            def step():
                out = run(q, k, v)
                torch.autograd.grad(out, (q, k, v), case.dout)
        try:
            if mode == GRAPH_MODE:
                elapsed, peak = time_ms(graphed(step)), None
            else:
                elapsed = time_ms(step)
                peak = peak_memory_bytes(step)
        except Exception as exc:  # noqa: BLE001
            # a peer that cannot be captured in a graph is a gap in that column, not a failure
            rows.append(BenchRow(**base, mode=mode, params=dict(params), status="skip" if mode == GRAPH_MODE else "error",
                                 reason=("cannot be captured in a CUDA graph: " if mode == GRAPH_MODE else "")
                                 + f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        rows.append(BenchRow(**base, mode=mode, params=dict(params), time_ms=elapsed,
                             tflops=flops(case.dims, mode) / elapsed / 1e9, peak_mem_bytes=peak))
    return rows


def add_speedups(rows: List[BenchRow]) -> None:
    math_times = {(r.shape, r.params.get("pad"), r.mode): r.time_ms for r in rows
                  if r.backend == "math" and r.time_ms}
    for r in rows:
        base = math_times.get((r.shape, r.params.get("pad"), r.mode))
        if base and r.time_ms:
            r.params["speedup_vs_math"] = base / r.time_ms


def run_bench(shapes, pads, backends, dtype_name: str, device: str, *, fwd_only=False, with_error=True,
              seed=0, progress: Optional[Callable[[str], None]] = None, graph: bool = False) -> List[BenchRow]:
    dtype = DTYPES[dtype_name]
    rows: List[BenchRow] = []
    if "flex" in backends:
        # one compiled flex_attention per shape and grad mode: more than dynamo's default
        # recompile limit (8) for the whole suite; past it flex silently runs uncompiled
        from torch._dynamo import config as dynamo_config  # (`import torch._dynamo` would make torch local)
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(256, getattr(dynamo_config, name)))
    for label, dims in shapes:
        for pad in pads:
            case = make_case(label, dims, pad, dtype, device, seed)
            for name in backends:
                if progress:
                    progress(f"{label} pad {pad} {name}")
                new_rows = bench_case(name, case, dtype_name, fwd_only=fwd_only, with_error=with_error,
                                      graph=graph and torch.device(device).type == "cuda")
                rows.extend(new_rows)
                if progress:
                    progress("  " + "  ".join(f"{r.mode} {_fmt(r.time_ms)} ms" if r.status == "ok" else
                                              f"{r.mode} {r.status}: {r.reason[:100]}" for r in new_rows))
                if device == "cuda":
                    torch.cuda.empty_cache()
            del case
    add_speedups(rows)
    return rows


# --------------------------------------------------------------------------- targets
def target_summary(rows: List[BenchRow]) -> List[Dict[str, object]]:
    """ANCHORS.md targets for the triton rows (fwd+bwd, the highest pad per shape for speed,
    memory and 10x; llm shapes for the padding ratio)."""
    table = {(r.shape, r.params.get("pad"), r.backend, r.mode): r for r in rows if r.status == "ok"}
    checks = []
    for (shape, pad, backend, mode), row in sorted(table.items(), key=lambda item: (item[0][0], item[0][1] or 0)):
        if backend != "triton" or mode != "fwd+bwd":
            continue
        peers = [table.get((shape, pad, p, mode)) for p in PEERS]
        peers = [p for p in peers if p is not None]
        best = min(peers, key=lambda p: p.time_ms) if peers else None
        entry: Dict[str, object] = {"shape": shape, "pad": pad, "time_ms": row.time_ms}
        if best is not None:
            entry["best_peer"] = best.backend
            entry["vs_best_peer"] = best.time_ms / row.time_ms  # > 1: faster than the best peer
        math_row = table.get((shape, pad, "math", mode))
        if math_row is not None:
            entry["vs_math"] = math_row.time_ms / row.time_ms
        cudnn = table.get((shape, pad, "cudnn", mode))
        if cudnn is not None and cudnn.peak_mem_bytes and row.peak_mem_bytes is not None:
            entry["mem_vs_cudnn"] = row.peak_mem_bytes / cudnn.peak_mem_bytes
        dense = table.get((shape, 0.0, "triton", mode))
        if pad and dense is not None:
            entry["pad_vs_dense_time"] = row.time_ms / dense.time_ms
        ours_graph = table.get((shape, pad, "triton", GRAPH_MODE))
        peers_graph = [table.get((shape, pad, p, GRAPH_MODE)) for p in PEERS]
        peers_graph = [p for p in peers_graph if p is not None]
        if ours_graph is not None and peers_graph:
            best_graph = min(peers_graph, key=lambda p: p.time_ms)
            entry["best_peer_graph"] = best_graph.backend
            entry["vs_best_peer_graph"] = best_graph.time_ms / ours_graph.time_ms
        checks.append(entry)
    return checks


# --------------------------------------------------------------------------- rendering
def _fmt(value, spec="{:.3f}"):
    return "-" if value is None else spec.format(value)


def markdown(rows: List[BenchRow], meta: Dict[str, object]) -> str:
    by_key: Dict[Tuple, Dict[str, BenchRow]] = {}
    for r in rows:
        by_key.setdefault((r.shape, r.params.get("pad"), r.backend), {})[r.mode] = r
    lines = [f"# Attention benchmark: {meta.get('machine', '')}", "",
             f"- date: {meta.get('date')}", f"- command: `{meta.get('command')}`"]
    ceilings = meta.get("ceilings") or {}
    if ceilings:
        lines.append(f"- ceilings measured in the same run: bf16 matmul {ceilings.get('bf16_matmul_tflops', 0):.0f} "
                     f"TFLOP/s, copy {ceilings.get('copy_tbps', 0):.2f} TB/s")
    lines += ["", "Times in ms (median of triton.testing.do_bench), forward / forward+backward; TFLOP/s "
              "dense-equivalent for forward+backward; peak = extra memory of forward+backward; "
              "rel err = forward vs float64 (first batch item).", "",
              "| shape (B,H,S,D) | pad | backend | fwd ms | fwd+bwd ms | f+b in a CUDA graph ms | TFLOP/s f+b | "
              "peak MB | x math f+b | rel err |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for (shape, pad, backend), modes in by_key.items():
        fwd, both, graph = modes.get("fwd"), modes.get("fwd+bwd"), modes.get(GRAPH_MODE)
        any_row = fwd or both
        if any_row.status != "ok":
            lines.append(f"| {shape} | {pad} | {backend} | {any_row.status}: {any_row.reason[:80]} | | | | | | |")
            continue
        peak = both.peak_mem_bytes if both and both.peak_mem_bytes is not None else None
        graph_cell = "-" if graph is None else (_fmt(graph.time_ms) if graph.status == "ok" else graph.status)
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            shape, pad, backend, _fmt(fwd.time_ms if fwd else None), _fmt(both.time_ms if both else None), graph_cell,
            _fmt(both.tflops if both else None, "{:.0f}"), _fmt(peak / 2 ** 20 if peak is not None else None, "{:.0f}"),
            _fmt(both.params.get("speedup_vs_math") if both else None, "{:.1f}"),
            _fmt(any_row.params.get("rel_err"), "{:.1e}")))
    summary = target_summary(rows)
    if summary:
        lines += ["", "## Targets (triton, forward+backward)", "",
                  "| shape | pad | vs best peer (>= 1) | same, in CUDA graphs | vs math (>= 10) | memory vs cuDNN (<= 1.25) "
                  "| pad/dense time (<= 0.8, llm) |",
                  "|---|---|---|---|---|---|---|"]
        for entry in summary:
            peer = entry.get("vs_best_peer")
            peer_graph = entry.get("vs_best_peer_graph")
            lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
                entry["shape"], entry["pad"],
                f"{peer:.2f}x ({entry['best_peer']})" if peer is not None else "-",
                f"{peer_graph:.2f}x ({entry['best_peer_graph']})" if peer_graph is not None else "-",
                _fmt(entry.get("vs_math"), "{:.1f}x"), _fmt(entry.get("mem_vs_cudnn"), "{:.2f}"),
                _fmt(entry.get("pad_vs_dense_time"), "{:.2f}")))
    for name, note in NOTES.items():
        lines.append(f"\n{name}: {note}.")
    return "\n".join(lines) + "\n"


def plot(rows: List[BenchRow], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mode = "fwd+bwd" if any(r.mode == "fwd+bwd" for r in rows) else "fwd"
    groups = []
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _render_terminal(rows: List[BenchRow]) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title="gpuparity bench attention")
    for column in ("shape", "pad", "backend", "fwd ms", "fwd+bwd ms", "graph f+b ms", "TFLOP/s", "peak MB", "x math",
                   "rel err"):
        table.add_column(column, justify="left" if column in ("shape", "backend") else "right")
    by_key: Dict[Tuple, Dict[str, BenchRow]] = {}
    for r in rows:
        by_key.setdefault((r.shape, r.params.get("pad"), r.backend), {})[r.mode] = r
    for (shape, pad, backend), modes in by_key.items():
        fwd, both, graph = modes.get("fwd"), modes.get("fwd+bwd"), modes.get(GRAPH_MODE)
        any_row = fwd or both
        if any_row.status != "ok":
            table.add_row(shape, str(pad), backend, f"[yellow]{any_row.status}[/]: {any_row.reason[:60]}")
            continue
        main = both or fwd
        peak = main.peak_mem_bytes
        graph_cell = "-" if graph is None else (_fmt(graph.time_ms) if graph.status == "ok" else graph.status)
        table.add_row(shape, str(pad), backend, _fmt(fwd.time_ms if fwd else None), _fmt(both.time_ms if both else None),
                      graph_cell,
                      _fmt(main.tflops, "{:.0f}"), _fmt(peak / 2 ** 20 if peak is not None else None, "{:.0f}"),
                      _fmt(main.params.get("speedup_vs_math"), "{:.1f}"), _fmt(any_row.params.get("rel_err"), "{:.1e}"))
    console = Console(width=max(140, Console().width))
    console.print(table)
    for entry in target_summary(rows):
        console.print("triton {shape} pad {pad}: ".format(**entry) + ", ".join(
            f"{k} {v:.2f}" for k, v in entry.items() if isinstance(v, float) and k not in ("time_ms", "pad")))


def run_cli(args) -> int:
    try:
        shapes = parse_shapes(args.shapes)
        pads = parse_pads(args.pad)
        backends = parse_backends(args.backends)
    except ValueError as exc:
        print(f"gpuparity bench attention: {exc}", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    command = (f"gpuparity bench attention --shapes '{args.shapes}' --dtype {args.dtype} --pad {args.pad} "
               f"--backends {args.backends}" + (" --fwd-only" if args.fwd_only else "") + (" --graph" if args.graph else "")
               + "".join(f" --{flag} {value}" for flag, value in (("json", args.json_path), ("markdown", args.markdown_path),
                                                                ("plot", args.plot_path)) if value))
    from rich.console import Console
    console = Console(stderr=True)
    rows = run_bench(shapes, pads, backends, args.dtype, device, fwd_only=args.fwd_only,
                     with_error=not args.no_error, seed=args.seed,
                     progress=lambda text: console.log(text), graph=args.graph)
    meta = metadata(command)
    meta["ceilings"] = measure_ceilings()
    meta["targets"] = target_summary(rows)
    _render_terminal(rows)
    if args.json_path:
        write_json(args.json_path, rows, meta)
    if args.markdown_path:
        with open(args.markdown_path, "w", encoding="utf-8") as handle:
            handle.write(markdown(rows, meta))
    if args.plot_path:
        plot(rows, args.plot_path, f"attention {args.dtype}, key padding, {meta.get('machine', '')}")
    failed = [r for r in rows if r.status == "error"]
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuparity bench attention")
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
