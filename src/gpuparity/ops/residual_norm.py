"""`gpuparity.residual_norm(x, residual, weight, bias=None, *, eps=None, norm="rms",
residual_in_fp32=False, rowscale=None, zero_centered_weight=False, out_dtype=None)` -> (out, new_residual):
a pre-norm block's residual add fused with its RMSNorm / LayerNorm, with the backend chosen by
the verified dispatcher; and
`gpuparity::residual_norm` (+ its backward op) as torch.library custom ops, the path the public
function takes while torch.compile or torch.export traces it (a Triton backend becomes the op,
with its triton_op twin where inductor can call the kernels; a composition is traced inline)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import library, select
from ..contracts.residual_norm import (RESIDUAL_NORM, RESIDUAL_NORM_BACKWARD, check_residual_norm_inputs,
                                       new_residual_dtype, problem_of, residual_norm_composition, residual_norm_problem)

__all__ = ["residual_norm"]


def residual_norm(x: Tensor, residual: Optional[Tensor], weight: Tensor, bias: Optional[Tensor] = None, *,
                  eps: Optional[float] = None, norm: str = "rms", residual_in_fp32: bool = False,
                  rowscale: Optional[Tensor] = None, zero_centered_weight: bool = False,
                  out_dtype: Optional[torch.dtype] = None, backend: str = "auto") -> Tuple[Tensor, Tensor]:
    """(out, new_residual): new_residual = x (* rowscale[..., None]) + residual (float32 when
    residual_in_fp32, else the residual's dtype; residual=None: x, cast the same way) and
    out = norm(new_residual) * weight (+ bias) in out_dtype (None: x's dtype), the norm over the
    last dimension: norm="rms" (RMSNorm, eps=None: F.rms_norm's default) or "layer" (LayerNorm,
    biased variance, eps=None: 1e-5). The residual may be float32 beside a 16-bit x (a float32
    residual stream). rowscale: one factor per row (x's shape without the last dimension),
    applied to x in fp32 before the add; it gets no gradient. zero_centered_weight: the norm
    multiplies by weight + 1 (taken in fp32). Gradients reach x, residual, weight and bias
    through both outputs. backend: "auto" or a name from `gpuparity.dispatch.backends("residual_norm")`."""
    check_residual_norm_inputs(x, residual, weight, bias, eps, norm, residual_in_fp32, rowscale,
                               zero_centered_weight, out_dtype)
    problem = residual_norm_problem(x, residual, weight, bias, norm, residual_in_fp32)
    extra = dict(rowscale=rowscale, zero_centered_weight=zero_centered_weight, out_dtype=out_dtype)
    if torch.compiler.is_compiling():
        # traced: the backend chosen now; a composition inline, the Triton kernels as an op
        chosen = library.traced_backend(problem, backend)
        if chosen.forward_saving is None:
            return chosen.fn(x, residual, weight, bias, eps=eps, norm=norm, residual_in_fp32=residual_in_fp32,
                             **extra)
        op = library._op("residual_norm", library._kernels_traceable(x, residual, weight, bias))
        out, new_residual, _ = op(x, residual, weight, bias, None if eps is None else float(eps), norm,
                                  residual_in_fp32, chosen.name, rowscale, zero_centered_weight, out_dtype)
        return out, new_residual
    return select.resolve(problem, backend).fn(x, residual, weight, bias, eps=eps, norm=norm,
                                               residual_in_fp32=residual_in_fp32, **extra)


# ----------------------------------------------------------------------------- torch.library
def _stats_like(x: Tensor, norm: str) -> Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_zeros(rows if norm == "rms" else 2 * rows, dtype=torch.float32)


def _residual_norm_body(a) -> Tuple[Tensor, Tensor, Tensor]:
    """(out, new_residual, stats), contiguous; stats are zeros for a backend without a fused backward."""
    x = a.x
    chosen = select.resolve(residual_norm_problem(x, a.residual, a.weight, a.bias, a.norm, a.residual_in_fp32),
                            a.backend)
    args = (x, a.residual, a.weight, a.bias, a.eps, a.norm, a.residual_in_fp32, a.rowscale, a.zero_centered_weight,
            a.out_dtype)
    if chosen.forward_saving is not None:
        (out, new_residual), (stats,) = chosen.forward_saving(*args)
    else:
        out, new_residual = chosen.fn(*args)
        stats = _stats_like(x, a.norm)
    # an op's outputs may not alias its inputs (a composition returns x itself as new_residual
    # when there is nothing to add or cast)
    new_residual = new_residual.clone(memory_format=torch.contiguous_format) if (
        new_residual is x or not new_residual.is_contiguous()) else new_residual
    return out.contiguous(), new_residual, stats


def _residual_norm_fake(a) -> Tuple[Tensor, Tensor, Tensor]:
    x = a.x
    dtype = new_residual_dtype(x, a.residual, a.residual_in_fp32)
    return (torch.empty(x.shape, dtype=a.out_dtype or x.dtype, device=x.device),
            torch.empty(x.shape, dtype=dtype, device=x.device),
            _stats_like(x, a.norm))


def _residual_norm_backward_body(a) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dresidual, dweight, dbias); dresidual without a residual and dbias without a bias are
    empty tensors. `backend` is the one the forward named (the traced path passes the chosen
    backend's name). A backend without a fused backward: out recomputed from new_residual (the
    norm's input) by the composition, differentiated."""
    new_residual, weight, bias, x_dtype, rowscale = a.new_residual, a.weight, a.bias, a.x_dtype, a.rowscale
    rdtype = new_residual.dtype if a.has_residual else None
    problem = problem_of(new_residual.device, x_dtype, new_residual.shape, a.has_residual, new_residual.dtype,
                         bias is not None, a.norm)
    chosen = select.resolve(problem, a.backend)
    if chosen.backward_from is not None:
        dx, dres, dw, db = chosen.backward_from((a.grad_out, a.grad_new_residual), (a.stats,), new_residual, weight,
                                                bias, a.norm, x_dtype, rdtype, rowscale, a.zero_centered_weight)
    else:
        def forward(s, weight_, bias_):
            return residual_norm_composition(s, None, weight_, bias_, eps=a.eps, norm=a.norm,
                                             zero_centered_weight=a.zero_centered_weight)[0]
        grad_out = a.grad_out
        if grad_out is None:
            grad_out = torch.zeros(new_residual.shape, dtype=new_residual.dtype, device=new_residual.device)
        ds, dw, db = library._recomputed_grads(forward, [new_residual, weight, bias], [True, True, bias is not None],
                                               grad_out.to(new_residual.dtype))
        if a.grad_new_residual is not None:
            ds = ds + a.grad_new_residual.to(ds.dtype)
        dres = None if rdtype is None else ds.to(rdtype, copy=True)   # outputs may not alias
        dx = ds.to(x_dtype) if rowscale is None else (ds.float() * rowscale.float()[..., None]).to(x_dtype)
    return (dx.contiguous(), library._nothing(new_residual) if dres is None else dres.contiguous(), dw.contiguous(),
            library._nothing(new_residual) if db is None else db.contiguous())


def _residual_norm_backward_fake(a) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    shape, device, new_residual = a.new_residual.shape, a.new_residual.device, a.new_residual
    return (torch.empty(shape, dtype=a.x_dtype, device=device),
            torch.empty(shape, dtype=new_residual.dtype, device=device) if a.has_residual
            else new_residual.new_empty(0, dtype=torch.float32),
            torch.empty(a.weight.shape, dtype=a.weight.dtype, device=device),
            torch.empty(a.bias.shape, dtype=a.bias.dtype, device=device) if a.bias is not None
            else new_residual.new_empty(0, dtype=torch.float32))


residual_norm_backward_op, residual_norm_backward_kernels_op = library.define(
    RESIDUAL_NORM_BACKWARD, _residual_norm_backward_body, _residual_norm_backward_fake)


def _setup(ctx, a, output, kernels):
    ctx.kernels = kernels
    ctx.save_for_backward(output[1], a.weight, a.bias, output[2], a.rowscale)
    ctx.spec = (a.eps, a.norm, a.x.dtype, a.residual is not None, a.backend, a.zero_centered_weight)


def _backward(ctx, grad_out, grad_new_residual, _grad_stats):
    new_residual, weight, bias, stats, rowscale = ctx.saved_tensors
    eps, norm, x_dtype, has_residual, backend, zero_centered_weight = ctx.spec
    dx, dres, dw, db = library._op("residual_norm_backward", ctx.kernels)(
        grad_out, grad_new_residual, new_residual, weight, bias, stats, eps, norm, x_dtype, has_residual, backend,
        rowscale, zero_centered_weight)
    needs = ctx.needs_input_grad
    return {"x": dx if needs[0] else None, "residual": dres if (needs[1] and has_residual) else None,
            "weight": dw if needs[2] else None, "bias": db if (needs[3] and bias is not None) else None}


residual_norm_op, residual_norm_kernels_op = library.define(RESIDUAL_NORM, _residual_norm_body,
                                                            _residual_norm_fake, _backward, _setup)
