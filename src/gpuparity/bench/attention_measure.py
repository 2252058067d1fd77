"""The timing core every `gpuparity bench attention` suite shares: one backend's prepared call
(a Setup) timed forward, forward+backward and in a CUDA graph, with its host time, peak memory
and error; and the FlashAttention peers (fa2, fa4), which run where they import."""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..checks.results import clip
from .common import GRAPH, BenchRow, graphed, host_time_ms, interleaved_host_ms, peak_memory_bytes, time_ms

GRAPH_MODE = "fwd+bwd" + GRAPH
BWD_FLOPS = 3.5   # forward+backward FLOPs per forward FLOP (FlashAttention's convention: backward 2.5x)


@dataclasses.dataclass
class Setup:
    """One backend ready to time. fn(*inputs) runs it in its own layout; inputs are made once,
    outside the timing (as a user keeps packed tensors or a block mask); dout is the gradient of
    its output (None: forward only); error(out) is a forward output's relative error against
    float64 (None: not computed)."""
    fn: Callable[..., torch.Tensor]
    inputs: Tuple[torch.Tensor, ...]
    dout: Optional[torch.Tensor] = None
    error: Optional[Callable[[torch.Tensor], float]] = None


def reason_of(exc: BaseException) -> str:
    """'ExcType: first line of the message' (at most 200 characters, cut between words): why a row
    did not run."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {clip(text.splitlines()[0], 200) if text else ''}"


def relative_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.to(ref.device, torch.float64)
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


def measure(base: Dict[str, Any], params: Dict[str, Any], build: Callable[[], Setup], modes: Sequence[str], *,
            flops_fwd: Optional[float] = None, bytes_fwd: Optional[float] = None,
            with_error: bool = True, host_steps: Optional[Dict[str, Callable[[], None]]] = None) -> List[BenchRow]:
    """One BenchRow per mode for the Setup that build() returns. A backend that cannot be built
    or raises on its first call gives a "skip" row per mode with the reason; one that raises
    while timed is an "error" row (a "skip" in a CUDA graph: a gap in that column). Eager rows
    carry params["host_ms"], the host time to issue one step (common.host_time_ms), unless
    host_steps is given: each eager mode's step is then put there, untimed, for the caller to
    time beside other backends' (interleaved_host_ms). TFLOP/s from flops_fwd (x BWD_FLOPS with
    the backward), GB/s from bytes_fwd."""
    try:
        setup = build()
        with torch.no_grad():
            out = setup.fn(*setup.inputs)    # compile / warm up; raise here if unsupported
        if with_error and setup.error is not None:
            params["rel_err"] = setup.error(out)
        del out
    except Exception as exc:  # noqa: BLE001 - a backend that cannot run is a row that says why
        return [BenchRow(**base, mode=m, params=dict(params), status="skip", reason=reason_of(exc)) for m in modes]

    grads = tuple(t.detach().requires_grad_() for t in setup.inputs) if setup.dout is not None else ()
    rows = []
    for mode in modes:
        if mode == "fwd":
            def step():
                with torch.no_grad():
                    setup.fn(*setup.inputs)
        else:
            def step():
                torch.autograd.grad(setup.fn(*grads), grads, setup.dout)
        row_params = dict(params)
        try:
            if mode == GRAPH_MODE:
                elapsed, peak = time_ms(graphed(step)), None
            else:
                elapsed = time_ms(step)
                if host_steps is None:
                    row_params["host_ms"] = host_time_ms(step)
                peak = peak_memory_bytes(step)
        except Exception as exc:  # noqa: BLE001
            graph = mode == GRAPH_MODE
            rows.append(BenchRow(**base, mode=mode, params=row_params, status="skip" if graph else "error",
                                 reason=("cannot be captured in a CUDA graph: " if graph else "") + reason_of(exc)))
            continue
        row = BenchRow(**base, mode=mode, params=row_params, time_ms=elapsed, peak_mem_bytes=peak)
        if flops_fwd:
            row.tflops = flops_fwd * (1.0 if mode == "fwd" else BWD_FLOPS) / elapsed / 1e9
        if bytes_fwd:
            row.gbps = bytes_fwd / elapsed / 1e6
        rows.append(row)
        if host_steps is not None and mode != GRAPH_MODE:
            host_steps[mode] = step
    return rows


# --------------------------------------------------------------------------- inputs and layouts
def key_lengths(batch: int, seq: int, pad: float, seed: int) -> torch.Tensor:
    """Per-item valid lengths whose padded fractions average `pad` (evenly spread over
    [0, 2 * pad], shuffled), each at least one key."""
    if pad == 0.0:
        return torch.full((batch,), seq, dtype=torch.long)
    fractions = torch.linspace(0.0, min(2 * pad, 1.0), batch) if batch > 1 else torch.tensor([pad])
    fractions = fractions[torch.randperm(batch, generator=torch.Generator().manual_seed(seed))]
    return (seq - torch.round(fractions * seq).long()).clamp(1, seq)


def packed(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> (total, H, D): the positions where valid (B, S) is True, item after item
    (flash_attn_varlen_func's layout)."""
    return x.transpose(1, 2)[valid].contiguous()


