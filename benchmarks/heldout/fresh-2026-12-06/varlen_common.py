"""A user's plain-PyTorch attention_varlen (flash_attn_varlen_func's layout): each packed sequence
through the dense core, bottom-right aligned causal/window. Flags plant the held-out bugs."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import dense_core  # noqa: E402


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale, *, softcap_unscaled=False,
           right_minus_one_literal=False):
    total_q, H, D = q.shape
    Hkv = k.shape[1]
    kv_index = torch.arange(H, device=q.device) // (H // Hkv)
    scale = D ** -0.5 if scale is None else scale
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    pieces = []
    for b in range(len(cq) - 1):
        qs, qe, ks, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if qe == qs:
            continue
        if ke == ks:
            pieces.append(torch.zeros_like(q[qs:qe]))
            continue
        sq, sk = qe - qs, ke - ks
        rel = (torch.arange(sk, device=q.device)[None, :] - torch.arange(sq, device=q.device)[:, None] - (sk - sq))
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
        if causal:
            allowed &= rel <= 0
        if window is not None:
            left, right = window
            if left >= 0:
                allowed &= rel >= -left
            if right >= 0 or right_minus_one_literal:
                allowed &= rel <= right
        qi, ki, vi = (t.transpose(0, 1).unsqueeze(0) for t in (q[qs:qe], k[ks:ke], v[ks:ke]))
        out = dense_core(qi, ki, vi, allowed, scale, softcap=softcap, kv_index=kv_index,
                         softcap_unscaled=softcap_unscaled)
        pieces.append(out[0].transpose(0, 1))
    if not pieces:
        return torch.zeros_like(q)
    return torch.cat(pieces, dim=0)
