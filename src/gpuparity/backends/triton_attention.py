"""gpuparity's fused masked attention in Triton: forward and backward kernels, their launchers,
the autograd Function, the tile configurations shipped per vendor and the "triton" backend.

The kernels follow FlashAttention-2 (and Triton's fused-attention tutorial): one program per
block of query rows, an online softmax in fp32 over blocks of keys, the log-sum-exp kept for
the backward, which recomputes the probabilities. Masks are read in tiles through their
strides (zero strides for broadcast dims), never expanded in memory; key/value blocks that a
query block cannot see (key padding, causal) are skipped, so padding makes it faster. The
backward uses no atomics: dk/dv (summed over a GQA group inside one program) and dq are
computed by separate kernels, so it is deterministic on every run.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
from typing import Dict, List, Optional, Tuple

import torch

from ..dispatch import Backend, Problem, register
from ..numerics import matmul_tf32
from . import triton_common
from .triton_common import AotSpec, PlanCache, PreparedLaunch, cdiv, clear_plans, lazy_kernel

_IMPORT_ERROR = ""
try:  # module-level names so Triton (compiler and interpreter) sees `tl` in the kernels' globals
    import triton
    import triton.language as tl
except Exception as exc:  # noqa: BLE001 - the backend then reports triton as unavailable
    triton = tl = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

LOG2E = 1.4426950408889634

# Mask kinds as the kernels see them (a constexpr).
MASK_NONE, MASK_BOOL, MASK_ADDITIVE = 0, 1, 2
MAX_HEAD_DIM = 256


# --------------------------------------------------------------------------- kernels
# Runtime ints that Triton would otherwise specialize on (== 1, divisible by 16): each
# distinct pattern is a separate compile of seconds. Lengths, head counts and the dropout seed
# only bound loops and masks, so specializing on them buys nothing; strides stay specialized
# (16-byte alignment of rows is what lets loads vectorize), as does group_size (1 folds away).
_NO_SPECIALIZE = ("seed", "num_heads", "num_kv_heads", "q_len", "k_len")


def _build_kernels():
    @triton.jit
    def _scan_padding(kpm_base, stride_pn, k_len, SCAN: tl.constexpr):
        """One batch item's key padding: the first and one-past-the-last kept key, and
        whether the kept keys have holes (anything but keys 0..last-1 kept).

        Programs skip key blocks outside [first, last): trailing (or leading) padding costs
        no matmuls. Without holes (right padding, i.e. per-item lengths) the tiles need no
        per-key mask reads at all. An all-padding item gets first >= last: nothing to visit.
        Each program scans its own row (k_len bytes, from L2): cheaper than another launch.
        """
        offs = tl.arange(0, SCAN)
        zeros = tl.full([SCAN], 0, tl.int32)
        first = tl.min(zeros + k_len, axis=0)
        last = tl.max(zeros, axis=0)
        count = tl.sum(zeros, axis=0)
        for start in range(0, k_len, SCAN):
            cols = start + offs
            padded = tl.load(kpm_base + cols * stride_pn, mask=cols < k_len, other=1)
            kept = padded == 0
            first = tl.minimum(first, tl.min(tl.where(kept, cols, k_len), axis=0))
            last = tl.maximum(last, tl.max(tl.where(kept, cols + 1, 0), axis=0))
            count += tl.sum(kept.to(tl.int32), axis=0)
        return first, last, count != last

    @triton.jit
    def _mma(a, b, acc, DOT_PRECISION: tl.constexpr):
        """tl.dot with fp32 accumulation. "upcast" is for Triton's interpreter, whose bf16 dot
        is broken: bf16 products are exact in fp32, so upcasting first computes the same."""
        if DOT_PRECISION == "upcast":
            result = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            result = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        return result

    @triton.jit
    def _key_range(first, last, start_m, k_len,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   HAS_BOUNDS: tl.constexpr):
        """Keys a block of query rows must visit: [lo, hi); blocks in [lo, full_end) need no
        causal or end-of-keys masking (the tile lies wholly inside both). first/last: the
        kept keys of this batch item (used when HAS_BOUNDS)."""
        lo = 0
        hi = k_len
        if HAS_BOUNDS:
            hi = tl.minimum(last, k_len)
            lo = (first // BLOCK_N) * BLOCK_N
        if IS_CAUSAL:
            # top-left aligned: query row i sees keys 0..i
            hi = tl.minimum(hi, (start_m + 1) * BLOCK_M)
        full_end = (hi // BLOCK_N) * BLOCK_N
        if IS_CAUSAL:
            # a key tile [n, n + BLOCK_N) is wholly visible to rows >= start_m * BLOCK_M
            # when n + BLOCK_N - 1 <= start_m * BLOCK_M
            full_end = tl.minimum(full_end, ((start_m * BLOCK_M + 1) // BLOCK_N) * BLOCK_N)
        full_end = tl.maximum(full_end, lo)
        hi = tl.maximum(hi, full_end)
        return lo, full_end, hi

    @triton.jit
    def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base,
                   rows, offs_n, offs_d, lo, hi, q_len, k_len, key_end, qk_scale, seed_bh, dropout_p,
                   stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                   MASK_EDGES: tl.constexpr, DOT_PRECISION: tl.constexpr):
        d_ok = offs_d < HEAD_DIM
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n
            # K is read transposed, (D, BLOCK_N), so that q @ k needs no shuffle.
            k_ptrs = k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd
            v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd
            if MASK_EDGES:
                k = tl.load(k_ptrs, mask=d_ok[:, None] & (cols[None, :] < k_len), other=0.0)
                v = tl.load(v_ptrs, mask=(cols[:, None] < k_len) & d_ok[None, :], other=0.0)
            else:
                k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
                v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
            # scores in base 2 (scale * log2(e) folded in) so the softmax can use exp2
            qk = _mma(q, k, None, DOT_PRECISION) * qk_scale
            if MASK_KIND == 2:
                bias = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn,
                               mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0.0)
                qk += bias.to(tl.float32) * 1.4426950408889634
            if MASK_KIND == 1:
                allowed = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn,
                                  mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0)
                qk = tl.where(allowed != 0, qk, float("-inf"))
            if HAS_KPM:
                padded = tl.load(kpm_base + cols * stride_pn, mask=cols < k_len, other=1)
                qk = tl.where(padded[None, :] == 0, qk, float("-inf"))
            if MASK_EDGES:
                visible = cols[None, :] < key_end
                if IS_CAUSAL:
                    visible = visible & (cols[None, :] <= rows[:, None])
                qk = tl.where(visible, qk, float("-inf"))
            # Online softmax: keep the running row max m_i and sum l_i, rescale the
            # accumulator by exp2(m_old - m_new) whenever the max grows.
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            if MASK_EDGES or HAS_KPM or MASK_KIND != 0:
                # a row that has seen no allowed key yet keeps m = -inf; subtract 0 instead
                # of -inf so exp2 gives 0, not NaN
                m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                m_new_safe = m_new
            p = tl.math.exp2(qk - m_new_safe[:, None])
            alpha = tl.math.exp2(m_i - m_new_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            if DROPOUT:
                # the normaliser l_i counts every key; dropout only thins what reaches v
                keep = tl.rand(seed_bh, rows[:, None] * k_len + cols[None, :]) >= dropout_p
                p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
            acc = _mma(p.to(v.dtype), v, acc, DOT_PRECISION)
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit(do_not_specialize=_NO_SPECIALIZE)
    def _attn_fwd_kernel(
        Q, K, V, Out, LSE, Mask, KPM, Bounds,
        qk_scale, dropout_p, seed,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_mb, stride_mh, stride_mm, stride_mn,
        stride_pb, stride_pn,
        num_heads, group_size, q_len, k_len,
        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
        DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, SCAN: tl.constexpr,
    ):
        start_m = tl.program_id(0)
        batch_head = tl.program_id(1)
        batch = batch_head // num_heads
        head = batch_head % num_heads
        kv_head = head // group_size  # GQA: a group of query heads reads one k/v head
        b64 = batch.to(tl.int64)

        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D_PAD)  # head dims that are not a power of two are padded and masked
        d_ok = offs_d < HEAD_DIM

        q_ptrs = Q + b64 * stride_qb + head.to(tl.int64) * stride_qh + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=(rows[:, None] < q_len) & d_ok[None, :], other=0.0)
        k_base = K + b64 * stride_kb + kv_head.to(tl.int64) * stride_kh
        v_base = V + b64 * stride_vb + kv_head.to(tl.int64) * stride_vh
        mask_base = Mask + b64 * stride_mb + head.to(tl.int64) * stride_mh
        kpm_base = KPM + b64 * stride_pb
        seed_bh = seed + batch_head

        first = 0
        last = k_len
        holes = False
        if HAS_KPM:
            first, last, holes = _scan_padding(kpm_base, stride_pn, k_len, SCAN)
            if (start_m == 0) & (head == 0):  # one program per batch item keeps them for the backward
                tl.store(Bounds + 3 * batch, first)
                tl.store(Bounds + 3 * batch + 1, last)
                tl.store(Bounds + 3 * batch + 2, holes.to(tl.int32))
        elif HAS_BOUNDS:  # per-item lengths, computed by the launcher
            first = tl.load(Bounds + 3 * batch)
            last = tl.load(Bounds + 3 * batch + 1)
        lo, full_end, hi = _key_range(first, last, start_m, k_len, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_BOUNDS)

        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
        if holes:
            # padding with holes: read the key padding mask in every tile
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base,
                                       rows, offs_n, offs_d, lo, full_end, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                                       stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                                       HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, True, DROPOUT, False, DOT_PRECISION)
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base,
                                       rows, offs_n, offs_d, full_end, hi, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                                       stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                                       HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, True, DROPOUT, True, DOT_PRECISION)
        else:
            # no mask, or right padding (kept keys are exactly 0..hi-1): [lo, hi) says it all.
            # Key tiles wholly inside the causal triangle and the key range: no edge masks.
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base,
                                       rows, offs_n, offs_d, lo, full_end, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                                       stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                                       HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, False, DROPOUT, False, DOT_PRECISION)
            # the diagonal / last tiles: causal and end-of-keys masks
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base,
                                       rows, offs_n, offs_d, full_end, hi, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                                       stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                                       HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, False, DROPOUT, True, DOT_PRECISION)

        # A row with no key to attend to has l_i == 0: its output is exactly 0 and its
        # log-sum-exp +inf, so the backward recomputes probabilities of exactly 0 for it.
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        out = tl.where(empty[:, None], 0.0, acc / l_safe[:, None])
        lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
        row_ok = rows < q_len
        tl.store(LSE + batch_head.to(tl.int64) * q_len + rows, lse, mask=row_ok)
        o_ptrs = Out + b64 * stride_ob + head.to(tl.int64) * stride_oh + rows[:, None] * stride_om + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    @triton.jit
    def _bwd_dkdv_inner(dk, dv, k, v, key_kept, q_base, do_base, lse_base, delta_base, mask_base,
                        cols, offs_m, offs_d, lo, hi, q_len, k_len, qk_scale, seed_bh, dropout_p,
                        stride_qm, stride_qd, stride_dm, stride_dd, stride_mm, stride_mn,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, IS_CAUSAL: tl.constexpr,
                        MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                        MASK_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
        d_ok = offs_d < HEAD_DIM
        for start_m in range(lo, hi, BLOCK_M):
            start_m = tl.multiple_of(start_m, BLOCK_M)
            rows = start_m + offs_m
            row_ok = rows < q_len
            # q read transposed, (D, BLOCK_M): the tile of scores is built as k @ q^T
            q_t = tl.load(q_base + rows[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                          mask=d_ok[:, None] & row_ok[None, :], other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            # rows past the end get lse = +inf: probabilities of exactly 0
            lse = tl.load(lse_base + rows, mask=row_ok, other=float("inf"))
            delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
            qk_t = _mma(k, q_t, None, DOT_PRECISION) * qk_scale
            if MASK_KIND == 2:
                bias_t = tl.load(mask_base + rows[None, :] * stride_mm + cols[:, None] * stride_mn,
                                 mask=row_ok[None, :] & (cols[:, None] < k_len), other=0.0)
                qk_t += bias_t.to(tl.float32) * 1.4426950408889634
            # recompute the probabilities from the saved log-sum-exp
            p_t = tl.math.exp2(qk_t - lse[None, :])
            if MASK_KIND == 1:
                allowed_t = tl.load(mask_base + rows[None, :] * stride_mm + cols[:, None] * stride_mn,
                                    mask=row_ok[None, :] & (cols[:, None] < k_len), other=0)
                p_t = tl.where(allowed_t != 0, p_t, 0.0)
            if HAS_KPM:
                p_t = tl.where(key_kept[:, None], p_t, 0.0)
            if MASK_DIAGONAL:
                if IS_CAUSAL:
                    p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
            dp_t = _mma(v, tl.trans(do), None, DOT_PRECISION)
            if DROPOUT:
                keep_t = tl.rand(seed_bh, rows[None, :] * k_len + cols[:, None]) >= dropout_p
                scale_keep = 1.0 / (1.0 - dropout_p)
                p_dropped_t = tl.where(keep_t, p_t * scale_keep, 0.0)
                dv = _mma(p_dropped_t.to(do.dtype), do, dv, DOT_PRECISION)
                dp_t = tl.where(keep_t, dp_t * scale_keep, 0.0)
            else:
                dv = _mma(p_t.to(do.dtype), do, dv, DOT_PRECISION)
            # softmax backward: ds = p * (dp - delta)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = _mma(ds_t.to(q_t.dtype), tl.trans(q_t), dk, DOT_PRECISION)
        return dk, dv

    @triton.jit(do_not_specialize=_NO_SPECIALIZE)
    def _attn_bwd_dkdv_kernel(
        Q, K, V, DO, LSE, Delta, DK, DV, Mask, KPM, Bounds,
        qk_scale, sm_scale, dropout_p, seed,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_db, stride_dh, stride_dm, stride_dd,
        stride_dkb, stride_dkh, stride_dkn, stride_dkd,
        stride_dvb, stride_dvh, stride_dvn, stride_dvd,
        stride_mb, stride_mh, stride_mm, stride_mn,
        stride_pb, stride_pn,
        num_heads, num_kv_heads, group_size, q_len, k_len,
        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
        DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        """dk, dv for one block of keys of one k/v head, summed over its GQA group in a fixed
        order (deterministic, no atomics)."""
        start_n = tl.program_id(0)
        batch_kv_head = tl.program_id(1)
        batch = batch_kv_head // num_kv_heads
        kv_head = batch_kv_head % num_kv_heads
        b64 = batch.to(tl.int64)

        cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D_PAD)
        d_ok = offs_d < HEAD_DIM
        col_ok = cols < k_len
        kv_ok = col_ok[:, None] & d_ok[None, :]
        k = tl.load(K + b64 * stride_kb + kv_head.to(tl.int64) * stride_kh + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=kv_ok, other=0.0)
        v = tl.load(V + b64 * stride_vb + kv_head.to(tl.int64) * stride_vh + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=kv_ok, other=0.0)
        dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)

        key_kept = col_ok
        if HAS_KPM:
            padded = tl.load(KPM + b64 * stride_pb + cols * stride_pn, mask=col_ok, other=1)
            key_kept = padded == 0
        # Query rows that can see this key block: causal -> from the diagonal on.
        q_lo = 0
        if IS_CAUSAL:
            q_lo = ((start_n * BLOCK_N) // BLOCK_M) * BLOCK_M
        q_hi = q_len
        if HAS_BOUNDS:
            first = tl.load(Bounds + 3 * batch)
            last = tl.load(Bounds + 3 * batch + 1)
            # all keys of this block are padding: visit no query, dk = dv = 0
            dead = (start_n * BLOCK_N >= last) | ((start_n + 1) * BLOCK_N <= first)
            q_hi = tl.where(dead, q_lo, q_len)
        # query tiles from q_full on lie wholly below the diagonal (every row sees every key)
        q_full = q_lo
        if IS_CAUSAL:
            q_full = tl.minimum(tl.cdiv(start_n * BLOCK_N + BLOCK_N - 1, BLOCK_M) * BLOCK_M, q_hi)
            q_full = tl.maximum(q_full, q_lo)

        for g in range(0, group_size):
            head = kv_head * group_size + g
            bh = batch * num_heads + head
            q_base = Q + b64 * stride_qb + head.to(tl.int64) * stride_qh
            do_base = DO + b64 * stride_db + head.to(tl.int64) * stride_dh
            lse_base = LSE + bh.to(tl.int64) * q_len
            delta_base = Delta + bh.to(tl.int64) * q_len
            mask_base = Mask + b64 * stride_mb + head.to(tl.int64) * stride_mh
            seed_bh = seed + bh
            dk, dv = _bwd_dkdv_inner(dk, dv, k, v, key_kept, q_base, do_base, lse_base, delta_base, mask_base,
                                     cols, offs_m, offs_d, q_lo, q_full, q_len, k_len, qk_scale, seed_bh, dropout_p,
                                     stride_qm, stride_qd, stride_dm, stride_dd, stride_mm, stride_mn,
                                     HEAD_DIM, BLOCK_M, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, True, DOT_PRECISION)
            dk, dv = _bwd_dkdv_inner(dk, dv, k, v, key_kept, q_base, do_base, lse_base, delta_base, mask_base,
                                     cols, offs_m, offs_d, q_full, q_hi, q_len, k_len, qk_scale, seed_bh, dropout_p,
                                     stride_qm, stride_qd, stride_dm, stride_dd, stride_mm, stride_mn,
                                     HEAD_DIM, BLOCK_M, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, False, DOT_PRECISION)

        dk = dk * sm_scale
        tl.store(DK + b64 * stride_dkb + kv_head.to(tl.int64) * stride_dkh + cols[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
                 dk.to(DK.dtype.element_ty), mask=kv_ok)
        tl.store(DV + b64 * stride_dvb + kv_head.to(tl.int64) * stride_dvh + cols[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
                 dv.to(DV.dtype.element_ty), mask=kv_ok)

    @triton.jit
    def _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, mask_base, kpm_base,
                      rows, offs_n, offs_d, lo, hi, q_len, k_len, key_end, qk_scale, seed_bh, dropout_p,
                      stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                      HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                      MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                      MASK_EDGES: tl.constexpr, DOT_PRECISION: tl.constexpr):
        d_ok = offs_d < HEAD_DIM
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            cols = start_n + offs_n
            k_ptrs = k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd
            v_ptrs = v_base + cols[None, :] * stride_vn + offs_d[:, None] * stride_vd
            if MASK_EDGES:
                k_t = tl.load(k_ptrs, mask=d_ok[:, None] & (cols[None, :] < k_len), other=0.0)
                v_t = tl.load(v_ptrs, mask=d_ok[:, None] & (cols[None, :] < k_len), other=0.0)
            else:
                k_t = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
                v_t = tl.load(v_ptrs, mask=d_ok[:, None], other=0.0)
            qk = _mma(q, k_t, None, DOT_PRECISION) * qk_scale
            if MASK_KIND == 2:
                bias = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn,
                               mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0.0)
                qk += bias.to(tl.float32) * 1.4426950408889634
            p = tl.math.exp2(qk - lse[:, None])
            if MASK_KIND == 1:
                allowed = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn,
                                  mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0)
                p = tl.where(allowed != 0, p, 0.0)
            if HAS_KPM:
                padded = tl.load(kpm_base + cols * stride_pn, mask=cols < k_len, other=1)
                p = tl.where(padded[None, :] == 0, p, 0.0)
            if MASK_EDGES:
                visible = cols[None, :] < key_end
                if IS_CAUSAL:
                    visible = visible & (cols[None, :] <= rows[:, None])
                p = tl.where(visible, p, 0.0)
            dp = _mma(do, v_t, None, DOT_PRECISION)
            if DROPOUT:
                keep = tl.rand(seed_bh, rows[:, None] * k_len + cols[None, :]) >= dropout_p
                dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
            ds = p * (dp - delta[:, None])
            dq = _mma(ds.to(k_t.dtype), tl.trans(k_t), dq, DOT_PRECISION)
        return dq

    @triton.jit(do_not_specialize=_NO_SPECIALIZE)
    def _attn_bwd_dq_kernel(
        Q, K, V, Out, DO, LSE, Delta, DQ, Mask, KPM, Bounds,
        qk_scale, sm_scale, dropout_p, seed,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_db, stride_dh, stride_dm, stride_dd,
        stride_dqb, stride_dqh, stride_dqm, stride_dqd,
        stride_mb, stride_mh, stride_mm, stride_mn,
        stride_pb, stride_pn,
        num_heads, group_size, q_len, k_len,
        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
        DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        start_m = tl.program_id(0)
        batch_head = tl.program_id(1)
        batch = batch_head // num_heads
        head = batch_head % num_heads
        kv_head = head // group_size
        b64 = batch.to(tl.int64)

        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D_PAD)
        d_ok = offs_d < HEAD_DIM
        row_ok = rows < q_len
        tile_ok = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + b64 * stride_qb + head.to(tl.int64) * stride_qh + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=tile_ok, other=0.0)
        do = tl.load(DO + b64 * stride_db + head.to(tl.int64) * stride_dh + rows[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                     mask=tile_ok, other=0.0)
        lse = tl.load(LSE + batch_head.to(tl.int64) * q_len + rows, mask=row_ok, other=float("inf"))
        # delta_i = sum_d out_id * dout_id, the row term of the softmax gradient; this kernel
        # runs first and keeps it for the dk/dv kernel
        o = tl.load(Out + b64 * stride_ob + head.to(tl.int64) * stride_oh + rows[:, None] * stride_om + offs_d[None, :] * stride_od,
                    mask=tile_ok, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(Delta + batch_head.to(tl.int64) * q_len + rows, delta, mask=row_ok)
        k_base = K + b64 * stride_kb + kv_head.to(tl.int64) * stride_kh
        v_base = V + b64 * stride_vb + kv_head.to(tl.int64) * stride_vh
        mask_base = Mask + b64 * stride_mb + head.to(tl.int64) * stride_mh
        kpm_base = KPM + b64 * stride_pb
        seed_bh = seed + batch_head

        first = 0
        last = k_len
        if HAS_BOUNDS:  # written by the forward (or the launcher, for lengths)
            first = tl.load(Bounds + 3 * batch)
            last = tl.load(Bounds + 3 * batch + 1)
        lo, full_end, hi = _key_range(first, last, start_m, k_len, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_BOUNDS)
        dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
        # One loop body for any padding (the forward's two-way split would double the shared
        # memory of this larger kernel): key padding, if any, is read in every tile.
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, mask_base, kpm_base,
                           rows, offs_n, offs_d, lo, full_end, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                           stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                           HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, False, DOT_PRECISION)
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, mask_base, kpm_base,
                           rows, offs_n, offs_d, full_end, hi, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                           stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                           HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, True, DOT_PRECISION)
        dq = dq * sm_scale
        tl.store(DQ + b64 * stride_dqb + head.to(tl.int64) * stride_dqh + rows[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
                 dq.to(DQ.dtype.element_ty), mask=tile_ok)

    # Triton resolves the helpers a kernel calls through the kernel's module globals (when it
    # compiles, and the interpreter when it runs): publish them there.
    globals().update(_mma=_mma, _scan_padding=_scan_padding, _key_range=_key_range, _fwd_inner=_fwd_inner, _bwd_dkdv_inner=_bwd_dkdv_inner,
                     _bwd_dq_inner=_bwd_dq_inner)
    return {
        "fwd": _attn_fwd_kernel,
        "dkdv": _attn_bwd_dkdv_kernel,
        "dq": _attn_bwd_dq_kernel,
    }


kernels = lazy_kernel(_build_kernels)


# --------------------------------------------------------------------------- tile configs
@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # A dense attn_mask adds a mask tile to every pipeline stage: configs whose stages would
    # then overflow shared memory name the stage count to use with one (None: num_stages).
    masked_stages: Optional[int] = None

    def stages(self, dense_mask: bool) -> int:
        return self.masked_stages if dense_mask and self.masked_stages is not None else self.num_stages


# Per vendor family, kernel, head-dim bucket (the padded head dim; a bucket a family lacks
# uses the next larger one) and element size (2 for fp16/bf16, 4 for fp32). Hopper configs
# (227 KiB of shared memory) were tuned on an H100 with benchmarks/tune_attention.py;
# Ampere ones fit an A100's 163 KiB; AMD ones fit 64 KiB of LDS, and RDNA (wave32) gets
# smaller tiles. aot_specs() lists every entry; CI compiles each for its family's targets.
_SM90 = {
    "fwd": {
        (32, 2): TileConfig(64, 64, 4, 3),
        # (128, 2): 128x64 with 8 warps, from a third-session sweep on llm-8k (H200, same sm_90 as
        # the H100): 1.80 ms vs 2.70 for the 64x64 / 4-warp tile the first sweep had chosen;
        # with a dense mask 3 stages need 256 KiB (Triton 3.6), so 2 there
        (64, 2): TileConfig(64, 64, 4, 3), (128, 2): TileConfig(128, 64, 8, 3, masked_stages=2),
        (256, 2): TileConfig(64, 32, 4, 2),
        (64, 4): TileConfig(64, 32, 4, 2), (128, 4): TileConfig(64, 32, 4, 2), (256, 4): TileConfig(32, 32, 4, 1),
    },
    "dkdv": {
        # (32, 2) and dq's: from a fourth-session sweep on aam-asv (S=1024) alone, H100: backward
        # 0.126 -> 0.114 ms with both; short keys (aam-nuc) keep their own, SHORT_CONFIGS
        (32, 2): TileConfig(64, 128, 4, 2),
        # (128, 2): 64x64 with 4 warps, 2 stages, from a fourth-session sweep on llm-8k (H200):
        # backward 5.75 ms vs 6.17 with the 64x128 / 8-warp tile the first sweep had chosen
        (64, 2): TileConfig(32, 64, 4, 3), (128, 2): TileConfig(64, 64, 4, 2), (256, 2): TileConfig(16, 32, 4, 1),
        (64, 4): TileConfig(32, 64, 4, 2), (128, 4): TileConfig(32, 32, 4, 2), (256, 4): TileConfig(16, 32, 4, 1),
    },
    "dq": {
        (32, 2): TileConfig(64, 64, 4, 3),
        (64, 2): TileConfig(64, 32, 4, 3), (128, 2): TileConfig(128, 64, 8, 3), (256, 2): TileConfig(32, 16, 4, 1),
        (64, 4): TileConfig(64, 32, 4, 2), (128, 4): TileConfig(32, 32, 4, 2), (256, 4): TileConfig(32, 16, 4, 1),
    },
}
_SM80 = {
    "fwd": {**_SM90["fwd"], (128, 2): TileConfig(64, 64, 4, 3)},  # the 128x64 tile is unmeasured on an A100
    "dkdv": {**_SM90["dkdv"], (128, 2): TileConfig(32, 64, 4, 3)},
    "dq": dict(_SM90["dq"]),
}
_SM80["fwd"].pop((32, 2))
_SM80["dkdv"].pop((32, 2))
_SM80["dq"].pop((32, 2))
_CDNA = {
    "fwd": {
        (64, 2): TileConfig(128, 64, 4, 1), (128, 2): TileConfig(128, 32, 4, 1), (256, 2): TileConfig(64, 32, 4, 1),
        (64, 4): TileConfig(64, 32, 4, 1), (128, 4): TileConfig(64, 32, 4, 1), (256, 4): TileConfig(32, 16, 4, 1),
    },
    "dkdv": {
        (64, 2): TileConfig(32, 64, 4, 1), (128, 2): TileConfig(32, 64, 4, 1), (256, 2): TileConfig(16, 32, 4, 1),
        (64, 4): TileConfig(32, 32, 4, 1), (128, 4): TileConfig(16, 32, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
    "dq": {
        (64, 2): TileConfig(64, 32, 4, 1), (128, 2): TileConfig(64, 32, 4, 1), (256, 2): TileConfig(32, 16, 4, 1),
        (64, 4): TileConfig(32, 32, 4, 1), (128, 4): TileConfig(32, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
}
_RDNA = {
    "fwd": {
        (64, 2): TileConfig(64, 32, 4, 1), (128, 2): TileConfig(64, 32, 4, 1), (256, 2): TileConfig(32, 16, 4, 1),
        (64, 4): TileConfig(32, 32, 4, 1), (128, 4): TileConfig(32, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
    "dkdv": {
        (64, 2): TileConfig(32, 32, 4, 1), (128, 2): TileConfig(16, 32, 4, 1), (256, 2): TileConfig(16, 16, 4, 1),
        (64, 4): TileConfig(16, 32, 4, 1), (128, 4): TileConfig(16, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
    "dq": {
        (64, 2): TileConfig(32, 32, 4, 1), (128, 2): TileConfig(32, 16, 4, 1), (256, 2): TileConfig(16, 16, 4, 1),
        (64, 4): TileConfig(32, 16, 4, 1), (128, 4): TileConfig(16, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
}
# Short key sequences (k_len <= SHORT_KEYS): smaller key blocks waste less of the last, partial
# block. From a fourth-session sweep on aam-nuc (512, 4, 150, 32), H200: forward 0.060 ms with
# 64x32 vs 0.077 with 64x64; dk/dv 0.144 vs 0.158 with 32x64 vs 32x128 (the general table's
# tiles were tuned on aam-nuc and aam-asv, S=1024, together). Entries override CONFIGS' for
# their (bucket, element size) only.
SHORT_KEYS = 256
SHORT_CONFIGS: Dict[str, Dict[str, Dict[Tuple[int, int], TileConfig]]] = {
    "nvidia_sm90": {"fwd": {(32, 2): TileConfig(64, 32, 4, 3)}, "dkdv": {(32, 2): TileConfig(32, 64, 4, 3)},
                    # dq: the tile the general table had before aam-asv got its own (0.145 ms vs
                    # 0.168 for aam-asv's 64x64 on aam-nuc, H200)
                    "dq": {(32, 2): TileConfig(64, 32, 4, 3)}},
}
# The interpreter runs one program at a time in numpy: large tiles, few programs.
_INTERP = {kernel: {key: TileConfig(32, 32, 4, 1) for key in table} for kernel, table in _SM80.items()}

CONFIGS: Dict[str, Dict[str, Dict[Tuple[int, int], TileConfig]]] = {
    "nvidia_sm90": _SM90, "nvidia": _SM80, "amd_cdna": _CDNA, "amd_rdna": _RDNA, "interpreter": _INTERP,
}
FAMILY_TARGETS = {
    "nvidia_sm90": ("cuda:90",),
    "nvidia": ("cuda:80",),
    "amd_cdna": ("hip:gfx942", "hip:gfx90a"),
    "amd_rdna": ("hip:gfx1100",),
}


def padded_head_dim(head_dim: int) -> int:
    return max(16, triton_next_pow2(head_dim))


# The forward's key-padding scan chunk (a constexpr): one size for every length, so lengths
# never cause a compile of their own; the scan loops over longer padding masks.
SCAN_BLOCK = 1024


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


BUCKETS = (32, 64, 128, 256)


def _bucket(head_dim: int) -> int:
    """The head-dim bucket of the config tables: the padded head dim, 16 counting as 32."""
    return max(32, padded_head_dim(head_dim))


_FAMILIES: Dict[Tuple, str] = {}


def family(device: torch.device) -> str:
    """Which config table serves `device`: nvidia, amd_cdna (wave64), amd_rdna (wave32), or
    interpreter. Cached per device (it is asked on every call)."""
    key = (device.type, device.index, triton_common.interpreting())
    if key not in _FAMILIES:
        if device.type != "cuda" or triton_common.interpreting():
            name = "interpreter"
        elif triton_common.vendor() == "amd":
            arch = triton_common.device_arch(device.index)
            name = "amd_rdna" if arch.startswith(("gfx10", "gfx11", "gfx12")) else "amd_cdna"
        else:
            major = torch.cuda.get_device_capability(device)[0]
            name = "nvidia_sm90" if major >= 9 else "nvidia"
        _FAMILIES[key] = name
    return _FAMILIES[key]


def load_overrides(path: str) -> None:
    """Replace table entries from a JSON file ({"nvidia": {"fwd": {"64,2": [bm, bn, warps,
    stages]}}}), e.g. what benchmarks/tune_attention.py found on another GPU. Read once from
    $GPUPARITY_ATTENTION_CONFIGS when set."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    for fam, kernels_ in data.items():
        for kernel_name, entries in kernels_.items():
            for key, values in entries.items():
                bucket, elem = (int(x) for x in key.split(","))
                CONFIGS[fam][kernel_name][(bucket, elem)] = TileConfig(*[int(x) for x in values])
                # an override serves every key length: the short-key entry makes way for it
                SHORT_CONFIGS.get(fam, {}).get(kernel_name, {}).pop((bucket, elem), None)
    clear_plans()


