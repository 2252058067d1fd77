"""FlashAttention 2.8's Python API (flash_attn.flash_attn_interface) on gpuparity's verified ops.

Same names, argument names, defaults, layouts ((B, S, H, D); packed (total, H, D)) and return
values as FlashAttention 2.8, and its conventions: causal and window_size are bottom-right aligned
when Sq != Sk, softcap=0.0 is off, ALiBi slopes add -slope * |i + Sk - Sq - j|. What each argument
maps to, and which features are composed rather than fused, is in docs/attention.md
("FlashAttention's API"). Also FlashAttention's module-level USE_TRITON_ROCM and _get_block_size_n.
return_attn_probs with dropout_p > 0 returns S_dmask in FlashAttention's encoding (testing only, as
there: a (B, H, Sq, Sk) fp32 pass). deterministic=True runs the call on a backend whose backward
gives the same bits on every run (gpuparity's Triton kernels, which have no atomics, or torch math:
auto's verified choice where it is one, else the first such backend verified here: `_deterministic.py`).
Differences a caller can see: num_splits is accepted and ignored, and bad arguments raise
FlashAttnArgumentError (a ValueError and a RuntimeError) naming the argument.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Dict, Optional, Union

import torch

from ..registry import BackendUnavailable
from ..ops import dropout as _dropout
from ..ops.attention import attention, attention_lse, attention_problem
from ..ops.decode import MAX_NEW_QUERIES, attention_decode, decode_problem
from ..ops.rotary import apply_rotary
from ..ops.varlen import attention_varlen, attention_varlen_problem
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor
from . import _compose as C
from . import _deterministic
from ._compose import FlashAttnArgumentError

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
           "FlashAttnArgumentError", "backends", "USE_TRITON_ROCM"]

# The backend each gpuparity op runs on ("auto": the fastest verified on this machine).
_BACKENDS: Dict[str, str] = {"attention": "auto", "attention_varlen": "auto", "attention_decode": "auto",
                             "rotary": "auto", "cross_entropy": "auto", "residual_norm": "auto"}


@contextlib.contextmanager
def backends(**names: str):
    """Run the calls inside on the named backends, e.g. backends(attention="triton"), keys
    "attention", "attention_varlen", "attention_decode", "rotary" (see gpuparity.dispatch.backends(op)),
    "cross_entropy" (ops.triton.cross_entropy's loss: a backend of op cross_entropy, "triton" its loss
    kernels, any other the torch row step; "auto" the kernels where that backend's verdict passed) and
    "residual_norm" (ops.triton.layer_norm's fused residual add and norm)."""
    unknown = sorted(set(names) - set(_BACKENDS))
    if unknown:
        raise TypeError(f"backends: unknown op(s) {unknown}; expected keys among {sorted(_BACKENDS)}")
    saved = dict(_BACKENDS)
    _BACKENDS.update(names)
    try:
        yield
    finally:
        _BACKENDS.clear()
        _BACKENDS.update(saved)


# FlashAttention's flag "the attention runs on its Triton kernels for AMD": set from the same
# environment variable, and True on a ROCm build of torch, where FlashAttention without its
# compiled CUDA/HIP extension (absent here) falls back to those kernels. gpuparity's own
# kernels serve either way; code that reads the flag to pick a code path sees FlashAttention's answer.
def _triton_rocm_flag() -> bool:
    return (os.getenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "FALSE") == "TRUE"
            or getattr(torch.version, "hip", None) is not None)


USE_TRITON_ROCM = _triton_rocm_flag()


def _get_block_size_n(device, head_dim, is_dropout, is_causal) -> int:
    """The key-block width of FlashAttention 2's CUDA forward kernel for this call (its tests split
    the scores in such blocks to decode S_dmask): 128 for head_dim <= 32; 128 (64 with dropout) up
    to 64; 64 up to 96; up to 128: 64 (32 with dropout), on sm86/sm89 64 only causal without
    dropout, else 32; 64 up to 256. The compute capability is read on a CUDA device; elsewhere the
    sm80/sm90 column."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not 0 < head_dim <= 256:
        raise FlashAttnArgumentError(f"head_dim: expected an int in [1, 256] (FlashAttention's largest), got "
                                     f"{describe(head_dim)}")
    device = torch.device(device) if device is not None else None
    on_cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
    major, minor = torch.cuda.get_device_capability(device) if on_cuda else (0, 0)
    is_sm8x = major == 8 and minor > 0   # sm86 / sm89, not the A100's sm80
    if head_dim <= 32:
        return 128
    if head_dim <= 64:
        return 64 if is_dropout else 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        if is_sm8x:
            return 64 if (is_causal and not is_dropout) else 32
        return 32 if is_dropout else 64
    return 64


def _fa_lse(lse: torch.Tensor) -> torch.Tensor:
    # a row that sees no key: FlashAttention's kernels report +inf there (gpuparity's lse: -inf)
    return lse.masked_fill(torch.isneginf(lse), float("inf"))


def _check_dense(q, k, v):
    expect_tensor("q", q, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_tensor("k", k, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_tensor("v", v, ndim=(4,), dtypes=FLOAT_DTYPES)
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] or tuple(v.shape) != tuple(k.shape):
        raise FlashAttnArgumentError(
            f"k, v: expected (batch_size, seqlen_k, nheads_k, headdim) with batch_size={q.shape[0]} and headdim="
            f"{q.shape[3]} of q, got k {describe(k)}, v {describe(v)}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise FlashAttnArgumentError(
            f"k: expected nheads_k dividing nheads={q.shape[2]} of q (MQA/GQA) in (batch_size, seqlen_k, nheads_k, "
            f"headdim), got k {describe(k)} (nheads_k={k.shape[2]})")


# ----------------------------------------------------------------------------- deterministic
def _backend(op: str, problem, deterministic: bool) -> str:
    """The backend name a call of `op` runs on: backends()'s, and with deterministic=True one whose
    backward is deterministic, by name (_deterministic.backend_for): auto's verified choice where
    it is one, else the first such backend verified here; a named backend that is not one is
    refused. `problem` is None when not deterministic (nothing to decide)."""
    name = _BACKENDS[op]
    return _deterministic.backend_for(op, name, problem) if deterministic else name


# ----------------------------------------------------------------------------- ALiBi
def _on_triton(op: str, problem) -> bool:
    """Whether `problem` (a call's masks and flags, its ALiBi aside) runs on backend "triton" of `op`:
    named through backends() (forced, as the ops force a named backend: one that cannot serve raises
    its reasons), or auto's verified choice here. Such a call gets ALiBi inside the Triton kernels; any
    other backend the composed (B, H, Sq, Sk) fp32 bias. Under auto the dense kernels must also pass
    the battery's ALiBi cases here (kind "<kind>+alibi", which only backends that opt in to "alibi"
    serve), the dense kernels the attention contract's, the varlen kernels the varlen contract's, the
    split-KV decode kernel the attention_decode contract's.
    Never while torch.compile traces: the ops are torch.library ops there, without ALiBi."""
    if torch.compiler.is_compiling():
        return False
    name = _BACKENDS[op]
    if _dropout.resolve(problem, name).name != "triton":
        return False
    if name != "auto":
        return True
    alibi = dataclasses.replace(problem, kind=problem.kind + "+alibi", features=problem.features + (("alibi", True),))
    try:
        return _dropout.resolve(alibi, "auto").name == "triton"
    except BackendUnavailable:   # not verified for ALiBi here: the composed bias serves
        return False


# ----------------------------------------------------------------------------- dense
def _alibi_in_kernels(q, k, v, slopes, allowed, is_causal, window, softcap, dropout_p, scale, return_lse,
                      key_lengths=None, generator=None):
    """(out, lse or None) with ALiBi in the dense Triton kernels, or None where the call runs
    elsewhere (q, k, v (B, H, S, D) views; allowed a bool mask broadcastable to (B, H, Sq, Sk) or
    None; key_lengths (B,): keys past them are padding and each item's diagonal sits at its length,
    as FlashAttention's KV cache)."""
    problem = attention_problem(q, k, v, attn_mask=allowed, is_causal=is_causal, scale=scale, window=window,
                                softcap=softcap, dropout_p=dropout_p)
    if not _on_triton("attention", problem):
        return None
    from ..backends.triton_attention import triton_attention
    seed = _dropout.draw_seed(q.device, generator) if dropout_p else None   # as gpuparity.attention draws it
    result = triton_attention(q, k, v, attn_mask=allowed, is_causal=is_causal, scale=scale, window=window,
                              softcap=softcap, dropout_p=float(dropout_p), seed=seed, alibi_slopes=slopes,
                              key_lengths=key_lengths, return_lse=return_lse)
    return result if return_lse else (result, None)


def _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_lse, generator=None,
           deterministic=False):
    """(out (B, Sq, H, D), lse (B, H, Sq) or None) through gpuparity.attention, or with ALiBi on the
    Triton backend through its kernels (no bias tensor)."""
    _check_dense(q, k, v)
    batch, q_len, heads, _ = q.shape
    k_len = k.shape[1]
    left, right = C.window_bounds(window_size, causal)
    is_causal, window, allowed = C.dense_masks(q_len, k_len, left, right, q.device)
    allowed = None if allowed is None else allowed.view(1, 1, q_len, k_len)
    bias = None
    if alibi_slopes is not None:
        slopes = C.check_slopes(alibi_slopes, batch, heads, q.device)
        fused = _alibi_in_kernels(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), slopes, allowed,
                                  is_causal, window, C.softcap_value(softcap), dropout_p, softmax_scale, return_lse,
                                  generator=generator)
        if fused is not None:
            out, lse = fused
            return out.transpose(1, 2).contiguous(), (None if lse is None else _fa_lse(lse))
        bias = C.alibi_bias(slopes, q_len, k_len, k_len - q_len)
    mask = C.with_bias(allowed, bias)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    problem = attention_problem(qt, kt, vt, attn_mask=mask, is_causal=is_causal, scale=softmax_scale, window=window,
                                softcap=C.softcap_value(softcap), dropout_p=dropout_p) if deterministic else None
    result = attention(qt, kt, vt, attn_mask=mask, is_causal=is_causal, scale=softmax_scale, window=window,
                       softcap=C.softcap_value(softcap), dropout_p=dropout_p, generator=generator,
                       backend=_backend("attention", problem, deterministic), return_lse=return_lse)
    out, lse = result if return_lse else (result, None)
    return out.transpose(1, 2).contiguous(), (None if lse is None else _fa_lse(lse))


