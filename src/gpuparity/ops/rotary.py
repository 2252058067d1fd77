"""`gpuparity.apply_rotary`: rotary position embeddings with flash-attn's contract, every input
checked, the backend chosen by the verified dispatcher."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from . import library, library_rotary, select
from ..contracts.rotary import check_rotary_inputs, rotary_kind, rotary_problem

__all__ = ["apply_rotary", "apply_rotary_pair", "check_rotary_inputs", "rotary_kind"]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False,
                 seqlen_offsets: Union[int, torch.Tensor] = 0, cu_seqlens: Optional[torch.Tensor] = None,
                 max_seqlen: Optional[int] = None, inplace: bool = False, backend: str = "auto") -> torch.Tensor:
    """Rotate the first rotary_dim = 2 * cos.shape[1] features of each head of x by the angle of
    its position (s + seqlen_offsets[b]); the rest of the head passes through.

    x: (B, S, H, D), or packed (total, H, D) with cu_seqlens (B + 1,) int32/int64.
    cos, sin: (S_max, rotary_dim / 2). interleaved=False: half-split (NeoX / Llama);
    True: pairs (2i, 2i+1) (GPT-J). inplace=True writes into x and returns it.
    """
    max_seqlen = check_rotary_inputs(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                                     cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, inplace=inplace)
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        out = library_rotary.apply_rotary(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, backend)
        if inplace:
            x.copy_(out)
            return x
        return out
    chosen = select.resolve(rotary_problem(x, cos, interleaved, seqlen_offsets, cu_seqlens), backend)
    kwargs = dict(interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                  max_seqlen=max_seqlen)
    if inplace and getattr(chosen.fn, "supports_inplace", False):
        return chosen.fn(x, cos, sin, inplace=True, **kwargs)
    out = chosen.fn(x, cos, sin, **kwargs)
    if inplace:
        x.copy_(out)
        return x
    return out


def apply_rotary_pair(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                      interleaved: bool = False, backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)) for an attention's q (B, S, Hq, D)
    and k (B, S, Hk, D): position s at table row s, no offsets, no packing, not in place. Where
    both calls resolve to a backend that rotates a pair in one launch (the Triton kernel), one
    launch forward and one backward; otherwise the two calls."""
    for name, x in (("q", q), ("k", k)):
        try:
            check_rotary_inputs(x, cos, sin, interleaved=interleaved, seqlen_offsets=0, cu_seqlens=None,
                                max_seqlen=None, inplace=False)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None
    if k.shape[0] != q.shape[0] or k.shape[1] != q.shape[1] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k: expected q's batch, sequence length and head dim (B, S, Hk, D) = "
                         f"({q.shape[0]}, {q.shape[1]}, Hk, {q.shape[3]}), got shape {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"k: expected q's dtype ({str(q.dtype).replace('torch.', '')}), got "
                        f"{str(k.dtype).replace('torch.', '')}")
    if torch.compiler.is_compiling():  # traced: the pair op where the Triton kernel serves both, chosen now
        chosen_q = library.traced_backend(rotary_problem(q, cos, interleaved, 0, None), backend)
        chosen_k = library.traced_backend(rotary_problem(k, cos, interleaved, 0, None), backend)
        if chosen_q is not chosen_k or getattr(chosen_q.fn, "pair", None) is None:
            # the two traced apply_rotary calls (a composition inline)
            return (library_rotary.apply_rotary(q, cos, sin, interleaved, 0, None, None, backend),
                    library_rotary.apply_rotary(k, cos, sin, interleaved, 0, None, None, backend))
        kernels = library._kernels_traceable(q, k, cos, sin)
        return library._op("apply_rotary_pair", kernels)(q, k, cos, sin, bool(interleaved), False, chosen_q.name)
    chosen_q = select.resolve(rotary_problem(q, cos, interleaved, 0, None), backend)
    chosen_k = select.resolve(rotary_problem(k, cos, interleaved, 0, None), backend)
    pair = getattr(chosen_q.fn, "pair", None)
    if pair is not None and chosen_k is chosen_q:
        return pair(q, k, cos, sin, interleaved=interleaved)
    return (chosen_q.fn(q, cos, sin, interleaved=interleaved), chosen_k.fn(k, cos, sin, interleaved=interleaved))
