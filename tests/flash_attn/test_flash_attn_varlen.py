"""gpuparity.flash_attn's varlen functions against the float64 referee on the padded batch,
forward and backward: bottom-right causal/window per sequence (Sq > Sk and Sq < Sk, an empty
sequence), ALiBi with masks and GQA (the padded composition), the (nheads, total_q) log-sum-exp,
dropout with the dense kernels' Philox mask (regenerated), paged KV through a shuffled block
table (forward, and gradients into the pool's pages), the packed variants and bert_padding's helpers."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, require_device, size  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity.flash_attn as flash_attn
from gpuparity.flash_attn import _compose as C
from gpuparity.flash_attn.bert_padding import index_first_axis, pad_input, unpad_input
from gpuparity.ops.dropout import attention_dropout_mask, draw_seed
from fa_reference import check, grads, reference

require_device()
DEVICE = torch.device(TEST_DEVICE)
# Sq < Sk, Sq > Sk, an empty query sequence, Sq = Sk (longer on a GPU run)
Q_LENS, K_LENS = [size(3, 113), size(7, 799), 0, size(5, 256)], [size(6, 203), size(2, 3), 4, size(5, 256)]
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def cumulative(lengths):
    return torch.tensor([0] + lengths).cumsum(0).to(DEVICE, torch.int32)


def packed_inputs(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(Q_LENS), HEADS, HEAD_DIM, generator=gen)
    k, v = (torch.randn(sum(K_LENS), KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    grad = torch.randn(q.shape, generator=gen)
    return [t.to(DEVICE, dtype) for t in (q, k, v)], grad.to(DEVICE, dtype)


def rows(lengths, width):
    return torch.cat([b * width + torch.arange(n) for b, n in enumerate(lengths)])


def padded_reference(q, k, v, dtype=torch.float64, **kwargs):
    """The referee on the padded batch, its rows packed back: (out (total_q, H, D), lse (H, total_q), empty)."""
    width_q, width_k, batch = max(Q_LENS), max(K_LENS), len(Q_LENS)
    rq, rk = rows(Q_LENS, width_q).to(q.device), rows(K_LENS, width_k).to(q.device)
    qp, kp, vp = (t.new_zeros((batch * w,) + tuple(t.shape[1:])).index_put((r,), t).view(batch, w, *t.shape[1:])
                  for t, r, w in ((q, rq, width_q), (k, rk, width_k), (v, rk, width_k)))
    out, lse, empty = reference(qp, kp, vp, q_lens=torch.tensor(Q_LENS), k_lens=torch.tensor(K_LENS), dtype=dtype,
                                **kwargs)
    return (out.reshape(batch * width_q, *out.shape[2:])[rq],
            lse.permute(1, 0, 2).reshape(q.shape[1], -1)[:, rq], empty.reshape(-1)[rq])


def check_varlen(qkv, grad, backends=None, **kwargs):
    cu_q, cu_k = cumulative(Q_LENS), cumulative(K_LENS)
    ref_kwargs = dict(causal=kwargs.get("causal", False), window=tuple(kwargs.get("window_size", (-1, -1))),
                      alibi=kwargs.get("alibi_slopes"), softcap=kwargs.get("softcap", 0.0))
    with flash_attn.backends(**(backends or dict(attention="composition", attention_varlen="composition"))):
        mine = grads(lambda q, k, v: flash_attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(Q_LENS), max(K_LENS),
                                                                        **kwargs), qkv, grad)
    ref = grads(lambda q, k, v: padded_reference(q, k, v, **ref_kwargs)[0], [t.cpu().double() for t in qkv], grad.cpu())
    base = grads(lambda q, k, v: padded_reference(q, k, v, dtype=q.dtype, **ref_kwargs)[0], qkv, grad)
    empty = padded_reference(*[t.cpu().double() for t in qkv], **ref_kwargs)[2]
    check(mine, ref, base, qkv[0].dtype, must_be_zero=empty.view(-1, 1, 1).expand(mine[0].shape))
    return empty


@pytest.mark.parametrize("flags", [dict(causal=True), dict(window_size=(2, 1)), dict(causal=True, softcap=3.0)])
def test_varlen_bottom_right_per_sequence(flags):
    qkv, grad = packed_inputs()
    empty = check_varlen(qkv, grad, **flags)
    if flags.get("causal"):
        assert empty.any()   # the Sq > Sk sequence has rows above its diagonal


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("flags", [dict(), dict(causal=True), dict(window_size=(3, 0))])
def test_varlen_alibi_with_masks_and_gqa(per_batch, flags):
    qkv, grad = packed_inputs(seed=1)
    shape = (len(Q_LENS), HEADS) if per_batch else (HEADS,)
    slopes = (torch.rand(shape, generator=torch.Generator().manual_seed(4)) * 0.5 + 0.05).to(DEVICE)
    check_varlen(qkv, grad, alibi_slopes=slopes, **flags)


def test_varlen_alibi_on_the_triton_kernel():
    qkv, grad = packed_inputs(seed=2)
    check_varlen(qkv, grad, backends=dict(attention="triton"), causal=True,
                 alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE))


def _not_composed(*args, **kwargs):
    raise AssertionError("the varlen ALiBi call was padded or given a bias: it did not run in the varlen kernels")


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("flags", [dict(causal=True), dict(window_size=(3, 0), softcap=3.0), dict()])
def test_varlen_alibi_runs_inside_the_varlen_kernels(per_batch, flags, monkeypatch):
    """backend "triton" for attention_varlen: ALiBi per sequence inside the varlen kernels, forward and
    backward; nothing is padded and no bias is built (both composers raise here)."""
    monkeypatch.setattr(C, "alibi_bias", _not_composed)
    monkeypatch.setattr(C, "pad", _not_composed)
    qkv, grad = packed_inputs(seed=5)
    shape = (len(Q_LENS), HEADS) if per_batch else (HEADS,)
    slopes = (torch.rand(shape, generator=torch.Generator().manual_seed(6)) * 0.5 + 0.05).to(DEVICE)
    check_varlen(qkv, grad, backends=dict(attention_varlen="triton"), alibi_slopes=slopes, **flags)


@pytest.mark.parametrize("alibi, varlen_backend", [(False, "composition"), (True, "composition"), (True, "triton")])
def test_varlen_lse(alibi, varlen_backend, monkeypatch):
    """The padded composition's log-sum-exp; with ALiBi on the varlen kernels, their own (nothing padded)."""
    if varlen_backend == "triton":
        monkeypatch.setattr(C, "alibi_bias", _not_composed)
        monkeypatch.setattr(C, "pad", _not_composed)
    qkv, _ = packed_inputs(seed=3)
    slopes = torch.full((HEADS,), 0.2, device=DEVICE) if alibi else None
    with flash_attn.backends(attention="composition", attention_varlen=varlen_backend):
        out, lse, s_dmask = flash_attn.flash_attn_varlen_func(*qkv, cumulative(Q_LENS), cumulative(K_LENS), max(Q_LENS),
                                                              max(K_LENS), causal=True, alibi_slopes=slopes,
                                                              return_attn_probs=True)
    _, want, empty = padded_reference(*[t.cpu().double() for t in qkv], causal=True, alibi=slopes)
    assert s_dmask is None and lse.shape == (HEADS, sum(Q_LENS)) and lse.dtype == torch.float32
    assert torch.isposinf(lse.cpu()[:, empty]).all() and empty.any()
    torch.testing.assert_close(lse.cpu().double()[:, ~empty], want[:, ~empty], rtol=1e-5, atol=1e-5)


