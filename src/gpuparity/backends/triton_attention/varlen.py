"""Launching the packed variable-length attention kernels: varlen_forward/varlen_backward, the
autograd Function and triton_attention_varlen, the function behind backend "triton" of op
"attention_varlen"."""
from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from ...numerics import matmul_tf32
from .. import triton_common
from ..triton_common import PlanCache, PreparedLaunch, cdiv, lazy_kernel
from .launch import LOG2E, _dummy, _window_softcap_scalars, alibi_table, check_alibi_slopes, dot_precision, natural_lse
from .tiles import padded_head_dim, tile_config


def _load_kernels() -> Dict[str, Any]:
    from .varlen_kernels import VARLEN_KERNELS  # imports triton: on first launch only
    return VARLEN_KERNELS


varlen_kernel_table = lazy_kernel(_load_kernels)

# Prepared launches per call signature (shapes, strides, max lengths, flags), as launch.py's.
_PLANS = PlanCache()


def _constexprs(head_dim, causal, dtype, window, softcap, alibi_stride):
    return dict(HEAD_DIM=head_dim, D_PAD=padded_head_dim(head_dim), IS_CAUSAL=bool(causal),
                DOT_PRECISION=dot_precision(dtype), HAS_WINDOW=window is not None, SOFTCAP=softcap is not None,
                HAS_ALIBI=alibi_stride is not None)


def _key(q, k, v, cu_q, max_q, max_k, causal, scale, window, softcap, alibi_stride, extra=()) -> tuple:
    return (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, cu_q.shape[0], max_q, max_k,
            causal, scale, window, softcap, alibi_stride, triton_common.interpreting(),
            matmul_tf32() if q.dtype == torch.float32 else None, *extra)


def _alibi(q, alibi_slopes):
    """(table as the kernels read it, its batch stride; None without ALiBi): launch.alibi_table,
    a placeholder pointer without slopes (never read then)."""
    if alibi_slopes is None:
        return _dummy(q.device), None
    return alibi_table(alibi_slopes, q.shape[1])


def _planned(key, build):
    plan = _PLANS.get(key)
    return plan if plan is not None else _PLANS.keep(key, build())


def _forward_launch(q, k, v, out, batch, max_q, max_k, causal, scale, window, softcap, alibi_stride):
    total_q, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    cfg = tile_config("fwd", q.device, head_dim, q.dtype, max_k)
    return PreparedLaunch(varlen_kernel_table()["varlen_fwd"], (cdiv(max_q, cfg.block_m), batch * heads), (
        scale * LOG2E, *_window_softcap_scalars(max_q, max_k, scale, window, softcap),
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), alibi_stride or 0,
        heads, heads // kv_heads, total_q),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.stages(False),
        **_constexprs(head_dim, causal, q.dtype, window, softcap, alibi_stride))


def varlen_forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float, window=None,
                   softcap=None, alibi_slopes=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): out like q (total_q, H, D); lse (H, total_q) float32 in base 2, +inf for rows
    with no key. Inputs validated (gpuparity.attention_varlen); rows of one head are contiguous.
    alibi_slopes fp32 (H,) or (B, H): -slope * |i + Sk - Sq - j| per sequence, in the kernels."""
    total_q, heads, _ = q.shape
    batch = cu_q.shape[0] - 1
    out = torch.empty_like(q)
    lse = torch.empty(heads, total_q, dtype=torch.float32, device=q.device)
    if out.numel() == 0 or batch == 0 or max_q == 0:
        return out.zero_(), lse.fill_(float("inf"))
    if k.shape[0] == 0 or max_k == 0:  # no sequence has a key: every row is empty
        return out.zero_(), lse.fill_(float("inf"))
    alibi, alibi_stride = _alibi(q, alibi_slopes)
    forward = _planned(_key(q, k, v, cu_q, max_q, max_k, causal, scale, window, softcap, alibi_stride, ("fwd",)),
                       lambda: _forward_launch(q, k, v, out, batch, max_q, max_k, causal, scale, window, softcap,
                                               alibi_stride))
    forward(q, k, v, out, lse, cu_q, cu_k, alibi)
    return out, lse


def _backward_launches(q, k, v, out, dout, dq, dk, dv, batch, max_q, max_k, causal, scale, window, softcap,
                       alibi_stride):
    total_q, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    constexprs = _constexprs(head_dim, causal, q.dtype, window, softcap, alibi_stride)
    extra = _window_softcap_scalars(max_q, max_k, scale, window, softcap)
    cfg = tile_config("dq", q.device, head_dim, q.dtype, max_k)
    dq_launch = PreparedLaunch(varlen_kernel_table()["varlen_dq"], (cdiv(max_q, cfg.block_m), batch * heads), (
        scale * LOG2E, scale, *extra,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *dout.stride(), *dq.stride(), alibi_stride or 0,
        heads, heads // kv_heads, total_q),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.stages(False),
        **constexprs)
    cfg = tile_config("dkdv", q.device, head_dim, q.dtype, max_k, alibi=alibi_stride is not None)
    dkdv_launch = PreparedLaunch(varlen_kernel_table()["varlen_dkdv"], (cdiv(max_k, cfg.block_n), batch * kv_heads), (
        scale * LOG2E, scale, *extra,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(), alibi_stride or 0,
        heads, kv_heads, heads // kv_heads, total_q),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.stages(False),
        **constexprs)
    return dq_launch, dkdv_launch


def varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float,
                    window=None, softcap=None, alibi_slopes=None):
    """(dq, dk, dv) like q, k, v; deterministic (no atomics)."""
    batch = cu_q.shape[0] - 1
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0 or batch == 0 or max_q == 0 or max_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    dout = dout.contiguous() if dout.stride(-1) != 1 else dout
    alibi, alibi_stride = _alibi(q, alibi_slopes)
    key = _key(q, k, v, cu_q, max_q, max_k, causal, scale, window, softcap, alibi_stride, ("bwd", dout.stride()))
    dq_launch, dkdv_launch = _planned(key, lambda: _backward_launches(
        q, k, v, out, dout, dq, dk, dv, batch, max_q, max_k, causal, scale, window, softcap, alibi_stride))
    delta = torch.empty((2,) + tuple(lse.shape), dtype=torch.float32, device=lse.device)   # delta and top
    dq_launch(q, k, v, out, dout, lse, delta, dq, cu_q, cu_k, alibi)  # first: it writes delta
    dkdv_launch(q, k, v, dout, lse, delta, dk, dv, cu_q, cu_k, alibi)
    return dq, dk, dv


def _forward_saving_ctx(ctx, q, k, v, cu_q, cu_k, call, alibi_slopes):
    """The autograd forward of TritonAttentionVarlen(Lse): (out, lse in base 2), what the backward needs kept in ctx."""
    max_q, max_k, causal, scale, window, softcap = call
    out, lse = varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, alibi_slopes)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes)
    ctx.call = call
    return out, lse


class TritonAttentionVarlen(torch.autograd.Function):
    """Inputs q, k, v, the cumulative lengths, one tuple of everything else and the ALiBi slopes."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, call, alibi_slopes=None):
        return _forward_saving_ctx(ctx, q, k, v, cu_q, cu_k, call, alibi_slopes)[0]

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k, alibi_slopes = ctx.saved_tensors
        max_q, max_k, causal, scale, window, softcap = ctx.call
        dq, dk, dv = varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
                                     window, softcap, alibi_slopes)
        return dq, dk, dv, None, None, None, None