_OVERRIDES_LOADED = []


def tile_config(kernel: str, device: torch.device, head_dim: int, dtype: torch.dtype,
                k_len: Optional[int] = None) -> TileConfig:
    """The tile config for `kernel` here; k_len (the key length) picks SHORT_CONFIGS' entry
    for short key sequences where there is one."""
    if not _OVERRIDES_LOADED:
        _OVERRIDES_LOADED.append(True)
        if os.environ.get("GPUPARITY_ATTENTION_CONFIGS"):
            load_overrides(os.environ["GPUPARITY_ATTENTION_CONFIGS"])
    elem = 4 if dtype == torch.float32 else 2
    fam = family(device)
    if k_len is not None and k_len <= SHORT_KEYS:
        short = SHORT_CONFIGS.get(fam, {}).get(kernel, {}).get((_bucket(head_dim), elem))
        if short is not None:
            return short
    table = CONFIGS[fam][kernel]
    # a family without its own entry for a small bucket uses the next larger bucket's
    for bucket in BUCKETS[BUCKETS.index(_bucket(head_dim)):]:
        if (bucket, elem) in table:
            return table[(bucket, elem)]
    raise KeyError(f"no {kernel} tile config for head_dim {head_dim}, {dtype} in {fam}")


# --------------------------------------------------------------------------- launchers
@dataclasses.dataclass
class MaskArgs:
    """Masks as the kernels read them: a tensor and four strides (0 for broadcast dims)."""
    kind: int = MASK_NONE
    mask: Optional[torch.Tensor] = None
    mask_strides: Tuple[int, int, int, int] = (0, 0, 0, 0)
    kpm: Optional[torch.Tensor] = None
    kpm_strides: Tuple[int, int] = (0, 0)
    bounds: Optional[torch.Tensor] = None        # int32 (B, 3): first, one-past-last kept key, has holes


