"""The fused attention kernels in Triton, at module level. Imports triton at its top: launch.py
imports this module lazily (never at package import), so the package imports without triton."""
# FlashAttention-2 (and Triton's fused-attention tutorial): one program per block of query
# rows, an online softmax in fp32 over blocks of keys, the log-sum-exp kept for the backward,
# which recomputes the probabilities. Masks are read in tiles through their strides (zero
# strides for broadcast dims), never expanded in memory; key/value blocks that a query block
# cannot see (key padding, causal) are skipped, so padding makes it faster. The backward
# kernels, built on the helpers here, are in backward_kernels.py.
from __future__ import annotations

import triton
import triton.language as tl

# Runtime ints that Triton would otherwise specialize on (== 1, divisible by 16): each
# distinct pattern is a separate compile of seconds. Lengths, head counts and the dropout seed
# only bound loops and masks, so specializing on them buys nothing; strides stay specialized
# (16-byte alignment of rows is what lets loads vectorize), as does group_size (1 folds away).
_NO_SPECIALIZE = ("seed", "num_heads", "num_kv_heads", "q_len", "k_len", "window_left", "window_right",
                  "alibi_shift")


@triton.jit
def program_block(ORDER: tl.constexpr):
    """(block, row) of this program in a grid (blocks, rows), which the hardware starts in launch
    order (axis 0 fastest). ORDER (tiles.causal_order) 0: as launched (block = program_id(0), row =
    program_id(1)); 1 and 2: rows interleaved, heaviest first: every row's heaviest block under a
    causal mask (1: the last, a query block's; 2: the first, a key block's) starts before any row's
    next one. The same programs run; only their order moves."""
    block = tl.program_id(0)
    row = tl.program_id(1)
    if ORDER == 1 or ORDER == 2:
        blocks = tl.num_programs(0)
        rows = tl.num_programs(1)
        linear = row * blocks + block
        block = linear // rows
        row = linear % rows
        if ORDER == 1:
            block = blocks - 1 - block
    return block, row


@triton.jit
def key_block_visits(k_len, BLOCK_N: tl.constexpr, ORDER: tl.constexpr):
    """(first key block, last block index, visits, row) of a dk/dv program. ORDER 3 (folded):
    key blocks p and last - p (visits 2, 1 for the middle block), the same work per program under
    a causal mask; any other order: program_block's one block (visits 1: a loop of one trip with
    constant bounds, which leaves no loop in the IR, the same code as a plain call)."""
    first_n, row = program_block(0 if ORDER == 3 else ORDER)
    last_n = first_n
    visits = 1
    if ORDER == 3:
        last_n = tl.cdiv(k_len, BLOCK_N) - 1
        visits = 1 + (last_n - first_n != first_n).to(tl.int32)
    return first_n, last_n, visits, row


@triton.jit
def key_block_of_visit(visit, first_n, last_n, ORDER: tl.constexpr):
    """The key block a dk/dv program's visit-th visit takes (see key_block_visits)."""
    start_n = first_n
    if ORDER == 3:
        start_n = tl.where(visit == 0, first_n, last_n - first_n)
    return start_n


@triton.jit
def dropout_keep(seed_bh, rows, cols, k_len, dropout_p):
    """The dropout keep mask of one (batch, head) tile: Philox at counter row * k_len + col,
    seeded with seed + batch * H + head. The one formula: the forward, both backward kernels and
    _dropout_mask_kernel (gpuparity.attention_dropout_mask) all call it."""
    return tl.rand(seed_bh, rows * k_len + cols) >= dropout_p


