"""`gpuparity bench rope`: rotary embeddings applied to q and k, gpuparity's Triton kernel against
the eager composition, torch.compile and Liger-Kernel (when installed), in the half-split,
interleaved and packed varlen layouts; effective GB/s and % of the measured copy bandwidth.

Shapes are (B, H, T, D) as in docs/targets.md; q and k are laid out (B, T, H, D) as the contract
takes them. Bytes counted: forward reads and writes q and k; forward+backward adds reading
dq, dk and writing their gradients. The cos/sin tables are too small to count.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import common
from .common import DTYPES, BenchResult, BenchRow, fresh_compile

from .names import LAYOUTS, ROPE_BACKENDS


def _liger_rope():
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except Exception as exc:  # noqa: BLE001
        return None, f"Liger-Kernel is not importable here ({type(exc).__name__})"

    def run(q, k, cos, sin, layout):
        # Liger takes (B, H, T, D) and full-width cos/sin (T, D), half-split only.
        if layout != "half":
            raise NotImplementedError("Liger-Kernel's rope has only the half-split layout")
        full_cos, full_sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        return LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), full_cos, full_sin)
    return run, ""


def rope_peers(device: torch.device) -> Dict[str, Tuple[Optional[Callable], str]]:
    """backend -> (fn(x, cos, sin, **rotary kwargs) or None, reason when None)."""
    from ..backends import compiled, triton_common, triton_rotary
    from ..contracts.rotary import rotary_composition
    peers: Dict[str, Tuple[Optional[Callable], str]] = {}
    reason = triton_common.availability() or triton_common.triton_unavailable_reason(device.type)
    peers["triton"] = (None, reason) if reason else (triton_rotary.triton_apply_rotary, "")
    peers["eager"] = (rotary_composition, "")
    reason = compiled.compile_unavailable_reason(device.type)
    peers["compile"] = (None, reason) if reason else (compiled.compiled_apply_rotary, "")
    return peers


def run_rope_bench(shapes: Sequence[Tuple[int, int, int, int]], layouts: Sequence[str], dtype: torch.dtype,
                   backends: Sequence[str], modes: Sequence[str], device: torch.device,
                   rep_ms: float = 100.0, rows: Optional[List[BenchRow]] = None) -> List[BenchRow]:
    """rows: the list the rows are appended to (kept by a caller that is interrupted)."""
    rows = [] if rows is None else rows
    dtype_name = str(dtype).replace("torch.", "")
    elem = torch.empty(0, dtype=dtype).element_size()
    peers = rope_peers(device)
    liger, liger_reason = _liger_rope()
    for batch, heads, seqlen, head_dim in shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        shape = (batch, seqlen, heads, head_dim)
        q = torch.randn(shape, generator=gen).to(device, dtype)
        k = torch.randn(shape, generator=gen).to(device, dtype)
        dq = torch.randn(shape, generator=gen).to(device, dtype)
        dk = torch.randn(shape, generator=gen).to(device, dtype)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(seqlen, dtype=torch.float32), inv_freq)
        cos, sin = angles.cos().to(device), angles.sin().to(device)
        for layout in layouts:
            label = f"{layout} ({batch},{heads},{seqlen},{head_dim})"
            kwargs: Dict[str, object] = {"interleaved": layout == "interleaved"}
            if layout == "varlen":
                kwargs["cu_seqlens"] = torch.arange(0, batch + 1, device=device, dtype=torch.int32) * seqlen
                kwargs["max_seqlen"] = seqlen
                view = (batch * seqlen, heads, head_dim)
            else:
                view = shape
            qv, kv, dqv, dkv = (t.reshape(view) for t in (q, k, dq, dk))
            for backend in backends:
                if backend == "liger":
                    fn, reason = (None, liger_reason) if liger is None else (None, "")
                else:
                    fn, reason = peers.get(backend, (None, f"unknown backend {backend!r}"))
                    if backend == "compile" and fn is not None:
                        fresh_compile()
                for mode in modes:
                    row = BenchRow("rope", label, backend, dtype_name, mode,
                                   params={"layout": layout, "B": batch, "H": heads, "T": seqlen, "D": head_dim})
                    rows.append(row)
                    if backend == "liger" and liger is not None:
                        def pair(x1, x2, run=liger, layout=layout):
                            return run(x1, x2, cos, sin, layout)
                    elif fn is None:
                        row.status, row.reason = "skip", reason
                        continue
                    else:
                        def pair(x1, x2, run=fn, kw=kwargs):
                            return run(x1, cos, sin, **kw), run(x2, cos, sin, **kw)
                    common.time_row(row, mode, device, rep_ms, lambda: pair(qv, kv),
                                    lambda: _rope_step(pair, qv.detach().requires_grad_(), kv.detach().requires_grad_(),
                                                       dqv, dkv),
                                    4 * q.numel() * elem, 8 * q.numel() * elem)
        del q, k, dq, dk
    return rows


def _rope_step(pair, qg, kg, dq, dk):
    def step():
        qg.grad = None
        kg.grad = None
        out_q, out_k = pair(qg, kg)
        torch.autograd.backward((out_q, out_k), (dq, dk))
    return step


def bench_rope(shapes: Sequence[Tuple[int, int, int, int]], layouts: Sequence[str], dtype_name: str,
               backends: Sequence[str], modes: Sequence[str], device: torch.device, *, rep_ms: float = 100.0,
               ceilings: bool = True, command: str = "") -> BenchResult:
    """Every (shape, layout, backend, mode) timed, with the run's metadata; `command` is the
    command line recorded in it. ceilings=False skips measuring the copy bandwidth."""
    meta = common.gbps_metadata(command, device, ceilings)
    return common.run_gbps("rope", lambda rows: run_rope_bench(shapes, layouts, DTYPES[dtype_name], backends, modes,
                                                                device, rep_ms, rows),
                           meta, backends, f"RoPE on q and k, {dtype_name}, {device.type}")


def estimate_rope(shapes: Sequence[Tuple[int, int, int, int]], layouts: Sequence[str], dtype_name: str,
                  backends: Sequence[str], modes: Sequence[str], device, rep_ms: float = 100.0) -> Dict[str, object]:
    """common.estimate_gbps of a rope run (the forward reads and writes q and k)."""
    elem = 4 if dtype_name == "fp32" else 2
    sizes = [4 * b * h * t * d * elem for b, h, t, d in shapes for _ in layouts]
    return dict(common.estimate_gbps(sizes, backends, modes, device, rep_ms), shapes=len(shapes), layouts=len(layouts))