class TritonAttentionVarlenLse(torch.autograd.Function):
    """TritonAttentionVarlen that also returns the kernels' own log-sum-exp in natural log: fp32
    (H, total_q), +inf for a row with no key, no gradient (FlashAttention's varlen softmax_lse)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, call, alibi_slopes=None):
        out, lse = _forward_saving_ctx(ctx, q, k, v, cu_q, cu_k, call, alibi_slopes)
        return out, natural_lse(ctx, lse)

    @staticmethod
    def backward(ctx, dout, _dlse):
        return TritonAttentionVarlen.backward(ctx, dout)


def _normalized(q, k, v, scale, window, softcap):
    """(q, k, v, scale, window, softcap) as the kernels take them: window (-1, -1) and softcap
    None/0 mean off; the kernels step through rows and heads by stride, but the head dim must be
    unit-stride to vectorize."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    window = None if window is None or tuple(window) == (-1, -1) else (int(window[0]), int(window[1]))
    softcap = None if not softcap else float(softcap)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return q, k, v, scale, window, softcap


def triton_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                            window=None, softcap=None, scale=None, alibi_slopes=None, return_lse: bool = False):
    """The kernel behind backend "triton" of "attention_varlen"; inputs validated by
    gpuparity.attention_varlen. alibi_slopes fp32 (H,) or (B, H) (checked here): FlashAttention's
    ALiBi, -slope * |i + Sk - Sq - j| on each sequence's own lengths, computed in the kernels.
    return_lse: (out, lse), lse the kernels' fp32 (H, total_q) natural log-sum-exp (+inf for a row
    with no key; no gradient)."""
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, cu_seqlens_q.shape[0] - 1, q.shape[1], q.device)
        alibi_slopes = alibi_slopes.detach()
    q, k, v, scale, window, softcap = _normalized(q, k, v, scale, window, softcap)
    call = (int(max_seqlen_q), int(max_seqlen_k), bool(causal), scale, window, softcap)
    function = TritonAttentionVarlenLse if return_lse else TritonAttentionVarlen
    return function.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, call, alibi_slopes)


# The forward/backward split the torch.library op calls (gpuparity.ops.library_varlen): a compiled
# graph saves (out, lse) and runs the fused backward kernels, as TritonAttentionVarlen does eagerly.
def varlen_forward_saving(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                          window=None, softcap=None, scale=None):
    q, k, v, scale, window, softcap = _normalized(q, k, v, scale, window, softcap)
    out, lse = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                              bool(causal), scale, window, softcap)
    return out, (lse,)


def varlen_backward_from(dout, saved, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                         causal=False, window=None, softcap=None, scale=None):
    out, lse = saved
    q, k, v, scale, window, softcap = _normalized(q, k, v, scale, window, softcap)
    return varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                           int(max_seqlen_k), bool(causal), scale, window, softcap)


__all__ = ["TritonAttentionVarlen", "triton_attention_varlen", "varlen_backward", "varlen_backward_from",
           "varlen_forward", "varlen_forward_saving", "varlen_kernel_table"]
