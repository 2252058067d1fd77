"""Rotary position embeddings in Triton (flash-attn's contract): half-split and interleaved
layouts, partial rotary_dim, int or per-batch offsets, packed varlen, in place or not; the
kernel, its launcher, the autograd.Function and the backend registered as "triton".

Every tensor is read through its own batch, sequence and head strides (64-bit offsets), so a
batched input cannot be mis-strided the way a hand-computed `t*d/2` batch stride once was.
The backward is the same kernel rotating by -theta.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple, Union

import torch

from ..registry import Backend, register
from . import triton_common
from .triton_common import AotSpec, PlanCache, PreparedLaunch, availability, cdiv, next_pow2, problem_reasons
from .. import caches

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton: the backend says so through availability()
    triton = None
    tl = None

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Per hardware family: threads per warp and elements per program. A program covers
# BLOCK_M positions x BLOCK_H heads x the rotary dims, and reuses one cos/sin tile for them.
# NVIDIA: 1024-element tiles at 8 elements per thread (4 warps). benchmarks/rope_variants.py
# (benchmarks/records/h100/rope-tiles-ab-2026-11-21.md): on an H100, 1024 ahead of 2048 by 2-5% at
# (64, 4, 1024, 32) (three runs), where 2048 left the half-split forward just behind
# torch.compile, and within 0.4% at (8, 32, 4096, 128); on an H200 ahead by 5% and 3%. AMD keeps
# 2048 (not measured).
FAMILIES = {
    "nvidia": {"warp": 32, "tile_elems": 1024, "max_warps": 16, "targets": ("cuda:80", "cuda:90")},
    "cdna": {"warp": 64, "tile_elems": 2048, "max_warps": 16, "targets": ("hip:gfx942", "hip:gfx90a")},
    "rdna": {"warp": 32, "tile_elems": 2048, "max_warps": 16, "targets": ("hip:gfx1100",)},
}
ELEMS_PER_THREAD = 8
MAX_BLOCK_H = 8


@dataclasses.dataclass(frozen=True)
class RotaryConfig:
    block_m: int        # positions per program
    block_h: int        # heads per program
    block_r: int        # rotary_dim / 2, rounded up to a power of two
    block_p: int        # pass-through chunk (features past rotary_dim)
    num_warps: int


@caches.lru_cache("backends.triton_rotary.rotary_config", maxsize=1024)
def rotary_config(heads: int, rotary_half: int, pass_dim: int, fam: Optional[str] = None,
                  max_seqlen: Optional[int] = None) -> RotaryConfig:
    spec = FAMILIES[fam or triton_common.tile_family()]
    block_r = next_pow2(max(rotary_half, 1))
    block_h = min(next_pow2(heads), MAX_BLOCK_H)
    block_m = max(1, spec["tile_elems"] // (block_h * 2 * block_r))
    if max_seqlen is not None:
        block_m = min(block_m, next_pow2(max(max_seqlen, 1)))
    block_p = min(next_pow2(max(pass_dim, 1)), 2 * block_r)
    elems = block_m * block_h * 2 * block_r
    warps = max(1, min(spec["max_warps"], elems // (spec["warp"] * ELEMS_PER_THREAD)))
    warps = 1 << (warps.bit_length() - 1)
    return RotaryConfig(block_m, block_h, block_r, block_p, warps)


if triton is not None:

    @triton.jit
    def _rotate_block(out_base, x_base, COS, SIN, SEQLEN_OFFSETS, pid_m, pid_h, pid_b,
                      seq_len, nheads, rotary_half, pass_dim, seqlen_ro, offset_value,
                      stride_out_s, stride_out_h, stride_x_s, stride_x_h, stride_cos_s, stride_sin_s,
                      OFFSETS_TENSOR: tl.constexpr, INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr,
                      COPY_PASS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr):
        """One program's tile: BLOCK_M positions (block pid_m) x BLOCK_H heads (block pid_h) of
        the sequence at x_base, written at out_base."""
        if pid_m * BLOCK_M < seq_len:
            if OFFSETS_TENSOR:
                offset = tl.load(SEQLEN_OFFSETS + pid_b).to(tl.int32)
            else:
                offset = offset_value
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rh = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
            rk = tl.arange(0, BLOCK_R)
            m_ok = rm < seq_len
            pos = (rm + offset).to(tl.int64)
            # Positions past the cos/sin table were rejected by validation; the mask only
            # keeps the tail of a block in bounds.
            cs_mask = (m_ok & (pos < seqlen_ro))[:, None] & (rk < rotary_half)[None, :]
            cos = tl.load(COS + pos[:, None] * stride_cos_s + rk[None, :], mask=cs_mask, other=1.0).to(tl.float32)
            sin = tl.load(SIN + pos[:, None] * stride_sin_s + rk[None, :], mask=cs_mask, other=0.0).to(tl.float32)
            if CONJUGATE:
                sin = -sin
            cos = cos[:, None, :]
            sin = sin[:, None, :]
            rm64 = rm.to(tl.int64)
            rh64 = rh.to(tl.int64)
            x_rows = x_base + rm64[:, None, None] * stride_x_s + rh64[None, :, None] * stride_x_h
            out_rows = out_base + rm64[:, None, None] * stride_out_s + rh64[None, :, None] * stride_out_h
            mh_ok = m_ok[:, None, None] & (rh < nheads)[None, :, None]
            if INTERLEAVED:
                # GPT-J layout: pairs (2i, 2i+1). Load the whole rotary span once and split pairs
                # in registers rather than issuing two stride-2 loads.
                rk2 = tl.arange(0, 2 * BLOCK_R)
                mask2 = mh_ok & (rk2 < 2 * rotary_half)[None, None, :]
                x = tl.load(x_rows + rk2[None, None, :], mask=mask2, other=0.0).to(tl.float32)
                x0, x1 = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_H, BLOCK_R, 2)))
                out0 = x0 * cos - x1 * sin
                out1 = x0 * sin + x1 * cos
                out = tl.reshape(tl.join(out0, out1), (BLOCK_M, BLOCK_H, 2 * BLOCK_R))
                tl.store(out_rows + rk2[None, None, :], out.to(out_base.dtype.element_ty), mask=mask2)
            else:
                # NeoX / Llama layout: the first half rotates against the second.
                mask = mh_ok & (rk < rotary_half)[None, None, :]
                x0 = tl.load(x_rows + rk[None, None, :], mask=mask, other=0.0).to(tl.float32)
                x1 = tl.load(x_rows + rotary_half + rk[None, None, :], mask=mask, other=0.0).to(tl.float32)
                out0 = x0 * cos - x1 * sin
                out1 = x0 * sin + x1 * cos
                tl.store(out_rows + rk[None, None, :], out0.to(out_base.dtype.element_ty), mask=mask)
                tl.store(out_rows + rotary_half + rk[None, None, :], out1.to(out_base.dtype.element_ty), mask=mask)
            if COPY_PASS:
                # Features past rotary_dim pass through unchanged (not needed in place).
                rp = tl.arange(0, BLOCK_P)
                for start in range(0, pass_dim, BLOCK_P):
                    cols = 2 * rotary_half + start + rp
                    pmask = mh_ok & ((start + rp) < pass_dim)[None, None, :]
                    keep = tl.load(x_rows + cols[None, None, :], mask=pmask, other=0.0)
                    tl.store(out_rows + cols[None, None, :], keep, mask=pmask)

    # offset_value is not specialized on: one compiled kernel serves every int offset, so a
    # decode loop (a new position per step) reuses its prepared launch (see rotary_launch).
    @triton.jit(do_not_specialize=["offset_value"])
    def _rotary_kernel(
        OUT, X, COS, SIN, CU_SEQLENS, SEQLEN_OFFSETS,
        seqlen, nheads, rotary_half, pass_dim, seqlen_ro, offset_value,
        stride_out_b, stride_out_s, stride_out_h,
        stride_x_b, stride_x_s, stride_x_h,
        stride_cos_s, stride_sin_s,
        IS_VARLEN: tl.constexpr, OFFSETS_TENSOR: tl.constexpr, INTERLEAVED: tl.constexpr,
        CONJUGATE: tl.constexpr, COPY_PASS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    ):
        # Head blocks vary fastest across programs: programs running together cover one
        # position's heads, a contiguous span of x, rather than the same head block of many
        # positions (one stride apart each).
        head_blocks = tl.cdiv(nheads, BLOCK_H)
        pid = tl.program_id(0)
        pid_m = pid // head_blocks
        pid_h = pid - pid_m * head_blocks
        pid_b = tl.program_id(1)
        if IS_VARLEN:
            # Packed (total, H, D): sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1].
            seq_start = tl.load(CU_SEQLENS + pid_b).to(tl.int64)
            seq_len = (tl.load(CU_SEQLENS + pid_b + 1) - seq_start).to(tl.int32)
            x_base = X + seq_start * stride_x_s
            out_base = OUT + seq_start * stride_out_s
        else:
            seq_len = seqlen
            x_base = X + pid_b.to(tl.int64) * stride_x_b
            out_base = OUT + pid_b.to(tl.int64) * stride_out_b
        _rotate_block(out_base, x_base, COS, SIN, SEQLEN_OFFSETS, pid_m, pid_h, pid_b,
                      seq_len, nheads, rotary_half, pass_dim, seqlen_ro, offset_value,
                      stride_out_s, stride_out_h, stride_x_s, stride_x_h, stride_cos_s, stride_sin_s,
                      OFFSETS_TENSOR, INTERLEAVED, CONJUGATE, COPY_PASS, BLOCK_M, BLOCK_H, BLOCK_R, BLOCK_P)

    @triton.jit
    def _rotary_pair_kernel(
        OUT_Q, Q, OUT_K, K, COS, SIN,
        seqlen, heads_q, heads_k, rotary_half, pass_dim, seqlen_ro,
        stride_oq_b, stride_oq_s, stride_oq_h, stride_q_b, stride_q_s, stride_q_h,
        stride_ok_b, stride_ok_s, stride_ok_h, stride_k_b, stride_k_s, stride_k_h,
        stride_cos_s, stride_sin_s,
        INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, COPY_PASS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    ):
        # q and k of one attention (B, S, H*, D), rotated by the same table in one launch: each
        # position block's programs take q's head blocks, then k's (a training step's rotation is
        # 4 launches per layer otherwise, k's a quarter of q's size with grouped heads).
        blocks_q = tl.cdiv(heads_q, BLOCK_H)
        head_blocks = blocks_q + tl.cdiv(heads_k, BLOCK_H)
        pid = tl.program_id(0)
        pid_m = pid // head_blocks
        pid_h = pid - pid_m * head_blocks
        pid_b = tl.program_id(1)
        b64 = pid_b.to(tl.int64)
        if pid_h < blocks_q:
            _rotate_block(OUT_Q + b64 * stride_oq_b, Q + b64 * stride_q_b, COS, SIN, COS, pid_m, pid_h, pid_b,
                          seqlen, heads_q, rotary_half, pass_dim, seqlen_ro, 0,
                          stride_oq_s, stride_oq_h, stride_q_s, stride_q_h, stride_cos_s, stride_sin_s,
                          False, INTERLEAVED, CONJUGATE, COPY_PASS, BLOCK_M, BLOCK_H, BLOCK_R, BLOCK_P)
        else:
            _rotate_block(OUT_K + b64 * stride_ok_b, K + b64 * stride_k_b, COS, SIN, COS, pid_m, pid_h - blocks_q,
                          pid_b, seqlen, heads_k, rotary_half, pass_dim, seqlen_ro, 0,
                          stride_ok_s, stride_ok_h, stride_k_s, stride_k_h, stride_cos_s, stride_sin_s,
                          False, INTERLEAVED, CONJUGATE, COPY_PASS, BLOCK_M, BLOCK_H, BLOCK_R, BLOCK_P)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# Launches prepared per call signature, as for attention and the norms: at small sizes the
# per-call Python decides the time (a training step rotates q and k, forward and backward).
# Only calls that read x, cos and sin in place (no copy for a strided last dimension) are kept.
_PLANS = PlanCache()


# Where offset_value sits among the kernel's scalar arguments (after its six pointers): a kept
# launch takes each call's int offset there (the kernel does not specialize on its value).
_OFFSET_SCALAR = 5
_INT32 = 2 ** 31


def _plan_key(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, inplace, conjugate) -> tuple:
    if isinstance(seqlen_offsets, torch.Tensor):
        offsets = ("t", seqlen_offsets.shape)
    else:
        # Triton still types an int by its width: an offset past int32 needs its own (i64) kernel,
        # or the kept i32 launcher would truncate it
        offsets = "i" if -_INT32 <= seqlen_offsets < _INT32 else "i64"
    varlen = None if cu_seqlens is None else (cu_seqlens.shape, max_seqlen)
    return (x.shape, x.stride(), x.dtype, x.device, cos.shape, cos.stride(), cos.dtype, sin.stride(), sin.dtype,
            interleaved, offsets, varlen, inplace, conjugate)


def rotary_launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool,
                  seqlen_offsets: Union[int, torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                  max_seqlen: Optional[int], inplace: bool, conjugate: bool,
                  config: Optional[RotaryConfig] = None) -> torch.Tensor:
    """Rotate x (B, S, H, D) or packed (total, H, D); returns out (x itself when inplace)."""
    offsets_tensor = isinstance(seqlen_offsets, torch.Tensor)
    key = None
    if config is None:
        key = _plan_key(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, inplace, conjugate)
        plan = _PLANS.get(key)
        if plan is not None:
            run, contiguous = plan
            # empty_like of a contiguous x is contiguous (strides of size-1 dims may differ from
            # torch.empty(x.shape)'s; no index uses them), for less host time (no size / dtype /
            # device arguments to parse)
            out = x if inplace else (torch.empty_like(x) if contiguous else
                                     torch.empty(x.shape, dtype=x.dtype, device=x.device))
            tensors = (out, x, cos, sin, cos if cu_seqlens is None else cu_seqlens,
                       seqlen_offsets if offsets_tensor else cos)
            if offsets_tensor:
                run(*tensors)
            else:
                scalars = run.scalars
                run.call(tensors, scalars[:_OFFSET_SCALAR] + (int(seqlen_offsets),) + scalars[_OFFSET_SCALAR + 1:])
            return out
    given = (x, cos, sin)
    x = _last_dim_contiguous(x) if not inplace else x
    if inplace and x.stride(-1) != 1:
        raise ValueError("x: inplace rotary needs the last dimension contiguous, got strides "
                         f"{tuple(x.stride())}")
    cos, sin = _last_dim_contiguous(cos), _last_dim_contiguous(sin)
    rotary_half = cos.shape[-1]
    head_dim = x.shape[-1]
    pass_dim = head_dim - 2 * rotary_half
    out = x if inplace else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if cu_seqlens is None:
        batch, seqlen, nheads = x.shape[0], x.shape[1], x.shape[2]
        x_strides = (x.stride(0), x.stride(1), x.stride(2))
        out_strides = (out.stride(0), out.stride(1), out.stride(2))
        grid_m_len = seqlen
    else:
        batch, nheads = cu_seqlens.shape[0] - 1, x.shape[1]
        seqlen = 0
        x_strides = (0, x.stride(0), x.stride(1))
        out_strides = (0, out.stride(0), out.stride(1))
        grid_m_len = int(max_seqlen)
    if x.numel() == 0 or batch == 0 or grid_m_len == 0:
        return out
    cfg = config or rotary_config(nheads, rotary_half, pass_dim, max_seqlen=grid_m_len)
    grid = (cdiv(grid_m_len, cfg.block_m) * cdiv(nheads, cfg.block_h), batch)
    scalars = (seqlen, nheads, rotary_half, pass_dim, cos.shape[0], 0 if offsets_tensor else int(seqlen_offsets),
               *out_strides, *x_strides, cos.stride(0), sin.stride(0))
    run = PreparedLaunch(_rotary_kernel, grid, scalars,
        IS_VARLEN=cu_seqlens is not None, OFFSETS_TENSOR=offsets_tensor, INTERLEAVED=bool(interleaved),
        CONJUGATE=bool(conjugate), COPY_PASS=(pass_dim > 0 and not inplace),
        BLOCK_M=cfg.block_m, BLOCK_H=cfg.block_h, BLOCK_R=cfg.block_r, BLOCK_P=cfg.block_p,
        num_warps=cfg.num_warps)
    # cos stands in for the pointer arguments the kernel does not read
    run(out, x, cos, sin, cos if cu_seqlens is None else cu_seqlens, seqlen_offsets if offsets_tensor else cos)
    if key is not None and x is given[0] and cos is given[1] and sin is given[2]:
        _PLANS.keep(key, (run, x.is_contiguous()))
    return out


class _RotaryApply(torch.autograd.Function):
    """out = rotate(x, theta); dx = rotate(dout, -theta). cos/sin get no gradient. The
    non-tensor arguments come as one tuple (autograd's Python layer costs per argument)."""

    @staticmethod
    def forward(ctx, x, cos, sin, cu_seqlens, seqlen_offsets, spec):
        interleaved, max_seqlen, inplace = spec
        out = rotary_launch(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                            cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, inplace=inplace, conjugate=False)
        offsets_tensor = isinstance(seqlen_offsets, torch.Tensor)
        ctx.save_for_backward(cos, sin, cu_seqlens, seqlen_offsets if offsets_tensor else None)
        ctx.interleaved, ctx.max_seqlen, ctx.offset_value = interleaved, max_seqlen, (
            0 if offsets_tensor else seqlen_offsets)
        if inplace:
            ctx.mark_dirty(x)
        return out

    @staticmethod
    def backward(ctx, dout):
        cos, sin, cu_seqlens, offsets = ctx.saved_tensors
        dx = rotary_launch(dout, cos, sin, interleaved=ctx.interleaved,
                           seqlen_offsets=offsets if offsets is not None else ctx.offset_value,
                           cu_seqlens=cu_seqlens, max_seqlen=ctx.max_seqlen, inplace=False, conjugate=True)
        return dx, None, None, None, None, None


def pair_config(heads_q: int, heads_k: int, rotary_half: int, pass_dim: int, seqlen: int,
                fam: Optional[str] = None) -> RotaryConfig:
    """One tile for both tensors of a pair: the smaller head count's (q's heads then take more
    head blocks of the same tile size)."""
    return rotary_config(min(heads_q, heads_k), rotary_half, pass_dim, fam=fam, max_seqlen=seqlen)


_PAIR_PLANS = PlanCache()


def rotary_pair_launch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                       interleaved: bool, conjugate: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, S, Hq, D) and k (B, S, Hk, D) by the same table in one launch (position s
    at row s: no offsets, no packing); returns new (q_out, k_out)."""
    key = (q.shape, q.stride(), k.shape, k.stride(), q.dtype, q.device, cos.shape, cos.stride(), cos.dtype,
           sin.stride(), sin.dtype, interleaved, conjugate)
    plan = _PAIR_PLANS.get(key)
    if plan is not None:
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        plan(q_out, q, k_out, k, cos, sin)
        return q_out, k_out
    given = (q, k, cos, sin)
    q, k, cos, sin = (_last_dim_contiguous(t) for t in given)
    # empty_like keeps a permuted layout (e.g. HF's q, a transposed (B, H, S, D)), which the
    # kernel reads through its strides like any other
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    batch, seqlen, heads_q, head_dim = q.shape
    heads_k = k.shape[2]
    rotary_half = cos.shape[-1]
    pass_dim = head_dim - 2 * rotary_half
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    cfg = pair_config(heads_q, heads_k, rotary_half, pass_dim, seqlen)
    grid = (cdiv(seqlen, cfg.block_m) * (cdiv(heads_q, cfg.block_h) + cdiv(heads_k, cfg.block_h)), batch)
    strides = [t.stride(i) for t in (q_out, q, k_out, k) for i in range(3)]
    scalars = (seqlen, heads_q, heads_k, rotary_half, pass_dim, cos.shape[0], *strides, cos.stride(0), sin.stride(0))
    run = PreparedLaunch(_rotary_pair_kernel, grid, scalars, INTERLEAVED=bool(interleaved),
                         CONJUGATE=bool(conjugate), COPY_PASS=pass_dim > 0, BLOCK_M=cfg.block_m,
                         BLOCK_H=cfg.block_h, BLOCK_R=cfg.block_r, BLOCK_P=cfg.block_p, num_warps=cfg.num_warps)
    run(q_out, q, k_out, k, cos, sin)
    if all(a is b for a, b in zip((q, k, cos, sin), given)):
        _PAIR_PLANS.keep(key, run)
    return q_out, k_out


class _RotaryPairApply(torch.autograd.Function):
    """(q_out, k_out) = rotate(q, k, theta); (dq, dk) = rotate(dq_out, dk_out, -theta)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return rotary_pair_launch(q, k, cos, sin, interleaved=interleaved, conjugate=False)

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        cos, sin = ctx.saved_tensors
        dq, dk = rotary_pair_launch(dq_out, dk_out, cos, sin, interleaved=ctx.interleaved, conjugate=True)
        return dq, dk, None, None, None


