"""`gpuparity.apply_rotary`: rotary position embeddings with flash-attn's contract, every input
checked, the backend chosen by the verified dispatcher."""
from __future__ import annotations

import numbers
from typing import Optional, Union

import torch

from .. import dispatch
from . import select
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def rotary_kind(interleaved: bool, cu_seqlens) -> str:
    """The probe key of a rotary call (as the battery's rotary spec names it): "half",
    "interleaved", "varlen-half" or "varlen-interleaved"."""
    return ("varlen-" if cu_seqlens is not None else "") + ("interleaved" if interleaved else "half")


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_rotary_inputs(x, cos, sin, *, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, inplace):
    """Validate apply_rotary's arguments; returns max_seqlen (computed when packed and None).

    Checks that need the values of device tensors (cu_seqlens order, offsets within the cos/sin
    table) cost one synchronisation; they are skipped while a CUDA graph is being captured.
    """
    expect_tensor("x", x, dtypes=FLOAT_DTYPES)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: expected a bool, got {describe(interleaved)}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace: expected a bool, got {describe(inplace)}")
    if cu_seqlens is None:
        expect_tensor("x", x, ndim=(4,))
        batch, seqlen = x.shape[0], x.shape[1]
        if max_seqlen is not None:
            raise ValueError(f"max_seqlen: only meaningful with cu_seqlens (packed input), got {describe(max_seqlen)}")
    else:
        if x.dim() != 3:
            raise ValueError(f"x: expected a packed 3-D tensor (total, H, D) with cu_seqlens, got {describe(x)}")
        expect_tensor("cu_seqlens", cu_seqlens, ndim=(1,), dtypes=INDEX_DTYPES)
        if cu_seqlens.numel() < 1:
            raise ValueError(f"cu_seqlens: expected B + 1 >= 1 cumulative lengths, got {describe(cu_seqlens)}")
        expect_same_device("x", x, cu_seqlens=cu_seqlens)
        batch, seqlen = cu_seqlens.numel() - 1, None
        if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral)
                                       or max_seqlen < 0):
            raise ValueError(f"max_seqlen: expected an int >= 0, got {describe(max_seqlen)}")
    head_dim = x.shape[-1]
    for name, table in (("cos", cos), ("sin", sin)):
        expect_tensor(name, table, ndim=(2,), dtypes=FLOAT_DTYPES)
    if cos.shape != sin.shape:
        raise ValueError(f"sin: expected the shape of cos {tuple(cos.shape)}, got {describe(sin)}")
    if cos.dtype != sin.dtype:
        raise TypeError(f"sin: expected the dtype of cos ({str(cos.dtype).replace('torch.', '')}), got {describe(sin)}")
    expect_same_device("x", x, cos=cos, sin=sin)
    rotary_half = cos.shape[1]
    if rotary_half < 1 or 2 * rotary_half > head_dim:
        raise ValueError(f"cos: expected shape (S_max, rotary_dim / 2) with 1 <= rotary_dim <= head dim {head_dim}, "
                         f"got {describe(cos)} (rotary_dim {2 * rotary_half})")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("cos/sin: gradients with respect to cos and sin are not supported (flash-attn's rotary "
                         "contract); pass cos.detach() and sin.detach()")
    table_len = cos.shape[0]
    if isinstance(seqlen_offsets, torch.Tensor):
        expect_tensor("seqlen_offsets", seqlen_offsets, ndim=(1,), dtypes=INDEX_DTYPES)
        if seqlen_offsets.shape[0] != batch:
            raise ValueError(f"seqlen_offsets: expected one offset per sequence ({batch},), got {describe(seqlen_offsets)}")
        expect_same_device("x", x, seqlen_offsets=seqlen_offsets)
    elif isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, numbers.Integral) or seqlen_offsets < 0:
        raise ValueError(f"seqlen_offsets: expected an int >= 0 or a ({batch},) integer tensor, "
                         f"got {describe(seqlen_offsets)}")
    if inplace and x.requires_grad and x.is_leaf and torch.is_grad_enabled():
        raise ValueError(f"x: inplace=True cannot modify a leaf tensor that requires grad, got {describe(x)}")

    if cu_seqlens is None:
        if isinstance(seqlen_offsets, torch.Tensor):
            if not _capturing(x.device) and seqlen_offsets.numel():
                low, high = (int(v) for v in torch.stack([seqlen_offsets.min(), seqlen_offsets.max()]).tolist())
                _check_positions(low, high + seqlen, table_len)
        else:
            _check_positions(int(seqlen_offsets), int(seqlen_offsets) + seqlen if seqlen else 0, table_len)
        return None
    total = x.shape[0]
    if _capturing(x.device):
        if max_seqlen is None:
            raise ValueError("max_seqlen: needed with cu_seqlens while a CUDA graph is being captured")
        return int(max_seqlen)
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    offsets = seqlen_offsets.long() if isinstance(seqlen_offsets, torch.Tensor) else torch.full_like(lengths, int(seqlen_offsets))
    if batch == 0:
        if total != 0 or int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens: expected [0] for an empty batch with x of {total} rows, got {cu_seqlens.tolist()}")
        return 0
    first, last, decreasing, longest, low, end = (int(v) for v in torch.stack([
        cu[0], cu[-1], (lengths < 0).sum(), lengths.max(), offsets.min(), (lengths + offsets).max()]).tolist())
    if first != 0 or last != total or decreasing:
        raise ValueError(f"cu_seqlens: expected a non-decreasing sequence from 0 to x.shape[0] = {total}, "
                         f"got first {first}, last {last}, {decreasing} decreasing step(s)")
    if max_seqlen is not None and int(max_seqlen) < longest:
        raise ValueError(f"max_seqlen: expected >= the longest sequence ({longest}), got {max_seqlen}")
    _check_positions(low, end, table_len)
    return int(max_seqlen) if max_seqlen is not None else longest


def _check_positions(lowest_offset: int, end: int, table_len: int) -> None:
    if lowest_offset < 0:
        raise ValueError(f"seqlen_offsets: expected offsets >= 0, got {lowest_offset}")
    if end > table_len:
        raise ValueError(f"cos: positions reach {end - 1} (sequence length + seqlen_offsets) but the cos/sin table "
                         f"has {table_len} rows; expected cos.shape[0] >= {end}")


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
    rotary_dim = 2 * cos.shape[1]
    problem = dispatch.Problem("rotary", x.device, x.dtype, rotary_kind(interleaved, cu_seqlens),
                               (("head_dim", x.shape[-1]), ("rotary_dim", rotary_dim),
                                ("offsets", "tensor" if isinstance(seqlen_offsets, torch.Tensor) else "int")))
    chosen = select.resolve(problem, backend)
    kwargs = dict(interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                  max_seqlen=max_seqlen)
    if inplace and getattr(chosen.fn, "supports_inplace", False):
        return chosen.fn(x, cos, sin, inplace=True, **kwargs)
    out = chosen.fn(x, cos, sin, **kwargs)
    if inplace:
        x.copy_(out)
        return x
    return out
