"""`gpuparity.attention_decode` and `gpuparity.kv_cache_append`: a few new queries against a KV
cache with per-item lengths (FlashAttention's flash_attn_with_kvcache contract, causal=True),
contiguous (B, Hkv, S_max, D) or paged (a pool of (num_blocks, Hkv, page_size, D) pages and a
vLLM-style block_table)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor

from . import select
from ..contracts.masks import gather_pages
from ..contracts.base import capturing
from ..contracts.decode import ATTENTION_DECODE, MAX_NEW_QUERIES, check_cache, check_pages, decode_problem, decode_reference
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor
from .library import _like, define

__all__ = ["attention_decode", "kv_cache_append", "decode_problem", "decode_reference", "explain_attention_decode",
           "MAX_NEW_QUERIES"]

# ----------------------------------------------------------------------------- public API
def attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None,
                     backend: str = "auto", return_lse: bool = False):
    """Attention of Sq (1-16) new queries per item against a KV cache.

    q: (B, H, Sq, D); k_cache, v_cache: (B, Hkv, S_max, D), H % Hkv == 0 (GQA);
    or, with block_table (B, max_blocks) int32/int64, page pools (num_blocks, Hkv, page_size, D)
    (any page size; FlashAttention's and vLLM's (num_blocks, page_size, Hkv, D) pool passes as
    its .transpose(1, 2), a view): item b's key j sits in page block_table[b, j // page_size] at
    slot j % page_size, S_max = max_blocks * page_size. The Triton backend reads the pages in
    place; the others gather them into a contiguous copy first. Table entries an item uses are
    checked to lie in the pool when the table is on the CPU; on a GPU (no sync) the kernel clamps
    them into the pool (a bad entry gives wrong keys, never a read outside it);
    cache_seqlens: (B,) int32/int64, item b attends keys 0..cache_seqlens[b]-1, which already
    include the new tokens (append them first with kv_cache_append). The Sq queries are the
    last Sq positions of each item: query i sees keys < cache_seqlens[b] - Sq + 1 + i
    (bottom-right causal, as flash_attn_with_kvcache(causal=True)); a query that sees no key
    returns zeros. Lengths are clamped to [0, S_max] (checked only when cache_seqlens is on the
    CPU: a check of device values would cost a sync per step). softcap=c: scores become
    c * tanh(s / c). Inference only: raises if a tensor requires grad. Returns (B, H, Sq, D).
    backend: "auto" or a name from gpuparity.dispatch.backends("attention_decode").
    return_lse=True: returns (out, lse), lse the fp32 (B, H, Sq) log-sum-exp of each query's scores
    over the keys it sees (-inf for none; a separate pass over the cache, not the kernel's).
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {describe(backend)}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {describe(return_lse)}")
    if return_lse:
        from .attention import attention_lse
        out = attention_decode(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap,
                               block_table=block_table, backend=backend)
        if block_table is not None:   # the separate log-sum-exp pass reads a gathered copy
            k_cache = gather_pages(k_cache, block_table)
        q_len, s_max = q.shape[2], k_cache.shape[2]
        # query i of item b sees keys j < cache_seqlens[b] - Sq + 1 + i (lengths clamped as the kernels do)
        ends = cache_seqlens.long().clamp(0, s_max).view(-1, 1, 1, 1) - q_len + 1 + \
            torch.arange(q_len, device=q.device).view(1, 1, q_len, 1)
        allowed = torch.arange(s_max, device=q.device).view(1, 1, 1, s_max) < ends
        return out, attention_lse(q, k_cache, attn_mask=allowed, scale=scale, softcap=softcap)
    problem = decode_problem(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap, block_table=block_table)
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        return torch.ops.gpuparity.attention_decode(q, k_cache, v_cache, cache_seqlens,
                                                    None if scale is None else float(scale),
                                                    problem.feature("softcap"), backend, block_table)
    chosen = select.resolve(problem, backend)
    return chosen.fn(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=problem.feature("softcap"),
                     **_paged(block_table))


def _paged(block_table) -> Dict[str, Any]:
    # backends are called with block_table only for a paged cache (a contiguous call keeps the
    # signature every decode backend has had)
    return {} if block_table is None else {"block_table": block_table}


# `gpuparity::attention_decode`, what attention_decode becomes under torch.compile / torch.export:
# a fake implementation and a body that resolves the backend when it runs (as ops/library.py's
# dense ops); forward only, as the op is (no autograd formula: the public function refuses
# tensors that require grad before tracing reaches it).
def _attention_decode_body(a) -> Tensor:
    problem = decode_problem(a.q, a.k_cache, a.v_cache, a.cache_seqlens, scale=a.scale, softcap=a.softcap,
                             block_table=a.block_table)
    out = select.resolve(problem, a.backend).fn(a.q, a.k_cache, a.v_cache, a.cache_seqlens, scale=a.scale,
                                                softcap=a.softcap, **_paged(a.block_table))
    return _like(out, a.q)


def _attention_decode_fake(a) -> Tensor:
    return torch.empty_like(a.q)


attention_decode_op, _ = define(ATTENTION_DECODE, _attention_decode_body, _attention_decode_fake, twin=False)


def explain_attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None,
                             block_table=None) -> Dict[str, Any]:
    """Why each backend would or would not serve this call under backend="auto": the reasons in
    words of those that cannot, and the battery's verdict (probed on a miss) of those that can."""
    problem = decode_problem(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap, block_table=block_table)
    return select.explain(problem)