@triton.jit
def _scan_padding(kpm_base, stride_pn, k_len, SCAN: tl.constexpr):
    """One batch item's key padding: the first and one-past-the-last kept key, and
    whether the kept keys have holes (anything but keys 0..last-1 kept).

    Programs skip key blocks outside [first, last): trailing (or leading) padding costs
    no matmuls. Without holes (right padding, i.e. per-item lengths) the tiles need no
    per-key mask reads at all. An all-padding item gets first >= last: nothing to visit.
    Each program, forward and backward, scans its own row (k_len bytes, from L2): cheaper
    than another launch, and nothing has to be kept between the forward and the backward.
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
def _tanh(x):
    """tanh as 1 - 2 / (exp(2x) + 1): saturates to +-1 without inf / inf, and needs no libdevice
    (portable to AMD and the interpreter)."""
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _alibi_bias(rows, cols, anchor, alibi_slope, alibi_shift):
    """ALiBi's bias -slope * |i + shift - j| in fp32 (base-2 units when the slope is), FlashAttention's
    distance: shift = Sk - Sq puts query i at key position i + Sk - Sq (bottom-right). The varlen
    kernels pass rows (or columns) already moved to that diagonal and shift 0. rows and cols come as
    (M, 1) and (1, N) (or transposed). Built as -|a_i - b_j| with a = slope * (i + shift - anchor)
    and b = slope * (j - anchor) made per row and per column: a score then costs one subtract, and
    the absolute value with the add goes into the fused multiply-add of the scores' scale (no
    integer-to-float conversion, no multiply per score). anchor, an integer position of this tile
    (its first key or query), keeps a and b small near the diagonal, where the scores that count
    are, so fp32 holds the distance there as exactly as |i + shift - j| did; far from it both are
    large and the bias's rounding is of the order of the old form's. Exact up to 2**24 positions."""
    a = alibi_slope * (rows + (alibi_shift - anchor)).to(tl.float32)
    b = alibi_slope * (cols - anchor).to(tl.float32)
    return -tl.abs(a - b)


@triton.jit
def alibi_slope_of(Alibi, batch, head, stride_ab, HAS_ALIBI: tl.constexpr):
    """The ALiBi slope of (batch, head) in the base-2 units of the kernels' scores (times log2(e)):
    Alibi is fp32 (B or 1, H), stride_ab 0 for slopes shared by every batch item. 0.0 without ALiBi
    (never read then)."""
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Alibi + batch * stride_ab + head) * 1.4426950408889634
    return slope


@triton.jit
def alibi_shift_of(Bounds, batch, alibi_shift, HAS_ALIBI: tl.constexpr, HAS_KPM: tl.constexpr,
                   HAS_BOUNDS: tl.constexpr):
    """The ALiBi shift of this batch item: Sk - Sq, or with key_lengths (Bounds without a padding
    mask) the item's own key length - Sq, FlashAttention's KV-cache alignment (query i at key
    position i + len_b - Sq): the launcher keeps len_b - Sk in Bounds[b, 2]."""
    shift = alibi_shift
    if HAS_ALIBI:
        if HAS_BOUNDS:
            if not HAS_KPM:
                shift += tl.load(Bounds + 3 * batch + 2)
    return shift


@triton.jit
def _key_range(first, last, start_m, k_len, window_left, window_right,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
               HAS_BOUNDS: tl.constexpr, HAS_WINDOW: tl.constexpr):
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
    if HAS_WINDOW:
        # rows [m, m + BLOCK_M) see keys m - left .. m + BLOCK_M - 1 + right: whole key blocks
        # outside that span are never visited (the launcher makes an unbounded side huge)
        lo = tl.maximum(lo, (tl.maximum(start_m * BLOCK_M - window_left, 0) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(hi, (start_m + 1) * BLOCK_M + window_right)
    full_end = (hi // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        # a key tile [n, n + BLOCK_N) is wholly visible to rows >= start_m * BLOCK_M
        # when n + BLOCK_N - 1 <= start_m * BLOCK_M
        full_end = tl.minimum(full_end, ((start_m * BLOCK_M + 1) // BLOCK_N) * BLOCK_N)
    full_end = tl.maximum(full_end, lo)
    hi = tl.maximum(hi, full_end)
    return lo, full_end, hi


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base, holes,
               rows, offs_n, offs_d, lo, hi, q_len, k_len, key_end, qk_scale, seed_bh, dropout_p,
               window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
               stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
               MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
               MASK_EDGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
               HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
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
        # scores in base 2 (scale * log2(e) folded in) so the softmax can use exp2; softcap:
        # c * tanh(scale * s / c) in fp32, before any mask (cap_in = scale / c, cap_out = c * log2(e))
        if SOFTCAP:
            qk = _tanh(_mma(q, k, None, DOT_PRECISION) * cap_in) * cap_out
        else:
            qk = _mma(q, k, None, DOT_PRECISION) * qk_scale
        if HAS_ALIBI:
            qk += _alibi_bias(rows[:, None], cols[None, :], start_n, alibi_slope, alibi_shift)
        if MASK_KIND == 2:
            bias = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn,
                           mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0.0)
            qk += bias.to(tl.float32) * 1.4426950408889634
        if MASK_KIND == 1:
            allowed = tl.load(mask_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn,
                              mask=(rows[:, None] < q_len) & (cols[None, :] < k_len), other=0)
            qk = tl.where(allowed != 0, qk, float("-inf"))
        if HAS_KPM:
            # read only when the padding has holes: else [lo, key_end) holds no padded key
            if holes:
                padded = tl.load(kpm_base + cols * stride_pn, mask=cols < k_len, other=1)
                qk = tl.where(padded[None, :] == 0, qk, float("-inf"))
        if MASK_EDGES:
            visible = cols[None, :] < key_end
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        if HAS_WINDOW:
            in_window = (cols[None, :] >= rows[:, None] - window_left) & (cols[None, :] <= rows[:, None] + window_right)
            qk = tl.where(in_window, qk, float("-inf"))
        # Online softmax: keep the running row max m_i and sum l_i, rescale the
        # accumulator by exp2(m_old - m_new) whenever the max grows.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        if MASK_EDGES or HAS_KPM or MASK_KIND != 0 or HAS_WINDOW:
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
            keep = dropout_keep(seed_bh, rows[:, None], cols[None, :], k_len, dropout_p)
            p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        acc = _mma(p.to(v.dtype), v, acc, DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_loops(acc, l_i, m_i, holes, q, k_base, v_base, mask_base, kpm_base, rows, offs_n, offs_d, lo, full_end, hi,
               q_len, k_len, qk_scale, seed_bh, dropout_p, window_left, window_right, cap_in, cap_out,
               alibi_slope, alibi_shift,
               stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
               HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
               HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Key tiles [lo, full_end), wholly inside the causal triangle and the key range (no edge
    masks), then [full_end, hi), the diagonal / last tiles (causal and end-of-keys masks)."""
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base, holes,
                               rows, offs_n, offs_d, lo, full_end, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                               window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                               stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                               HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, False, DOT_PRECISION, HAS_WINDOW, SOFTCAP,
                               HAS_ALIBI)
    return _fwd_inner(acc, l_i, m_i, q, k_base, v_base, mask_base, kpm_base, holes,
                      rows, offs_n, offs_d, full_end, hi, q_len, k_len, hi, qk_scale, seed_bh, dropout_p,
                      window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
                      stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn,
                      HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM, DROPOUT, True, DOT_PRECISION, HAS_WINDOW, SOFTCAP,
                      HAS_ALIBI)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attn_fwd_kernel(
    Q, K, V, Out, LSE, Mask, KPM, Bounds, Alibi,
    qk_scale, dropout_p, seed, window_left, window_right, cap_in, cap_out, alibi_shift,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_pb, stride_pn, stride_ab,
    num_heads, group_size, q_len, k_len,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, HAS_KPM: tl.constexpr, HAS_BOUNDS: tl.constexpr,
    DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr, SCAN: tl.constexpr,
    HAS_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, ORDER: tl.constexpr = 0,
):
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    qk_scale = tl.cast(qk_scale, tl.float32)
    dropout_p = tl.cast(dropout_p, tl.float32)
    cap_in = tl.cast(cap_in, tl.float32)
    cap_out = tl.cast(cap_out, tl.float32)
    start_m, batch_head = program_block(ORDER)   # ORDER: tiles.causal_order
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
    alibi_slope = alibi_slope_of(Alibi, batch, head, stride_ab, HAS_ALIBI)
    alibi_shift = alibi_shift_of(Bounds, batch, alibi_shift, HAS_ALIBI, HAS_KPM, HAS_BOUNDS)

    first = 0
    last = k_len
    holes = False
    if HAS_KPM:
        first, last, holes = _scan_padding(kpm_base, stride_pn, k_len, SCAN)
    elif HAS_BOUNDS:  # per-item lengths, computed by the launcher
        first = tl.load(Bounds + 3 * batch)
        last = tl.load(Bounds + 3 * batch + 1)
    lo, full_end, hi = _key_range(first, last, start_m, k_len, window_left, window_right,
                                  BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_BOUNDS, HAS_WINDOW)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    args = (q, k_base, v_base, mask_base, kpm_base, rows, offs_n, offs_d, lo, full_end, hi, q_len, k_len,
            qk_scale, seed_bh, dropout_p, window_left, window_right, cap_in, cap_out, alibi_slope, alibi_shift,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, stride_pn)
    if HAS_KPM and D_PAD >= 128:
        # head dims above 64 (D_PAD >= 128): a pair of loops for padding with holes (the mask read in every
        # tile), another for a suffix (no reads). H100, llm-8k (2, 16, 8192, 128): 2.31 ms
        # against 2.44 with one pair of loops and the read behind a branch, although this form
        # doubles the shared memory and spills a little.
        if holes:
            acc, l_i, m_i = _fwd_loops(acc, l_i, m_i, True, *args, HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, True,
                                       DROPOUT, DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI)
        else:
            acc, l_i, m_i = _fwd_loops(acc, l_i, m_i, False, *args, HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, False,
                                       DROPOUT, DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI)
    else:
        # One pair of loops for any padding (or none): key padding with holes is read in every
        # tile behind a branch, a suffix (per-item lengths) not at all. Head dims up to 64 (H100):
        # bert (32, 12, 512, 64) pad 0.25 0.086-0.087 ms against 0.104 with the two pairs of loops
        # above, llm-4k (4, 16, 4096, 64) 0.579 against 0.614.
        acc, l_i, m_i = _fwd_loops(acc, l_i, m_i, holes, *args, HEAD_DIM, BLOCK_N, IS_CAUSAL, MASK_KIND, HAS_KPM,
                                   DROPOUT, DOT_PRECISION, HAS_WINDOW, SOFTCAP, HAS_ALIBI)

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


# What the launchers and the AOT specs look kernels up by: the names are part of the AOT spec names.
@triton.jit(do_not_specialize=("seed", "q_len", "k_len"))
def _dropout_mask_kernel(Keep, dropout_p, seed, q_len, k_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keep (B * H, Sq, Sk) int8: the mask the attention kernels apply for (seed, dropout_p),
    through the same dropout_keep and the same seed + batch_head as they use."""
    # torch.compile's generated code may pass a Python float as fp64 (inductor types
    # them so by default); in fp64 they would promote the fp32 math below.
    dropout_p = tl.cast(dropout_p, tl.float32)
    start_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    seed_bh = seed + batch_head
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    base = Keep + batch_head.to(tl.int64) * q_len * k_len
    for start_n in range(0, k_len, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        keep = dropout_keep(seed_bh, rows[:, None], cols[None, :], k_len, dropout_p)
        tl.store(base + rows[:, None].to(tl.int64) * k_len + cols[None, :], keep.to(tl.int8),
                 mask=(rows[:, None] < q_len) & (cols[None, :] < k_len))


KERNELS = {
    "fwd": _attn_fwd_kernel,
    "dropout_mask": _dropout_mask_kernel,
}
