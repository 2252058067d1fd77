# long file: the dq and dk/dv programs and their four entry points (two-launch, one-launch, descriptor) share every loop and flag; apart they would drift
"""The backward kernels of fused attention in Triton: dk/dv and dq as two launches (long
sequences: delta is computed once, by the dq kernel, and read by dk/dv) or as one (short ones,
where the second launch costs more host time than it saves device time). Imports triton at its
top: launch.py loads it lazily, with kernels.py."""
# No atomics anywhere: dk/dv (summed over a GQA group inside one program) and dq are computed by
# separate programs, so the backward is deterministic on every run, in either form.
from __future__ import annotations

import triton
import triton.language as tl

from .kernels import (_NO_SPECIALIZE, _alibi_bias, _key_range, _mma, _scan_padding, _tanh, alibi_shift_of,
                      alibi_slope_of, dropout_keep, key_block_of_visit, key_block_visits,
                      program_block)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, key_kept, q_base, do_base, lse_base, delta_base, top_base, mask_base, o_base,
                    cols, offs_m, offs_d, lo, hi, q_len, k_len, qk_scale, seed_bh, dropout_p,
                    window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                    stride_qm, stride_qd, stride_dm, stride_dd, stride_mm, stride_mn, stride_om, stride_od,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, IS_CAUSAL: tl.constexpr,
                    MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                    MASK_DIAGONAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                    DELTA_INLINE: tl.constexpr,
                    TMA: tl.constexpr = False, q_desc=None, do_desc=None, q_row0=0, q_col=0, do_row0=0, do_col=0):
    """Accumulates dk, dv over query blocks [lo, hi). top_base: the dq kernel's top
    (_dq_loops; not read with DELTA_INLINE). TMA: q and dout tiles from the tensor
    descriptors q_desc / do_desc, at rows q_row0 + m / do_row0 + m, columns q_col / do_col."""
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        row_ok = rows < q_len
        if TMA:
            # Hopper's tensor memory accelerator: the tiles land in shared memory with no
            # addresses in registers (the launcher allows it only where every tile lies inside
            # its own (batch, head): q_len a multiple of BLOCK_M, head dim a power of two)
            q_t = tl.trans(q_desc.load([q_row0 + start_m, q_col]))
            do = do_desc.load([do_row0 + start_m, do_col])
        else:
            # q read transposed, (D, BLOCK_M): the tile of scores is built as k @ q^T
            q_t = tl.load(q_base + rows[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                          mask=d_ok[:, None] & row_ok[None, :], other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_dm + offs_d[None, :] * stride_dd,
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if TMA:   # every row exists (q_len is a multiple of BLOCK_M): no masks, fewer registers
            lse = tl.load(lse_base + rows)
        else:
            # rows past the end get lse = +inf: probabilities of exactly 0
            lse = tl.load(lse_base + rows, mask=row_ok, other=float("inf"))
        if DELTA_INLINE:
            # the one-launch backward: no dq program has stored delta yet; rowsum(out * dout) here
            o = tl.load(o_base + rows[:, None] * stride_om + offs_d[None, :] * stride_od,
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        elif TMA:
            delta = tl.load(delta_base + rows)
        else:
            delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        if SOFTCAP:
            tanh_t = _tanh(_mma(k, q_t, None, DOT_PRECISION) * cap_in)
            qk_t = tanh_t * cap_out
        else:
            qk_t = _mma(k, q_t, None, DOT_PRECISION) * qk_scale
        if HAS_ALIBI:   # the forward's bias, recomputed (no gradient flows to it)
            qk_t += _alibi_bias(rows[None, :], cols[:, None], start_m + alibi_shift, alibi_slope, alibi_shift)
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
            if not TMA:   # the descriptor kernel zeroes padded keys' rows at the end instead
                p_t = tl.where(key_kept[:, None], p_t, 0.0)
        if MASK_DIAGONAL:
            if IS_CAUSAL:
                p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)
        if HAS_WINDOW:
            in_window_t = (cols[:, None] >= rows[None, :] - window_left) & (cols[:, None] <= rows[None, :] + window_right)
            p_t = tl.where(in_window_t, p_t, 0.0)
        dp_t = _mma(v, tl.trans(do), None, DOT_PRECISION)
        if DROPOUT:
            keep_t = dropout_keep(seed_bh, rows[None, :], cols[:, None], k_len, dropout_p)
            scale_keep = 1.0 / (1.0 - dropout_p)
            p_dropped_t = tl.where(keep_t, p_t * scale_keep, 0.0)
            dv = _mma(p_dropped_t.to(do.dtype), do, dv, DOT_PRECISION)
            dp_t = tl.where(keep_t, dp_t * scale_keep, 0.0)
        else:
            dv = _mma(p_t.to(do.dtype), do, dv, DOT_PRECISION)
        # softmax backward: ds = p * (dp - delta)
        ds_t = p_t * (dp_t - delta[None, :])
        if not DELTA_INLINE and k.dtype == tl.float32:
            # a row's key with p > 1/2 takes dp - delta as the dq kernel had it where it kept one
            # (top == top: not NaN): on a near one-hot row the difference of this kernel's dp and
            # delta is rounding (_dq_loops; fp32 only)
            top = tl.load(top_base + rows, mask=row_ok, other=float("nan"))
            ds_t = tl.where((p_t > 0.5) & (top == top)[None, :], p_t * top[None, :], ds_t)
        if SOFTCAP:  # through c * tanh(s / c): d/ds = 1 - tanh^2
            ds_t = ds_t * (1.0 - tanh_t * tanh_t)
        dk = _mma(ds_t.to(q_t.dtype), tl.trans(q_t), dk, DOT_PRECISION)
    return dk, dv


@triton.jit
def _dkdv_program(
    start_n, batch, kv_head,
    Q, K, V, Out, DO, LSE, Delta, DK, DV, Mask, KPM, Bounds, Alibi,
    qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_db, stride_dh, stride_dm, stride_dd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_pb, stride_pn, stride_ab,
    num_heads, group_size, q_len, k_len,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, SCAN: tl.constexpr,
    DELTA_INLINE: tl.constexpr,
    QDesc=None, DODesc=None, q_rb=0, q_rh=0, q_ch=0, do_rb=0, do_rh=0, do_ch=0, TMA: tl.constexpr = False,
    KDesc=None, VDesc=None, k_rb=0, k_rh=0, k_ch=0, v_rb=0, v_rh=0, v_ch=0,
):
    """dk, dv for one block of keys of one k/v head, summed over its GQA group in a fixed
    order (deterministic, no atomics). TMA: q, dout, k and v tiles through tensor descriptors over
    2-D views of them, where (batch, head)'s row m sits at row batch * rb + head * rh + m, column
    head * ch (k and v then stay in shared memory for the loop's products, not in registers)."""
    b64 = batch.to(tl.int64)

    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < HEAD_DIM
    col_ok = cols < k_len
    kv_ok = col_ok[:, None] & d_ok[None, :]
    if TMA:
        # a tile past k_len reads the next head's keys (or zeros past the end): their rows of dk and
        # dv are never stored, and no other row depends on them
        k = KDesc.load([batch * k_rb + kv_head * k_rh + start_n * BLOCK_N, kv_head * k_ch])
        v = VDesc.load([batch * v_rb + kv_head * v_rh + start_n * BLOCK_N, kv_head * v_ch])
    else:
        k = tl.load(K + b64 * stride_kb + kv_head.to(tl.int64) * stride_kh + cols[:, None] * stride_kn
                    + offs_d[None, :] * stride_kd, mask=kv_ok, other=0.0)
        v = tl.load(V + b64 * stride_vb + kv_head.to(tl.int64) * stride_vh + cols[:, None] * stride_vn
                    + offs_d[None, :] * stride_vd, mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)

    # Query rows that can see this key block: causal -> from the diagonal on.
    q_lo = 0
    if IS_CAUSAL:
        q_lo = ((start_n * BLOCK_N) // BLOCK_M) * BLOCK_M
    q_hi = q_len
    key_kept = col_ok
    if HAS_KPM:
        padded = tl.load(KPM + b64 * stride_pb + cols * stride_pn, mask=col_ok, other=1)
        key_kept = padded == 0
    if HAS_BOUNDS:
        if HAS_KPM and TMA:
            # The descriptor kernel reads only this block's keys (no scan of the row): a block of
            # padding alone visits no query. It also zeroes padded keys' rows of dk and dv once, at
            # the end, instead of masking their probabilities in every tile (key_kept live through
            # its loop spilled at its register limit): row j of dk and dv depends on key j alone
            # (its column of the probabilities), so the kept keys' rows are the per-tile mask's
            # bits. The pointer kernel keeps the per-tile mask and the scan (the end form doubled
            # its spills and ran 7-10% slower, H100).
            dead = tl.max(key_kept.to(tl.int32), axis=0) == 0
        else:
            if HAS_KPM:
                first, last, _ = _scan_padding(KPM + b64 * stride_pb, stride_pn, k_len, SCAN)
            else:   # per-item lengths, computed by the launcher
                first = tl.load(Bounds + 3 * batch)
                last = tl.load(Bounds + 3 * batch + 1)
            # all keys of this block are padding: visit no query, dk = dv = 0
            dead = (start_n * BLOCK_N >= last) | ((start_n + 1) * BLOCK_N <= first)
        q_hi = tl.where(dead, q_lo, q_len)
    if HAS_WINDOW:
        # rows that see keys [n, n + BLOCK_N): n - right .. n + BLOCK_N - 1 + left
        q_lo = tl.maximum(q_lo, (tl.maximum(start_n * BLOCK_N - window_right, 0) // BLOCK_M) * BLOCK_M)
        q_hi = tl.minimum(q_hi, start_n * BLOCK_N + BLOCK_N + window_left)
    # query tiles from q_full on lie wholly below the diagonal (every row sees every key)
    q_full = q_lo
    if IS_CAUSAL:
        q_full = tl.minimum(tl.cdiv(start_n * BLOCK_N + BLOCK_N - 1, BLOCK_M) * BLOCK_M, q_hi)
        q_full = tl.maximum(q_full, q_lo)

    alibi_shift = alibi_shift_of(Bounds, batch, alibi_shift, HAS_ALIBI, HAS_KPM, HAS_BOUNDS)
    for g in range(0, group_size):
        head = kv_head * group_size + g
        bh = batch * num_heads + head
        q_base = Q + b64 * stride_qb + head.to(tl.int64) * stride_qh
        do_base = DO + b64 * stride_db + head.to(tl.int64) * stride_dh
        lse_base = LSE + bh.to(tl.int64) * q_len
        delta_base = Delta + bh.to(tl.int64) * q_len
        # Delta is (2, B, H, Sq): delta, then _dq_loops' top; the grid is (key blocks, B * kv heads)
        top_base = delta_base + tl.num_programs(1).to(tl.int64) * group_size * q_len
        mask_base = Mask + b64 * stride_mb + head.to(tl.int64) * stride_mh
        seed_bh = seed + bh
        alibi_slope = alibi_slope_of(Alibi, batch, head, stride_ab, HAS_ALIBI)
        o_base = Out + b64 * stride_ob + head.to(tl.int64) * stride_oh
        q_row0 = batch * q_rb + head * q_rh
        do_row0 = batch * do_rb + head * do_rh
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, key_kept, q_base, do_base, lse_base, delta_base, top_base, mask_base, o_base,
                                 cols, offs_m, offs_d, q_lo, q_full, q_len, k_len, qk_scale, seed_bh, dropout_p,
                                 window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                                 stride_qm, stride_qd, stride_dm, stride_dd, stride_mm, stride_mn, stride_om, stride_od,
                                 HEAD_DIM, BLOCK_M, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, True, DOT_PRECISION,
                                 HAS_WINDOW, SOFTCAP, HAS_ALIBI, DELTA_INLINE, TMA,
                                 QDesc, DODesc, q_row0, head * q_ch, do_row0, head * do_ch)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, key_kept, q_base, do_base, lse_base, delta_base, top_base, mask_base, o_base,
                                 cols, offs_m, offs_d, q_full, q_hi, q_len, k_len, qk_scale, seed_bh, dropout_p,
                                 window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                                 stride_qm, stride_qd, stride_dm, stride_dd, stride_mm, stride_mn, stride_om, stride_od,
                                 HEAD_DIM, BLOCK_M, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, False, DOT_PRECISION,
                                 HAS_WINDOW, SOFTCAP, HAS_ALIBI, DELTA_INLINE, TMA,
                                 QDesc, DODesc, q_row0, head * q_ch, do_row0, head * do_ch)

    dk = dk * sm_scale
    if HAS_KPM:
        if TMA:
            # read again rather than kept through the loop (volatile: not merged with the load
            # above); where, not a product: a padded key's scores may be anything (inf, NaN)
            kept_end = tl.load(KPM + b64 * stride_pb + cols * stride_pn, mask=col_ok, other=1, volatile=True) == 0
            dk = tl.where(kept_end[:, None], dk, 0.0)
            dv = tl.where(kept_end[:, None], dv, 0.0)
    elif HAS_BOUNDS:
        # per-item lengths: the keys past an item's length in its last live block were visited
        # like kept ones (no mask is read); their rows of dk and dv are zero, as padding's are
        first = tl.load(Bounds + 3 * batch)
        last = tl.load(Bounds + 3 * batch + 1)
        in_range = (cols >= first) & (cols < last)
        dk = tl.where(in_range[:, None], dk, 0.0)
        dv = tl.where(in_range[:, None], dv, 0.0)
    tl.store(DK + b64 * stride_dkb + kv_head.to(tl.int64) * stride_dkh + cols[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + b64 * stride_dvb + kv_head.to(tl.int64) * stride_dvh + cols[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_ok)




@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, Delta, DK, DV, Mask, KPM, Bounds, Alibi,
    qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_db, stride_dh, stride_dm, stride_dd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_pb, stride_pn, stride_ab,
    num_heads, num_kv_heads, group_size, q_len, k_len,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, SCAN: tl.constexpr, ORDER: tl.constexpr = 0,
):
    """The dk/dv half of the two-launch backward: delta comes from the dq kernel, run first.
    ORDER: tiles.causal_order; 3 folds the grid (a program takes key blocks p and last - p)."""
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    dropout_p = tl.cast(dropout_p, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    first_n, last_n, visits, batch_kv_head = key_block_visits(k_len, BLOCK_N, ORDER)
    for visit in range(0, visits):
        _dkdv_program(key_block_of_visit(visit, first_n, last_n, ORDER), batch_kv_head // num_kv_heads, batch_kv_head % num_kv_heads,
                      Q, K, V, DO, DO, LSE, Delta, DK, DV, Mask, KPM, Bounds, Alibi,   # Out unused: delta is stored
                      qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
                      stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd, 0, 0, 0, 0,
                      stride_db, stride_dh, stride_dm, stride_dd, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                      stride_dvb, stride_dvh, stride_dvn, stride_dvd, stride_mb, stride_mh, stride_mm, stride_mn,
                      stride_pb, stride_pn, stride_ab, num_heads, group_size, q_len, k_len,
                      HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, HAS_BOUNDS, DROPOUT,
                      DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, SCAN, False)


# The descriptors' row origins (batch * rb + head * rh) are lengths: specializing on them would
# compile once per length pattern, and descriptor coordinates gain nothing from it.
_ORIGINS = ("q_rb", "q_rh", "q_ch", "do_rb", "do_rh", "do_ch", "k_rb", "k_rh", "k_ch", "v_rb", "v_rh", "v_ch")


@triton.jit(do_not_specialize=_NO_SPECIALIZE + _ORIGINS)
def _attn_bwd_dkdv_tma_kernel(
    Q, K, V, DO, LSE, Delta, DK, DV, Mask, KPM, Bounds, Alibi, QDesc, DODesc, KDesc, VDesc,
    qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_db, stride_dh, stride_dm, stride_dd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_pb, stride_pn, stride_ab,
    num_heads, num_kv_heads, group_size, q_len, k_len,
    q_rb, q_rh, q_ch, do_rb, do_rh, do_ch, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, SCAN: tl.constexpr, ORDER: tl.constexpr = 0,
):
    """_attn_bwd_dkdv_kernel with q, dout, k and v tiles read through tensor descriptors
    (Hopper's TMA, host-side descriptors over 2-D views, _dkdv_program): the same arithmetic in
    the same order, so the same bits; the per-tile addresses leave the registers and k, v stay in
    shared memory, where the pointer form spills at D=128 (H200: dk/dv 4.37 -> 3.54 ms at
    (2, 16, 8192, 128); benchmarks/records/h200/attention-tma-2026-11-26.md)."""
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    dropout_p = tl.cast(dropout_p, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    first_n, last_n, visits, batch_kv_head = key_block_visits(k_len, BLOCK_N, ORDER)
    for visit in range(0, visits):
        _dkdv_program(key_block_of_visit(visit, first_n, last_n, ORDER), batch_kv_head // num_kv_heads, batch_kv_head % num_kv_heads,
                      Q, K, V, DO, DO, LSE, Delta, DK, DV, Mask, KPM, Bounds, Alibi,
                      qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
                      stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd, 0, 0, 0, 0,
                      stride_db, stride_dh, stride_dm, stride_dd, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                      stride_dvb, stride_dvh, stride_dvn, stride_dvd, stride_mb, stride_mh, stride_mm, stride_mn,
                      stride_pb, stride_pn, stride_ab, num_heads, group_size, q_len, k_len,
                      HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, HAS_BOUNDS, DROPOUT,
                      DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, SCAN, False,
                      QDesc, DODesc, q_rb, q_rh, q_ch, do_rb, do_rh, do_ch, True,
                      KDesc, VDesc, k_rb, k_rh, k_ch, v_rb, v_rh, v_ch)



@triton.jit
def _bwd_dq_inner(dq, ds_sum, p_sum, ds_abs, top_r, top_n, track, q, do, lse, delta, k_base, v_base, mask_base, kpm_base, holes,
                  rows, offs_n, offs_d, lo, hi, q_len, k_len, key_end, qk_scale, seed_bh, dropout_p,
                  window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                  stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                  MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                  MASK_EDGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                  LOOP_STAGES: tl.constexpr = None):
    d_ok = offs_d < HEAD_DIM
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=LOOP_STAGES):
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
        if SOFTCAP:
            tanh_s = _tanh(_mma(q, k_t, None, DOT_PRECISION) * cap_in)
            qk = tanh_s * cap_out
        else:
            qk = _mma(q, k_t, None, DOT_PRECISION) * qk_scale
        if HAS_ALIBI:
            qk += _alibi_bias(rows[:, None], cols[None, :], start_n, alibi_slope, alibi_shift)
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
            # read only when the padding has holes: else [lo, key_end) holds no padded key
            if holes:
                padded = tl.load(kpm_base + cols * stride_pn, mask=cols < k_len, other=1)
                p = tl.where(padded[None, :] == 0, p, 0.0)
        if MASK_EDGES:
            visible = cols[None, :] < key_end
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            p = tl.where(visible, p, 0.0)
        if HAS_WINDOW:
            in_window = (cols[None, :] >= rows[:, None] - window_left) & (cols[None, :] <= rows[:, None] + window_right)
            p = tl.where(in_window, p, 0.0)
        dp = _mma(do, v_t, None, DOT_PRECISION)
        if DROPOUT:
            keep = dropout_keep(seed_bh, rows[:, None], cols[None, :], k_len, dropout_p)
            dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
        ds = p * (dp - delta[:, None])
        if q.dtype == tl.float32:
            # what _dq_loops needs for the delta consistent with these very dp (its docstring);
            # fp32 only: 16-bit inputs compile to the loop without them
            ds_sum += tl.sum(ds, 1)
            p_sum += tl.sum(p, 1)
            ds_abs += tl.sum(tl.abs(ds), 1)
            if track != 0:
                # a row's key with p > 1/2 (one at most): its dp - delta, for the dk/dv kernel
                top = p > 0.5
                top_r += tl.sum(tl.where(top, dp - delta[:, None], 0.0), 1)
                top_n += tl.sum(top.to(tl.float32), 1)
        if SOFTCAP:
            ds = ds * (1.0 - tanh_s * tanh_s)
        dq = _mma(ds.to(k_t.dtype), tl.trans(k_t), dq, DOT_PRECISION)
    return dq, ds_sum, p_sum, ds_abs, top_r, top_n


@triton.jit
def _dq_loops(dq, holes, q, do, lse, delta, k_base, v_base, mask_base, kpm_base, rows, offs_n, offs_d,
              lo, full_end, hi, q_len, k_len, qk_scale, seed_bh, dropout_p, window_left, window_right,
              cap_in, cap_out, alibi_slope, alibi_shift,
              stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
              HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
              HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, LOOP_STAGES: tl.constexpr):
    """(dq, delta, top): key tiles [lo, full_end) with no edge masks, then [full_end, hi) (as
    kernels._fwd_loops); LOOP_STAGES: the loops' pipeline depth (None: the kernel's). delta comes in
    as rowsum(out * dout) and goes out as sum_j p_j dp_j / sum_j p_j over the dp of these loops,
    the delta the dk/dv kernel is to use.

    Why: ds = p * (dp - delta) cancels on a row whose softmax is (nearly) one-hot only when delta
    shares dp's own rounding; rowsum(out * dout) is another dot over the head dim, in another
    order, and leaves ~1e-7 * |dout| * |v| where the true difference is ~0 (huge logits: dq, dk
    of 1e-5 where they are 1e-40). Dividing by sum_j p_j takes out the lse's rounding, common to
    the whole row. Computed as delta + sum_j ds_j / sum_j p_j (the small terms summed directly).
    In fp32, a block with a row where that correction is not negligible against the row's ds
    (|sum ds| > 2**-13 * sum |ds|: a softmax within a few percent of one-hot, or a row with one
    key) runs its loops again with the corrected delta; any other block runs them once
    (tests/backends/test_triton_attention_sharp_rows.py). 16-bit inputs compile to the loops once
    with rowsum(out * dout), as before (delta out unchanged, top NaN): their out, rounded to 2**-9,
    puts that correction above any such bound on most rows of sharp attention, and the error it
    leaves is within the dtype's own. fp32 inputs with TF32 products get the corrected delta but
    never redo: their dp is rounded as coarsely.
    The dk/dv kernel recomputes dp in its own order (a transposed product: not the same rounding),
    so the redo also gives it top: per row, dp - delta of its one key with p > 1/2 as these loops
    have it, NaN where there is none or the block did not redo (there the difference between the
    two orders is negligible)."""
    top_r = tl.zeros_like(delta)
    top_n = tl.zeros_like(delta)
    if q.dtype == tl.float32:
        tau = 0.0001220703125   # 2**-13: rows that do not redo are within about that of their value
        todo = tl.program_id(0) * 0 + 1
        for attempt in range(0, 2):
            if todo != 0:
                ds_sum = tl.zeros_like(delta)
                p_sum = tl.zeros_like(delta)
                ds_abs = tl.zeros_like(delta)
                dq = tl.zeros_like(dq)   # (not a second accumulator: one tile of them is live)
                dq, ds_sum, p_sum, ds_abs, top_r, top_n = _bwd_dq_inner(
                    dq, ds_sum, p_sum, ds_abs, top_r, top_n, attempt, q, do, lse, delta, k_base, v_base, mask_base,
                    kpm_base, holes, rows, offs_n, offs_d, lo, full_end, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                    window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                    stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                    HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, False, DOT_PRECISION, HAS_WINDOW,
                    SOFTCAP, HAS_ALIBI, LOOP_STAGES)
                dq, ds_sum, p_sum, ds_abs, top_r, top_n = _bwd_dq_inner(
                    dq, ds_sum, p_sum, ds_abs, top_r, top_n, attempt, q, do, lse, delta, k_base, v_base, mask_base,
                    kpm_base, holes, rows, offs_n, offs_d, full_end, hi, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                    window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                    stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                    HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, True, DOT_PRECISION, HAS_WINDOW,
                    SOFTCAP, HAS_ALIBI, LOOP_STAGES)
                redo = tl.max((tl.abs(ds_sum) > tau * ds_abs).to(tl.int32), 0)
                if DOT_PRECISION == "tf32":   # TF32 products: dp itself is rounded at 2**-11
                    redo = redo * 0
                todo = tl.where(attempt == 0, redo, 0)
                if attempt == 0:   # the redo's loops (and the dk/dv kernel) use the delta they ran with
                    # a row with no key (or past the end) has p_sum = 0: its delta stays
                    delta += tl.where(p_sum > 0.0, ds_sum / tl.where(p_sum > 0.0, p_sum, 1.0), 0.0)
    else:
        # 16-bit: the loops once, with rowsum(out * dout) (the sums above stay zero, top NaN)
        dq, s0, s1, s2, s3, s4 = _bwd_dq_inner(
            dq, top_r, top_r, top_r, top_r, top_n, 0, q, do, lse, delta, k_base, v_base, mask_base, kpm_base, holes,
            rows, offs_n, offs_d, lo, full_end, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
            window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
            HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, False, DOT_PRECISION, HAS_WINDOW,
            SOFTCAP, HAS_ALIBI, LOOP_STAGES)
        dq, s0, s1, s2, s3, s4 = _bwd_dq_inner(
            dq, top_r, top_r, top_r, top_r, top_n, 0, q, do, lse, delta, k_base, v_base, mask_base, kpm_base, holes,
            rows, offs_n, offs_d, full_end, hi, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
            window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
            HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, True, DOT_PRECISION, HAS_WINDOW,
            SOFTCAP, HAS_ALIBI, LOOP_STAGES)
    return dq, delta, tl.where(top_n == 1.0, top_r, float("nan"))


@triton.jit
def _dq_program(
    start_m, batch, head,
    Q, K, V, Out, DO, LSE, Delta, DQ, Mask, KPM, Bounds, Alibi,
    qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_db, stride_dh, stride_dm, stride_dd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_pb, stride_pn, stride_ab,
    num_heads, group_size, q_len, k_len,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, SCAN: tl.constexpr,
    STORE_DELTA: tl.constexpr, SPLIT_KPM: tl.constexpr = False,
):
    batch_head = batch * num_heads + head
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
    # delta_i = sum_d out_id * dout_id, the row term of the softmax gradient, made consistent with
    # dp by _dq_loops; in the two-launch backward this kernel runs first and keeps it for dk/dv
    o = tl.load(Out + b64 * stride_ob + head.to(tl.int64) * stride_oh + rows[:, None] * stride_om + offs_d[None, :] * stride_od,
                mask=tile_ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    k_base = K + b64 * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + kv_head.to(tl.int64) * stride_vh
    mask_base = Mask + b64 * stride_mb + head.to(tl.int64) * stride_mh
    kpm_base = KPM + b64 * stride_pb
    seed_bh = seed + batch_head
    alibi_slope = alibi_slope_of(Alibi, batch, head, stride_ab, HAS_ALIBI)
    alibi_shift = alibi_shift_of(Bounds, batch, alibi_shift, HAS_ALIBI, HAS_KPM, HAS_BOUNDS)

    first = 0
    last = k_len
    holes = False
    if HAS_KPM:   # the forward's scan, again (no bounds are kept between the two)
        first, last, holes = _scan_padding(kpm_base, stride_pn, k_len, SCAN)
    elif HAS_BOUNDS:  # per-item lengths, computed by the launcher
        first = tl.load(Bounds + 3 * batch)
        last = tl.load(Bounds + 3 * batch + 1)
    lo, full_end, hi = _key_range(first, last, start_m, k_len, window_left, window_right,
                                  BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_BOUNDS, HAS_WINDOW)
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    args = (q, do, lse, delta, k_base, v_base, mask_base, kpm_base, rows, offs_n, offs_d, lo, full_end, hi,
            q_len, k_len, qk_scale, seed_bh, dropout_p, window_left, window_right, cap_in, cap_out,
            alibi_slope, alibi_shift, stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn)
    if HAS_KPM and SPLIT_KPM:
        # key padding without holes (a suffix: per-item lengths) gets loops with no mask reads and
        # no branch in them, at the kernel's pipeline depth; padding with holes gets its own loops
        # (the mask read in every tile) at depth 1, so the two sets of pipeline buffers fit in
        # shared memory (tiles.split_kpm_dq says where)
        if holes:
            dq, delta, top = _dq_loops(dq, True, *args, HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, True, DROPOUT,
                           DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, 1)
        else:
            dq, delta, top = _dq_loops(dq, False, *args, HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, False, DROPOUT,
                           DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, None)
    else:
        # One loop body for any padding: key padding with holes is read in every tile behind a
        # branch, other padding (a suffix: per-item lengths) not at all.
        dq, delta, top = _dq_loops(dq, holes, *args, HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT,
                       DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, None)
    if STORE_DELTA:
        # _dq_loops' delta and top, for the dk/dv kernel: Delta is (2, B, H, Sq) float32, and this
        # kernel's grid (query blocks, B * H)
        delta_ptrs = Delta + batch_head.to(tl.int64) * q_len + rows
        tl.store(delta_ptrs, delta, mask=row_ok)
        if q.dtype == tl.float32:   # (16-bit: the dk/dv kernel reads no top)
            tl.store(delta_ptrs + tl.num_programs(1).to(tl.int64) * q_len, top, mask=row_ok)
    dq = dq * sm_scale
    tl.store(DQ + b64 * stride_dqb + head.to(tl.int64) * stride_dqh + rows[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=tile_ok)




@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attn_bwd_dq_kernel(
    Q, K, V, Out, DO, LSE, Delta, DQ, Mask, KPM, Bounds, Alibi,
    qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_db, stride_dh, stride_dm, stride_dd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_pb, stride_pn, stride_ab,
    num_heads, group_size, q_len, k_len,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, SCAN: tl.constexpr, SPLIT_KPM: tl.constexpr = False, ORDER: tl.constexpr = 0,
):
    """The dq half of the two-launch backward; it stores delta for the dk/dv kernel. SPLIT_KPM:
    tiles.split_kpm_dq. ORDER: tiles.causal_order (kernels.program_block)."""
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    dropout_p = tl.cast(dropout_p, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    start_m, batch_head = program_block(ORDER)
    _dq_program(start_m, batch_head // num_heads, batch_head % num_heads,
                Q, K, V, Out, DO, LSE, Delta, DQ, Mask, KPM, Bounds, Alibi,
                qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
                stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od,
                stride_db, stride_dh, stride_dm, stride_dd, stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                stride_mb, stride_mh, stride_mm, stride_mn, stride_pb, stride_pn, stride_ab,
                num_heads, group_size, q_len, k_len,
                HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, HAS_BOUNDS, DROPOUT,
                DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, SCAN, True, SPLIT_KPM)


@triton.jit(do_not_specialize=_NO_SPECIALIZE + ("q_blocks",))
def _attn_bwd_kernel(
    Q, K, V, Out, DO, LSE, DQ, DK, DV, Mask, KPM, Bounds, Alibi,
    qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_db, stride_dh, stride_dm, stride_dd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_pb, stride_pn, stride_ab,
    num_heads, num_kv_heads, group_size, q_len, k_len, q_blocks,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_BLOCK_M: tl.constexpr, KV_BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, SCAN: tl.constexpr,
):
    """The whole backward in one launch (short sequences, where a launch costs more host time than
    the kernels take): per (batch, k/v head), the first q_blocks * group_size programs compute dq
    (BLOCK_M x BLOCK_N tiles), the rest dk/dv for one block of KV_BLOCK_N keys, computing delta
    themselves from out and dout since no program runs before them. No atomics: deterministic."""
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    dropout_p = tl.cast(dropout_p, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    pid = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch = batch_kv_head // num_kv_heads
    kv_head = batch_kv_head % num_kv_heads
    dq_programs = q_blocks * group_size
    if pid < dq_programs:
        _dq_program(pid % q_blocks, batch, kv_head * group_size + pid // q_blocks,
                    Q, K, V, Out, DO, LSE, LSE, DQ, Mask, KPM, Bounds, Alibi,   # no delta stored
                    qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
                    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od,
                    stride_db, stride_dh, stride_dm, stride_dd, stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                    stride_mb, stride_mh, stride_mm, stride_mn, stride_pb, stride_pn, stride_ab,
                    num_heads, group_size, q_len, k_len,
                    HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, HAS_BOUNDS, DROPOUT,
                    DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, SCAN, False)
    else:
        _dkdv_program(pid - dq_programs, batch, kv_head,
                      Q, K, V, Out, DO, LSE, LSE, DK, DV, Mask, KPM, Bounds, Alibi,   # delta computed inline
                      qk_scale, sm_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
                      stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od,
                      stride_db, stride_dh, stride_dm, stride_dd, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                      stride_dvb, stride_dvh, stride_dvn, stride_dvd, stride_mb, stride_mh, stride_mm, stride_mn,
                      stride_pb, stride_pn, stride_ab, num_heads, group_size, q_len, k_len,
                      HEAD_DIM, D_PAD, KV_BLOCK_M, KV_BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, HAS_BOUNDS, DROPOUT,
                      DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI, SCAN, True)


BACKWARD_KERNELS = {
    "dkdv": _attn_bwd_dkdv_kernel,
    "dkdv_tma": _attn_bwd_dkdv_tma_kernel,
    "dq": _attn_bwd_dq_kernel,
    "bwd": _attn_bwd_kernel,
}
