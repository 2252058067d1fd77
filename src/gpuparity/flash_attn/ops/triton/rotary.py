"""FlashAttention's `flash_attn.ops.triton.rotary.apply_rotary` on gpuparity's verified rotary op
(`gpuparity.apply_rotary`, whose backend the dispatcher chooses: Triton where it passed its
checks here). `conjugate=True` (the backward's rotation) passes -sin, which is exact."""
from __future__ import annotations

from typing import Optional, Union

import torch

from ..._compose import FlashAttnArgumentError
from ...flash_attn_interface import _BACKENDS
from ....ops.rotary import apply_rotary as _rotate
from ....validation import describe

__all__ = ["apply_rotary"]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seqlen_offsets: Union[int, torch.Tensor] = 0,
                 cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None, interleaved=False,
                 inplace=False, conjugate=False) -> torch.Tensor:
    """Rotate the first rotary_dim = 2 * cos.shape[1] features of each head of x by the angle of
    its position; the rest of each head passes through.

    Arguments:
        x: (batch, seqlen, nheads, headdim), or packed (total_seqlen, nheads, headdim) with cu_seqlens.
        cos, sin: (seqlen_ro, rotary_dim / 2); position p reads row p.
        seqlen_offsets: int, or (batch,) int32/int64: sequence b's token s sits at position s + offset[b].
        cu_seqlens: (batch + 1,) int32/int64 or None; max_seqlen: int (computed when None).
        interleaved: rotate pairs (2i, 2i + 1) (GPT-J) instead of the two halves (GPT-NeoX).
        inplace: write into x and return it. conjugate: rotate by -angle (sin negated).
    Returns:
        y: x's shape.
    Positions past the table raise (FlashAttention's kernel leaves them unrotated when the offsets
    are a tensor). Not differentiable in cos and sin, as FlashAttention's.
    """
    if not isinstance(conjugate, bool):
        raise TypeError(f"conjugate: expected a bool, got {describe(conjugate)}")
    if conjugate and isinstance(sin, torch.Tensor):
        sin = -sin
    try:
        return _rotate(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                       max_seqlen=max_seqlen, inplace=inplace, backend=_BACKENDS["rotary"])
    except FlashAttnArgumentError:
        raise
    except ValueError as exc:   # gpuparity's checks name the argument; FlashAttention's callers catch RuntimeError too
        raise FlashAttnArgumentError(f"apply_rotary: {exc}") from None
