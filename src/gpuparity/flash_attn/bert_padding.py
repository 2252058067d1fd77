"""flash_attn.bert_padding's helpers: move between padded (batch, seqlen, ...) tensors and the
packed (total_nnz, ...) layout of the varlen functions, differentiably."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..validation import describe

__all__ = ["index_first_axis", "index_put_first_axis", "index_first_axis_residual", "unpad_input", "pad_input",
           "unpad_input_for_concatenated_sequences"]


def _check(name: str, value, min_dim: int = 1) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() < min_dim:
        raise TypeError(f"{name}: expected a tensor with at least {min_dim} dims, got {describe(value)}")


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """input[indices] along the first axis (gradient scattered back with zeros elsewhere)."""
    _check("input", input, 2)
    _check("indices", indices)
    return input[indices]


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A (first_axis_dim, ...) zero tensor with rows `indices` set to `values`."""
    _check("values", values, 2)
    _check("indices", indices)
    out = values.new_zeros((int(first_axis_dim),) + tuple(values.shape[1:]))
    return out.index_put((indices,), values)


def index_first_axis_residual(input: torch.Tensor, indices: torch.Tensor):
    """(input[indices], input): the rows and the whole input, gradients of both summed into input."""
    _check("input", input, 2)
    return input[indices], input


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool/int (1 = valid),
    unused_mask: (batch, seqlen), tokens allocated but unused (kept in the packed rows, not counted
    in seqused). Returns (packed (total_nnz, ...), indices (total_nnz,) into the flattened
    (batch * seqlen), cu_seqlens (batch + 1,) int32, max_seqlen_in_batch int, seqused (batch,) int32)."""
    _check("hidden_states", hidden_states, 2)
    _check("attention_mask", attention_mask, 2)
    if tuple(attention_mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(f"attention_mask: expected shape (batch, seqlen) = {tuple(hidden_states.shape[:2])}, "
                         f"got {describe(attention_mask)}")
    kept = attention_mask.bool() if unused_mask is None else (attention_mask.bool() | unused_mask.bool())
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def unpad_input_for_concatenated_sequences(hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor):
    """Several samples per row: attention_mask_in_length (batch, seqlen) holds, left-aligned, the
    length of each sample of the row (zeros after). Returns (packed, indices, cu_seqlens (one
    entry per sample), max_seqlen_in_batch)."""
    _check("hidden_states", hidden_states, 2)
    _check("attention_mask_in_length", attention_mask_in_length, 2)
    seqlen = attention_mask_in_length.shape[-1]
    total = attention_mask_in_length.sum(dim=-1)
    kept = torch.arange(seqlen, device=total.device).view(1, -1) < total.view(-1, 1)
    flat_lengths = attention_mask_in_length.flatten()
    sample_lengths = flat_lengths[flat_lengths != 0]
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    max_seqlen = int(sample_lengths.max()) if sample_lengths.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(sample_lengths, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape((-1,) + tuple(hidden_states.shape[2:]))
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Packed (total_nnz, ...) back to (batch, seqlen, ...), zeros where nothing was packed."""
    out = index_put_first_axis(hidden_states, indices, int(batch) * int(seqlen))
    return out.view((int(batch), int(seqlen)) + tuple(hidden_states.shape[1:]))
