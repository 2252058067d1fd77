"""FlashAttention's `flash_attn.ops.triton.layer_norm` (layer_norm_fn, rms_norm_fn, RMSNorm,
layer_norm_linear_fn, layer_norm_ref, rms_norm_ref) on gpuparity's verified residual_norm op
(gpuparity.residual_norm: the residual add fused with the RMSNorm / LayerNorm, forward and
backward, the backend chosen by the verified dispatcher; "triton": gpuparity's fused kernels).

What each argument takes:
- x, weight, bias, residual, eps, is_rms_norm, prenorm, residual_in_fp32: the fused op.
- rowscale, zero_centered_weight, out_dtype: the fused op too (its rowscale, zero_centered_weight
  and out_dtype arguments), when there is no dropout and no x1.
- dropout_p > 0 or x1: composed. torch draws the keep mask (torch.rand >= dropout_p, torch's
  generator: reproducible under torch.manual_seed), and x * rowscale, the kept values / (1 - p),
  + x1 (its own mask) and + residual are taken in fp32 by torch ops, rounded once to the residual
  stream's dtype; the fused op then normalizes that stream (residual=None). The backward goes
  through the same torch ops (autograd keeps the mask): exact and differentiable.
- weight1 / bias1 (the parallel second output): a second call of the fused op on the first's
  new_residual (the same stream; its gradient reaches x through the first call).
- out / residual_out: the results are copied into them (autograd sees the copy). FlashAttention
  2.8 itself writes into `out` but drops a passed `residual_out` (its _layer_norm_fwd allocates
  anew); here both are filled.
- layer_norm_linear_fn: layer_norm_fn (out_dtype: the autocast dtype when autocast is on), then
  F.linear with the weights cast to that dtype, as FlashAttention does; y is kept, not recomputed.

Differences from FlashAttention's kernels (within its tests' tolerances): the norm is taken of
the residual stream as stored (rounded to its dtype; FlashAttention normalizes the fp32 sum), the
dropout mask comes from torch's generator, not Triton's Philox per row; a residual whose dtype is
neither x's nor float32 is refused (the fused op's rule). The `_ref` functions are plain torch
compositions written from FlashAttention's definitions, independent of the kernels."""
from __future__ import annotations

import numbers
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._compose import FlashAttnArgumentError
from ...flash_attn_interface import _BACKENDS
from ....contracts.residual_norm import check_residual_norm_inputs
from ....ops.residual_norm import residual_norm
from ....validation import FLOAT_DTYPES, describe

__all__ = ["layer_norm_fn", "rms_norm_fn", "RMSNorm", "layer_norm_linear_fn", "layer_norm_ref", "rms_norm_ref"]


# ----------------------------------------------------------------------------- references (plain torch)
def _ref_inputs(x, weight, bias, residual, x1, weight1, bias1, rowscale, dropout_p, zero_centered_weight,
                dropout_mask, dropout_mask1, upcast):
    """The references' shared steps: upcast, weight + 1, rowscale, dropout, + x1, + residual.
    Returns (x's dtype, the summed stream, weight, bias, weight1, bias1)."""
    dtype = x.dtype
    if upcast:
        x, weight, residual, x1, weight1 = (None if t is None else t.float()
                                            for t in (x, weight, residual, x1, weight1))
        bias, bias1 = (None if t is None else t.float() for t in (bias, bias1))
    if zero_centered_weight:
        weight = weight + 1.0
        weight1 = None if weight1 is None else weight1 + 1.0
    if x1 is not None and rowscale is not None:
        raise FlashAttnArgumentError("rowscale is not supported with parallel LayerNorm (x1)")
    if rowscale is not None:
        x = x * rowscale[..., None]

    def drop(t, mask):
        if mask is None:
            return F.dropout(t, p=dropout_p)
        return torch.where(mask, t, torch.zeros_like(t)) / (1.0 - dropout_p)

    if dropout_p > 0.0:
        x = drop(x, dropout_mask)
        x1 = None if x1 is None else drop(x1, dropout_mask1)
    if x1 is not None:
        x = x + x1
    if residual is not None:
        x = (x + residual).to(x.dtype)
    return dtype, x, weight, bias, weight1, bias1


def _ref_outputs(out, out1, stream, prenorm):
    if out1 is None:
        return (out, stream) if prenorm else out
    return (out, out1, stream) if prenorm else (out, out1)