def test_varlen_dropout_with_alibi_uses_the_dense_philox_mask_forward_and_backward():
    """The padded batch's mask is attention_dropout_mask(B, H, max_seqlen_q, max_seqlen_k, p, seed)
    with the seed torch's generator gives: the referee with that mask equals the call, gradients too."""
    qkv, grad = packed_inputs(seed=4)
    p = 0.3
    torch.manual_seed(11)
    seed = draw_seed(DEVICE)
    keep = attention_dropout_mask(len(Q_LENS), HEADS, max(Q_LENS), max(K_LENS), p, seed, DEVICE).cpu()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    torch.manual_seed(11)
    with flash_attn.backends(attention="triton"):
        mine = grads(lambda q, k, v: flash_attn.flash_attn_varlen_func(q, k, v, cumulative(Q_LENS), cumulative(K_LENS),
                                                                        max(Q_LENS), max(K_LENS), dropout_p=p,
                                                                        causal=True, alibi_slopes=slopes), qkv, grad)
    flags = dict(causal=True, keep=keep, dropout_p=p, alibi=slopes)
    ref = grads(lambda q, k, v: padded_reference(q, k, v, **flags)[0], [t.cpu().double() for t in qkv], grad.cpu())
    base = grads(lambda q, k, v: padded_reference(q, k, v, dtype=q.dtype, **flags)[0], qkv, grad)
    check(mine, ref, base, qkv[0].dtype)
    assert not keep.all()


