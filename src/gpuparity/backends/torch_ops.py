"""Torch's own implementations of the non-attention ops, and their plain compositions in the
input dtype (the trusted baselines of the battery and the last resort of "auto")."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import Backend, register
from ..contracts.norms import layer_norm as reference_layer_norm, rms_norm as reference_rms_norm
from ..contracts.rotary import apply_rotary as reference_apply_rotary
from ..numerics import default_rms_eps


# ---------------------------------------------------------------- norms
def torch_rms_norm(x, normalized_shape, weight=None, eps=None):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, normalized_shape, weight, eps)
    return rms_norm_composition(x, normalized_shape, weight, eps)


def rms_norm_composition(x, normalized_shape, weight=None, eps=None):
    """Statistics in fp32, output in x's dtype: the eager RMSNorm most models ship."""
    eps = default_rms_eps(x.dtype) if eps is None else eps
    y = reference_rms_norm(x.float(), normalized_shape, None, eps).to(x.dtype)
    return y * weight if weight is not None else y


def torch_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def layer_norm_composition(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    y = reference_layer_norm(x.float(), normalized_shape, None, None, eps).to(x.dtype)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


# ---------------------------------------------------------------- rotary
def rotary_composition(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    """The eager rotary of most model code, in x's dtype (cos/sin cast to it)."""
    return reference_apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                                  cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


# ---------------------------------------------------------------- softmax / matmul / conv / loss
def torch_softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)


def softmax_composition(x, dim=-1):
    """exp / sum in the input dtype, as a model would write it."""
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def torch_matmul(a, b):
    return torch.matmul(a, b)


def matmul_composition(a, b):
    """Products in the input dtype, summed with an fp32 accumulator: no GEMM library involved."""
    return (a.unsqueeze(-1) * b.unsqueeze(-3)).float().sum(dim=-2).to(a.dtype)


def torch_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)


def conv2d_composition(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """im2col (unfold) + batched matmul in fp32: no convolution library involved."""
    batch, _, height, width = x.shape
    out_ch, in_per_group, kh, kw = weight.shape
    cols = F.unfold(x.float(), (kh, kw), dilation=dilation, padding=padding, stride=stride)
    cols = cols.view(batch, groups, in_per_group * kh * kw, -1)
    w = weight.float().view(groups, out_ch // groups, -1)
    out = torch.einsum("gok,bgkl->bgol", w, cols).reshape(batch, out_ch, -1)
    pad = (padding, padding) if isinstance(padding, int) else tuple(padding)
    st = (stride, stride) if isinstance(stride, int) else tuple(stride)
    dil = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    out_h = (height + 2 * pad[0] - dil[0] * (kh - 1) - 1) // st[0] + 1
    out_w = (width + 2 * pad[1] - dil[1] * (kw - 1) - 1) // st[1] + 1
    out = out.view(batch, out_ch, out_h, out_w)
    if bias is not None:
        out = out + bias.float().view(1, -1, 1, 1)
    return out.to(x.dtype)


def torch_cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction)


def cross_entropy_composition(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    logp = torch.log_softmax(logits.float(), dim=-1)
    valid = target != ignore_index
    safe_target = target.masked_fill(~valid, 0)
    nll = -logp.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    loss = ((1 - label_smoothing) * nll + label_smoothing * smooth).masked_fill(~valid, 0.0)
    if reduction == "sum":
        return loss.sum().to(logits.dtype)
    if reduction == "none":
        return loss.to(logits.dtype)
    return (loss.sum() / valid.sum()).to(logits.dtype)


def torch_swiglu(gate, up):
    return F.silu(gate) * up


def swiglu_composition(gate, up):
    return gate * torch.sigmoid(gate) * up


def _register_pair(op, torch_fn, composition_fn, torch_desc):
    register(Backend("torch", op, torch_fn, torch_desc))
    register(Backend("composition", op, composition_fn, "plain composition in the input dtype (trusted baseline)",
                     fallback=True))


_register_pair("rms_norm", torch_rms_norm, rms_norm_composition, "torch F.rms_norm")
_register_pair("layer_norm", torch_layer_norm, layer_norm_composition, "torch F.layer_norm")
register(Backend("composition", "rotary", rotary_composition, "eager rotary in the input dtype", fallback=True))
_register_pair("softmax", torch_softmax, softmax_composition, "torch.softmax")
_register_pair("matmul", torch_matmul, matmul_composition, "torch.matmul (cuBLAS / hipBLASLt / CPU BLAS)")
_register_pair("conv2d", torch_conv2d, conv2d_composition, "F.conv2d (cuDNN / MIOpen / CPU)")
_register_pair("cross_entropy", torch_cross_entropy, cross_entropy_composition, "F.cross_entropy")
_register_pair("swiglu", torch_swiglu, swiglu_composition, "F.silu(gate) * up (autograd keeps the activation)")
