"""The pieces gpuparity.flash_attn composes FlashAttention's features from: argument checks that
name the argument, FlashAttention's bottom-right causal/window alignment turned into the masks
gpuparity's ops take, ALiBi as an additive fp32 bias, padding packed sequences into a dense batch,
gathering paged KV into contiguous keys and values, and the S_dmask encoding of dropout calls."""
from __future__ import annotations

import numbers
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..contracts.varlen import bottom_right_allowed
from ..validation import describe

NEG_INF = float("-inf")


class FlashAttnArgumentError(ValueError, RuntimeError):
    """A bad argument. A ValueError as everywhere in gpuparity, and a RuntimeError because that is
    what FlashAttention's own checks raise: code written against flash_attn catches either."""


def capturing(device) -> bool:
    """True while torch.compile traces or a CUDA graph is captured: checks that read device values
    on the host (a sync) are skipped then."""
    return torch.compiler.is_compiling() or (torch.device(device).type == "cuda"
                                             and torch.cuda.is_current_stream_capturing())


# ----------------------------------------------------------------------------- scalars
def window_bounds(window_size, causal) -> Tuple[int, int]:
    """(left, right) with -1 for an unbounded side; causal sets right = 0 (FlashAttention)."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {describe(causal)}")
    try:
        values = [int(w) for w in (window_size.tolist() if isinstance(window_size, torch.Tensor) else window_size)]
    except (TypeError, ValueError):
        values = None
    if values is None or len(values) != 2 or isinstance(window_size, (str, bytes)):
        raise TypeError(f"window_size: expected a pair (left, right) of ints (-1 = unbounded), got "
                        f"{describe(window_size)}")
    left, right = (max(-1, w) for w in values)  # FlashAttention reads any negative side as unbounded
    return (left, 0) if causal else (left, right)


def softcap_value(softcap) -> Optional[float]:
    """FlashAttention's softcap: a float, <= 0 means off."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap: expected a float (0.0 = off), got {describe(softcap)}")
    return float(softcap) if softcap > 0 else None


def check_slopes(alibi_slopes, batch: int, heads: int, device) -> torch.Tensor:
    """alibi_slopes as (B or 1, H) fp32."""
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes: expected a (nheads,) or (batch_size, nheads) fp32 tensor, got "
                        f"{describe(alibi_slopes)}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes: expected dtype float32 (as FlashAttention), got {describe(alibi_slopes)}")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise FlashAttnArgumentError(f"alibi_slopes: expected shape (nheads,) = ({heads},) or (batch_size, nheads) "
                                     f"= ({batch}, {heads}), got {describe(alibi_slopes)}")
    if alibi_slopes.device != torch.device(device):
        raise FlashAttnArgumentError(f"alibi_slopes: expected a tensor on {device} (the device of q), got "
                                     f"{describe(alibi_slopes)}")
    return alibi_slopes.reshape(-1, heads)


def check_grad_free(what: str, **tensors) -> None:
    """The KV-cache paths are inference only, as in FlashAttention: refuse a call that asks for gradients."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise FlashAttnArgumentError(
                f"{name}: requires grad, but {what} has no backward (inference only, as in FlashAttention); "
                f"call it under torch.no_grad() / torch.inference_mode() or pass {name}.detach()")


# ----------------------------------------------------------------------------- masks
def dense_masks(q_len: int, k_len: int, left: int, right: int, device):
    """FlashAttention's bottom-right window (left, right) on a (Sq, Sk) problem as what
    gpuparity.attention takes (top-left): (is_causal, window, bool (Sq, Sk) mask or None). Query i
    sits at key position i + Sk - Sq; a side shifted below zero cannot be a top-left window and
    becomes an explicit mask."""
    if (left < 0 and right < 0) or q_len == 0 or k_len == 0:
        return False, None, None
    shift = k_len - q_len

    def side(bound: int, shifted: int, length: int) -> Optional[int]:
        # None: no bound (unset, or so wide that it bounds no query)
        return None if bound < 0 or shifted >= length - 1 else shifted

    low, high = side(left, left - shift, q_len), side(right, right + shift, k_len)
    if (low is not None and low < 0) or (high is not None and high < 0):
        # the window lies off the top-left diagonal on one side: only an explicit mask says that
        return False, None, bottom_right_allowed(q_len, k_len, False, (left, right), device)
    top_left = [-1 if low is None else low, -1 if high is None else high]
    if top_left == [-1, -1]:
        return False, None, None
    if top_left == [-1, 0]:
        return True, None, None
    return False, (top_left[0], top_left[1]), None


def item_allowed(q_lens: torch.Tensor, k_lens: torch.Tensor, q_len: int, k_len: int, left: int, right: int,
                 key_start: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Bool (B, 1, Sq, Sk), True = attend: item b has q_lens[b] queries and keys
    key_start[b] .. k_lens[b] - 1 (padding beyond), its window bottom-right aligned on its own
    lengths (query i at key position i + k_lens[b] - q_lens[b])."""
    device = q_lens.device
    i = torch.arange(q_len, device=device).view(1, q_len, 1)
    j = torch.arange(k_len, device=device).view(1, 1, k_len)
    ql, kl = q_lens.long().view(-1, 1, 1), k_lens.long().view(-1, 1, 1)
    keep = (i < ql) & (j < kl)
    if key_start is not None:
        keep &= j >= key_start.long().view(-1, 1, 1)
    relative = j - i - (kl - ql)
    if left >= 0:
        keep &= relative >= -left
    if right >= 0:
        keep &= relative <= right
    return keep.unsqueeze(1)


