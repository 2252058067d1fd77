"""Implementations with planted bugs (and correct ones), loaded by the battery as
'tests/checks/planted_impls.py:NAME'. Each bug is one a real kernel port has shipped."""
from __future__ import annotations

import ctypes
import os
import time

import torch

from gpuparity import reference
from gpuparity.contracts.attention import composition


# ---------------------------------------------------------------- attention
def attention_correct(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                       scale=scale)


def attention_ignores_mask(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """User story 1: the mask is silently dropped."""
    return composition(q, k, v, is_causal=is_causal, scale=scale)


def attention_mask_batch0_only(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """The key-padding mask of batch item 0 is applied to every item."""
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask[:1].expand_as(key_padding_mask)
    return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                       scale=scale)


def attention_wrong_scale(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """1/D instead of 1/sqrt(D)."""
    scale = 1.0 / q.shape[-1] if scale is None else scale
    return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                       scale=scale)


def attention_nan_on_empty_rows(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Softmax over a row of -inf: NaN (the pre-_safe_softmax behaviour)."""
    from gpuparity.backends.masks import allowed_mask
    k_full = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v_full = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k_full.transpose(-2, -1)).float() * scale
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        scores = scores + attn_mask.float()
    allowed = allowed_mask(q.shape[-2], k.shape[-2], q.device, attn_mask=attn_mask,
                           key_padding_mask=key_padding_mask, is_causal=is_causal)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1).to(q.dtype) @ v_full


class _WrongDV(torch.autograd.Function):
    """Correct forward; the backward's dV uses the probabilities *before* masking."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, key_padding_mask, is_causal, scale):
        ctx.save_for_backward(q, k, v)
        ctx.masks = (attn_mask, key_padding_mask, is_causal, scale)
        return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                           scale=scale)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        attn_mask, key_padding_mask, is_causal, scale = ctx.masks
        with torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, k, v))
            out = composition(q_, k_, v_, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                              is_causal=is_causal, scale=scale)
            dq, dk, _ = torch.autograd.grad(out, (q_, k_, v_), grad_out)
            v2 = v.detach().requires_grad_(True)
            unmasked = composition(q.detach(), k.detach(), v2, scale=scale)
            (dv,) = torch.autograd.grad(unmasked, (v2,), grad_out)
        return dq, dk, dv, None, None, None, None


def attention_wrong_dv(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return _WrongDV.apply(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


# ---------------------------------------------------------------- rotary
def rotary_correct(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    return reference.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                                  cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


def rotary_interleaved_batch_stride_bug(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None,
                                        max_seqlen=None):
    """User story 3: interleaved RoPE reads batch b at b * t*d/2 instead of b * h*t*d."""
    if not interleaved or cu_seqlens is not None or x.shape[0] == 1:
        return rotary_correct(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                              cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    batch, seqlen, heads, dim = x.shape
    flat = x.contiguous().reshape(-1)
    per_batch = seqlen * heads * dim
    items = []
    for b in range(batch):
        base = b * (seqlen * dim // 2)  # the bug: should be b * per_batch
        items.append(flat[base: base + per_batch].view(1, seqlen, heads, dim))
    wrong = torch.cat(items)
    return rotary_correct(wrong, cos, sin, interleaved=True, seqlen_offsets=seqlen_offsets)


# ---------------------------------------------------------------- norms
def layer_norm_correct(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """fp32 statistics and math (torch 2.13's own CPU bf16 kernel is not accurate enough at
    widths of 3: up to 5% relative grad_x error on some seeds)."""
    as_float = (lambda t: None if t is None else t.float())
    return torch.nn.functional.layer_norm(x.float(), normalized_shape, as_float(weight), as_float(bias),
                                          eps).to(x.dtype)


def layer_norm_unbiased_variance(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    dims = tuple(range(-len(normalized_shape), 0))
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    var = xf.var(dims, keepdim=True, unbiased=True)  # the bug: F.layer_norm uses the biased variance
    y = ((xf - mean) * torch.rsqrt(var + eps)).to(x.dtype)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def rms_norm_assumes_contiguous(x, normalized_shape, weight=None, eps=None):
    """Reads x as if it were contiguous, as a kernel indexing row * hidden would."""
    strides = torch.empty(x.shape).stride()
    as_if_contiguous = x.as_strided(x.shape, strides, x.storage_offset())
    return torch.nn.functional.rms_norm(as_if_contiguous, normalized_shape, weight, eps)


# ---------------------------------------------------------------- crashes and hangs
def softmax_abort(x, dim=-1):
    os.abort()


def softmax_segfault(x, dim=-1):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def softmax_hang(x, dim=-1):
    time.sleep(3600)


def softmax_raises(x, dim=-1):
    raise RuntimeError("kernel launch failed (planted)")


def softmax_wrong_shape(x, dim=-1):
    return torch.softmax(x, dim=dim)[..., :1]


def softmax_wrong_dtype(x, dim=-1):
    return torch.softmax(x.double(), dim=dim)


def softmax_nan(x, dim=-1):
    out = torch.softmax(x, dim=dim)
    return out + float("nan") * (out[..., :1] > 1e9)


def softmax_error_by_width(x, dim=-1):
    """ERRORs one way on rows wider than 4 and another way (a different exception type) on
    narrower ones: a shrinker that keeps any ERROR would trade the first for the second."""
    if x.shape[dim] > 4:
        raise ValueError("width over 4 refused (planted)")
    raise TypeError("narrow rows refused (planted, a different error)")
