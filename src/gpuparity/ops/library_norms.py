"""`gpuparity::rms_norm` and `gpuparity::layer_norm`: the torch.library ops that gpuparity.rms_norm
and gpuparity.layer_norm become under torch.compile / torch.export, with their triton_op twins and
the backward op `::norm_backward` (a fake implementation each, a registered autograd formula; the
backend chosen as ops/library.py describes for the dense ops). Their argument checks and the
Problem a call becomes are the op's contract's (contracts/norms.py)."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..contracts.norms import LAYER_NORM, NORM_BACKWARD, RMS_NORM, norm_problem
from ..registry import Problem
from .library import (_kernels_traceable, _like, _nothing, _op, _recomputed_grads, _serve, _served, define,
                      traced_backend)

__all__ = ["traced_norm", "rms_norm_op", "layer_norm_op", "norm_backward_op"]


def _rows(x: Tensor, normalized_shape: Sequence[int]) -> int:
    return math.prod(x.shape[:x.dim() - len(normalized_shape)])


def _stats_like(x: Tensor, normalized_shape: Sequence[int], is_rms: bool) -> Tensor:
    """The saved statistics' buffer (the Triton norm kernels' layout: rstd per row, for
    LayerNorm a mean per row too, and the backward's arrival counter)."""
    rows = _rows(x, normalized_shape)
    return x.new_zeros((rows if is_rms else 2 * rows) + 1, dtype=torch.float32)


def _norm_problem(op: str, x: Tensor, normalized_shape: Sequence[int], weight, bias) -> Problem:
    return norm_problem(op, x, tuple(normalized_shape), weight, bias)


def _norm_forward(op: str, x, normalized_shape, weight, bias, eps, backend) -> Tuple[Tensor, Tensor]:
    is_rms = op == "rms_norm"
    args = (x, list(normalized_shape), weight, eps) if is_rms else (x, list(normalized_shape), weight, bias, eps)
    chosen = _serve(_norm_problem(op, x, normalized_shape, weight, bias), backend)
    if chosen.forward_saving is not None:
        out, (stats,) = chosen.forward_saving(*args)
    else:
        out, stats = chosen.fn(*args), _stats_like(x, normalized_shape, is_rms)
    return _like(out, x), stats


def _rms_norm_body(a) -> Tuple[Tensor, Tensor]:
    return _norm_forward("rms_norm", a.x, a.normalized_shape, a.weight, None, a.eps, a.backend)


def _layer_norm_body(a) -> Tuple[Tensor, Tensor]:
    return _norm_forward("layer_norm", a.x, a.normalized_shape, a.weight, a.bias, a.eps, a.backend)


def _norm_fake(a) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(a.x), _stats_like(a.x, a.normalized_shape, not hasattr(a, "bias"))


# The Triton backward counts its programs' arrivals in the last element of `stats` and its last
# program sets it back to zero: the op leaves `stats` as it found them, so it declares no mutation.
def _norm_backward_body(a) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias); a gradient not wanted (or of an absent parameter) is an empty tensor."""
    x, weight, bias, eps, is_rms = a.x, a.weight, a.bias, a.eps, a.is_rms
    shape = list(a.normalized_shape)
    op = "rms_norm" if is_rms else "layer_norm"
    chosen = _served(_norm_problem(op, x, shape, weight, bias), a.backend)
    args = [x, shape, weight, eps] if is_rms else [x, shape, weight, bias, eps]
    if chosen.backward_from is not None:
        grads = list(chosen.backward_from(a.grad, (a.stats,), *args))
    else:
        def forward(x_, weight_, bias_):
            return chosen.fn(x_, shape, weight_, eps) if is_rms else chosen.fn(x_, shape, weight_, bias_, eps)
        grads = _recomputed_grads(forward, [x, weight, bias], a.wanted, a.grad)
    grads += [None] * (3 - len(grads))
    return tuple(g.contiguous() if (g is not None and w) else _nothing(x)
                 for g, w in zip(grads, a.wanted))


def _norm_backward_fake(a) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty(p.shape, dtype=p.dtype, device=a.x.device) if (w and p is not None)
                 else a.x.new_empty(0, dtype=torch.float32) for p, w in zip((a.x, a.weight, a.bias), a.wanted))


norm_backward_op, norm_backward_kernels_op = define(NORM_BACKWARD, _norm_backward_body, _norm_backward_fake)


def _norm_setup(ctx, a, output, kernels):
    ctx.kernels = kernels
    is_rms = not hasattr(a, "bias")
    bias = None if is_rms else a.bias
    ctx.save_for_backward(a.x, a.weight, bias, output[1])
    ctx.spec = (list(a.normalized_shape), a.eps, is_rms, a.backend)
    ctx.order = a._fields


def _norm_backward(ctx, grad, _grad_stats):
    x, weight, bias, stats = ctx.saved_tensors
    shape, eps, is_rms, backend = ctx.spec
    needs = dict(zip(ctx.order, ctx.needs_input_grad))
    wanted = [bool(needs["x"]), bool(needs["weight"]) and weight is not None,
              bool(needs.get("bias")) and bias is not None]
    dx, dw, db = _op("norm_backward", ctx.kernels)(grad, x, shape, weight, bias, eps, stats, is_rms, backend, wanted)
    return {name: (g if w else None) for name, g, w in zip(("x", "weight", "bias"), (dx, dw, db), wanted)}


rms_norm_op, rms_norm_kernels_op = define(RMS_NORM, _rms_norm_body, _norm_fake, _norm_backward, _norm_setup)
layer_norm_op, layer_norm_kernels_op = define(LAYER_NORM, _layer_norm_body, _norm_fake, _norm_backward, _norm_setup)


def traced_norm(op: str, x: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
                bias: Optional[Tensor], eps: Optional[float], backend: str) -> Tensor:
    """A traced gpuparity.rms_norm (bias None) or layer_norm: a composition inline, a Triton
    backend as an op (see the top)."""
    is_rms = op == "rms_norm"
    chosen = traced_backend(_norm_problem(op, x, normalized_shape, weight, bias), backend)
    shape = list(normalized_shape)
    if chosen.forward_saving is None:
        return chosen.fn(x, shape, weight, eps) if is_rms else chosen.fn(x, shape, weight, bias, eps)
    run = _op(op, _kernels_traceable(x))
    if is_rms:
        return run(x, shape, weight, eps, chosen.name)[0]
    return run(x, shape, weight, bias, float(eps), chosen.name)[0]
