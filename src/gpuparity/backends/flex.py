"""FlexAttention backend ("flex"): torch's flex_attention compiled by torch.compile, with a
block mask built from the call's masks so that fully masked blocks are skipped.

Only offered where torch.compile can generate GPU code here (torch >= 2.5 with flex_attention,
a GPU and a working Triton); auto still needs its probe to pass. Block masks are cached per
mask tensor (by identity and version), so a training loop that reuses one padding mask builds
it once; torch.compile compiles once per shape.
"""
from __future__ import annotations

import collections
import importlib
import inspect
from typing import Any, List, Optional, Tuple

import torch

from ..registry import Backend, Problem, register
from . import triton_common
from .. import caches

_CACHE_SIZE = 16
_block_masks: "collections.OrderedDict[Tuple, Tuple[Tuple[Any, ...], Any]]" = caches.register(
    "backends.flex.block_masks", collections.OrderedDict())


@caches.lru_cache("backends.flex.availability")
def _availability() -> Optional[str]:
    """Cheap and cached: imports and device checks only; the probe compiles for real."""
    try:
        importlib.import_module("torch.nn.attention.flex_attention")
    except Exception as exc:  # noqa: BLE001
        return f"flex: this torch ({torch.__version__}) has no usable flex_attention ({type(exc).__name__})"
    if not torch.cuda.is_available():
        return "flex: needs a CUDA or ROCm GPU (torch.compile generates Triton GPU code for it)"
    reason = triton_common.triton_unavailable_reason("cuda")
    if reason:
        return f"flex: torch.compile cannot generate code here: {reason}"
    try:
        importlib.import_module("torch._dynamo")
        importlib.import_module("torch._inductor")
    except Exception as exc:  # noqa: BLE001
        return f"flex: torch.compile is not importable ({type(exc).__name__}: {exc})"
    return None


@caches.lru_cache("backends.flex.compiled_flex")
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


@caches.lru_cache("backends.flex.aux_request")
def _aux_request():
    """(kwargs asking flex_attention for the log-sum-exp, how to read it from the result)."""
    from torch.nn.attention import flex_attention as module
    params = inspect.signature(module.flex_attention).parameters
    if "return_aux" in params and hasattr(module, "AuxRequest"):
        return {"return_aux": module.AuxRequest(lse=True)}, lambda result: (result[0], result[1].lse)
    return {"return_lse": True}, lambda result: (result[0], result[1])


def _as_4d(mask: torch.Tensor, shape) -> torch.Tensor:
    """A stride-0 expanded view of `mask` to (B, H, Sq, Sk): indexing it costs no memory."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask.expand(*shape)


def _same(cached: Tuple[Any, ...], current: Tuple[Any, ...]) -> bool:
    for (c_tensor, c_version), tensor in zip(cached, current):
        if tensor is None:
            if c_tensor is not None:
                return False
            continue
        if c_tensor is not tensor or c_version != tensor._version:
            return False
    return True


def _plan(q, k, attn_mask, key_padding_mask, is_causal):
    """(block_mask or None, score_mod or None) for this call, cached per mask tensor."""
    from torch.nn.attention.flex_attention import create_block_mask
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    key = (batch, heads, q_len, k_len, bool(is_causal), str(q.device),
           id(attn_mask), id(key_padding_mask))
    current = (attn_mask, key_padding_mask)
    hit = _block_masks.get(key)
    if hit is not None and _same(hit[0], current):
        _block_masks.move_to_end(key)
        return hit[1]

    shape = (batch, heads, q_len, k_len)
    allowed_4d = None
    bias_4d = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed_4d = _as_4d(attn_mask, shape)
        else:
            bias_4d = _as_4d(attn_mask.detach(), shape)
            # -inf entries are masks, not scores: the block mask skips them and empty rows
            # come out as zeros instead of NaN
            allowed_4d = ~torch.isneginf(bias_4d)
    padding = key_padding_mask

    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= 0  # all True, shaped like the indices
        if is_causal:
            keep = keep & (kv_idx <= q_idx)
        if padding is not None:
            keep = keep & ~padding[b, kv_idx]
        if allowed_4d is not None:
            keep = keep & allowed_4d[b, h, q_idx, kv_idx]
        return keep

    def add_bias(score, b, h, q_idx, kv_idx):
        return score + bias_4d[b, h, q_idx, kv_idx].to(score.dtype)
    score_mod = add_bias if bias_4d is not None else None

    block_mask = None
    if is_causal or padding is not None or allowed_4d is not None:
        mask_batch = None if (padding is None and (attn_mask is None or attn_mask.dim() < 4 or attn_mask.shape[0] == 1)) else batch
        mask_heads = None if (attn_mask is None or attn_mask.dim() < 3 or attn_mask.shape[-3] == 1) else heads
        kwargs = {}
        if "_compile" in inspect.signature(create_block_mask).parameters:
            kwargs["_compile"] = True
        block_mask = create_block_mask(mask_mod, mask_batch, mask_heads, q_len, k_len, device=q.device, **kwargs)

    plan = (block_mask, score_mod)
    _block_masks[key] = (tuple((t, t._version if t is not None else None) for t in current), plan)
    while len(_block_masks) > _CACHE_SIZE:
        _block_masks.popitem(last=False)
    return plan


def flex(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    block_mask, score_mod = _plan(q, k, attn_mask, key_padding_mask, is_causal)
    aux_kwargs, unpack = _aux_request()
    result = _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=q.shape[1] != k.shape[1], **aux_kwargs)
    out, lse = unpack(result)
    # The contract: a row with no key left is exactly zero with zero gradients, whatever
    # flex_attention itself returns for it.
    empty = torch.isneginf(lse.detach()) | torch.isnan(lse.detach())
    return out.masked_fill(empty.unsqueeze(-1), 0.0)


def _supports(problem: Problem) -> List[str]:
    reasons = []
    head_dim = problem.feature("head_dim", 64)
    if head_dim < 16 or head_dim & (head_dim - 1):
        reasons.append(f"flex: head_dim {head_dim} is not a power of two >= 16")
    if problem.feature("mask_requires_grad"):
        reasons.append("flex: no gradient for a float attn_mask (it requires grad)")
    if problem.feature("window") is not None or problem.feature("softcap") is not None:
        # FlexAttention could express both (mask_mod, score_mod); gpuparity's flex backend does
        # not build them yet, so it declines rather than ignore them
        reasons.append("flex: sliding window and softcap are not wired into gpuparity's flex backend yet")
    return reasons


register(Backend("flex", "attention", flex,
                 "torch FlexAttention compiled by torch.compile, block mask skips masked blocks",
                 device_types=("cuda",), dtypes=(torch.float16, torch.bfloat16, torch.float32),
                 availability=_availability, supports=_supports, battery_level="full", jit=True))