def layer_norm_ref(x, weight, bias, residual=None, x1=None, weight1=None, bias1=None, eps=1e-6, dropout_p=0.0,
                   rowscale=None, prenorm=False, zero_centered_weight=False, dropout_mask=None, dropout_mask1=None,
                   upcast=False):
    """FlashAttention's LayerNorm reference: F.layer_norm of the summed stream taken in the
    weight's dtype, the output in x's dtype; upcast=True: every input in float32 first.
    dropout_mask / dropout_mask1 (bool, True = kept) replay a run's dropout; without them
    F.dropout draws anew. Returns out, (out, stream), (out, out1) or (out, out1, stream)."""
    dtype, s, weight, bias, weight1, bias1 = _ref_inputs(x, weight, bias, residual, x1, weight1, bias1, rowscale,
                                                         dropout_p, zero_centered_weight, dropout_mask,
                                                         dropout_mask1, upcast)

    def norm(w, b):
        return F.layer_norm(s.to(w.dtype), s.shape[-1:], weight=w, bias=b, eps=eps).to(dtype)

    return _ref_outputs(norm(weight, bias), None if weight1 is None else norm(weight1, bias1), s, prenorm)


def rms_norm_ref(x, weight, bias, residual=None, x1=None, weight1=None, bias1=None, eps=1e-6, dropout_p=0.0,
                 rowscale=None, prenorm=False, zero_centered_weight=False, dropout_mask=None, dropout_mask1=None,
                 upcast=False):
    """FlashAttention's RMSNorm reference: s / sqrt(mean(s^2) + eps) * weight (+ bias) in the
    promoted dtype of the stream and the weight, the output in x's dtype; arguments as layer_norm_ref."""
    dtype, s, weight, bias, weight1, bias1 = _ref_inputs(x, weight, bias, residual, x1, weight1, bias1, rowscale,
                                                         dropout_p, zero_centered_weight, dropout_mask,
                                                         dropout_mask1, upcast)
    normed = s * torch.rsqrt(s.square().mean(dim=-1, keepdim=True) + eps)

    def affine(w, b):
        y = normed * w
        return (y if b is None else y + b).to(dtype)

    return _ref_outputs(affine(weight, bias), None if weight1 is None else affine(weight1, bias1), s, prenorm)


