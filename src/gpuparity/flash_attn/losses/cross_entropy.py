"""FlashAttention's `flash_attn.losses.cross_entropy.CrossEntropyLoss` module on
`ops.triton.cross_entropy.cross_entropy_loss` (gpuparity's cross-entropy row step)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..ops.triton.cross_entropy import cross_entropy_loss, refuse_process_group

__all__ = ["CrossEntropyLoss"]


class CrossEntropyLoss(nn.Module):
    """Cross entropy over (batch, vocab_size) logits with FlashAttention's options:
    ignore_index, reduction ("mean": sum over rows / number of rows not ignored, NaN when every row
    is ignored, as FlashAttention; "sum"; "none"), label_smoothing, logit_scale, lse_square_scale
    (z-loss), inplace_backward, return_z_loss (also return the z-loss part, for logging).
    process_group (tensor-parallel vocabulary) is refused with NotImplementedError."""

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0, logit_scale=1.0,
                 lse_square_scale=0.0, inplace_backward=False, process_group=None, return_z_loss=False):
        super().__init__()
        if reduction not in ("mean", "none", "sum"):
            raise NotImplementedError(f"reduction: expected 'mean', 'none' or 'sum', got {reduction!r}")
        refuse_process_group(process_group)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.logit_scale = logit_scale
        self.lse_square_scale = lse_square_scale
        self.inplace_backward = inplace_backward
        self.process_group = process_group
        self.return_z_loss = return_z_loss

    def _reduce(self, values: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.reduction == "mean":
            return values.sum() / (target != self.ignore_index).sum()
        return values.sum() if self.reduction == "sum" else values

    def forward(self, input: torch.Tensor, target: torch.Tensor, precomputed_lse: Optional[torch.Tensor] = None):
        """input: (batch, vocab_size); target: (batch,). Returns the loss ((batch,) for "none", else
        a scalar), and the z-loss the same way when return_z_loss."""
        loss, z_loss = cross_entropy_loss(input, target, precomputed_lse=precomputed_lse,
                                          label_smoothing=self.label_smoothing, logit_scale=self.logit_scale,
                                          lse_square_scale=self.lse_square_scale, ignore_index=self.ignore_index,
                                          inplace_backward=self.inplace_backward, process_group=self.process_group)
        loss = self._reduce(loss, target)
        return (loss, self._reduce(z_loss, target)) if self.return_z_loss else loss