def paged(k, v, page=3, seed=0):
    """k, v packed (total_k, Hkv, D) scattered onto shuffled pages of a pool with spare pages."""
    blocks = [-(-n // page) for n in K_LENS]
    width = max(blocks)
    pool_size = sum(blocks) + 5
    order = torch.randperm(pool_size, generator=torch.Generator().manual_seed(seed))
    table = torch.full((len(K_LENS), width), -1, dtype=torch.int32)   # unused entries: -1, never read
    k_pool = torch.randn(pool_size, page, *k.shape[1:], generator=torch.Generator().manual_seed(9)).to(k)
    v_pool = torch.randn(pool_size, page, *k.shape[1:], generator=torch.Generator().manual_seed(10)).to(k)
    used, start = 0, 0
    for b, n in enumerate(K_LENS):
        for j in range(blocks[b]):
            table[b, j] = order[used]
            piece = slice(start + j * page, start + min(n, (j + 1) * page))
            count = piece.stop - piece.start
            k_pool[order[used], :count], v_pool[order[used], :count] = k[piece], v[piece]
            used += 1
        start += n
    return k_pool, v_pool, table.to(DEVICE)


@pytest.mark.parametrize("alibi", [False, True])
def test_varlen_paged_kv_matches_contiguous(alibi):
    qkv, _ = packed_inputs(seed=5)
    k_pool, v_pool, table = paged(qkv[1], qkv[2])
    kwargs = dict(causal=True, alibi_slopes=torch.full((HEADS,), 0.3, device=DEVICE) if alibi else None)
    args = (cumulative(Q_LENS), cumulative(K_LENS), max(Q_LENS), max(K_LENS))
    with flash_attn.backends(attention="composition", attention_varlen="composition"), torch.no_grad():
        got = flash_attn.flash_attn_varlen_func(qkv[0], k_pool, v_pool, *args, block_table=table, **kwargs)
        want = flash_attn.flash_attn_varlen_func(*qkv, *args, **kwargs)
    torch.testing.assert_close(got, want)
    ref = padded_reference(*[t.cpu().double() for t in qkv], causal=True, alibi=kwargs["alibi_slopes"])[0]
    torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-5, atol=1e-5)


def test_varlen_paged_kv_errors():
    qkv, _ = packed_inputs(seed=6)
    k_pool, v_pool, table = paged(qkv[1], qkv[2])
    args = (cumulative(Q_LENS), cumulative(K_LENS), max(Q_LENS), max(K_LENS))
    bad = table.clone()
    bad[0, 0] = k_pool.shape[0]
    with pytest.raises(ValueError, match=r"block_table: entries in use must be page indices in \[0, "):
        flash_attn.flash_attn_varlen_func(qkv[0], k_pool, v_pool, *args, block_table=bad)
    with pytest.raises(RuntimeError, match="block_table: 1 pages of 3 tokens"):
        flash_attn.flash_attn_varlen_func(qkv[0], k_pool, v_pool, *args, block_table=table[:, :1].contiguous())


def test_varlen_paged_kv_gradients_reach_the_pool_pages():
    """block_table with requires_grad inputs: out and the gradients of q and of the paged pools
    against the referee on the contiguous keys, the pool's gradient scattered back through the
    table (zero on the spare pages no sequence reads)."""
    qkv, grad = packed_inputs(seed=7)
    k_pool, v_pool, table = paged(qkv[1], qkv[2])
    args = (cumulative(Q_LENS), cumulative(K_LENS), max(Q_LENS), max(K_LENS))
    k_lens = torch.tensor(K_LENS)
    item = torch.repeat_interleave(torch.arange(len(K_LENS)), k_lens)
    position = torch.arange(int(k_lens.sum())) - torch.cumsum(k_lens, 0).sub(k_lens)[item]
    pages, slots = table.cpu().long()[item, position // k_pool.shape[1]], position % k_pool.shape[1]

    def through_pages(q, kp, vp, dtype):
        return padded_reference(q, kp[pages, slots], vp[pages, slots], dtype=dtype, causal=True)[0]

    with flash_attn.backends(attention="composition", attention_varlen="composition"):
        mine = grads(lambda q, kp, vp: flash_attn.flash_attn_varlen_func(q, kp, vp, *args, causal=True,
                                                                          block_table=table),
                     [qkv[0], k_pool, v_pool], grad)
    ref = grads(lambda q, kp, vp: through_pages(q, kp, vp, torch.float64),
                [t.cpu().double() for t in (qkv[0], k_pool, v_pool)], grad.cpu())
    base = grads(lambda q, kp, vp: through_pages(q, kp, vp, q.dtype), [t.cpu() for t in (qkv[0], k_pool, v_pool)],
                 grad.cpu())
    check(mine, ref, base, qkv[0].dtype, names=("out", "dq", "dk_pool", "dv_pool"))
    spare = torch.ones(k_pool.shape[0], dtype=torch.bool)
    spare[pages] = False
    assert spare.any() and not mine[2][spare.to(DEVICE)].any() and mine[2][~spare.to(DEVICE)].abs().sum() > 0


def test_varlen_packed_variants():
    qkv, grad = packed_inputs(seed=7)
    lens = [4, 0, 6]
    cu = torch.tensor([0] + lens).cumsum(0).to(DEVICE, torch.int32)
    x = torch.randn(sum(lens), 3, HEADS, HEAD_DIM, device=DEVICE)
    with flash_attn.backends(attention_varlen="composition"):
        whole = flash_attn.flash_attn_varlen_qkvpacked_func(x, cu, max(lens), causal=True)
        kv = flash_attn.flash_attn_varlen_kvpacked_func(x[:, 0], x[:, 1:], cu, cu, max(lens), max(lens), causal=True)
        want = flash_attn.flash_attn_varlen_func(*x.unbind(1), cu, cu, max(lens), max(lens), causal=True)
    torch.testing.assert_close(whole, want)
    torch.testing.assert_close(kv, want)


def test_bert_padding_round_trip_and_varlen_equals_dense_with_padding():
    """unpad_input -> varlen -> pad_input equals the dense call on each sequence alone."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(3, 6, HEADS, HEAD_DIM, generator=gen).to(DEVICE).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6, [1, 1, 0, 0, 0, 0]], dtype=torch.bool, device=DEVICE)
    packed, indices, cu, max_len, used = unpad_input(x, mask)
    assert cu.tolist() == [0, 3, 9, 11] and max_len == 6 and used.tolist() == [3, 6, 2] and cu.dtype == torch.int32
    back = pad_input(packed, indices, 3, 6)
    torch.testing.assert_close(back, x * mask.view(3, 6, 1, 1))
    back.sum().backward()
    torch.testing.assert_close(x.grad, mask.view(3, 6, 1, 1).expand_as(x).float())
    torch.testing.assert_close(index_first_axis(x.detach().reshape(18, HEADS, HEAD_DIM), indices), packed.detach())
    with flash_attn.backends(attention="composition", attention_varlen="composition"):
        out = pad_input(flash_attn.flash_attn_varlen_func(packed, packed, packed, cu, cu, max_len, max_len, causal=True),
                        indices, 3, 6)
        for b, n in enumerate(used.tolist()):
            alone = x[b:b + 1, :n]
            torch.testing.assert_close(out[b, :n], flash_attn.flash_attn_func(alone, alone, alone, causal=True)[0])


@pytest.mark.parametrize("flags", [dict(causal=True), dict(window=(2, 1), softcap=2.0)])
def test_gpuparity_attention_varlen_return_lse(flags):
    """gpuparity.attention_varlen(return_lse=True): (out, lse (H, total_q)), -inf where a row sees no key."""
    import gpuparity
    qkv, _ = packed_inputs(seed=9)
    cu_q, cu_k = cumulative(Q_LENS), cumulative(K_LENS)
    out, lse = gpuparity.attention_varlen(*qkv, cu_q, cu_k, max(Q_LENS), max(K_LENS), backend="composition",
                                          return_lse=True, **flags)
    torch.testing.assert_close(out, gpuparity.attention_varlen(*qkv, cu_q, cu_k, max(Q_LENS), max(K_LENS),
                                                               backend="composition", **flags))
    ref_flags = dict(causal=flags.get("causal", False), window=flags.get("window", (-1, -1)),
                     softcap=flags.get("softcap", 0.0))
    _, want, empty = padded_reference(*[t.cpu().double() for t in qkv], **ref_flags)
    assert lse.shape == (HEADS, sum(Q_LENS)) and torch.isneginf(lse.cpu()[:, empty]).all()
    torch.testing.assert_close(lse.cpu().double()[:, ~empty], want[:, ~empty], rtol=1e-5, atol=1e-5)