def alibi_bias(slopes: torch.Tensor, q_len: int, k_len: int, shift) -> torch.Tensor:
    """fp32 (B or 1, H, Sq, Sk): -slope * |i + shift - j|, shift = Sk - Sq (an int, or (B,) per item),
    FlashAttention's ALiBi bias, added to the scaled scores."""
    device = slopes.device
    i = torch.arange(q_len, device=device).view(1, q_len, 1)
    j = torch.arange(k_len, device=device).view(1, 1, k_len)
    shift = shift.long().view(-1, 1, 1) if isinstance(shift, torch.Tensor) else shift
    distance = (i + shift - j).abs().to(torch.float32).unsqueeze(1)   # (B|1, 1, Sq, Sk)
    return -slopes.view(slopes.shape[0], slopes.shape[1], 1, 1) * distance


def with_bias(allowed: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """One attn_mask from a bool mask and an additive bias (-inf where not allowed)."""
    if bias is None:
        return allowed
    if allowed is None:
        return bias
    while allowed.dim() < 4:
        allowed = allowed.unsqueeze(0)
    return bias.masked_fill(~allowed, NEG_INF)


# ----------------------------------------------------------------------------- packing
def lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).long()


def padded_rows(cu_seqlens: torch.Tensor, total: int, width: int) -> torch.Tensor:
    """For each packed row, its row in the padded (B * width) layout (one host sync)."""
    counts = lengths(cu_seqlens)
    item = torch.repeat_interleave(torch.arange(counts.numel(), device=cu_seqlens.device), counts, output_size=total)
    position = torch.arange(total, device=cu_seqlens.device) - cu_seqlens.long()[item]
    return item * width + position


def pad(x: torch.Tensor, rows: torch.Tensor, batch: int, width: int) -> torch.Tensor:
    """Packed (total, ...) -> (B, width, ...) with zeros in the padding; differentiable."""
    out = x.new_zeros((batch * width,) + tuple(x.shape[1:]))
    return out.index_put((rows,), x).view((batch, width) + tuple(x.shape[1:]))


def check_max_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int) -> None:
    """The padded layout is max_seqlen wide: a longer sequence would write past its row."""
    for name, cu, limit in (("max_seqlen_q", cu_seqlens_q, max_seqlen_q), ("max_seqlen_k", cu_seqlens_k, max_seqlen_k)):
        longest = int(lengths(cu).max()) if cu.numel() > 1 else 0
        if longest > limit:
            raise FlashAttnArgumentError(f"{name}: expected at least the longest sequence ({longest}), got {limit}")


