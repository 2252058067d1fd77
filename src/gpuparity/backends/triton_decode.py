"""Decode attention against a KV cache (op "attention_decode"): a split-KV (flash-decoding) Triton
kernel, SDPA with a bool mask, the plain composition that is the trusted fallback, and the op's
float64 reference (the battery's)."""
# The Triton kernels are defined on first launch (`_build`), so this module, imported by
# backends.load, imports without triton and does not pay for importing it.
#
# Flash-decoding: a decode step has 1-16 queries per head and a long cache, so one program per
# query block (FlashAttention) leaves most of the GPU idle at small batch. Here the grid is
# (B * Hkv, num_splits): each program holds the GROUP = H / Hkv query heads x Sq queries that
# share one KV head (K and V are read once per KV head, not once per query head), walks its
# share of that item's cache in BLOCK_N tiles (only up to cache_seqlens[b]: tiles past it are
# never loaded) with an online softmax in fp32, and writes (out, lse) per split; a second small
# kernel combines the splits by their log-sum-exp. With one split the first kernel writes the
# output directly.
#
# Paged caches (constexpr PAGE_SIZE > 0): K and V are page pools (num_blocks, Hkv, page, D) and a
# split reads its keys in place through the item's block-table row: where the page size is a
# multiple of BLOCK_N a tile lies in one page (one table entry per tile, rows contiguous as in a
# contiguous cache); otherwise each key of the tile loads its own entry. Triton pipelines the
# K/V loads one buffer deep behind the table load (two for a contiguous cache): on an H200, pages
# of 256 run within 10% of the contiguous kernel, pages of 16 up to 24% slower on short rows
# (benchmarks/records/h200/paged-decode-2026-11-27.md).
#
# ALiBi (constexpr HAS_ALIBI, gpuparity.flash_attn's alibi_slopes in its decode case): each row of
# the query block loads its head's slope once; a tile subtracts slope * |pos - j| after the softcap,
# pos = the row's own key position L_b - Sq + i. Without it no code is emitted.
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from . import triton_common
from ..registry import Backend, Problem, register
from .sdpa import aligned
from .. import caches
from ..contracts.masks import decode_allowed, gather_pages

LOG2E = 1.4426950408889634
MAX_QUERIES = 16          # new queries per step the kernel's query block is sized for
MAX_HEAD_DIM = 256
MAX_SPLITS = 128


def _repeat_kv(q, k_cache, v_cache):
    group = q.shape[1] // k_cache.shape[1]
    if group == 1:
        return k_cache, v_cache
    return k_cache.repeat_interleave(group, dim=1), v_cache.repeat_interleave(group, dim=1)


def decode_sdpa(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    """F.scaled_dot_product_attention with the decode mask as a bool mask (GQA by enable_gqa
    where torch has it); rows with no key give zeros, as everywhere in gpuparity. A paged cache
    is gathered into a contiguous one first."""
    if softcap is not None:
        raise ValueError(f"softcap: SDPA has no logit softcap, got softcap={softcap}; use backend='triton' "
                         f"or 'composition'")
    if block_table is not None:
        k_cache, v_cache = gather_pages(k_cache, block_table), gather_pages(v_cache, block_table)
    allowed = decode_allowed(cache_seqlens, q.shape[2], k_cache.shape[2])
    empty = ~allowed.any(-1, keepdim=True)
    q, k_cache, v_cache = aligned(q), aligned(k_cache), aligned(v_cache)   # known issue SDPA-CUDNN-MISALIGNED
    if _sdpa_has_gqa():
        out = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=allowed | empty, scale=scale,
                                             enable_gqa=k_cache.shape[1] != q.shape[1])
    else:
        k, v = _repeat_kv(q, k_cache, v_cache)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | empty, scale=scale)
    return out.masked_fill(empty, 0.0)


@caches.lru_cache("backends.triton_decode.sdpa_has_gqa")
def _sdpa_has_gqa() -> bool:
    import inspect
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        try:
            x = torch.zeros(1, 2, 1, 8)
            F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
            return True
        except TypeError:
            return False