def _returned(out, lse, return_attn_probs, s_dmask=None):
    # S_dmask: FlashAttention's testing-only probabilities with the dropout pattern (None without dropout)
    return (out, lse, s_dmask) if return_attn_probs else out


def _seeded(device) -> tuple:
    """(a generator whose next draw is the call's dropout seed, that seed), the default generator
    of `device` advanced as the call itself would advance it: S_dmask regenerates the call's mask."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        default = torch.cuda.default_generators[index]
    else:
        default = torch.default_generator
    generator = default.clone_state()
    return generator, _dropout.draw_seed(device)


def _s_dmask(q, k, dropout_p, scale, softcap, allowed, bias, seed, causal):
    """S_dmask of a dropout call on (B, Sq, H, D) q and k (varlen: padded), its keep mask
    regenerated from the call's seed (gpuparity.attention_dropout_mask)."""
    keep = _dropout.attention_dropout_mask(q.shape[0], q.shape[2], q.shape[1], k.shape[1], float(dropout_p), seed,
                                           q.device)
    block_n = _get_block_size_n(q.device, q.shape[3], True, causal)
    with torch.no_grad():   # FlashAttention's S_dmask carries no gradient
        return C.dropout_probs_encoding(q, k, allowed, bias, scale, softcap, keep, block_n)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q: (batch_size, seqlen_q, nheads, headdim); k, v: (batch_size, seqlen_k, nheads_k, headdim),
    nheads % nheads_k == 0 (MQA/GQA). causal and window_size=(left, right) are bottom-right aligned:
    query i sees keys i + Sk - Sq - left .. i + Sk - Sq + right (-1: unbounded; causal: right = 0);
    a row that sees no key returns zeros. softcap > 0: scores s become softcap * tanh(s / softcap).
    alibi_slopes (nheads,) or (batch_size, nheads) fp32: adds -slope * |i + Sk - Sq - j|.
    dropout_p: gpuparity.attention's dropout (its seed from torch's generator). Returns out
    (batch_size, seqlen_q, nheads, headdim); with return_attn_probs (out, softmax_lse
    (batch_size, nheads, seqlen_q) fp32, S_dmask): S_dmask None without dropout, else
    (batch_size, nheads, round128(seqlen_q), round128(seqlen_k)) in FlashAttention's encoding
    (unnormalized probabilities per key block of _get_block_size_n, negative where dropped)."""
    with_probs = bool(return_attn_probs) and dropout_p > 0
    generator, seed = _seeded(q.device) if with_probs else (None, None)
    out, lse = _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      bool(return_attn_probs), generator, bool(deterministic))
    s_dmask = None
    if with_probs:
        batch, q_len, heads, _ = q.shape
        k_len = k.shape[1]
        full = torch.full((batch,), q_len, device=q.device), torch.full((batch,), k_len, device=q.device)
        allowed = C.item_allowed(*full, q_len, k_len, *C.window_bounds(window_size, causal))
        bias = None if alibi_slopes is None else C.alibi_bias(C.check_slopes(alibi_slopes, batch, heads, q.device),
                                                               q_len, k_len, k_len - q_len)
        s_dmask = _s_dmask(q, k, dropout_p, softmax_scale, C.softcap_value(softcap), allowed, bias, seed, causal)
    return _returned(out, lse, return_attn_probs, s_dmask)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv: (batch_size, seqlen, 3, nheads, headdim); otherwise flash_attn_func."""
    expect_tensor("qkv", qkv, ndim=(5,), dtypes=FLOAT_DTYPES)
    if qkv.shape[2] != 3:
        raise FlashAttnArgumentError(f"qkv: expected shape (batch_size, seqlen, 3, nheads, headdim), got {describe(qkv)}")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv: (batch_size, seqlen_k, 2, nheads_k, headdim); otherwise flash_attn_func."""
    expect_tensor("kv", kv, ndim=(5,), dtypes=FLOAT_DTYPES)
    if kv.shape[2] != 2:
        raise FlashAttnArgumentError(f"kv: expected shape (batch_size, seqlen_k, 2, nheads_k, headdim), got {describe(kv)}")
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


# ----------------------------------------------------------------------------- varlen
def _varlen_padded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, left, right, scale, softcap,
                   alibi_slopes, dropout_p, want_out, want_lse, want_probs=False, causal=False, deterministic=False):
    """The packed sequences padded into one dense batch with a per-item mask (bottom-right window,
    padding, ALiBi as a bias) through gpuparity.attention: the composition that serves ALiBi and
    dropout in varlen, and the log-sum-exp. Returns (out (total_q, H, D) or None, lse (H, total_q) or None,
    S_dmask (B, H, round128(max_seqlen_q), round128(max_seqlen_k)) or None: want_probs, with dropout)."""
    C.check_max_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    batch, heads = cu_seqlens_q.numel() - 1, q.shape[1]
    rows_q = C.padded_rows(cu_seqlens_q, q.shape[0], max_seqlen_q)
    rows_k = C.padded_rows(cu_seqlens_k, k.shape[0], max_seqlen_k)
    q_lens, k_lens = C.lengths(cu_seqlens_q), C.lengths(cu_seqlens_k)
    allowed = C.item_allowed(q_lens, k_lens, max_seqlen_q, max_seqlen_k, left, right)
    bias = None
    if alibi_slopes is not None:
        bias = C.alibi_bias(C.check_slopes(alibi_slopes, batch, heads, q.device), max_seqlen_q, max_seqlen_k,
                            k_lens - q_lens)
    mask = C.with_bias(allowed, bias)
    qp, kp, vp = (C.pad(t, rows, batch, width).transpose(1, 2)
                  for t, rows, width in ((q, rows_q, max_seqlen_q), (k, rows_k, max_seqlen_k), (v, rows_k, max_seqlen_k)))
    out = lse = s_dmask = None
    want_probs = want_probs and dropout_p > 0
    generator, seed = _seeded(q.device) if want_probs else (None, None)
    if want_out:
        problem = attention_problem(qp, kp, vp, attn_mask=mask, scale=scale, softcap=softcap,
                                    dropout_p=dropout_p) if deterministic else None
        out = attention(qp, kp, vp, attn_mask=mask, scale=scale, softcap=softcap, dropout_p=dropout_p,
                        generator=generator, backend=_backend("attention", problem, deterministic))
        out = out.transpose(1, 2).reshape(batch * max_seqlen_q, heads, q.shape[2])[rows_q]
    if want_probs:
        s_dmask = _s_dmask(qp.transpose(1, 2), kp.transpose(1, 2), dropout_p, scale, softcap, allowed, bias, seed,
                           causal)
    if want_lse:
        lse = attention_lse(qp, kp, attn_mask=mask, scale=scale, softcap=softcap)
        lse = _fa_lse(lse.permute(1, 0, 2).reshape(heads, batch * max_seqlen_q)[:, rows_q])
    return out, lse, s_dmask


def _unpage(k, v, block_table, cu_seqlens_k):
    """Paged k, v (num_blocks, page_block_size, nheads_k, headdim) read through block_table into
    packed (total_k, nheads_k, headdim), sequence b's keys 0..len_b-1 on its table's pages."""
    for name, t in (("k", k), ("v", v)):
        expect_tensor(name, t, ndim=(4,), dtypes=FLOAT_DTYPES)
    if tuple(v.shape) != tuple(k.shape):
        raise FlashAttnArgumentError(f"v: expected the shape of the paged k {tuple(k.shape)}, got {describe(v)}")
    expect_tensor("cu_seqlens_k", cu_seqlens_k, ndim=(1,), dtypes=(torch.int32, torch.int64))
    k_lens = C.lengths(cu_seqlens_k)
    C.check_block_table(block_table, k_lens.numel(), k, k_lens, "cu_seqlens_k")
    total = int(cu_seqlens_k[-1]) if cu_seqlens_k.numel() else 0
    item = torch.repeat_interleave(torch.arange(k_lens.numel(), device=k.device), k_lens, output_size=total)
    position = torch.arange(total, device=k.device) - cu_seqlens_k.long()[item]
    pages, slots = C.page_slots(block_table, position, item, k.shape[1])
    return k[pages, slots], v[pages, slots]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q: (total_q, nheads, headdim), k, v: (total_k, nheads_k, headdim), sequence b the rows
    cu_seqlens[b]:cu_seqlens[b+1]; causal and window bottom-right aligned per sequence. With
    block_table (batch_size, max_num_blocks_per_seq) int32, k and v are a paged pool
    (num_blocks, page_block_size, nheads_k, headdim) and sequence b's keys 0..len_b-1 sit on pages
    block_table[b] (differentiable: the pool's gradient is zero on pages no sequence reads). Returns
    out (total_q, nheads, headdim); with return_attn_probs (out, softmax_lse (nheads, total_q) fp32,
    S_dmask): S_dmask as flash_attn_func's, (batch_size, nheads, round128(max_seqlen_q),
    round128(max_seqlen_k)), sequence b's queries and keys from 0."""
    if block_table is not None:   # the page gather is an index: gradients flow back into the pool's pages
        k, v = _unpage(k, v, block_table, cu_seqlens_k)
    left, right = C.window_bounds(window_size, causal)
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    # sides too wide to bound any query of any sequence (left >= Sk - 1, right >= Sq - 1): unbounded
    left = -1 if left >= max_seqlen_k else left
    right = -1 if right >= max_seqlen_q else right
    varlen_causal = (left, right) == (-1, 0)
    window = None if varlen_causal or (left, right) == (-1, -1) else (left, right)
    softcap = C.softcap_value(softcap)
    # validates q, k, v, cu_seqlens and max_seqlen (the composed paths too)
    problem = attention_varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                       causal=varlen_causal, window=window, softcap=softcap, scale=softmax_scale)
    if alibi_slopes is not None:
        slopes = C.check_slopes(alibi_slopes, cu_seqlens_q.numel() - 1, q.shape[1], q.device)
        if dropout_p == 0.0 and _on_triton("attention_varlen", problem):
            # ALiBi inside the varlen kernels, per sequence on its own lengths: nothing padded
            from ..backends.triton_attention import triton_attention_varlen
            result = triton_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                             causal=varlen_causal, window=window, softcap=softcap,
                                             scale=softmax_scale, alibi_slopes=slopes,
                                             return_lse=bool(return_attn_probs))
            out, lse = result if return_attn_probs else (result, None)
            return _returned(out, None if lse is None else _fa_lse(lse), return_attn_probs)
    composed = alibi_slopes is not None or dropout_p != 0.0
    out = None
    if not composed:
        out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=varlen_causal,
                               window=window, softcap=softcap, scale=softmax_scale,
                               backend=_backend("attention_varlen", problem, bool(deterministic)))
    lse = s_dmask = None
    if composed or return_attn_probs:
        padded_out, lse, s_dmask = _varlen_padded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                  left, right, softmax_scale, softcap, alibi_slopes, dropout_p,
                                                  composed, bool(return_attn_probs), bool(return_attn_probs), causal,
                                                  bool(deterministic))
        out = padded_out if composed else out
    return _returned(out, lse, return_attn_probs, s_dmask)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv: (total, 3, nheads, headdim); otherwise flash_attn_varlen_func with the same sequences for q and k."""
    expect_tensor("qkv", qkv, ndim=(4,), dtypes=FLOAT_DTYPES)
    if qkv.shape[1] != 3:
        raise FlashAttnArgumentError(f"qkv: expected shape (total, 3, nheads, headdim), got {describe(qkv)}")
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv: (total_k, 2, nheads_k, headdim); otherwise flash_attn_varlen_func."""
    expect_tensor("kv", kv, ndim=(4,), dtypes=FLOAT_DTYPES)
    if kv.shape[1] != 2:
        raise FlashAttnArgumentError(f"kv: expected shape (total_k, 2, nheads_k, headdim), got {describe(kv)}")
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


