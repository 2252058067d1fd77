"""`gpuparity bench norm`: RMSNorm and LayerNorm, gpuparity's Triton kernels against the peers a
user would pick instead (torch F.*, the eager composition, torch.compile, Liger-Kernel when
installed); effective GB/s and % of the copy bandwidth measured in the same run.

Bytes counted (docs/targets.md): forward reads x and writes y; forward+backward adds reading x and
dy and writing dx. Weights and statistics are too small to count.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import common
from .common import DTYPES, BenchResult, BenchRow, fresh_compile

from .names import NORM_BACKENDS, NORM_OPS as OPS


def fwd_bwd_step(forward: Callable[[], torch.Tensor], grad_out: torch.Tensor, leaves: Sequence[torch.Tensor]):
    """One forward+backward; gradients are dropped first so no accumulation kernel is timed."""
    def step():
        for leaf in leaves:
            leaf.grad = None
        forward().backward(grad_out)
    return step


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
    from ..contracts import norms as norms_contract
    peers: Dict[str, Tuple[Optional[Callable], str]] = {}
    from ..backends import triton_common, triton_norms
    reason = triton_common.availability() or triton_common.triton_unavailable_reason(device.type)
    if op == "rms":
        peers["triton"] = (None, reason) if reason else (
            lambda x, w, b, eps: triton_norms.triton_rms_norm(x, x.shape[-1:], w, eps), "")
        peers["torch"] = (lambda x, w, b, eps: F.rms_norm(x, x.shape[-1:], w, eps), "")
        peers["eager"] = (lambda x, w, b, eps: norms_contract.rms_norm_composition(x, x.shape[-1:], w, eps), "")
    else:
        peers["triton"] = (None, reason) if reason else (
            lambda x, w, b, eps: triton_norms.triton_layer_norm(x, x.shape[-1:], w, b, eps), "")
        peers["torch"] = (lambda x, w, b, eps: F.layer_norm(x, x.shape[-1:], w, b, eps), "")
        peers["eager"] = (lambda x, w, b, eps: norms_contract.layer_norm_composition(x, x.shape[-1:], w, b, eps), "")
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


def run_norm_bench(ops: Sequence[str], shapes: Sequence[Tuple[int, int]], dtype: torch.dtype,
                   backends: Sequence[str], modes: Sequence[str], device: torch.device,
                   rep_ms: float = 100.0, rows: Optional[List[BenchRow]] = None) -> List[BenchRow]:
    """rows: the list the rows are appended to (kept by a caller that is interrupted)."""
    rows = [] if rows is None else rows
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

                    def step(fn=fn):
                        xg = x.detach().requires_grad_()
                        wg = weight.detach().requires_grad_()
                        bg = bias.detach().requires_grad_() if bias is not None else None
                        leaves = [t for t in (xg, wg, bg) if t is not None]
                        return fwd_bwd_step(lambda: fn(xg, wg, bg, eps), dy, leaves)
                    common.time_row(row, mode, device, rep_ms, lambda: fn(x, weight, bias, eps), step,
                                    2 * x.numel() * elem, 5 * x.numel() * elem)
            del x, dy
    return rows


def bench_norm(ops: Sequence[str], shapes: Sequence[Tuple[int, int]], dtype_name: str, backends: Sequence[str],
               modes: Sequence[str], device: torch.device, *, rep_ms: float = 100.0, ceilings: bool = True,
               command: str = "") -> BenchResult:
    """Every (op, shape, backend, mode) timed, with the run's metadata; `command` is the command
    line recorded in it. ceilings=False skips measuring the copy bandwidth (GPU only anyway)."""
    meta = common.gbps_metadata(command, device, ceilings)
    return common.run_gbps("norm", lambda rows: run_norm_bench(ops, shapes, DTYPES[dtype_name], backends, modes,
                                                                device, rep_ms, rows),
                           meta, backends, f"RMSNorm / LayerNorm, {dtype_name}, {device.type}")


def estimate_norm(ops: Sequence[str], shapes: Sequence[Tuple[int, int]], dtype_name: str, backends: Sequence[str],
                  modes: Sequence[str], device, rep_ms: float = 100.0) -> Dict[str, object]:
    """common.estimate_gbps of a norm run (the forward reads x and writes y)."""
    elem = 4 if dtype_name == "fp32" else 2
    return dict(common.estimate_gbps([2 * rows * hidden * elem for _ in ops for rows, hidden in shapes], backends,
                                     modes, device, rep_ms), shapes=len(shapes), ops=len(ops))
