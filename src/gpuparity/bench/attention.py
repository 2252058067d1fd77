"""`gpuparity bench attention`: every attention backend side by side on the docs/targets.md shape
suite (or user shapes) with key-padding masks: forward and forward+backward time, host time per
step, dense-equivalent TFLOP/s, peak memory, speedup over SDPA math and error against float64;
with --suite, also the sliding-window, packed-varlen and decode suites (attention_suites.py).

Peers are timed as a user would call them (torch SDPA under one forced backend with a
broadcast bool mask; FlexAttention compiled, with a key-padding block mask built once;
FlashAttention 2/4 through flash_attn_varlen_func on sequences packed once, where installed);
gpuparity's kernel is timed through `gpuparity.attention(..., backend="triton")`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .attention_measure import (BWD_FLOPS, GRAPH_MODE, SDPA_NAMES, Progress, Setup, Workload, cumulative, flash_varlen,
                                flex, key_lengths, packed, run_workloads, sdpa)
from .attention_suites import DECODE_KV_HEADS, SUITES, WINDOWS, suite_workloads
from .common import (COMPILE_S, DTYPES, BenchResult, BenchRow, attach_partial, estimate_seconds, measure_ceilings,
                     metadata)
from .names import BACKENDS, SHAPES

__all__ = ["SHAPES", "BACKENDS", "PEERS", "SUITES", "GRAPH_MODE", "NOTES", "Case", "make_case", "key_lengths",
           "runner", "relative_error", "flops", "run_bench", "target_summary", "bench_attention"]

# SHAPES (name -> (B, H, S, D), from docs/targets.md) and BACKENDS: names.py (no torch)
PEERS = ("cudnn", "flex", "fa2", "fa4")   # the targets: at least as fast as the best of these
NOTES = {"flash": "ignores the mask: a speed reference only, wrong for padded inputs"}

# --------------------------------------------------------------------------- inputs
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
def runner(name: str, case: Case) -> Callable:
    """fn(q, k, v) of an SDPA backend, flex or ours on the case's (B, H, S, D) tensors."""
    batch, _, seq, _ = case.dims
    if name in SDPA_NAMES:
        return sdpa(name, None if name == "flash" else (~case.key_padding_mask).view(batch, 1, 1, seq))
    if name == "flex":
        padding = case.key_padding_mask
        return flex(lambda b, h, q_idx, kv_idx: ~padding[b, kv_idx], batch, seq, seq, case.q.device)
    if name == "triton":
        from ..ops.attention import attention
        kpm = case.key_padding_mask
        return lambda q, k, v: attention(q, k, v, key_padding_mask=kpm, backend="triton")
    raise ValueError(f"backend: unknown {name!r}")


def _flash_setup(name: str, case: Case) -> Setup:
    """fa2/fa4: the keys of each item packed once (no padding computed), every query kept."""
    batch, heads, seq, head_dim = case.dims
    valid = ~case.key_padding_mask
    every = torch.ones_like(valid)
    cu_q = torch.arange(batch + 1, device=valid.device, dtype=torch.int32) * seq
    fn = flash_varlen(name, cu_q, cumulative(valid.sum(1)), seq, seq)
    inputs = (packed(case.q, every), packed(case.k, valid), packed(case.v, valid))
    return Setup(fn, inputs, packed(case.dout, every),
                 lambda out: relative_error(out.view(batch, seq, heads, head_dim).transpose(1, 2), case, True))


def setup(name: str, case: Case) -> Setup:
    if name in ("fa2", "fa4"):
        return _flash_setup(name, case)
    return Setup(runner(name, case), (case.q, case.k, case.v), case.dout,
                 lambda out: relative_error(out, case, masked=name != "flash"))


def relative_error(out: torch.Tensor, case: Case, masked: bool) -> float:
    """Relative L2 error of a forward output on the first batch item (up to 4 heads) against
    the float64 reference (every item keeps at least one key, so no row is empty)."""
    from ..contracts import reference
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
    return forward if mode == "fwd" else BWD_FLOPS * forward


def dense_workloads(shapes, pads, dtype, device: str, seed: int) -> Iterator[Workload]:
    for label, dims in shapes:
        for pad in pads:
            case = make_case(label, dims, pad, dtype, device, seed)
            params = {"shape": list(case.dims), "pad": case.pad}
            yield Workload(label, params, lambda name, case=case: setup(name, case), flops_fwd=flops(dims, "fwd"))
            del case


def add_speedups(rows: List[BenchRow]) -> None:
    math_times = {(r.shape, r.params.get("pad"), r.mode): r.time_ms for r in rows
                  if r.backend == "math" and r.time_ms}
    for r in rows:
        base = math_times.get((r.shape, r.params.get("pad"), r.mode))
        if base and r.time_ms:
            r.params["speedup_vs_math"] = base / r.time_ms
        if r.backend in NOTES:
            r.params["note"] = NOTES[r.backend]