def kv_cache_append(k_cache, v_cache, k_new, v_new, cache_seqlens, *, block_table=None):
    """Write k_new/v_new (B, Hkv, Sn, D) into the caches at positions cache_seqlens[b].. in place;
    returns cache_seqlens + Sn (a new tensor, same dtype and device). With block_table, the caches
    are page pools (num_blocks, Hkv, page_size, D) as in attention_decode and token j of item b
    goes to page block_table[b, j // page_size], slot j % page_size (the pages it writes must be
    in the pool: checked with the overflow, ValueError naming block_table).

    Overflow (cache_seqlens + Sn > S_max) raises ValueError naming cache_seqlens; checking it
    reads the lengths on the host (one sync when they live on the GPU), skipped while a CUDA
    graph is captured or torch.compile traces (an overflow is then scatter's device-side
    index error).
    """
    batch, kv_heads, s_max, head_dim = check_cache(k_cache, v_cache, cache_seqlens, block_table)
    for name, new in (("k_new", k_new), ("v_new", v_new)):
        expect_tensor(name, new, ndim=(4,), dtypes=FLOAT_DTYPES)
        if new.shape[0] != batch or new.shape[1] != kv_heads or new.shape[3] != head_dim:
            raise ValueError(f"{name}: expected shape (B={batch}, Hkv={kv_heads}, Sn, D={head_dim}) to match the "
                             f"cache, got {describe(new)}")
    if tuple(v_new.shape) != tuple(k_new.shape):
        raise ValueError(f"v_new: expected the shape of k_new {tuple(k_new.shape)}, got {describe(v_new)}")
    expect_same_dtype("k_cache", k_cache, k_new=k_new, v_new=v_new)
    expect_same_device("k_cache", k_cache, k_new=k_new, v_new=v_new)
    new_len = k_new.shape[2]
    lengths = cache_seqlens.to(torch.int64)
    if not capturing(k_cache.device) and batch:
        low, high = (int(x) for x in torch.stack([lengths.min(), lengths.max()]).tolist())
        if low < 0 or high + new_len > s_max:
            raise ValueError(f"cache_seqlens: appending Sn={new_len} tokens needs cache_seqlens + Sn <= S_max="
                             f"{s_max} and cache_seqlens >= 0, got cache_seqlens min {low}, max {high} "
                             f"(overflow by {max(0, high + new_len - s_max)})")
        if block_table is not None:
            check_pages(block_table, k_cache, lengths + new_len)
    if new_len and block_table is not None:
        page = k_cache.shape[2]
        positions = (lengths.view(batch, 1) + torch.arange(new_len, device=k_cache.device).view(1, new_len)).reshape(-1)
        items = torch.arange(batch, device=k_cache.device).repeat_interleave(new_len)
        pages, slots = block_table.long()[items, positions // page], positions % page
        # (num_blocks, page_size, Hkv, D) views of the pools: one (Hkv, D) row per new token
        for pool, new in ((k_cache, k_new), (v_cache, v_new)):
            pool.transpose(1, 2).index_put_((pages, slots), new.transpose(1, 2).reshape(batch * new_len, kv_heads,
                                                                                         head_dim))
    elif new_len:
        positions = lengths.view(batch, 1) + torch.arange(new_len, device=k_cache.device).view(1, new_len)
        index = positions.view(batch, 1, new_len, 1).expand(batch, kv_heads, new_len, head_dim)
        k_cache.scatter_(2, index, k_new)
        v_cache.scatter_(2, index, v_new)
    return cache_seqlens + new_len

