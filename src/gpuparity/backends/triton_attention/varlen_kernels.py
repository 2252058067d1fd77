"""The packed variable-length attention kernels (flash_attn_varlen_func's layout) in Triton, built
on the dense kernels' tile loops; imports triton at its top, so varlen.py loads it lazily."""
# One program per (sequence, head, block of query rows) (dk/dv: per block of keys of a k/v head),
# its sequence's start and length read from cu_seqlens: blocks past a sequence's end exit at
# once and keys are visited only within the sequence, so no padding is ever computed. Causal
# and window masks are bottom-right aligned (FlashAttention's varlen): query i of a sequence of
# Sq queries and Sk keys sits at key position i + Sk - Sq. The dense tile loops compare rows
# with columns top-left aligned, so they get rows shifted by that diagonal (forward, dq) or
# columns shifted back by it (dk/dv); the dense kernels themselves are untouched.
from __future__ import annotations

import triton
import triton.language as tl

from .backward_kernels import _bwd_dkdv_inner, _dq_loops
from .kernels import _fwd_inner, alibi_slope_of

_NO_SPECIALIZE = ("num_heads", "num_kv_heads", "total_q", "window_left", "window_right")


@triton.jit
def _sequence(Cu, batch):
    """(start as int64, length as int32) of sequence `batch` from its cumulative lengths."""
    start = tl.load(Cu + batch).to(tl.int64)
    end = tl.load(Cu + batch + 1).to(tl.int64)
    return start, (end - start).to(tl.int32)