# ----------------------------------------------------------------------------- checks
def _check(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, out_dtype, out, residual_out):
    """FlashAttention's argument rules, as FlashAttnArgumentError (a ValueError and a RuntimeError)
    naming the argument; the fused op's checks follow (converted the same way)."""
    if not isinstance(x, Tensor) or x.dim() == 0:
        raise FlashAttnArgumentError(f"x: expected a tensor (..., hidden), got {describe(x)}")
    for name, t in (("x1", x1), ("residual_out", residual_out)):
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != tuple(x.shape)):
            raise FlashAttnArgumentError(f"{name}: expected the shape of x {tuple(x.shape)}, got {describe(t)}")
    if out is not None and (not isinstance(out, Tensor) or tuple(out.shape) != tuple(x.shape)
                            or out.dtype not in FLOAT_DTYPES):
        raise FlashAttnArgumentError(f"out: expected a floating tensor of x's shape {tuple(x.shape)}, "
                                     f"got {describe(out)}")
    if x1 is not None and x1.dtype != x.dtype:
        raise FlashAttnArgumentError(f"x1: expected the dtype of x ({x.dtype}), got {describe(x1)}")
    if x1 is not None and rowscale is not None:
        raise FlashAttnArgumentError("rowscale: not supported with parallel LayerNorm (x1 given); pass one of them")
    if weight1 is None and bias1 is not None:
        raise FlashAttnArgumentError(f"bias1: given without weight1, got {describe(bias1)}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise FlashAttnArgumentError(f"dropout_p: expected a float in [0, 1), got {describe(dropout_p)}")
    if rowscale is not None:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not isinstance(rowscale, Tensor) or rowscale.numel() != rows:
            raise FlashAttnArgumentError(f"rowscale: expected {rows} values (one per row of x {tuple(x.shape)}), "
                                         f"got {describe(rowscale)}")
        rowscale = rowscale.reshape(x.shape[:-1])
    try:
        check_residual_norm_inputs(x, residual, weight, bias, eps, "rms", False, rowscale, False, out_dtype)
        if weight1 is not None:
            check_residual_norm_inputs(x, None, weight1, bias1, eps, "rms")
    except (TypeError, ValueError) as exc:
        raise FlashAttnArgumentError(str(exc)) from exc
    return rowscale


def _keep_mask(t: Tensor, p: float) -> Tensor:
    """FlashAttention's mask convention: True where the value is kept (probability 1 - p)."""
    return torch.rand(t.shape, device=t.device) >= p


# ----------------------------------------------------------------------------- layer_norm_fn
def layer_norm_fn(x, weight, bias, residual=None, x1=None, weight1=None, bias1=None, eps=1e-6, dropout_p=0.0,
                  rowscale=None, prenorm=False, residual_in_fp32=False, zero_centered_weight=False, is_rms_norm=False,
                  return_dropout_mask=False, out_dtype=None, out=None, residual_out=None):
    """FlashAttention's dropout + residual + LayerNorm / RMSNorm (see the module's docstring for
    which path each argument takes). Returns, as FlashAttention: y; (y, residual_out) with
    prenorm; y1 after y when weight1 is given; and (dropout_mask, dropout_mask1) last with
    return_dropout_mask (None where there is no dropout / no x1). residual_out's dtype: the
    residual's, else float32 with residual_in_fp32, else x's. y's dtype: out's, else out_dtype,
    else x's."""
    rowscale = _check(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, out_dtype, out,
                      residual_out)
    norm = "rms" if is_rms_norm else "layer"
    y_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
    stream_dtype = residual.dtype if residual is not None else (torch.float32 if residual_in_fp32 else x.dtype)
    backend = _BACKENDS.get("residual_norm", "auto")
    fused = dict(eps=float(eps), norm=norm, zero_centered_weight=bool(zero_centered_weight), out_dtype=y_dtype,
                 backend=backend)
    mask = mask1 = None
    try:
        if dropout_p == 0.0 and x1 is None:
            y, stream = residual_norm(x, residual, weight, bias, residual_in_fp32=residual is None and residual_in_fp32,
                                      rowscale=rowscale, **fused)
        else:
            s = x.float()
            if rowscale is not None:
                s = s * rowscale.float()[..., None]
            if dropout_p > 0.0:
                mask = _keep_mask(x, dropout_p)
                s = torch.where(mask, s / (1.0 - dropout_p), torch.zeros_like(s))
            if x1 is not None:
                s1 = x1.float()
                if dropout_p > 0.0:
                    mask1 = _keep_mask(x1, dropout_p)
                    s1 = torch.where(mask1, s1 / (1.0 - dropout_p), torch.zeros_like(s1))
                s = s + s1
            if residual is not None:
                s = s + residual.float()
            y, stream = residual_norm(s.to(stream_dtype), None, weight, bias, **fused)
        y1 = None
        if weight1 is not None:
            y1 = residual_norm(stream, None, weight1, bias1, **fused)[0]
    except (TypeError, ValueError) as exc:
        if isinstance(exc, FlashAttnArgumentError):
            raise
        raise FlashAttnArgumentError(str(exc)) from exc
    if out is not None:
        y = out.copy_(y)
    if residual_out is not None:
        stream = residual_out.copy_(stream)
    outputs = [y] + ([y1] if y1 is not None else []) + ([stream] if prenorm else [])
    if return_dropout_mask:
        outputs += [mask, mask1]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def rms_norm_fn(x, weight, bias, residual=None, x1=None, weight1=None, bias1=None, eps=1e-6, dropout_p=0.0,
                rowscale=None, prenorm=False, residual_in_fp32=False, zero_centered_weight=False,
                return_dropout_mask=False, out_dtype=None, out=None, residual_out=None):
    """layer_norm_fn with is_rms_norm=True."""
    return layer_norm_fn(x, weight, bias, residual, x1, weight1, bias1, eps, dropout_p, rowscale, prenorm,
                         residual_in_fp32, zero_centered_weight, True, return_dropout_mask, out_dtype, out,
                         residual_out)


class RMSNorm(torch.nn.Module):
    """FlashAttention's RMSNorm module: parameter `weight` (ones, zeros when zero_centered_weight),
    `bias` registered as None (its state_dict holds `weight` alone); dropout_p applies in training."""

    def __init__(self, hidden_size, eps=1e-5, dropout_p=0.0, zero_centered_weight=False, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.drop = torch.nn.Dropout(dropout_p) if dropout_p > 0.0 else None
        self.zero_centered_weight = zero_centered_weight
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        (torch.nn.init.zeros_ if self.zero_centered_weight else torch.nn.init.ones_)(self.weight)

    def forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
        p = self.drop.p if self.drop is not None and self.training else 0.0
        return rms_norm_fn(x, self.weight, self.bias, residual=residual, eps=self.eps, dropout_p=p, prenorm=prenorm,
                           residual_in_fp32=residual_in_fp32, zero_centered_weight=self.zero_centered_weight)


def layer_norm_linear_fn(x, norm_weight, norm_bias, linear_weight, linear_bias, residual=None, eps=1e-6,
                         prenorm=False, residual_in_fp32=False, is_rms_norm=False):
    """FlashAttention's norm followed by a linear layer: the norm's output in the autocast dtype
    when autocast is on (else x's), the linear's weights cast to that dtype. Returns out, or
    (out, residual_out) with prenorm."""
    device_type = x.device.type if isinstance(x, Tensor) else "cpu"
    autocast = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else None
    with torch.autocast(device_type, enabled=False):
        y, stream = layer_norm_fn(x, norm_weight, norm_bias, residual=residual, eps=eps, prenorm=True,
                                  residual_in_fp32=residual_in_fp32, is_rms_norm=is_rms_norm, out_dtype=dtype)
        dtype = y.dtype
        out = F.linear(y, linear_weight.to(dtype), None if linear_bias is None else linear_bias.to(dtype))
    return (out, stream) if prenorm else out