def add_ceiling_fractions(rows: List[BenchRow], ceilings: Dict[str, float]) -> None:
    """params["of_ceiling"]: a row's TFLOP/s over the measured bf16 matmul rate, or for a GB/s
    row (decode) its bytes read per second over the measured copy rate (read + write)."""
    for r in rows:
        if r.status != "ok":
            continue
        if r.gbps and ceilings.get("copy_tbps"):
            r.params["of_ceiling"] = r.gbps / (ceilings["copy_tbps"] * 1e3)
        elif r.tflops and ceilings.get("bf16_matmul_tflops"):
            r.params["of_ceiling"] = r.tflops / ceilings["bf16_matmul_tflops"]


def run_bench(shapes, pads, backends, dtype_name: str, device: str, *, fwd_only=False, with_error=True,
              seed=0, progress: Optional[Progress] = None, graph: bool = False, suites: Sequence[str] = ("dense",),
              windows: Sequence[int] = WINDOWS, kv_heads: int = DECODE_KV_HEADS,
              suite_shapes: Optional[Dict[str, Sequence]] = None,
              rows: Optional[List[BenchRow]] = None) -> List[BenchRow]:
    """The rows of every suite asked for; suite_shapes gives a suite its own shapes (else `shapes`).
    rows: the list the rows are appended to as they finish (kept by a caller that is interrupted)."""
    dtype = DTYPES[dtype_name]
    if "flex" in backends:
        # one compiled flex_attention per shape and grad mode: more than dynamo's default
        # recompile limit (8) for the whole suite; past it flex silently runs uncompiled
        from torch._dynamo import config as dynamo_config  # (`import torch._dynamo` would make torch local)
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(256, getattr(dynamo_config, name)))
    rows = [] if rows is None else rows
    for suite in suites:
        own = (suite_shapes or {}).get(suite, shapes)
        work = dense_workloads(own, pads, dtype, device, seed) if suite == "dense" else suite_workloads(
            suite, own, pads, dtype, device, seed, windows=windows, kv_heads=kv_heads)
        run_workloads(work, backends, dtype_name, device, fwd_only=fwd_only, with_error=with_error,
                      graph=graph, progress=progress, rows=rows)
    add_speedups(rows)
    return rows


# --------------------------------------------------------------------------- targets
DECODE_PEERS = ("math", "efficient", "cudnn", "flex", "fa2", "fa4")


def _fastest(table, shape, pad, mode, names) -> Optional[BenchRow]:
    found = [table[key] for key in ((shape, pad, name, mode) for name in names) if key in table]
    return min(found, key=lambda r: r.time_ms) if found else None


def target_summary(rows: List[BenchRow]) -> List[Dict[str, object]]:
    """docs/targets.md's targets for the triton rows (fwd+bwd, or fwd for decode; the highest pad per
    shape for speed, memory and 10x; llm shapes for the padding ratio); host_vs_cudnn is our
    host time per eager step over cuDNN SDPA's (target <= 1)."""
    table = {(r.shape, r.params.get("pad"), r.backend, r.mode): r for r in rows if r.status == "ok"}
    checks = []
    for (shape, pad, backend, mode), row in sorted(table.items(), key=lambda item: (item[0][0], item[0][1] or 0)):
        decode = row.params.get("suite") == "decode"
        if backend != "triton" or mode != ("fwd" if decode else "fwd+bwd"):
            continue
        entry: Dict[str, object] = {"shape": shape, "pad": pad, "time_ms": row.time_ms}
        best = _fastest(table, shape, pad, mode, DECODE_PEERS if decode else PEERS)
        if best is not None:
            entry["best_peer"] = best.backend
            entry["vs_best_peer"] = best.time_ms / row.time_ms  # > 1: faster than the best peer
        math_row = table.get((shape, pad, "math", mode))
        if math_row is not None:
            entry["vs_math"] = math_row.time_ms / row.time_ms
        cudnn = table.get((shape, pad, "cudnn", mode))
        if cudnn is not None and cudnn.peak_mem_bytes and row.peak_mem_bytes is not None:
            entry["mem_vs_cudnn"] = row.peak_mem_bytes / cudnn.peak_mem_bytes
        if cudnn is not None and cudnn.params.get("host_ms") and row.params.get("host_ms") is not None:
            entry["host_vs_cudnn"] = row.params["host_ms"] / cudnn.params["host_ms"]
        if row.params.get("of_ceiling") is not None:
            entry["of_ceiling"] = row.params["of_ceiling"]
        dense = table.get((shape, 0.0, "triton", mode))
        if pad and dense is not None:
            entry["pad_vs_dense_time"] = row.time_ms / dense.time_ms
        ours_graph = table.get((shape, pad, "triton", GRAPH_MODE))
        best_graph = _fastest(table, shape, pad, GRAPH_MODE, PEERS)
        if ours_graph is not None and best_graph is not None:
            entry["best_peer_graph"] = best_graph.backend
            entry["vs_best_peer_graph"] = best_graph.time_ms / ours_graph.time_ms
        checks.append(entry)
    return checks