# ----------------------------------------------------------------------------- paged KV
def check_block_table(block_table, batch: int, pool: torch.Tensor, needed: torch.Tensor, needed_name: str) -> None:
    """block_table (B, max_blocks) int32 into a pool of (num_blocks, page_size, Hkv, D) pages:
    every page item b uses (its first ceil(needed[b] / page_size) entries) must exist. One host
    sync; skipped while a CUDA graph is captured or torch.compile traces."""
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or \
            block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_table: expected a (batch_size, max_num_blocks_per_seq) int32 tensor, got "
                        f"{describe(block_table)}")
    if block_table.shape[0] != batch:
        raise FlashAttnArgumentError(f"block_table: expected one row per sequence ({batch}), got {describe(block_table)}")
    if block_table.device != pool.device:
        raise FlashAttnArgumentError(f"block_table: expected a tensor on {pool.device} (the KV pool's device), got "
                                     f"{describe(block_table)}")
    num_blocks, page = pool.shape[0], pool.shape[1]
    if page < 1:
        raise FlashAttnArgumentError(f"k_cache: expected pages of page_block_size >= 1 tokens, got {describe(pool)}")
    if capturing(pool.device):
        return
    capacity = block_table.shape[1] * page
    longest = int(needed.max()) if needed.numel() else 0
    if longest > capacity:
        raise FlashAttnArgumentError(
            f"block_table: {block_table.shape[1]} pages of {page} tokens per sequence hold {capacity} tokens, but "
            f"{needed_name} needs {longest}")
    used = torch.arange(block_table.shape[1], device=block_table.device).view(1, -1) * page < needed.view(-1, 1)
    entries = block_table[used]
    if entries.numel():
        low, high = (int(x) for x in torch.stack([entries.min(), entries.max()]).tolist())
        if low < 0 or high >= num_blocks:
            raise FlashAttnArgumentError(
                f"block_table: entries in use must be page indices in [0, {num_blocks}) (the pool k_cache holds "
                f"{num_blocks} pages), got min {low}, max {high}")


def page_slots(block_table: torch.Tensor, positions: torch.Tensor, item: torch.Tensor, page: int):
    """(page, slot) of token `positions` of sequences `item` (tensors of one shape)."""
    return block_table.long()[item, positions // page], positions % page


def gather_pages(pool: torch.Tensor, block_table: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width, Hkv, D): each sequence's first `width` tokens read through its block table
    (pages past a sequence's length are clamped into the pool: masked by the caller)."""
    num_blocks, page = pool.shape[0], pool.shape[1]
    blocks = -(-width // page)
    table = block_table[:, :blocks].long().clamp(0, num_blocks - 1)
    flat = pool[table.reshape(-1)]   # (B * blocks, page, Hkv, D)
    return flat.view(block_table.shape[0], blocks * page, *pool.shape[2:])[:, :width]


# ----------------------------------------------------------------------------- S_dmask
def round_multiple(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def dropout_probs_encoding(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, bias: Optional[torch.Tensor],
                           scale: Optional[float], softcap: Optional[float], keep: torch.Tensor,
                           block_n: int) -> torch.Tensor:
    """FlashAttention's S_dmask of a dropout call: (B, H, round128(Sq), round128(Sk)) in q's dtype,
    entry (b, h, i, j) = exp(s_ij - m) with m the largest score of row i in key blocks (block_n
    wide) j's block .. the last (the running max of its forward, which walks the key blocks from the
    last), negated where dropout dropped the probability; 0 where the key is masked and in the
    rounding. Its tests recover the softmax by scaling block j by exp(m - lse).
    q (B, Sq, H, D), k (B, Sk, Hk, D); allowed bool (B or 1, 1, Sq, Sk); bias fp32 broadcastable to
    (B, H, Sq, Sk) or None; keep bool (B, H, Sq, Sk) (True: kept)."""
    batch, q_len, heads, head_dim = q.shape
    k_len = k.shape[1]
    encoded = torch.zeros(batch, heads, round_multiple(q_len, 128), round_multiple(k_len, 128), dtype=q.dtype,
                          device=q.device)
    if q_len == 0 or k_len == 0:
        return encoded
    keys = k.float().repeat_interleave(heads // k.shape[2], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), keys) * (head_dim ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed, NEG_INF)
    blocks = -(-k_len // block_n)
    padded = F.pad(scores, (0, blocks * block_n - k_len), value=NEG_INF)
    block_max = padded.view(batch, heads, q_len, blocks, block_n).amax(dim=-1)
    running = block_max.flip(-1).cummax(dim=-1).values.flip(-1)      # max over blocks j .. last
    unnormalized = torch.exp(scores - running.repeat_interleave(block_n, dim=-1)[..., :k_len])
    unnormalized = unnormalized.masked_fill(~allowed, 0.0)             # also where every score is -inf
    encoded[:, :, :q_len, :k_len] = torch.where(keep, unnormalized, -unnormalized).to(q.dtype)
    return encoded