def triton_apply_rotary_pair(q, k, cos, sin, *, interleaved=False, conjugate=False):
    """The Triton backend's rotation of an attention's q and k in one launch each way (the
    contract's checks ran in ops.rotary.apply_rotary_pair). conjugate=True rotates by -theta
    without autograd (the traced op's backward)."""
    if conjugate:
        return rotary_pair_launch(q, k, cos, sin, interleaved=bool(interleaved), conjugate=True)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return _RotaryPairApply.apply(q, k, cos, sin, bool(interleaved))
    return rotary_pair_launch(q, k, cos, sin, interleaved=bool(interleaved), conjugate=False)


def triton_apply_rotary(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None,
                        inplace=False):
    if cu_seqlens is not None and max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item()) if cu_seqlens.numel() > 1 else 0
    if not (torch.is_grad_enabled() and x.requires_grad):  # no autograd node to build
        return rotary_launch(x, cos, sin, interleaved=bool(interleaved), seqlen_offsets=seqlen_offsets,
                             cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, inplace=bool(inplace), conjugate=False)
    offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else int(seqlen_offsets)
    return _RotaryApply.apply(x, cos, sin, cu_seqlens, offsets, (bool(interleaved), max_seqlen, bool(inplace)))


triton_apply_rotary.supports_inplace = True
# q and k in one launch (ops.rotary.apply_rotary_pair)
triton_apply_rotary.pair = triton_apply_rotary_pair