# ----------------------------------------------------------------------------- KV cache
def _check_kvcache(q, k_cache, v_cache, k, v, block_table):
    expect_tensor("q", q, ndim=(4,), dtypes=FLOAT_DTYPES)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        expect_tensor(name, t, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_same_dtype("q", q, k_cache=k_cache, v_cache=v_cache)
    expect_same_device("q", q, k_cache=k_cache, v_cache=v_cache)
    batch, _, heads, head_dim = q.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise FlashAttnArgumentError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {describe(v_cache)}")
    layout = "(num_blocks, page_block_size, nheads_k, headdim)" if block_table is not None else \
        "(batch_size_cache, seqlen_cache, nheads_k, headdim)"
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or kv_heads == 0 or heads % kv_heads:
        raise FlashAttnArgumentError(f"k_cache: expected {layout} with headdim={head_dim} and nheads_k dividing "
                                     f"nheads={heads} of q, got {describe(k_cache)}")
    if (k is None) != (v is None):
        raise FlashAttnArgumentError(f"k, v: pass both new keys and values or neither, got k {describe(k)}, v {describe(v)}")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            expect_tensor(name, t, ndim=(4,), dtypes=FLOAT_DTYPES)
            if t.shape[0] != batch or t.shape[2] != kv_heads or t.shape[3] != head_dim:
                raise FlashAttnArgumentError(f"{name}: expected (batch_size={batch}, seqlen_new, nheads_k={kv_heads}, "
                                             f"headdim={head_dim}), got {describe(t)}")
        if tuple(v.shape) != tuple(k.shape):
            raise FlashAttnArgumentError(f"v: expected the shape of k {tuple(k.shape)}, got {describe(v)}")
        expect_same_dtype("q", q, k=k, v=v)
        expect_same_device("q", q, k=k, v=v)


def _index(name, value, batch, device):
    if value is None:
        return None
    expect_tensor(name, value, ndim=(1,), dtypes=(torch.int32, torch.int64))
    if value.shape[0] != batch or value.device != device:
        raise FlashAttnArgumentError(f"{name}: expected ({batch},) (one per sequence) on {device}, got {describe(value)}")
    return value.long()


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None,
                            block_table: Optional[torch.Tensor] = None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None,
                            num_splits=0, return_softmax_lse=False):
    """Attention of q (batch_size, seqlen_q, nheads, headdim) against a KV cache, after appending
    k, v (batch_size, seqlen_new, nheads_k, headdim) in place at cache_seqlens (rotated first by
    rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2) when given, q too: at cache_seqlens + i when
    causal or local, else all at cache_seqlens). k_cache, v_cache: (batch_size_cache, seqlen_cache,
    nheads_k, headdim), rows chosen by cache_batch_idx; or with block_table (batch_size,
    max_num_blocks_per_seq) int32 a paged pool (num_blocks, page_block_size, nheads_k, headdim), any
    page size. cache_seqlens: int or (batch_size,) tokens already cached (None: the whole cache);
    cache_leftpad (batch_size,): keys before it are padding. causal and window bottom-right
    aligned on each item's length; alibi_slopes as flash_attn_func. Inference only (raises if a
    gradient is asked for); num_splits is ignored. Returns out (batch_size, seqlen_q, nheads,
    headdim), with return_softmax_lse (out, lse (batch_size, nheads, seqlen_q) fp32)."""
    _check_kvcache(q, k_cache, v_cache, k, v, block_table)
    C.check_grad_free("flash_attn_with_kvcache", q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    batch, q_len, heads, head_dim = q.shape
    device = q.device
    paged = block_table is not None
    if paged and (cache_batch_idx is not None or cache_leftpad is not None):
        raise FlashAttnArgumentError("block_table: a paged cache takes neither cache_batch_idx nor cache_leftpad "
                                     "(as in FlashAttention)")
    new_len = 0 if k is None else k.shape[1]
    width = block_table.shape[1] * k_cache.shape[1] if paged and isinstance(block_table, torch.Tensor) and \
        block_table.dim() == 2 else k_cache.shape[1]
    if cache_seqlens is None:
        seqlens = torch.full((batch,), width, dtype=torch.long, device=device)
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        seqlens = torch.full((batch,), cache_seqlens, dtype=torch.long, device=device)
    else:
        seqlens = _index("cache_seqlens", cache_seqlens, batch, device)
    batch_idx = _index("cache_batch_idx", cache_batch_idx, batch, device)
    leftpad = _index("cache_leftpad", cache_leftpad, batch, device)
    ends = seqlens + new_len
    if paged:
        C.check_block_table(block_table, batch, k_cache, ends, "cache_seqlens + seqlen_new")
    elif not C.capturing(device):
        if batch_idx is not None and batch and (int(batch_idx.min()) < 0 or int(batch_idx.max()) >= k_cache.shape[0]):
            raise FlashAttnArgumentError(f"cache_batch_idx: expected rows of k_cache in [0, {k_cache.shape[0]}), got "
                                         f"{batch_idx.tolist()}")
        if batch_idx is None and k_cache.shape[0] < batch:
            raise FlashAttnArgumentError(f"k_cache: expected at least batch_size={batch} rows without cache_batch_idx, "
                                         f"got {describe(k_cache)}")
        if batch and (int(seqlens.min()) < 0 or int(ends.max()) > width):
            raise FlashAttnArgumentError(f"cache_seqlens: expected 0 <= cache_seqlens and cache_seqlens + seqlen_new "
                                         f"({new_len}) <= seqlen_cache ({width}), got {seqlens.tolist()}")
    left, right = C.window_bounds(window_size, causal)
    # FlashAttention rotates q at cache_seqlens + i when causal or local, judged after its C++
    # turns a side >= the cache's length into unbounded
    local = (0 <= left < width) or (0 <= right < width)
    # sides too wide to bound any query (left >= Sk - 1, right >= Sq - 1): unbounded
    left = -1 if left >= width else left
    right = -1 if right > 0 and right >= q_len - 1 else right
    if rotary_cos is not None or rotary_sin is not None:
        if k is None:
            raise FlashAttnArgumentError("rotary_cos: rotary embedding applies to new keys; pass k and v with it "
                                         "(as in FlashAttention)")
        if rotary_cos is None or rotary_sin is None:
            raise FlashAttnArgumentError("rotary_cos, rotary_sin: pass both or neither")
        rotate = dict(interleaved=bool(rotary_interleaved), seqlen_offsets=seqlens, backend=_BACKENDS["rotary"])
        k = apply_rotary(k, rotary_cos, rotary_sin, **rotate)
        if local:                     # causal or local: query i at position cache_seqlens + i
            q = apply_rotary(q, rotary_cos, rotary_sin, **rotate)
        else:                         # otherwise every query at position cache_seqlens
            q = apply_rotary(q.reshape(batch, 1, q_len * heads, head_dim), rotary_cos, rotary_sin,
                             **rotate).view(batch, q_len, heads, head_dim)
    item = torch.arange(batch, device=device)
    if k is not None and new_len:
        positions = seqlens.view(-1, 1) + torch.arange(new_len, device=device).view(1, -1)
        items = item.view(-1, 1).expand(batch, new_len)
        if paged:
            where = C.page_slots(block_table, positions, items, k_cache.shape[1])
        else:
            where = ((items if batch_idx is None else batch_idx[items]), positions)
        k_cache.index_put_(where, k)
        v_cache.index_put_(where, v)
    # read keys only up to the longest item (the checks above already read the lengths on the host)
    span = width if C.capturing(device) or not batch else max(1, min(width, int(ends.max())))
    if leftpad is None and left < 0 and (right == 0 or q_len == 1) and q_len <= MAX_NEW_QUERIES and \
            not return_softmax_lse:
        # FlashAttention's decode case (causal; one query needs no mask): the split-KV decode kernel
        # reads the cache through strides, its lengths bottom-right aligned as FlashAttention's; a
        # paged pool as its (num_blocks, nheads_k, page_block_size, headdim) view with the table's
        # first pages up to the longest item (the kernel reads the pages in place, no gather)
        if paged:
            table = block_table[:, :-(-span // k_cache.shape[1])]
            keys, values, pages = k_cache, v_cache, {"block_table": table}
        else:
            # without cache_batch_idx the cache's first rows, as views (no copy)
            keys, values, pages = ((k_cache[:batch, :span], v_cache[:batch, :span]) if batch_idx is None else
                                   (k_cache[batch_idx, :span], v_cache[batch_idx, :span])) + ({},)
        args = (q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), ends)
        options = dict(scale=softmax_scale, softcap=C.softcap_value(softcap), **pages)
        out = None
        if alibi_slopes is None:
            out = attention_decode(*args, backend=_BACKENDS["attention_decode"], **options)
        else:
            # ALiBi in the split-KV kernel where it serves this call (named, or auto's choice verified
            # on the decode contract's ALiBi cases); elsewhere the masked path below composes the bias
            slopes = C.check_slopes(alibi_slopes, batch, heads, device)
            if _on_triton("attention_decode", decode_problem(*args, **options)):
                from ..backends.triton_decode import triton_decode
                out = triton_decode(*args, alibi_slopes=slopes, **options)
        if out is not None:
            return out.transpose(1, 2).contiguous()
    if paged:   # the masked dense path (window, leftpad, lse, ALiBi off the decode kernel): pages gathered
        keys, values = C.gather_pages(k_cache, block_table, span), C.gather_pages(v_cache, block_table, span)
    else:
        keys, values = ((k_cache[:batch, :span], v_cache[:batch, :span]) if batch_idx is None else
                        (k_cache[batch_idx, :span], v_cache[batch_idx, :span]))
    q_lens = torch.full((batch,), q_len, dtype=torch.long, device=device)
    bias = None
    if alibi_slopes is not None:
        slopes = C.check_slopes(alibi_slopes, batch, heads, device)
        # the kernels take the lengths (keys past an item's length, and its diagonal); a mask only
        # for what lengths cannot say: left padding, a left window, a bottom-right right side
        # bounding some query (one query sees every key up to its item's length whatever the right side)
        masked = leftpad is not None or left >= 0 or (right >= 0 and q_len > 1)
        allowed = C.item_allowed(q_lens, ends, q_len, span, left, right, key_start=leftpad) if masked else None
        fused = _alibi_in_kernels(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), slopes, allowed,
                                  False, None, C.softcap_value(softcap), 0.0, softmax_scale,
                                  bool(return_softmax_lse), key_lengths=ends)
        if fused is not None:
            out, lse = fused
            out = out.transpose(1, 2).contiguous()
            return (out, _fa_lse(lse)) if return_softmax_lse else out
        bias = C.alibi_bias(slopes, q_len, span, ends - q_len)
    allowed = C.item_allowed(q_lens, ends, q_len, span, left, right, key_start=leftpad)
    mask = C.with_bias(allowed, bias)
    result = attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask,
                       scale=softmax_scale, softcap=C.softcap_value(softcap), backend=_BACKENDS["attention"],
                       return_lse=bool(return_softmax_lse))
    out, lse = result if return_softmax_lse else (result, None)
    out = out.transpose(1, 2).contiguous()
    return (out, _fa_lse(lse)) if return_softmax_lse else out
