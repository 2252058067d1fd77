"""Held-out bug: packed rotary positions counted over the whole buffer, not within each
sequence. The table is read masked as flash-attn's Triton kernel reads it (past it: cos 1, sin 0)."""
import torch


def _positions(x, cu_seqlens, seqlen_offsets, global_positions):
    if cu_seqlens is None:
        B, S = x.shape[0], x.shape[1]
        pos = torch.arange(S, device=x.device)[None, :].expand(B, S)
        off = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else torch.full((B,), int(seqlen_offsets))
        return pos + off.to(x.device).long()[:, None]
    total = x.shape[0]
    cu = cu_seqlens.to(x.device).long()
    idx = torch.arange(total, device=x.device)
    seq = torch.bucketize(idx, cu[1:], right=True)
    pos = idx if global_positions else idx - cu[seq]
    if isinstance(seqlen_offsets, torch.Tensor):
        return pos + seqlen_offsets.to(x.device).long()[seq]
    return pos + int(seqlen_offsets)


def _rotary(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, global_positions):
    half = cos.shape[1]
    pos = _positions(x, cu_seqlens, seqlen_offsets, global_positions)
    inside = (pos < cos.shape[0]).unsqueeze(-1)
    pos = pos.clamp_max(cos.shape[0] - 1)
    c = torch.where(inside, cos.float()[pos], 1.0).unsqueeze(-2)
    s = torch.where(inside, sin.float()[pos], 0.0).unsqueeze(-2)
    xf = x.float()
    rot, rest = xf[..., :2 * half], xf[..., 2 * half:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
        out = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return torch.cat([out, rest], dim=-1).to(x.dtype)


def rotary(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    return _rotary(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, True)


def correct(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    return _rotary(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, False)
