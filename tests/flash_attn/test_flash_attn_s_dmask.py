"""S_dmask of dropout calls with return_attn_probs in FlashAttention's encoding: decoded the way
FlashAttention's tests decode it (key blocks of _get_block_size_n, each scaled by exp(running max
- lse); the sign is the dropout pattern), it gives the float64 softmax and the keep mask the
kernels used (regenerated from the call's seed), dense (GQA, causal Sq < Sk, ALiBi, window) and
varlen; None without dropout, as FlashAttention."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, require_device  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity.flash_attn as flash_attn
from gpuparity.flash_attn.flash_attn_interface import _get_block_size_n
from gpuparity.ops.dropout import attention_dropout_mask, draw_seed
from fa_reference import reference

require_device()
DEVICE = torch.device(TEST_DEVICE)


def scores_of(q, k, scale=None, causal=False, window=(-1, -1), alibi=None):
    """float64 (B, H, Sq, Sk) scores with -inf where masked (bottom-right, FlashAttention's)."""
    q, k = q.cpu().double(), k.cpu().double()
    heads, head_dim = q.shape[2], q.shape[3]
    k = k.repeat_interleave(heads // k.shape[2], dim=2)
    q_len, k_len = q.shape[1], k.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (head_dim ** -0.5 if scale is None else scale)
    i, j = torch.arange(q_len).view(-1, 1), torch.arange(k_len).view(1, -1)
    diagonal = i + k_len - q_len
    ok = torch.ones(q_len, k_len, dtype=torch.bool)
    left, right = window[0], (0 if causal else window[1])
    if left >= 0:
        ok &= j >= diagonal - left
    if right >= 0:
        ok &= j <= diagonal + right
    if alibi is not None:
        scores = scores - alibi.cpu().double().view(1, -1, 1, 1) * (diagonal - j).abs()
    return scores.masked_fill(~ok, float("-inf")), ok


def decode(s_dmask, scores, ok, block_n):
    """(probabilities, kept) from S_dmask as FlashAttention's tests read it: |S| of key block j
    times exp(m_j - lse), m_j the largest score in blocks j .. last; kept = S >= 0."""
    q_len, k_len = scores.shape[-2:]
    s = s_dmask[..., :q_len, :k_len].cpu().double()
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    pieces, maxima = s.abs().split(block_n, dim=-1), [b.amax(dim=-1) for b in scores.split(block_n, dim=-1)]
    running = torch.stack(maxima, dim=-1).flip(-1).cummax(dim=-1).values.flip(-1).unbind(-1)
    probs = torch.cat([piece * torch.exp(m.unsqueeze(-1) - lse) for piece, m in zip(pieces, running)], dim=-1)
    return probs.masked_fill(~ok, 0.0), (s >= 0) | ~ok


@pytest.mark.parametrize("flags", [dict(causal=True), dict(window_size=(20, 3), alibi=True), dict()])
def test_dense_s_dmask_decodes_to_the_softmax_and_the_kernels_dropout_mask(flags):
    gen = torch.Generator().manual_seed(0)
    batch, q_len, k_len, heads, kv_heads, head_dim, p = 2, 4, 70, 2, 1, 64, 0.3
    q = torch.randn(batch, q_len, heads, head_dim, generator=gen).to(DEVICE).requires_grad_()
    k, v = (torch.randn(batch, k_len, kv_heads, head_dim, generator=gen).to(DEVICE) for _ in range(2))
    slopes = torch.tensor([0.3, 0.05], device=DEVICE) if flags.get("alibi") else None
    window = tuple(flags.get("window_size", (-1, -1)))
    torch.manual_seed(5)
    seed = draw_seed(DEVICE)
    keep = attention_dropout_mask(batch, heads, q_len, k_len, p, seed, DEVICE).cpu()
    torch.manual_seed(5)
    with flash_attn.backends(attention="triton"):
        out, lse, s_dmask = flash_attn.flash_attn_func(q, k, v, dropout_p=p, causal=flags.get("causal", False),
                                                       window_size=window, alibi_slopes=slopes,
                                                       return_attn_probs=True)
    assert s_dmask.shape == (batch, heads, 128, 128) and s_dmask.dtype == q.dtype and not s_dmask.requires_grad
    block_n = _get_block_size_n(DEVICE, head_dim, True, flags.get("causal", False))
    assert block_n < k_len   # several key blocks: the running max matters
    q = q.detach()
    scores, ok = scores_of(q, k, causal=flags.get("causal", False), window=window, alibi=slopes)
    probs, kept = decode(s_dmask, scores, ok, block_n)
    torch.testing.assert_close(probs, torch.softmax(scores, dim=-1).nan_to_num(0.0), rtol=1e-4, atol=1e-6)
    assert torch.equal(kept, keep | ~ok) and not keep[:, :, ok].all()
    assert (s_dmask[..., q_len:, :] == 0).all() and (s_dmask[..., k_len:] == 0).all()
    # the output is the call's: the referee with the decoded mask
    want = reference(q.cpu().double(), k.cpu().double(), v.cpu().double(), causal=flags.get("causal", False),
                     window=window, alibi=slopes, keep=kept & ok, dropout_p=p)[0]
    torch.testing.assert_close(out.cpu().double(), want, rtol=1e-4, atol=1e-5)


def test_s_dmask_is_none_without_dropout_and_calls_keep_drawing_new_seeds():
    q = torch.randn(1, 3, 2, 16, device=DEVICE)
    with flash_attn.backends(attention="triton"):
        assert flash_attn.flash_attn_func(q, q, q, return_attn_probs=True)[2] is None
        torch.manual_seed(1)
        first = flash_attn.flash_attn_func(q, q, q, dropout_p=0.5, return_attn_probs=True)[2]
        second = flash_attn.flash_attn_func(q, q, q, dropout_p=0.5, return_attn_probs=True)[2]
    assert not torch.equal(first < 0, second < 0)   # the default generator advanced between calls


def test_varlen_s_dmask_per_sequence():
    gen = torch.Generator().manual_seed(1)
    q_lens, k_lens, heads, head_dim, p = [3, 6], [40, 5], 2, 64, 0.25
    q = torch.randn(sum(q_lens), heads, head_dim, generator=gen).to(DEVICE)
    k, v = (torch.randn(sum(k_lens), heads, head_dim, generator=gen).to(DEVICE) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0] + n).cumsum(0).to(DEVICE, torch.int32) for n in (q_lens, k_lens))
    torch.manual_seed(3)
    seed = draw_seed(DEVICE)
    keep = attention_dropout_mask(2, heads, max(q_lens), max(k_lens), p, seed, DEVICE).cpu()
    torch.manual_seed(3)
    with flash_attn.backends(attention="triton"):
        out, lse, s_dmask = flash_attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), dropout_p=p,
                                                              causal=True, return_attn_probs=True)
    assert s_dmask.shape == (2, heads, 128, 128)
    block_n = _get_block_size_n(DEVICE, head_dim, True, True)
    for b in range(2):
        rows_q = slice(int(cu_q[b]), int(cu_q[b + 1]))
        rows_k = slice(int(cu_k[b]), int(cu_k[b + 1]))
        scores, ok = scores_of(q[rows_q][None], k[rows_k][None], causal=True)
        probs, kept = decode(s_dmask[b:b + 1], scores, ok, block_n)
        torch.testing.assert_close(probs, torch.softmax(scores, dim=-1).nan_to_num(0.0), rtol=1e-4, atol=1e-6)
        assert torch.equal(kept[0], keep[b, :, :q_lens[b], :k_lens[b]] | ~ok)
        assert (s_dmask[b, :, q_lens[b]:] == 0).all()