@triton.jit
def _varlen_key_range(row0, k_len, window_left, window_right,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                      HAS_WINDOW: tl.constexpr):
    """As kernels._key_range for rows [row0, row0 + BLOCK_M) in key positions (row0 = the block's
    first query + Sk - Sq, negative when Sq > Sk): [lo, hi) to visit, [lo, full_end) unmasked."""
    lo = 0
    hi = k_len
    if IS_CAUSAL:
        hi = tl.minimum(hi, row0 + BLOCK_M)
    if HAS_WINDOW:
        lo = tl.maximum(lo, (tl.maximum(row0 - window_left, 0) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(hi, row0 + BLOCK_M + window_right)
    hi = tl.maximum(hi, 0)  # rows wholly before the diagonal see nothing (no division of negatives)
    full_end = (hi // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        full_end = tl.minimum(full_end, (tl.maximum(row0 + 1, 0) // BLOCK_N) * BLOCK_N)
    full_end = tl.maximum(full_end, lo)
    hi = tl.maximum(hi, full_end)
    return lo, full_end, hi


@triton.jit
def _query_block(CuQ, CuK, num_heads, group_size, window_left, window_right,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """This program's block of query rows (forward, dq): its head and k/v head (int64), its
    sequence's starts and lengths, its rows, their shift to key positions and its key range."""
    start_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // num_heads
    head = batch_head % num_heads
    q_start, q_len = _sequence(CuQ, batch)
    k_start, k_len = _sequence(CuK, batch)
    diag = k_len - q_len
    lo, full_end, hi = _varlen_key_range(start_m * BLOCK_M + diag, k_len, window_left, window_right,
                                         BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_WINDOW)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    return (head.to(tl.int64), (head // group_size).to(tl.int64), q_start, q_len, k_start, k_len, rows, diag,
            lo, full_end, hi)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _varlen_fwd_kernel(
    Q, K, V, Out, LSE, CuQ, CuK, Alibi,
    qk_scale, window_left, window_right, cap_in, cap_out,
    stride_qm, stride_qh, stride_qd,
    stride_kn, stride_kh, stride_kd,
    stride_vn, stride_vh, stride_vd,
    stride_om, stride_oh, stride_od, stride_ab,
    num_heads, group_size, total_q,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
):
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    h64, kvh64, q_start, q_len, k_start, k_len, rows, diag, lo, full_end, hi = _query_block(
        CuQ, CuK, num_heads, group_size, window_left, window_right, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_WINDOW)
    if tl.program_id(0) * BLOCK_M >= q_len:  # past this sequence's queries
        return
    # ALiBi: the tile loops get rows in key positions (rows + diag), so the distance needs no shift
    alibi_slope = alibi_slope_of(Alibi, tl.program_id(1) // num_heads, h64, stride_ab, HAS_ALIBI)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    row_ok = rows < q_len
    q = tl.load(Q + q_start * stride_qm + h64 * stride_qh + rows[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + k_start * stride_kn + kvh64 * stride_kh
    v_base = V + k_start * stride_vn + kvh64 * stride_vh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    # rows in key positions: what the tile loop's causal / window compares need
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, K, K, False,
                               rows + diag, offs_n, offs_d, lo, full_end, q_len, k_len, hi, qk_scale, 0, 0.0,
                               window_left, window_right, cap_in, cap_out, alibi_slope, 0,
                               stride_kn, stride_kd, stride_vn, stride_vd, 0, 0, 0,
                               HEAD_DIM, BLOCK_N, IS_CAUSAL, 0, False, False, False, DOT_PRECISION, HAS_WINDOW, SOFTCAP,
                               HAS_ALIBI)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, K, K, False,
                               rows + diag, offs_n, offs_d, full_end, hi, q_len, k_len, hi, qk_scale, 0, 0.0,
                               window_left, window_right, cap_in, cap_out, alibi_slope, 0,
                               stride_kn, stride_kd, stride_vn, stride_vd, 0, 0, 0,
                               HEAD_DIM, BLOCK_N, IS_CAUSAL, 0, False, False, True, DOT_PRECISION, HAS_WINDOW, SOFTCAP,
                               HAS_ALIBI)
    # a row with no key (before the diagonal, an empty key sequence): output 0, lse +inf
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = tl.where(empty[:, None], 0.0, acc / l_safe[:, None])
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    tl.store(LSE + h64 * total_q + q_start + rows, lse, mask=row_ok)
    o_ptrs = Out + q_start * stride_om + h64 * stride_oh + rows[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _varlen_bwd_dq_kernel(
    Q, K, V, Out, DO, LSE, Delta, DQ, CuQ, CuK, Alibi,
    qk_scale, sm_scale, window_left, window_right, cap_in, cap_out,
    stride_qm, stride_qh, stride_qd,
    stride_kn, stride_kh, stride_kd,
    stride_vn, stride_vh, stride_vd,
    stride_om, stride_oh, stride_od,
    stride_dm, stride_dh, stride_dd,
    stride_dqm, stride_dqh, stride_dqd, stride_ab,
    num_heads, group_size, total_q,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
):
    """dq for one block of query rows of one sequence and head; also delta (rowsum(out * dout)
    made consistent with dp by backward_kernels._dq_loops), kept for the dk/dv kernel, which runs
    after it."""
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    h64, kvh64, q_start, q_len, k_start, k_len, rows, diag, lo, full_end, hi = _query_block(
        CuQ, CuK, num_heads, group_size, window_left, window_right, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_WINDOW)
    if tl.program_id(0) * BLOCK_M >= q_len:
        return
    alibi_slope = alibi_slope_of(Alibi, tl.program_id(1) // num_heads, h64, stride_ab, HAS_ALIBI)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    tile_ok = (rows < q_len)[:, None] & (offs_d < HEAD_DIM)[None, :]
    row_ok = rows < q_len
    q = tl.load(Q + q_start * stride_qm + h64 * stride_qh + rows[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=tile_ok, other=0.0)
    do = tl.load(DO + q_start * stride_dm + h64 * stride_dh + rows[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                 mask=tile_ok, other=0.0)
    o = tl.load(Out + q_start * stride_om + h64 * stride_oh + rows[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=tile_ok, other=0.0)
    row_base = h64 * total_q + q_start
    lse = tl.load(LSE + row_base + rows, mask=row_ok, other=float("inf"))
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    k_base = K + k_start * stride_kn + kvh64 * stride_kh
    v_base = V + k_start * stride_vn + kvh64 * stride_vh
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    dq, delta, top = _dq_loops(dq, False, q, do, lse, delta, k_base, v_base, K, K, rows + diag, offs_n, offs_d,
                               lo, full_end, hi, q_len, k_len, qk_scale, 0, 0.0, window_left, window_right,
                               cap_in, cap_out, alibi_slope, 0, stride_kn, stride_kd, stride_vn, stride_vd, 0, 0, 0,
                               HEAD_DIM, BLOCK_N, IS_CAUSAL, 0, False, False, DOT_PRECISION, HAS_WINDOW, SOFTCAP,
                               HAS_ALIBI, None)
    # Delta is (2, H, total_q): _dq_loops' delta, consistent with dp, then its top
    tl.store(Delta + row_base + rows, delta, mask=row_ok)
    if q.dtype == tl.float32:   # (16-bit: the dk/dv kernel reads no top)
        tl.store(Delta + num_heads.to(tl.int64) * total_q + row_base + rows, top, mask=row_ok)
    dq = dq * sm_scale
    tl.store(DQ + q_start * stride_dqm + h64 * stride_dqh + rows[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=tile_ok)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _varlen_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, Delta, DK, DV, CuQ, CuK, Alibi,
    qk_scale, sm_scale, window_left, window_right, cap_in, cap_out,
    stride_qm, stride_qh, stride_qd,
    stride_kn, stride_kh, stride_kd,
    stride_vn, stride_vh, stride_vd,
    stride_dm, stride_dh, stride_dd,
    stride_dkn, stride_dkh, stride_dkd,
    stride_dvn, stride_dvh, stride_dvd, stride_ab,
    num_heads, num_kv_heads, group_size, total_q,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
):
    """dk, dv for one block of keys of one sequence and k/v head, summed over its GQA group in a
    fixed order (deterministic, no atomics)."""
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    start_n = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch = batch_kv_head // num_kv_heads
    kv_head = batch_kv_head % num_kv_heads
    k_start, k_len = _sequence(CuK, batch)
    if start_n * BLOCK_N >= k_len:
        return
    q_start, q_len = _sequence(CuQ, batch)

    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    kv_ok = (cols < k_len)[:, None] & d_ok[None, :]
    kvh64 = kv_head.to(tl.int64)
    k = tl.load(K + k_start * stride_kn + kvh64 * stride_kh + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=kv_ok, other=0.0)
    v = tl.load(V + k_start * stride_vn + kvh64 * stride_vh + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)

    # the key block's first column in query-row positions (bottom-right: row i sits at key i + diag)
    diag = k_len - q_len
    n0 = start_n * BLOCK_N - diag
    q_lo = 0
    q_hi = q_len
    if IS_CAUSAL:
        q_lo = (tl.maximum(n0, 0) // BLOCK_M) * BLOCK_M
    if HAS_WINDOW:
        q_lo = tl.maximum(q_lo, (tl.maximum(n0 - window_right, 0) // BLOCK_M) * BLOCK_M)
        q_hi = tl.minimum(q_hi, n0 + BLOCK_N + window_left)
    q_full = q_lo
    if IS_CAUSAL:  # query tiles from q_full on see every key of the block
        q_full = tl.minimum(tl.cdiv(tl.maximum(n0 + BLOCK_N - 1, 0), BLOCK_M) * BLOCK_M, q_hi)
        q_full = tl.maximum(q_full, q_lo)

    for g in range(0, group_size):
        head = kv_head * group_size + g
        h64 = head.to(tl.int64)
        q_base = Q + q_start * stride_qm + h64 * stride_qh
        do_base = DO + q_start * stride_dm + h64 * stride_dh
        lse_base = LSE + h64 * total_q + q_start
        delta_base = Delta + h64 * total_q + q_start
        top_base = delta_base + num_heads.to(tl.int64) * total_q   # Delta: (2, H, total_q), as the dq kernel stores it
        # columns come in query-row positions (cols - diag): the ALiBi distance needs no shift
        alibi_slope = alibi_slope_of(Alibi, batch, head, stride_ab, HAS_ALIBI)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, cols < k_len, q_base, do_base, lse_base, delta_base, top_base, K, K,
                                 cols - diag, offs_m, offs_d, q_lo, q_full, q_len, k_len, qk_scale, 0, 0.0,
                                 window_left, window_right, cap_in, cap_out, alibi_slope, 0,
                                 stride_qm, stride_qd, stride_dm, stride_dd, 0, 0, 0, 0,
                                 HEAD_DIM, BLOCK_M, IS_CAUSAL, 0, False, False, True, DOT_PRECISION,
                                 HAS_WINDOW, SOFTCAP, HAS_ALIBI, False)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, cols < k_len, q_base, do_base, lse_base, delta_base, top_base, K, K,
                                 cols - diag, offs_m, offs_d, q_full, q_hi, q_len, k_len, qk_scale, 0, 0.0,
                                 window_left, window_right, cap_in, cap_out, alibi_slope, 0,
                                 stride_qm, stride_qd, stride_dm, stride_dd, 0, 0, 0, 0,
                                 HEAD_DIM, BLOCK_M, IS_CAUSAL, 0, False, False, False, DOT_PRECISION,
                                 HAS_WINDOW, SOFTCAP, HAS_ALIBI, False)

    dk = dk * sm_scale
    tl.store(DK + k_start * stride_dkn + kvh64 * stride_dkh + cols[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + k_start * stride_dvn + kvh64 * stride_dvh + cols[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_ok)


VARLEN_KERNELS = {
    "varlen_fwd": _varlen_fwd_kernel,
    "varlen_dq": _varlen_bwd_dq_kernel,
    "varlen_dkdv": _varlen_bwd_dkdv_kernel,
}