def cumulative(lengths: torch.Tensor) -> torch.Tensor:
    """(B,) lengths -> (B + 1,) int32 cu_seqlens from 0."""
    return torch.nn.functional.pad(lengths.to(torch.int32).cumsum(0, dtype=torch.int32), (1, 0))


# --------------------------------------------------------------------------- torch peers
SDPA_NAMES = {"math": "MATH", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
              "flash": "FLASH_ATTENTION"}


def sdpa(name: str, attn_mask: Optional[torch.Tensor] = None, **kwargs) -> Callable[..., torch.Tensor]:
    """fn(q, k, v): torch SDPA forced to one backend (math, efficient, cudnn, flash), as a user
    calls it: the bool mask (True = attend) made once."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    member = getattr(SDPBackend, SDPA_NAMES[name])

    def run(q, k, v):
        with sdpa_kernel([member]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)
    return run


def flex(mask_mod: Callable, batch: Optional[int], q_len: int, k_len: int, device, **kwargs) -> Callable:
    """fn(q, k, v): compiled FlexAttention with the block mask of mask_mod built once; raises
    with the reason where flex cannot run (no GPU, no torch.compile)."""
    from ..backends import flex as flex_backend
    reason = flex_backend._availability()
    if reason:
        raise RuntimeError(reason)
    from torch.nn.attention.flex_attention import create_block_mask
    block_mask = create_block_mask(mask_mod, batch, None, q_len, k_len, device=device, _compile=True)
    compiled = flex_backend._compiled_flex()

    def run(q, k, v):
        return compiled(q, k, v, block_mask=block_mask, **kwargs)
    return run


# --------------------------------------------------------------------------- workloads
@dataclasses.dataclass
class Workload:
    """One case of a suite: its row label and params, build(backend) -> Setup (raises for a
    backend that is no peer here), and the work one forward does (FLOPs, or bytes read)."""
    label: str
    params: Dict[str, Any]
    build: Callable[[str], Setup]
    flops_fwd: Optional[float] = None
    bytes_fwd: Optional[float] = None
    forward_only: bool = False


# Cases whose forward reads more than this keep each backend's host rounds back to back (run_workloads).
INTERLEAVE_MAX_BYTES = 1 << 30

# progress(label, None) before a backend runs on a case, progress(label, its rows) after
Progress = Callable[[str, Optional[List[BenchRow]]], None]


def run_workloads(workloads, backends: Sequence[str], dtype_name: str, device: str, *, fwd_only=False,
                  with_error=True, graph=False, progress: Optional[Progress] = None,
                  rows: Optional[List[BenchRow]] = None) -> List[BenchRow]:
    """Every backend on every workload (an iterable: each case's tensors are freed before the
    next is made); graph modes only on a CUDA device. rows: the list the rows are appended to
    as each backend finishes (what an interrupted run still has); returned."""
    rows = [] if rows is None else rows
    graph = graph and torch.device(device).type == "cuda"
    pending = iter(workloads)
    while True:
        work = next(pending, None)   # made only now: the previous case is freed by then
        if work is None:
            break
        modes = ("fwd",) if fwd_only or work.forward_only else ("fwd", "fwd+bwd") + ((GRAPH_MODE,) if graph else ())
        # host time: every backend's eager steps of this case timed round by round in turn, after
        # their device times (a shared host drifts by more than the backends differ). Not for
        # cases that read more than INTERLEAVE_MAX_BYTES (large decode caches): a kept step keeps
        # its backend's input copies (fa2 / fa4 take the cache in their own layout) beside the
        # next backend's, so there each backend's rounds run back to back as it is measured.
        interleave = (work.bytes_fwd or 0) <= INTERLEAVE_MAX_BYTES
        steps: Dict[str, Dict[str, Callable[[], None]]] = {}
        case_rows: List[Tuple[str, List[BenchRow]]] = []
        for name in backends:
            step = f"{work.label} pad {work.params.get('pad')} {name}"
            if progress:
                progress(step, None)
            base = dict(bench="attention", shape=work.label, backend=name, dtype=dtype_name)
            steps[name] = {}
            new_rows = measure(base, dict(work.params), lambda: work.build(name), modes, flops_fwd=work.flops_fwd,
                               bytes_fwd=work.bytes_fwd, with_error=with_error,
                               host_steps=steps[name] if interleave else None)
            case_rows.append((step, new_rows))
            rows.extend(new_rows)
            if progress:
                progress(step, new_rows)   # device times; host_ms is filled in below
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
        _host_times_interleaved(case_rows, steps)
        steps = case_rows = work = None
    return rows


def _host_times_interleaved(case_rows, steps: Dict[str, Dict[str, Callable[[], None]]]) -> None:
    """Fill params["host_ms"] of each eager row from interleaved_host_ms over the backends that
    ran that mode; a step that raises there leaves its row without host_ms."""
    by_mode: Dict[str, Dict[str, Callable[[], None]]] = {}
    for name, modes in steps.items():
        for mode, step in modes.items():
            by_mode.setdefault(mode, {})[name] = step
    for mode, fns in by_mode.items():
        times = interleaved_host_ms(fns)
        for _, new_rows in case_rows:
            for row in new_rows:
                if row.mode == mode and row.backend in times:
                    row.params["host_ms"] = times[row.backend]


# --------------------------------------------------------------------------- FlashAttention
FLASH = {"fa2": ("flash_attn", "FlashAttention 2/3, the flash-attn package"),
         "fa4": ("flash_attn.cute", "FlashAttention-4, the flash-attn-4 package")}


def flash_function(name: str, function: str) -> Callable:
    """`function` from the FlashAttention module of column `name` (fa2, fa4); ImportError saying
    what failed to import when it is not installed or lacks the function."""
    module_name, package = FLASH[name]
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure (missing wheel, ABI, CUDA) is the reason
        raise ImportError(f"{name}: cannot import {module_name} ({package}): {reason_of(exc)}") from None
    fn = getattr(module, function, None)
    if fn is None:
        raise ImportError(f"{name}: {module_name} ({package}) has no {function}")
    return fn


def flash_varlen(name: str, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, *, causal: bool = False,
                 window: Optional[Tuple[int, int]] = None) -> Callable[..., torch.Tensor]:
    """fn(q, k, v) over packed (total, H, D) tensors through column `name`'s
    flash_attn_varlen_func (bottom-right causal / window, as FlashAttention aligns them)."""
    fn = flash_function(name, "flash_attn_varlen_func")
    if name == "fa2":
        def run(q, k, v):
            return fn(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window or (-1, -1))
        return run
    extra = {"window_size": window} if window else {}

    def run_cute(q, k, v):
        out = fn(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal, **extra)
        return out[0] if isinstance(out, tuple) else out   # some versions return (out, lse)
    return run_cute
