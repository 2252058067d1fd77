"""A user's plain-PyTorch attention, varlen (per sequence, bottom-right) and decode (the paged cache
gathered) for the held-out set: fp32 compute, q's dtype out."""
import torch


def dense_core(q, k, v, allowed, scale, *, float_mask=None, softcap=None, kv_index=None, mask_then_scale=False,
               softcap_unscaled=False):
    """q (B, H, Sq, D); k, v (B, Hkv, Sk, D); allowed: bool, broadcast; kv_index: GQA."""
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


def dense_attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, *, modulo=False, mask_then_scale=False):
    """The dense attention contract's call (top-left causal, bool/float attn_mask, key padding)."""
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    heads = torch.arange(H, device=q.device)
    kv_index = heads % Hkv if modulo else heads // (H // Hkv)
    scale = D ** -0.5 if scale is None else scale
    allowed = torch.ones(1, 1, Sq, Sk, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed & torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril()
    float_mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            float_mask = attn_mask
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    return dense_core(q, k, v, allowed, scale, float_mask=float_mask, kv_index=kv_index,
                      mask_then_scale=mask_then_scale)


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


def decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table, *, max_length_offset=False,
           pages_without_permute=False):
    B, H, Sq, D = q.shape
    if block_table is not None:
        pool_k, pool_v = k_cache, v_cache
        n_blocks, Hkv, page, _ = pool_k.shape
        pages = block_table.long().clamp(0, n_blocks - 1)
        P = pages.shape[1]
        if pages_without_permute:   # (B, P, Hkv, page, D) read as (B, Hkv, P * page, D)
            k_cache = pool_k[pages].reshape(B, Hkv, P * page, D)
            v_cache = pool_v[pages].reshape(B, Hkv, P * page, D)
        else:
            k_cache = pool_k[pages].permute(0, 2, 1, 3, 4).reshape(B, Hkv, P * page, D)
            v_cache = pool_v[pages].permute(0, 2, 1, 3, 4).reshape(B, Hkv, P * page, D)
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    kv_index = torch.arange(H, device=q.device) // (H // Hkv)
    scale = D ** -0.5 if scale is None else scale
    lengths = cache_seqlens.to(q.device).long().clamp(0, S)
    # query i of item b sees keys j < L_b - Sq + 1 + i
    last = lengths.max().expand(B) if max_length_offset else lengths
    limit = last[:, None] - Sq + 1 + torch.arange(Sq, device=q.device)[None, :]
    allowed = torch.arange(S, device=q.device)[None, None, :] < limit[:, :, None]
    allowed = allowed & (torch.arange(S, device=q.device)[None, None, :] < lengths[:, None, None])
    return dense_core(q, k_cache, v_cache, allowed[:, None], scale, softcap=softcap, kv_index=kv_index)