# ----------------------------------------------------------------------------- Triton kernels
def _build() -> Dict[str, Any]:
    # triton and tl become module globals here: Triton resolves the names a kernel uses through
    # the kernel's __globals__ (this module), so they must be bound before the first compile.
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=("sab", "num_kv_heads", "q_len", "s_max", "num_splits", "num_blocks"))
    def decode_split(Q, K, V, SEQLENS, BT, ALIBI, O, LSE,
                     sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, so_row, so_split, sbt, sab,
                     num_kv_heads, q_len, s_max, num_splits, num_blocks, qk_scale, cap_in, cap_out,
                     GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
                     DOT_PRECISION: tl.constexpr, FINAL: tl.constexpr, PAGE_SIZE: tl.constexpr,
                     HAS_ALIBI: tl.constexpr):
        pid_bh = tl.program_id(0)
        split = tl.program_id(1)
        b = pid_bh // num_kv_heads
        hkv = pid_bh % num_kv_heads
        seqlen = tl.load(SEQLENS + b).to(tl.int32)
        seqlen = tl.minimum(tl.maximum(seqlen, 0), s_max)
        # rows of the query block: (head within the group, query) pairs, GROUP * Sq of them
        rows = tl.arange(0, BLOCK_M)
        n_rows = GROUP * q_len
        row_ok = rows < n_rows
        head = hkv * GROUP + rows // q_len
        qi = rows % q_len
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < HEAD_DIM
        q_ptrs = (Q + b.to(tl.int64) * sqb + head[:, None].to(tl.int64) * sqh + qi[:, None].to(tl.int64) * sqs
                  + dims[None, :])
        q = tl.load(q_ptrs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        limit = seqlen - q_len + 1 + qi          # bottom-right causal: row sees keys < limit
        if HAS_ALIBI:
            # FlashAttention's ALiBi, -slope * |pos - j|, with query i at key position pos =
            # seqlen - Sq + i (bottom-right on the item's length, as the dense kernels' shift):
            # slopes fp32 (B or 1, H), sab 0 when shared; in the base-2 units of the scores
            slope = tl.load(ALIBI + b.to(tl.int64) * sab + head, mask=row_ok, other=0.0) * 1.4426950408889634
            position = (limit - 1).to(tl.float32)
        # this item's keys split evenly (whole tiles) over the splits: a short item still
        # spreads over every program of its row, and splits past its length do nothing
        per_split = tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N) * BLOCK_N
        lo = split * per_split
        hi = tl.minimum(lo + per_split, seqlen)
        if PAGE_SIZE == 0:      # a contiguous cache: item b's keys at K[b, hkv]
            k_base = K + b.to(tl.int64) * skb + hkv.to(tl.int64) * skh
            v_base = V + b.to(tl.int64) * svb + hkv.to(tl.int64) * svh
        else:                   # a page pool: key j of item b in page BT[b, j // PAGE_SIZE], slot j % PAGE_SIZE
            k_base = K + hkv.to(tl.int64) * skh
            v_base = V + hkv.to(tl.int64) * svh
            bt_row = BT + b.to(tl.int64) * sbt
        offs_n = tl.arange(0, BLOCK_N)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            cols = start + offs_n
            col_ok = cols < hi
            if PAGE_SIZE == 0:
                k_rows = cols.to(tl.int64) * sks
                v_rows = cols.to(tl.int64) * svs
            else:
                # entries are clamped into the pool: a bad table gives wrong keys, never a read
                # outside it (the op checks tables it can read without a sync)
                if PAGE_SIZE % BLOCK_N == 0:   # tiles start at multiples of BLOCK_N: one page per tile
                    page = tl.load(bt_row + start // PAGE_SIZE)
                    page = tl.minimum(tl.maximum(page, 0), num_blocks - 1).to(tl.int64)
                    slots = (start % PAGE_SIZE + offs_n).to(tl.int64)
                else:                          # a tile over several pages: one table entry per key
                    page = tl.load(bt_row + cols // PAGE_SIZE, mask=col_ok, other=0)
                    page = tl.minimum(tl.maximum(page, 0), num_blocks - 1).to(tl.int64)
                    slots = (cols % PAGE_SIZE).to(tl.int64)
                k_rows = page * skb + slots * sks
                v_rows = page * svb + slots * svs
            kt = tl.load(k_base + k_rows[None, :] + dims[:, None],
                         mask=col_ok[None, :] & dim_ok[:, None], other=0.0)
            if DOT_PRECISION == "upcast":   # the interpreter's bf16 dot is broken; products are exact in fp32
                qk = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
            else:
                qk = tl.dot(q, kt, input_precision=DOT_PRECISION)
            if SOFTCAP:   # c * tanh(scale * s / c), tanh as 1 - 2 / (exp(2x) + 1) (no libdevice)
                qk = (1.0 - 2.0 / (tl.math.exp2(qk * cap_in * 2.8853900817779268) + 1.0)) * cap_out
            else:
                qk = qk * qk_scale                  # base-2 scores: scale * log2(e) folded in
            if HAS_ALIBI:   # after the softcap, as FlashAttention and the dense kernels add it
                qk -= slope[:, None] * tl.abs(position[:, None] - cols[None, :].to(tl.float32))
            keep = col_ok[None, :] & (cols[None, :] < limit[:, None])
            qk = tl.where(keep, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with nothing yet: no inf - inf
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(qk - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + v_rows[:, None] + dims[None, :],
                        mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = acc * alpha[:, None]
            if DOT_PRECISION == "upcast":
                acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
            m_i = m_new
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]             # zeros where the row saw no key
        out_rows = (pid_bh * n_rows + rows).to(tl.int64)   # (b, h, i) flattened: out is (B, H, Sq, D)
        o_ptrs = O + out_rows[:, None] * so_row + split * so_split + dims[None, :]
        tl.store(o_ptrs, out, mask=row_ok[:, None] & dim_ok[None, :])
        if not FINAL:
            lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))
            tl.store(LSE + out_rows * num_splits + split, lse, mask=row_ok)

    @triton.jit(do_not_specialize=("num_splits",))
    def decode_combine(OP, LSE, OUT, so_row, so_split, num_splits,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        splits = tl.arange(0, BLOCK_S)
        s_ok = splits < num_splits
        lse = tl.load(LSE + row * num_splits + splits, mask=s_ok, other=float("-inf"))
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        weight = tl.math.exp2(lse - m)          # 0 for splits that saw no key
        total = tl.sum(weight, 0)
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < HEAD_DIM
        parts = tl.load(OP + row * so_row + splits[:, None] * so_split + dims[None, :],
                        mask=s_ok[:, None] & dim_ok[None, :], other=0.0)
        out = tl.sum(parts * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
        tl.store(OUT + row * HEAD_DIM + dims, out, mask=dim_ok)

    return {"split": decode_split, "combine": decode_combine}


kernel_table = triton_common.lazy_kernel(_build)


def choose_splits(batch: int, kv_heads: int, s_max: int, block_n: int, device: torch.device) -> int:
    """Splits per (item, KV head): B * Hkv * splits fills about twice the GPU's SMs; a few
    (item, KV head) rows with a long cache split further (each split keeping >= 512 keys, up to
    8 programs per SM) so that enough loads are in flight; many rows still split in 2-3, which
    evens out the last wave. Never more splits than the cache has tiles. From CUDA-graph timings
    on the H100 (benchmarks/records/h100/decode-*.md: B 1-64, Hkv 8, Sk 4k-128k). The
    interpreter counts 2 "SMs", so the CPU tests split too."""
    rows = max(1, batch * kv_heads)
    if device.type == "cuda" and not triton_common.interpreting():
        sms = triton_common.sm_count(device)
        splits = triton_common.cdiv(2 * sms, rows)
        if 2 * rows < sms:
            splits = max(splits, min(triton_common.cdiv(s_max, 512), triton_common.cdiv(8 * sms, rows)))
        elif rows >= 2 * sms:
            splits = max(splits, 2 if s_max < 32768 else 3)
    else:
        splits = triton_common.cdiv(2, rows)
    return max(1, min(splits, triton_common.cdiv(max(s_max, 1), block_n), MAX_SPLITS))


def _config(device: torch.device) -> Dict[str, int]:
    """Tile and launch settings. Decode is bound by reading K and V, so the key tile is wide
    enough for long coalesced reads and a few stages keep loads in flight."""
    if triton_common.interpreting() or device.type != "cuda":
        return {"block_n": 16, "num_warps": 1, "num_stages": 1}
    return VENDOR_CONFIGS["amd" if triton_common.vendor() == "amd" else "nvidia"]


VENDOR_CONFIGS = {"nvidia": {"block_n": 64, "num_warps": 4, "num_stages": 3},
                  "amd": {"block_n": 64, "num_warps": 4, "num_stages": 1}}
# Bytes of K and V tiles the pipeline may hold at once (stages x 2 x BLOCK_N x BLOCK_D x element):
# what fits beside the query tile in shared memory on every target (an H100 has 227 KB, an A100
# 163 KB, an MI300 64 KB of LDS); D=256 in fp32 with 3 stages asked for 296 KB on the H100.
TILE_BYTES = {"nvidia": 100 * 1024, "amd": 64 * 1024}


def fit_tiles(block_n: int, num_stages: int, head_dim: int, element_size: int, budget: int) -> Tuple[int, int]:
    """(block_n, num_stages) shrunk, stages first, until the K and V tiles fit `budget` bytes."""
    block_d = max(16, triton_common.next_pow2(head_dim))
    while num_stages > 1 and num_stages * 2 * block_n * block_d * element_size > budget:
        num_stages -= 1
    while block_n > 16 and num_stages * 2 * block_n * block_d * element_size > budget:
        block_n //= 2
    return block_n, num_stages


def triton_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None,
                  alibi_slopes=None, num_splits=None, block_n=None, num_stages=None):
    """Split-KV decode attention (see the module comment). With block_table (B, max_blocks)
    int32/int64, k_cache and v_cache are page pools (num_blocks, Hkv, page_size, D) and each split
    reads its keys through the table (item b's key j: page block_table[b, j // page_size], slot
    j % page_size), with no copy of the pages. alibi_slopes fp32 (H,) or (B, H): FlashAttention's
    ALiBi, -slope * |cache_seqlens[b] - Sq + i - j| added to the (softcapped) scores of query i.
    num_splits / block_n / num_stages: chosen here unless given (tests and tuning)."""
    # torch's TF32 switch, and the slopes' checks and layout, as the attention kernels read them
    from .triton_attention.launch import alibi_table, check_alibi_slopes, dot_precision
    batch, heads, q_len, head_dim = q.shape
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, batch, heads, q.device)
    kv_heads = k_cache.shape[1]
    page_size = 0 if block_table is None else k_cache.shape[2]
    # the keys an item can have: its cache row, or its table's pages
    s_max = k_cache.shape[2] if block_table is None else block_table.shape[1] * page_size
    group = heads // kv_heads
    config = dict(_config(q.device))
    if not triton_common.interpreting() and q.device.type == "cuda":
        budget = TILE_BYTES["amd" if triton_common.vendor() == "amd" else "nvidia"]
        config["block_n"], config["num_stages"] = fit_tiles(int(block_n or config["block_n"]), config["num_stages"],
                                                            head_dim, k_cache.element_size(), budget)
    block_n = int(block_n or config["block_n"])
    config["num_stages"] = int(num_stages or config["num_stages"])
    splits = int(num_splits or choose_splits(batch, kv_heads, s_max, block_n, q.device))
    scale = head_dim ** -0.5 if scale is None else float(scale)
    out = torch.empty((batch, heads, q_len, head_dim), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    seqlens = cache_seqlens if cache_seqlens.is_contiguous() else cache_seqlens.contiguous()
    if block_table is None:
        table, table_stride = seqlens, 0       # unread (PAGE_SIZE=0): any pointer will do
    else:
        table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
        table_stride = table.stride(0)
    slopes, slope_stride = (seqlens, 0) if alibi_slopes is None else alibi_table(alibi_slopes, heads)   # unread without
    block_d = max(16, triton_common.next_pow2(head_dim))
    block_m = max(16, triton_common.next_pow2(group * q_len))
    final = splits == 1
    if final:
        partial, lse, so_row, so_split = out, out, head_dim, 0
    else:
        rows = batch * heads * q_len
        partial = torch.empty((rows, splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((rows, splits), dtype=torch.float32, device=q.device)
        so_row, so_split = splits * head_dim, head_dim
    if softcap is not None:
        qk_scale, cap_in, cap_out = 1.0, scale / softcap, softcap * LOG2E
    else:
        qk_scale, cap_in, cap_out = scale * LOG2E, 1.0, 1.0
    kernels = kernel_table()
    triton_common.launch(
        kernels["split"], (batch * kv_heads, splits),
        (q, k_cache, v_cache, seqlens, table, slopes, partial, lse,
         q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
         v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), so_row, so_split, table_stride, slope_stride,
         kv_heads, q_len, s_max, splits, k_cache.shape[0], qk_scale, cap_in, cap_out),
        num_warps=config["num_warps"], num_stages=config["num_stages"],
        GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_D=block_d,
        SOFTCAP=softcap is not None, DOT_PRECISION=dot_precision(q.dtype), FINAL=final, PAGE_SIZE=page_size,
        HAS_ALIBI=alibi_slopes is not None)
    if not final:
        triton_common.launch(
            kernels["combine"], (batch * heads * q_len,), (partial, lse, out, so_row, so_split, splits),
            num_warps=1 if triton_common.interpreting() else 4, num_stages=None,
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, triton_common.next_pow2(splits)))
    return out


# ----------------------------------------------------------------------------- ahead of time
# (head_dim, GROUP = H / Hkv, new queries, dtype, softcap, final, page size, ALiBi): Llama-style GQA
# decode at the common head dims, the largest query block (8 heads x 16 new queries) and the widest
# head dim the kernel takes, fp32 (the tf32x3 dot on NVIDIA); BLOCK_M and BLOCK_D as triton_decode
# sizes them. Paged (page size > 0): vLLM's 16-token pages (a table entry per key: a tile spans
# several pages) and 256-token pages (one entry per tile), GQA 32:8. ALiBi (gpuparity.flash_attn's
# alibi_slopes): the MHA decode of ALiBi models (BLOOM, MPT) on a contiguous cache, and the largest
# query block with softcap on 16-token pages (every per-row term at once: the most registers).
AOT_CASES = ((128, 8, 1, "bf16", False, False, 0, False), (128, 8, 16, "bf16", True, False, 0, False),
             (256, 4, 16, "bf16", False, False, 0, False), (256, 1, 1, "bf16", True, True, 0, False),
             (64, 1, 1, "fp32", False, False, 0, False),
             (128, 4, 1, "bf16", False, False, 16, False), (128, 4, 1, "bf16", False, False, 256, False),
             (128, 1, 1, "bf16", False, False, 0, True), (128, 8, 16, "bf16", True, False, 16, True))


# Built as launches on caches with the head dim innermost build them (AotSpec.aligned_params): at
# AOT_CASES' head dims (multiples of 16) every stride and output stride is a multiple of 16, which
# Triton marks, and which vectorizes the pipelined loads of K and V (and sizes their buffers).
_ALIGNED_STRIDES = ("sqb", "sqh", "sqs", "skb", "skh", "sks", "svb", "svh", "svs", "so_row", "so_split")


def aot_specs() -> List[Any]:
    """The split kernel at AOT_CASES and the combine kernel at the widest head dim and most
    splits, for every AOT target with its vendor's launch settings (tests/backends/test_aot.py)."""
    if _triton_availability():
        return []
    from .triton_common import AOT_TARGETS, AotSpec
    kernels = kernel_table()
    specs = []
    for target in AOT_TARGETS:
        vendor = "amd" if target.startswith("hip") else "nvidia"
        cfg = VENDOR_CONFIGS[vendor]
        for head_dim, group, q_len, dtype, softcap, final, page, alibi in AOT_CASES:
            # the tile triton_decode launches: the vendor's, fitted to its shared-memory budget
            block_n, stages = fit_tiles(cfg["block_n"], cfg["num_stages"], head_dim, 4 if dtype == "fp32" else 2,
                                        TILE_BYTES[vendor])
            precision = "tf32x3" if dtype == "fp32" and vendor == "nvidia" else "ieee"
            constexprs = dict(GROUP=group, BLOCK_M=max(16, triton_common.next_pow2(group * q_len)),
                              BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_D=max(16, triton_common.next_pow2(head_dim)),
                              SOFTCAP=softcap, DOT_PRECISION=precision, FINAL=final, PAGE_SIZE=page,
                              HAS_ALIBI=alibi)
            types = dict(Q=f"*{dtype}", K=f"*{dtype}", V=f"*{dtype}", SEQLENS="*i32", BT="*i32", ALIBI="*fp32",
                         O=f"*{dtype}" if final else "*fp32", LSE="*fp32", qk_scale="fp32", cap_in="fp32",
                         cap_out="fp32", **{name: "constexpr" for name in constexprs})
            # in the kernel's parameter order (compile attributes go by position); the rest are i32
            signature = {name: types.get(name, "i32") for name in _parameters(kernels["split"])}
            specs.append(AotSpec(f"attention_decode.split.{target}.d{head_dim}.{dtype}.g{group}q{q_len}"
                                 + (".softcap" if softcap else "") + (".final" if final else "")
                                 + (f".page{page}" if page else "") + (".alibi" if alibi else ""),
                                 kernels["split"], signature, constexprs, num_warps=cfg["num_warps"],
                                 num_stages=stages, targets=(target,), aligned_params=_ALIGNED_STRIDES))
        constexprs = dict(HEAD_DIM=MAX_HEAD_DIM, BLOCK_D=MAX_HEAD_DIM, BLOCK_S=MAX_SPLITS)
        signature = dict(OP="*fp32", LSE="*fp32", OUT="*bf16", so_row="i32", so_split="i32", num_splits="i32",
                         **{name: "constexpr" for name in constexprs})
        specs.append(AotSpec(f"attention_decode.combine.{target}.d{MAX_HEAD_DIM}.s{MAX_SPLITS}", kernels["combine"],
                             signature, constexprs, num_warps=4, num_stages=1, targets=(target,),
                             aligned_params=("so_row", "so_split")))
    return specs


def _parameters(kernel) -> List[str]:
    return list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)   # JIT or interpreted: .fn


# ----------------------------------------------------------------------------- registration
def _triton_supports(problem: Problem) -> List[str]:
    reasons = triton_common.problem_reasons(problem)
    if reasons:
        return reasons
    if problem.feature("head_dim", 64) > MAX_HEAD_DIM:
        reasons.append(f"triton: head_dim {problem.feature('head_dim')} > {MAX_HEAD_DIM} (the query block "
                       f"and a K/V tile must fit in registers)")
    if problem.feature("q_len", 1) > MAX_QUERIES:
        reasons.append(f"triton: {problem.feature('q_len')} new queries > {MAX_QUERIES} (the decode kernel "
                       f"holds all of a KV head's queries in one block; use gpuparity.attention for prefill)")
    return reasons


def _sdpa_supports(problem: Problem) -> List[str]:
    if problem.feature("softcap") is not None:
        return [f"sdpa: SDPA has no logit softcap (softcap={problem.feature('softcap')})"]
    return []


def _triton_availability() -> Optional[str]:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means the same here
        return f"triton: not importable ({type(exc).__name__}: {exc})"
    return None


def _backend_triton(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None,
                    alibi_slopes=None):
    return triton_decode(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap, block_table=block_table,
                         alibi_slopes=alibi_slopes)


register(Backend("triton", "attention_decode", _backend_triton,
                 "split-KV (flash-decoding) Triton kernel: K/V read once per KV head, tiles past "
                 "cache_seqlens never loaded, splits combined by log-sum-exp; paged caches read in place "
                 "through the block table; ALiBi slopes in the kernel",
                 device_types=("cuda", "cpu"), dtypes=(torch.float16, torch.bfloat16, torch.float32),
                 availability=_triton_availability, supports=_triton_supports, jit=True, opt_in=("alibi",)))
register(Backend("sdpa", "attention_decode", decode_sdpa,
                 "torch SDPA over the whole cache with a bool mask (GQA through enable_gqa); paged caches "
                 "gathered into a contiguous copy first",
                 supports=_sdpa_supports))
