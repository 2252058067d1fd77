"""Shared plain-PyTorch dense attention core for the held-out implementations of 2026-12-06
(written as a user's own wrapper would be: fp32 compute, the result in q's dtype)."""
import torch


def dense_core(q, k, v, allowed, scale, *, float_mask=None, softcap=None, kv_index=None, mask_then_scale=False,
               softcap_unscaled=False):
    """q (B, H, Sq, D); k, v (B, Hkv, Sk, D); allowed bool broadcastable to (B, H, Sq, Sk) or None.
    kv_index: the kv head of each query head (GQA)."""
    if kv_index is not None:
        k, v = k[:, kv_index], v[:, kv_index]
    qf, kf, vf = q.float(), k.float(), v.float()
    s = qf @ kf.transpose(-2, -1)
    if mask_then_scale and float_mask is not None:
        s = (s + float_mask.float()) * scale
    else:
        if softcap is not None and softcap_unscaled:
            s = softcap * torch.tanh(s / softcap) * scale
        else:
            s = s * scale
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
        if float_mask is not None:
            s = s + float_mask.float()
    ok = ~torch.isneginf(s)
    if allowed is not None:
        ok = ok & allowed
    empty = ~ok.any(-1, keepdim=True)
    s = s.masked_fill(~ok, float("-inf")).masked_fill(empty, 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    return (p @ vf).to(q.dtype)
