"""SwiGLU (silu(gate) * up, the gated MLP of Llama-family models) in Triton: one elementwise
kernel each way, fp32 math, the backward recomputing silu from the saved gate and up, so the
activation silu(gate) is never stored (an eager `act_fn(gate) * up` keeps it for autograd: one
(tokens, intermediate) tensor per layer). Registered as the "triton" backend of op "swiglu"."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..registry import Backend, register
from .triton_common import AotSpec, availability, cdiv, launch, next_pow2, problem_reasons

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton: the backend says so through availability()
    triton = None
    tl = None

# Elements of a row per program, and warps per program.
MAX_BLOCK = 1024
NUM_WARPS = 4

if triton is not None:

    @triton.jit
    def _sigmoid(g):
        # 1 / (1 + exp(-g)): exp overflows to inf for g < -88 and the quotient is then 0, as it should
        return 1.0 / (1.0 + tl.exp(-g))

    @triton.jit
    def _swiglu_fwd_kernel(G, U, OUT, n_cols, stride_g, stride_u, stride_o, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < n_cols
        g = tl.load(G + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(U + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(OUT + row * stride_o + cols, g * _sigmoid(g) * u, mask=ok)

    @triton.jit
    def _swiglu_bwd_kernel(DO, G, U, DG, DU, n_cols, stride_do, stride_g, stride_u, stride_dg, stride_du,
                           BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < n_cols
        do = tl.load(DO + row * stride_do + cols, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(G + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(U + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
        s = _sigmoid(g)
        # d silu(g) / dg = s * (1 + g * (1 - s))
        tl.store(DG + row * stride_dg + cols, do * u * (s * (1.0 + g * (1.0 - s))), mask=ok)
        tl.store(DU + row * stride_du + cols, do * (g * s), mask=ok)


def _row_stride(t: torch.Tensor) -> Optional[int]:
    """The stride between rows when t reads as (rows, last dim) with unit column stride (a
    contiguous tensor, or a chunk of a fused projection's output), else None."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return None
    for i in range(t.dim() - 2):
        if t.shape[i] > 1 and t.stride(i) != t.stride(i + 1) * t.shape[i + 1]:
            return None
    return t.stride(-2) if t.dim() >= 2 else t.shape[-1]


def _rows(t: torch.Tensor) -> Tuple[torch.Tensor, int]:
    stride = _row_stride(t)
    if stride is None:
        t = t.contiguous()
        stride = t.shape[-1] if t.dim() else 1
    return t, stride


def _grid(rows: int, cols: int) -> Tuple[Tuple[int, int], int]:
    block = min(MAX_BLOCK, next_pow2(max(cols, 1)))
    return (rows, cdiv(cols, block)), block


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel() == 0:
        return out
    gate, stride_g = _rows(gate)
    up, stride_u = _rows(up)
    cols = out.shape[-1]
    grid, block = _grid(out.numel() // cols, cols)
    launch(_swiglu_fwd_kernel, grid, (gate, up, out, cols, stride_g, stride_u, cols), num_warps=NUM_WARPS, BLOCK=block)
    return out


def swiglu_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    if dgate.numel() == 0:
        return dgate, dup
    grad, stride_do = _rows(grad)
    gate, stride_g = _rows(gate)
    up, stride_u = _rows(up)
    cols = dgate.shape[-1]
    grid, block = _grid(dgate.numel() // cols, cols)
    launch(_swiglu_bwd_kernel, grid, (grad, gate, up, dgate, dup, cols, stride_do, stride_g, stride_u, cols, cols),
           num_warps=NUM_WARPS, BLOCK=block)
    return dgate, dup


class TritonSwiGLU(torch.autograd.Function):
    """Saves gate and up (views as given: a fused projection's halves cost no copy), not the
    activation."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return swiglu_forward(gate, up)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        dgate, dup = swiglu_backward(grad, gate, up)
        return (dgate if ctx.needs_input_grad[0] else None), (dup if ctx.needs_input_grad[1] else None)


def triton_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return TritonSwiGLU.apply(gate, up)


def aot_specs() -> List[AotSpec]:
    """The shipped configuration (bf16, a full block) of both kernels, for every AOT target."""
    if triton is None:
        return []
    const = {"BLOCK": MAX_BLOCK}
    fwd = {"G": "*bf16", "U": "*bf16", "OUT": "*bf16", "n_cols": "i32", "stride_g": "i64", "stride_u": "i64",
           "stride_o": "i64", "BLOCK": "constexpr"}
    bwd = {"DO": "*bf16", "G": "*bf16", "U": "*bf16", "DG": "*bf16", "DU": "*bf16", "n_cols": "i32",
           "stride_do": "i64", "stride_g": "i64", "stride_u": "i64", "stride_dg": "i64", "stride_du": "i64",
           "BLOCK": "constexpr"}
    return [AotSpec("swiglu.fwd", _swiglu_fwd_kernel, fwd, const, num_warps=NUM_WARPS),
            AotSpec("swiglu.bwd", _swiglu_bwd_kernel, bwd, const, num_warps=NUM_WARPS)]


def _saving(gate, up):
    return swiglu_forward(gate, up), ()


def _from(grad, saved, gate, up):
    return swiglu_backward(grad, gate, up)


register(Backend(
    name="triton", op="swiglu", fn=triton_swiglu,
    description="gpuparity's Triton kernels: fp32 math, the backward recomputes silu (no stored activation)",
    dtypes=(torch.float16, torch.bfloat16, torch.float32), availability=availability, supports=problem_reasons,
    jit=True, forward_saving=_saving, backward_from=_from))
