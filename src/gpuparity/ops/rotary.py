"""`gpuparity.apply_rotary`: rotary position embeddings with flash-attn's contract, every input
checked, the backend chosen by the verified dispatcher."""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import library, select
from ..contracts.rotary import check_rotary_inputs, rotary_kind, rotary_problem

__all__ = ["apply_rotary", "check_rotary_inputs", "rotary_kind"]


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
        out = library.apply_rotary(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, backend)
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