def _broadcast_strides(t: torch.Tensor) -> Tuple[int, int, int, int]:
    shape = (1,) * (4 - t.dim()) + tuple(t.shape)
    strides = (0,) * (4 - t.dim()) + tuple(t.stride())
    return tuple(0 if size == 1 else stride for size, stride in zip(shape, strides))  # type: ignore[return-value]


def prepare_masks(q: torch.Tensor, k: torch.Tensor, attn_mask=None, key_padding_mask=None,
                  key_lengths=None) -> MaskArgs:
    batch, k_len = q.shape[0], k.shape[2]
    args = MaskArgs()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            args.kind = MASK_BOOL
            args.mask = attn_mask.view(torch.uint8)  # same bytes, no copy; Triton reads u8
        else:
            args.kind = MASK_ADDITIVE
            args.mask = attn_mask.detach()
        args.mask_strides = _broadcast_strides(args.mask)
    if key_lengths is not None and key_padding_mask is not None:  # rare: fold lengths into the mask
        beyond = torch.arange(k_len, device=q.device).view(1, k_len) >= key_lengths.to(q.device).view(-1, 1)
        key_padding_mask, key_lengths = key_padding_mask | beyond, None
    if key_padding_mask is not None:
        kpm = key_padding_mask
        if kpm.dtype == torch.bool:
            kpm = kpm.view(torch.uint8)
        args.kpm = kpm
        args.kpm_strides = (0 if kpm.shape[0] == 1 else kpm.stride(0), kpm.stride(1))
        # (first, last, holes) per batch item: written by the forward kernel, read by the backward
        args.bounds = torch.empty(batch, 3, dtype=torch.int32, device=q.device)
    elif key_lengths is not None:
        lengths = key_lengths.to(device=q.device, dtype=torch.int32).clamp(0, k_len)
        # keys 0..length-1 kept: no holes
        args.bounds = torch.stack([torch.zeros_like(lengths), lengths, torch.zeros_like(lengths)], dim=1).contiguous()
    return args


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 follows torch's TF32 switch (on NVIDIA; AMD's Triton has no portable tf32 dot).
    With TF32 off, NVIDIA GPUs get fp32-accurate dots from the tensor cores ("tf32x3": each
    operand split into a TF32 high and low part, three products) instead of CUDA-core FMAs:
    the battery holds it to the fp32 bar, it runs several times faster and compiles in a
    fraction of the time. GPUPARITY_FP32_DOT=ieee asks for the FMA path."""
    if triton_common.interpreting():
        return "upcast" if dtype == torch.bfloat16 else "ieee"
    if dtype != torch.float32:
        return "ieee"  # ignored for 16-bit inputs
    if triton_common.vendor() != "nvidia":
        return "ieee"
    return "tf32" if matmul_tf32() else strict_fp32_dot()


_STRICT_DOT: List[str] = []


def strict_fp32_dot() -> str:
    """The NVIDIA fp32 dot used when TF32 is off: "tf32x3" where this Triton has it, else
    "ieee"; GPUPARITY_FP32_DOT=ieee|tf32x3 chooses."""
    if not _STRICT_DOT:
        wanted = os.environ.get("GPUPARITY_FP32_DOT", "tf32x3")
        if wanted not in ("ieee", "tf32x3"):
            raise ValueError(f"GPUPARITY_FP32_DOT: expected ieee or tf32x3, got {wanted!r}")
        if wanted == "tf32x3":
            try:
                from triton.backends.nvidia.compiler import CUDAOptions
                if "tf32x3" not in CUDAOptions.allowed_dot_input_precisions:
                    wanted = "ieee"
            except Exception:  # noqa: BLE001 - no NVIDIA backend in this Triton: FMA dots
                wanted = "ieee"
        _STRICT_DOT.append(wanted)
    return _STRICT_DOT[0]


_DUMMIES: Dict[torch.device, torch.Tensor] = {}


def _dummy(device) -> torch.Tensor:
    """A placeholder pointer for absent masks (the kernels never read it); one per device."""
    if device not in _DUMMIES:
        _DUMMIES[device] = torch.zeros(16, dtype=torch.uint8, device=device)
    return _DUMMIES[device]


def _common_constexprs(head_dim, masks: MaskArgs, is_causal, dropout_p, dtype):
    return dict(HEAD_DIM=head_dim, D_PAD=padded_head_dim(head_dim), IS_CAUSAL=bool(is_causal),
                MASK_KIND=masks.kind, HAS_KPM=masks.kpm is not None, HAS_BOUNDS=masks.bounds is not None,
                DROPOUT=dropout_p > 0.0, DOT_PRECISION=dot_precision(dtype))


def _output_like(q: torch.Tensor) -> torch.Tensor:
    """An output with q's memory layout when q is dense (so a (B,S,H,D) view stays one), else
    (B,S,H,D) when heads are inner to the sequence in q, else (B,H,S,D) contiguous."""
    if q.is_contiguous() or q.transpose(1, 2).is_contiguous():
        return torch.empty_like(q)
    batch, heads, q_len, head_dim = q.shape
    if q.stride(1) < q.stride(2):
        return torch.empty(batch, q_len, heads, head_dim, dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty(batch, heads, q_len, head_dim, dtype=q.dtype, device=q.device)


# Launches prepared per call signature (shapes, strides, dtype, mask layout, flags): a training
# loop repeats a few signatures, and re-deriving tile configs, constexprs and ~50 launch
# arguments on every call is host time that short sequences cannot hide. Calls with dropout
# (a new seed each time) are not kept.
_PLANS = PlanCache()


def _plan_key(q, k, v, masks: MaskArgs, is_causal: bool, scale: float, dropout_p: float, extra=()) -> Optional[tuple]:
    if dropout_p > 0.0:
        return None
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, masks.kind,
           None if masks.mask is None else masks.mask.dtype, masks.mask_strides,
           None if masks.kpm is None else masks.kpm.dtype, masks.kpm_strides, masks.bounds is not None,
           is_causal, scale, triton_common.interpreting(), *extra)
    if q.dtype == torch.float32:
        key += (matmul_tf32(),)
    return key


def _planned(key: Optional[tuple], build) -> Tuple[PreparedLaunch, ...]:
    if key is None:
        return build()
    plan = _PLANS.get(key)
    return plan if plan is not None else _PLANS.keep(key, build())


def _mask_tensors(q, masks: MaskArgs) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dummy = _dummy(q.device)
    return (dummy if masks.mask is None else masks.mask, dummy if masks.kpm is None else masks.kpm,
            dummy if masks.bounds is None else masks.bounds)


def _forward_launch(q, k, v, out, masks: MaskArgs, is_causal, scale, dropout_p, seed) -> Tuple[PreparedLaunch]:
    batch, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    cfg = tile_config("fwd", q.device, head_dim, q.dtype, k_len)
    return (PreparedLaunch(kernels()["fwd"], (cdiv(q_len, cfg.block_m), batch * heads), (
        scale * LOG2E, float(dropout_p), int(seed),
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *masks.mask_strides, *masks.kpm_strides,
        heads, heads // kv_heads, q_len, k_len),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.stages(masks.kind != MASK_NONE), SCAN=SCAN_BLOCK,
        **_common_constexprs(head_dim, masks, is_causal, dropout_p, q.dtype)),)


def attention_forward(q, k, v, masks: MaskArgs, is_causal: bool, scale: float, dropout_p: float = 0.0,
                      seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): lse is (B, H, Sq) float32 in base 2, +inf for rows with no key."""
    batch, heads, q_len, _ = q.shape
    out = _output_like(q)
    lse = torch.empty(batch, heads, q_len, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    if k.shape[2] == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse
    (forward,) = _planned(_plan_key(q, k, v, masks, is_causal, scale, dropout_p, ("fwd",)),
                          lambda: _forward_launch(q, k, v, out, masks, is_causal, scale, dropout_p, seed))
    forward(q, k, v, out, lse, *_mask_tensors(q, masks))
    return out, lse


def _backward_launches(q, k, v, out, dout, dq, dk, dv, masks: MaskArgs, is_causal, scale, dropout_p, seed
                       ) -> Tuple[PreparedLaunch, PreparedLaunch]:
    batch, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    constexprs = _common_constexprs(head_dim, masks, is_causal, dropout_p, q.dtype)
    dense_mask = masks.kind != MASK_NONE
    cfg = tile_config("dq", q.device, head_dim, q.dtype, k_len)
    dq_launch = PreparedLaunch(kernels()["dq"], (cdiv(q_len, cfg.block_m), batch * heads), (
        scale * LOG2E, scale, float(dropout_p), int(seed),
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *dout.stride(), *dq.stride(),
        *masks.mask_strides, *masks.kpm_strides,
        heads, heads // kv_heads, q_len, k_len),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.stages(dense_mask),
        **constexprs)
    cfg = tile_config("dkdv", q.device, head_dim, q.dtype, k_len)
    dkdv_launch = PreparedLaunch(kernels()["dkdv"], (cdiv(k_len, cfg.block_n), batch * kv_heads), (
        scale * LOG2E, scale, float(dropout_p), int(seed),
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
        *masks.mask_strides, *masks.kpm_strides,
        heads, kv_heads, heads // kv_heads, q_len, k_len),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.stages(dense_mask),
        **constexprs)
    return dq_launch, dkdv_launch


def attention_backward(dout, q, k, v, out, lse, masks: MaskArgs, is_causal: bool, scale: float,
                       dropout_p: float = 0.0, seed: int = 0):
    batch, heads, q_len, _ = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    # out's and dq/dk/dv's strides follow from q's, k's and v's (the key's); dout's do not
    key = _plan_key(q, k, v, masks, is_causal, scale, dropout_p, ("bwd", dout.stride()))
    dq_launch, dkdv_launch = _planned(key, lambda: _backward_launches(
        q, k, v, out, dout, dq, dk, dv, masks, is_causal, scale, dropout_p, seed))
    mask, kpm, bounds = _mask_tensors(q, masks)
    delta = torch.empty(batch, heads, q_len, dtype=torch.float32, device=q.device)
    # dq first: it also computes delta = rowsum(out * dout), which the dk/dv kernel reads
    dq_launch(q, k, v, out, dout, lse, delta, dq, mask, kpm, bounds)
    dkdv_launch(q, k, v, dout, lse, delta, dk, dv, mask, kpm, bounds)
    return dq, dk, dv


class TritonAttention(torch.autograd.Function):
    """Inputs q, k, v and one tuple of everything else (fewer arguments through autograd's
    Python layer: it costs per argument, on every call, forward and backward)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        masks, is_causal, scale, dropout_p, seed = call
        out, lse = attention_forward(q, k, v, masks, is_causal, scale, dropout_p, seed)
        # the masks go through save_for_backward too: a mask changed in place before the
        # backward then raises (autograd's version check) instead of giving wrong gradients
        ctx.save_for_backward(q, k, v, out, lse, masks.mask, masks.kpm, masks.bounds)
        ctx.meta = (masks.kind, masks.mask_strides, masks.kpm_strides, is_causal, scale, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, mask, kpm, bounds = ctx.saved_tensors
        kind, mask_strides, kpm_strides, is_causal, scale, dropout_p, seed = ctx.meta
        masks = MaskArgs(kind, mask, mask_strides, kpm, kpm_strides, bounds)
        dq, dk, dv = attention_backward(dout, q, k, v, out, lse, masks, is_causal, scale, dropout_p, seed)
        return dq, dk, dv, None


def deterministic() -> bool:
    """The backward has no atomics: it is deterministic whatever GPUPARITY_DETERMINISTIC or
    torch.use_deterministic_algorithms say. Kept as a function so callers can ask."""
    return True


def triton_attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
                     key_lengths=None, dropout_p: float = 0.0, seed: Optional[int] = None):
    """The kernel behind backend "triton". Inputs are assumed validated (gpuparity.attention
    does that). key_lengths (B,) int: keys at or past a batch item's length are padding
    (an alternative to key_padding_mask that needs no mask reads). dropout_p applies to the
    attention probabilities (as nn.MultiheadAttention in training); seed makes it repeatable."""
    if attn_mask is not None and attn_mask.dtype != torch.bool and attn_mask.requires_grad:
        raise ValueError("attn_mask: a float mask that requires grad is not supported by the triton "
                         "backend (no gradient for the mask); detach it or use backend='sdpa_math'")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if dropout_p > 0.0 and seed is None:
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item())
    masks = prepare_masks(q, k, attn_mask, key_padding_mask, key_lengths)
    return TritonAttention.apply(q, k, v, (masks, bool(is_causal), scale, float(dropout_p), int(seed or 0)))


# --------------------------------------------------------------------------- AOT specs
_POINTER_TYPES = {
    "LSE": "*fp32", "Delta": "*fp32", "Bounds": "*i32", "KPM": "*u8",
}
_FLOAT_SCALARS = {"qk_scale", "sm_scale", "dropout_p"}


def _signature(kernel, dtype: str, mask_type: str) -> Dict[str, str]:
    signature = {}
    # JITFunction and InterpretedFunction both keep the Python function in .fn
    for name, param in inspect.signature(getattr(kernel, "fn", kernel)).parameters.items():
        if "constexpr" in str(param.annotation):
            signature[name] = "constexpr"
        elif name in _POINTER_TYPES:
            signature[name] = _POINTER_TYPES[name]
        elif name == "Mask":
            signature[name] = mask_type
        elif name[:1].isupper():
            signature[name] = f"*{dtype}"
        elif name in _FLOAT_SCALARS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature


def _aot_spec(fam, targets, kernel_name, head_dim, elem, cfg, dropout=False, dense_mask=True) -> AotSpec:
    dtype = "bf16" if elem == 2 else "fp32"
    kernel = kernels()[kernel_name]
    # fp32 on NVIDIA ships split-TF32 tensor-core dots ("tf32x3", dot_precision's choice with
    # TF32 off); with TF32 on it is "tf32": the same tiles and operands in shared memory, one
    # product instead of three. AMD's Triton has FMA dots only.
    precision = "tf32x3" if elem == 4 and fam.startswith("nvidia") else "ieee"
    constexprs = dict(HEAD_DIM=head_dim, D_PAD=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      IS_CAUSAL=True, MASK_KIND=MASK_ADDITIVE if dense_mask else MASK_NONE, HAS_KPM=True,
                      HAS_BOUNDS=True, DROPOUT=dropout, DOT_PRECISION=precision)
    if kernel_name == "fwd":
        constexprs["SCAN"] = SCAN_BLOCK
    return AotSpec(
        name=f"attention.{kernel_name}.{fam}.d{head_dim}.{dtype}.m{cfg.block_m}n{cfg.block_n}"
             f"w{cfg.num_warps}s{cfg.stages(dense_mask)}" + (".dropout" if dropout else "")
             + ("" if dense_mask else ".nomask"),
        kernel=kernel, signature=_signature(kernel, dtype, "*fp32"), constexprs=constexprs,
        num_warps=cfg.num_warps, num_stages=cfg.stages(dense_mask), targets=targets)


def aot_specs() -> List[AotSpec]:
    """Every shipped tile configuration, compiled at the largest head dim that uses it, with
    the mask flags that cost the most shared memory (additive mask tiles, key padding with
    its two-way loop, causal), and, for a config with fewer stages under a dense mask, also
    without one at its full depth. Dropout adds registers, not shared memory: it is compiled
    once per family and kernel (at the 64 bf16 config) to prove it builds."""
    specs: List[AotSpec] = []
    for fam, targets in FAMILY_TARGETS.items():
        for kernel_name in ("fwd", "dkdv", "dq"):
            largest: Dict[Tuple[int, TileConfig], int] = {}
            entries = list(CONFIGS[fam][kernel_name].items())
            entries += list(SHORT_CONFIGS.get(fam, {}).get(kernel_name, {}).items())
            for (bucket, elem), cfg in entries:
                largest[(elem, cfg)] = max(bucket, largest.get((elem, cfg), 0))
            for (elem, cfg), head_dim in largest.items():
                specs.append(_aot_spec(fam, targets, kernel_name, head_dim, elem, cfg))
                if cfg.masked_stages is not None:  # its deeper pipeline, used without a dense mask
                    specs.append(_aot_spec(fam, targets, kernel_name, head_dim, elem, cfg, dense_mask=False))
            specs.append(_aot_spec(fam, targets, kernel_name, 64, 2, CONFIGS[fam][kernel_name][(64, 2)],
                                   dropout=True))
    return specs


# --------------------------------------------------------------------------- backend
_UNAVAILABLE: Dict[Tuple[str, bool], Optional[str]] = {}


def _unavailable_reason(device_type: str) -> Optional[str]:
    """triton_unavailable_reason, cached: dispatch asks on every call."""
    key = (device_type, triton_common.interpreting())
    if key not in _UNAVAILABLE:
        _UNAVAILABLE[key] = triton_common.triton_unavailable_reason(device_type)
    return _UNAVAILABLE[key]


def _supports(problem: Problem) -> List[str]:
    reasons = []
    absent = _unavailable_reason(problem.device.type)
    if absent:
        return [f"triton: {absent}" if not absent.startswith("triton") else absent]
    head_dim = problem.feature("head_dim", 64)
    if head_dim > MAX_HEAD_DIM:
        reasons.append(f"triton: head_dim {head_dim} > {MAX_HEAD_DIM}")
    if problem.feature("mask_requires_grad"):
        reasons.append("triton: no gradient for a float attn_mask (it requires grad)")
    return reasons


def _availability() -> Optional[str]:
    return f"triton: not importable ({_IMPORT_ERROR})" if triton is None else None


def _backend_fn(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return triton_attention(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                            is_causal=is_causal, scale=scale)


register(Backend("triton", "attention", _backend_fn,
                 "gpuparity's fused Triton kernel (forward and backward, masks read in tiles)",
                 device_types=("cuda", "cpu"), dtypes=(torch.float16, torch.bfloat16, torch.float32),
                 availability=_availability, supports=_supports, jit=True))