register(Backend(
    name="triton", op="rotary", fn=triton_apply_rotary,
    description="gpuparity's Triton rotary (half-split / interleaved / varlen, fp32 math, forward and backward)",
    dtypes=KERNEL_DTYPES, availability=availability, supports=problem_reasons, jit=True))


# ----------------------------------------------------------------------------- AOT
# (heads, rotary_dim / 2, pass-through dims, interleaved, varlen): the two anchor shapes' tiles
# and a partial rotary with its pass-through copy, across both layouts and the varlen path.
AOT_CASES = ((32, 64, 0, False, False), (4, 16, 0, True, True), (8, 32, 64, True, False))


def aot_specs() -> List[AotSpec]:
    if triton is None:
        return []
    specs = []
    for fam, spec in FAMILIES.items():
        for heads, half, pass_dim, interleaved, varlen in AOT_CASES:
            cfg = rotary_config(heads, half, pass_dim, fam=fam)
            const = {"IS_VARLEN": varlen, "OFFSETS_TENSOR": varlen, "INTERLEAVED": interleaved,
                     "CONJUGATE": False, "COPY_PASS": pass_dim > 0, "BLOCK_M": cfg.block_m,
                     "BLOCK_H": cfg.block_h, "BLOCK_R": cfg.block_r, "BLOCK_P": cfg.block_p}
            sig = {"OUT": "*bf16", "X": "*bf16", "COS": "*fp32", "SIN": "*fp32", "CU_SEQLENS": "*i32",
                   "SEQLEN_OFFSETS": "*i32", "seqlen": "i32", "nheads": "i32", "rotary_half": "i32",
                   "pass_dim": "i32", "seqlen_ro": "i32", "offset_value": "i32",
                   "stride_out_b": "i64", "stride_out_s": "i64", "stride_out_h": "i64",
                   "stride_x_b": "i64", "stride_x_s": "i64", "stride_x_h": "i64",
                   "stride_cos_s": "i64", "stride_sin_s": "i64"}
            sig.update({k: "constexpr" for k in const})
            name = (f"{fam}:rotary-{'interleaved' if interleaved else 'half'}{'-varlen' if varlen else ''}"
                    f"-h{heads}-r{2 * half}-p{pass_dim}")
            specs.append(AotSpec(name, _rotary_kernel, sig, const, num_warps=cfg.num_warps,
                                 targets=spec["targets"]))
        # the pair launch of a grouped-query attention's q and k (Llama's 32 and 8 heads, D 128)
        cfg = pair_config(32, 8, 64, 0, 4096, fam=fam)
        const = {"INTERLEAVED": False, "CONJUGATE": False, "COPY_PASS": False, "BLOCK_M": cfg.block_m,
                 "BLOCK_H": cfg.block_h, "BLOCK_R": cfg.block_r, "BLOCK_P": cfg.block_p}
        sig = {"OUT_Q": "*bf16", "Q": "*bf16", "OUT_K": "*bf16", "K": "*bf16", "COS": "*bf16", "SIN": "*bf16",
               **{name: "i32" for name in ("seqlen", "heads_q", "heads_k", "rotary_half", "pass_dim", "seqlen_ro")},
               **{f"stride_{t}_{d}": "i64" for t in ("oq", "q", "ok", "k") for d in "bsh"},
               "stride_cos_s": "i64", "stride_sin_s": "i64"}
        sig.update({k: "constexpr" for k in const})
        specs.append(AotSpec(f"{fam}:rotary-pair-half-h32-h8-r128", _rotary_pair_kernel, sig, const,
                             num_warps=cfg.num_warps, targets=spec["targets"]))
    return specs