def bench_attention(shapes: Sequence[Tuple[str, Tuple[int, int, int, int]]], pads: Sequence[float],
                    backends: Sequence[str], dtype_name: str, device: str, *, fwd_only: bool = False,
                    with_error: bool = True, seed: int = 0, graph: bool = False,
                    progress: Optional[Progress] = None, command: str = "", suites: Sequence[str] = ("dense",),
                    windows: Sequence[int] = WINDOWS, kv_heads: int = DECODE_KV_HEADS,
                    suite_shapes: Optional[Dict[str, Sequence]] = None) -> BenchResult:
    """run_bench's rows with the run's metadata: platform, the ceilings measured after the rows
    (GPU only; each row's fraction of them in params["of_ceiling"]) and the targets of docs/targets.md;
    `command` is the command line recorded in it. Interrupted (KeyboardInterrupt, or the CLI's
    SIGTERM), the exception is re-raised carrying the rows that finished as a partial result
    (exc.partial_result, no ceilings measured)."""
    rows: List[BenchRow] = []
    try:
        run_bench(shapes, pads, backends, dtype_name, device, fwd_only=fwd_only, with_error=with_error,
                  seed=seed, progress=progress, graph=graph, suites=suites, windows=windows, kv_heads=kv_heads,
                  suite_shapes=suite_shapes, rows=rows)
    except KeyboardInterrupt as exc:
        add_speedups(rows)
        attach_partial(exc, _attention_result(list(rows), metadata(command), {}, backends, dtype_name, suites))
        raise
    return _attention_result(rows, metadata(command), measure_ceilings(), backends, dtype_name, suites)


def _attention_result(rows: List[BenchRow], meta: Dict[str, object], ceilings: Dict[str, float],
                      backends: Sequence[str], dtype_name: str, suites: Sequence[str]) -> BenchResult:
    meta["ceilings"] = ceilings
    add_ceiling_fractions(rows, ceilings)
    meta["targets"] = target_summary(rows)
    meta["suites"] = list(suites)
    title = "key padding" if list(suites) == ["dense"] else ", ".join(suites)
    return BenchResult("attention", rows, meta, list(backends), f"attention {dtype_name}, {title}")


# --------------------------------------------------------------------------- the estimate
GPU_ONLY = ("efficient", "cudnn", "flex", "triton", "fa2", "fa4")   # skipped at once on a CPU
COMPILED = ("flex",)


def _forward_flops(suite: str, dims: Tuple[int, int, int, int], windows: Sequence[int]) -> float:
    batch, heads, seq, head_dim = dims
    if suite == "decode":
        return 4.0 * batch * heads * seq * head_dim            # one query against the cache
    if suite == "window":
        return 4.0 * batch * heads * head_dim * seq * min(seq, max(windows)) * len(windows)
    return 4.0 * batch * heads * seq * seq * head_dim


def estimate_attention(suite_shapes: Dict[str, Sequence[Tuple[str, Tuple[int, int, int, int]]]],
                       pads: Sequence[float], backends: Sequence[str], device: str, *, fwd_only: bool = False,
                       graph: bool = False, windows: Sequence[int] = WINDOWS) -> Dict[str, object]:
    """What a run will do and roughly how long it takes, before it starts: {"shapes", "pads",
    "backends", "modes", "measurements", "seconds"} (seconds: a rough figure, see common.py)."""
    cpu = str(device).startswith("cpu")
    measurements, seconds, n_shapes, modes_max = 0, 0.0, 0, 0
    for suite, shapes in suite_shapes.items():
        modes = ("fwd",) if fwd_only or suite == "decode" else ("fwd", "fwd+bwd") + ((GRAPH_MODE,) if graph and not cpu
                                                                                     else ())
        modes_max = max(modes_max, len(modes))
        cases = len(shapes) * (1 if suite == "decode" else len(pads))
        n_shapes += len(shapes)
        for _, dims in shapes:
            forward = _forward_flops(suite, dims, windows)
            for name in backends:
                for mode in modes:
                    measurements += cases // len(shapes)
                    if cpu and name in GPU_ONLY:
                        continue        # a skip row at once
                    per_case = estimate_seconds(device, forward * (1.0 if mode == "fwd" else BWD_FLOPS))
                    per_case += COMPILE_S if name in COMPILED else 0.0
                    seconds += per_case * (cases // len(shapes))
    return {"shapes": n_shapes, "pads": len(pads), "backends": len(backends), "modes": modes_max,
            "measurements": measurements, "seconds": seconds}
