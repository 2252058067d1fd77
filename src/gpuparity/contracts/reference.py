"""Float64 references of every op, written as plain differentiable torch compositions.

Callers upcast inputs to float64 on the CPU; these functions do no casting of their own
beyond what the op's meaning needs. They define the semantics every backend is held to
(docs/design.md, contracts), including the corner cases: a fully masked attention row returns
zeros with zero gradients.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------- attention
def window_allowed(q_len: int, k_len: int, window, device="cpu") -> torch.Tensor:
    """Bool (Sq, Sk): query i sees key j when i - left <= j <= i + right (-1: that side unbounded)."""
    left, right = window
    offset = torch.arange(k_len, device=device).view(1, k_len) - torch.arange(q_len, device=device).view(q_len, 1)
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= offset >= -left
    if right >= 0:
        keep &= offset <= right
    return keep


def attention_allowed(q_len: int, k_len: int, batch: int, *, attn_mask=None, key_padding_mask=None,
                      is_causal: bool = False, window=None, device="cpu") -> torch.Tensor:
    """Bool (B or 1, H or 1, Sq, Sk): True where a query may attend to a key.

    attn_mask bool: True = attend (SDPA); float attn_mask: -inf means masked.
    key_padding_mask: (B, Sk), True = padding (nn.MultiheadAttention).
    is_causal: top-left aligned, query i sees keys 0..i (SDPA).
    window (left, right): query i sees keys i - left .. i + right, -1 = unbounded on that side
    (FlashAttention's window_size), top-left aligned as is_causal.
    """
    allowed = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=device)
    if is_causal:
        allowed = allowed & torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()
    if window is not None:
        allowed = allowed & window_allowed(q_len, k_len, window, device)
    if attn_mask is not None:
        m = attn_mask if attn_mask.dtype == torch.bool else ~torch.isneginf(attn_mask)
        while m.dim() < 4:
            m = m.unsqueeze(0)
        allowed = allowed & m
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask.view(key_padding_mask.shape[0], 1, 1, k_len)
    return allowed


def empty_query_rows(q_len: int, k_len: int, batch: int, heads: int, **masks) -> torch.Tensor:
    """Bool (B, H, Sq, 1): rows with no key left to attend to."""
    allowed = attention_allowed(q_len, k_len, batch, **masks)
    return (~allowed.any(-1, keepdim=True)).expand(batch, heads, q_len, 1)


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
              window=None, softcap=None):
    """q: (B, H, Sq, D); k, v: (B, Hkv, Sk, D), H % Hkv == 0 (GQA: head h reads kv head
    h // (H // Hkv), as SDPA's enable_gqa). softcap c: scaled scores s become c * tanh(s / c)
    (Gemma-2) before any mask or float attn_mask is applied."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    if heads != kv_heads:
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scale = head_dim ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        scores = scores + attn_mask.to(scores.dtype)
    allowed = attention_allowed(q_len, k_len, batch, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, window=window, device=q.device)
    allowed = allowed & ~torch.isneginf(scores)
    empty = ~allowed.any(-1, keepdim=True)
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    return torch.matmul(probs, v)


def attention_dropout(q, k, v, keep, dropout_p: float, **masks):
    """`attention` with dropout on the probabilities: those where `keep` (bool, broadcastable
    to (B, H, Sq, Sk), True = kept) is False are zeroed, the rest scaled by 1 / (1 - dropout_p).
    masks: attention's keyword arguments. The probabilities are attention's own, read through an
    identity value matrix (a product with 1 and 0s is exact), so the two cannot disagree."""
    batch, heads, _, _ = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    eye = torch.eye(k_len, dtype=q.dtype, device=q.device).expand(batch, kv_heads, k_len, k_len)
    probs = attention(q, k, eye, **masks)
    dropped = torch.where(keep.to(q.device), probs / (1.0 - dropout_p), torch.zeros((), dtype=probs.dtype,
                                                                                     device=q.device))
    if heads != kv_heads:
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    return torch.matmul(dropped, v)


# --------------------------------------------------------------------------- softmax
def softmax(x, dim: int = -1):
    return torch.softmax(x, dim=dim)


# --------------------------------------------------------------------------- norms
def _norm_dims(normalized_shape: Sequence[int]):
    return tuple(range(-len(tuple(normalized_shape)), 0))


def default_rms_eps(dtype: torch.dtype) -> float:
    """What F.rms_norm uses for eps=None. Its docs say finfo(x.dtype).eps, but its kernels use
    the eps of the op-math dtype (float32 for fp16/bf16 inputs); we follow the kernels, since
    that is what users compare against."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def rms_norm(x, normalized_shape, weight=None, eps: Optional[float] = None, *, eps_dtype=None):
    """F.rms_norm; pass eps_dtype (the dtype under test) when x was upcast and eps is None."""
    if eps is None:
        eps = default_rms_eps(eps_dtype or x.dtype)
    dims = _norm_dims(normalized_shape)
    y = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps)
    return y * weight if weight is not None else y


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    dims = _norm_dims(normalized_shape)
    mean = x.mean(dim=dims, keepdim=True)
    var = (x - mean).pow(2).mean(dim=dims, keepdim=True)  # biased, as F.layer_norm
    y = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


# --------------------------------------------------------------------------- rotary
def rotary_positions(batch: int, seqlen: int, seqlen_offsets: Union[int, torch.Tensor]) -> torch.Tensor:
    """(B, S) absolute positions: s + offset[b]."""
    base = torch.arange(seqlen).unsqueeze(0).expand(batch, seqlen)
    if isinstance(seqlen_offsets, torch.Tensor):
        return base + seqlen_offsets.to("cpu", torch.long).view(batch, 1)
    return base + int(seqlen_offsets)


def _rotate(x, cos, sin, interleaved: bool):
    """x (..., rotary_dim); cos/sin (..., rotary_dim/2) broadcast to x's leading dims."""
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out0 = x0 * cos - x1 * sin
        out1 = x0 * sin + x1 * cos
        return torch.stack((out0, out1), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


def apply_rotary(x, cos, sin, *, interleaved: bool = False, seqlen_offsets=0, cu_seqlens=None,
                 max_seqlen=None):
    """The flash-attn rotary contract: x (B, S, H, D) or packed (total, H, D) with cu_seqlens;
    cos/sin (S_max, rotary_dim/2); the first rotary_dim features rotate, the rest pass."""
    rotary_dim = cos.shape[-1] * 2
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        pos = rotary_positions(batch, seqlen, seqlen_offsets).to(x.device)
        c = cos[pos].unsqueeze(2)  # (B, S, 1, rd/2)
        s = sin[pos].unsqueeze(2)
    else:
        bounds = cu_seqlens.to("cpu", torch.long).tolist()
        batch = len(bounds) - 1
        pos_parts = []
        for b in range(batch):
            length = bounds[b + 1] - bounds[b]
            offset = int(seqlen_offsets[b]) if isinstance(seqlen_offsets, torch.Tensor) else int(seqlen_offsets)
            pos_parts.append(torch.arange(length) + offset)
        pos = torch.cat(pos_parts).to(x.device) if pos_parts else torch.zeros(0, dtype=torch.long, device=x.device)
        c = cos[pos].unsqueeze(1)  # (total, 1, rd/2)
        s = sin[pos].unsqueeze(1)
    rotated = _rotate(x[..., :rotary_dim], c.to(x.dtype), s.to(x.dtype), interleaved)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


# --------------------------------------------------------------------------- matmul / conv / loss
def matmul(a, b):
    return torch.matmul(a, b)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)


def cross_entropy(logits, target, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean"):
    return F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction)
