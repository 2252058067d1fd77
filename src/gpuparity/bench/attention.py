"""`gpuparity bench attention`: every attention backend side by side on the ANCHORS.md shape
suite (or user shapes) with key-padding masks: forward and forward+backward time,
dense-equivalent TFLOP/s, peak memory, speedup over SDPA math and error against float64.

Peers are timed as a user would call them (torch SDPA under one forced backend with a
broadcast bool mask; FlexAttention compiled, with a key-padding block mask built once);
gpuparity's kernel is timed through `gpuparity.attention(..., backend="triton")`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .common import (DTYPES, GRAPH, BenchResult, BenchRow, graphed, measure_ceilings, metadata, peak_memory_bytes,
                     time_ms)

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
NOTES = {"flash": "ignores the mask: a speed reference only, wrong for padded inputs"}


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


# progress(label, None) before a backend runs on a case, progress(label, its rows) after
Progress = Callable[[str, Optional[List[BenchRow]]], None]


def run_bench(shapes, pads, backends, dtype_name: str, device: str, *, fwd_only=False, with_error=True,
              seed=0, progress: Optional[Progress] = None, graph: bool = False) -> List[BenchRow]:
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
                step = f"{label} pad {pad} {name}"
                if progress:
                    progress(step, None)
                new_rows = bench_case(name, case, dtype_name, fwd_only=fwd_only, with_error=with_error,
                                      graph=graph and torch.device(device).type == "cuda")
                rows.extend(new_rows)
                if progress:
                    progress(step, new_rows)
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


def bench_attention(shapes: Sequence[Tuple[str, Tuple[int, int, int, int]]], pads: Sequence[float],
                    backends: Sequence[str], dtype_name: str, device: str, *, fwd_only: bool = False,
                    with_error: bool = True, seed: int = 0, graph: bool = False,
                    progress: Optional[Progress] = None, command: str = "") -> BenchResult:
    """run_bench's rows with the run's metadata: platform, the ceilings measured after the rows
    (GPU only) and the ANCHORS.md targets; `command` is the command line recorded in it."""
    rows = run_bench(shapes, pads, backends, dtype_name, device, fwd_only=fwd_only, with_error=with_error,
                     seed=seed, progress=progress, graph=graph)
    meta = metadata(command)
    meta["ceilings"] = measure_ceilings()
    meta["targets"] = target_summary(rows)
    return BenchResult("attention", rows, meta, list(backends), f"attention {dtype_name}, key padding")
