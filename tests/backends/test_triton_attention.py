"""The fused Triton attention kernels against the float64 referee: every mask kind, dtypes,
odd head dims, GQA, Sq != Sk, causal with padding, fully masked rows, strided inputs, forward
and backward. On a CPU-only machine they run under TRITON_INTERPRET=1 on small shapes; with
GPUPARITY_TEST_DEVICE=cuda they run compiled on the GPU at realistic sizes."""
from __future__ import annotations

import math

import pytest
import torch
from device_env import ON_GPU, TEST_DEVICE as DEVICE, require_device, size

pytest.importorskip("triton")

from gpuparity import reference  # noqa: E402
from gpuparity.backends import triton_attention  # noqa: E402
from gpuparity.contracts import attention as attention_contract  # noqa: E402
from gpuparity.backends.triton_attention import tiles  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402

require_device()
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


def make_inputs(batch, heads, kv_heads, q_len, k_len, head_dim, dtype, *, seed=0, logit_scale=1.0, layout="bhsd"):
    gen = torch.Generator().manual_seed(seed)

    def rand(h, s):
        if layout == "bshd":  # a (B, S, H, D) tensor viewed as (B, H, S, D): strided, not copied
            t = torch.randn(batch, s, h, head_dim, generator=gen).to(DEVICE, dtype).transpose(1, 2)
        else:
            t = torch.randn(batch, h, s, head_dim, generator=gen).to(DEVICE, dtype)
        return t

    q = rand(heads, q_len) * logit_scale
    k = rand(kv_heads, k_len)
    v = rand(kv_heads, k_len)
    return [t.detach().requires_grad_() for t in (q, k, v)]


def padding_mask(batch, k_len, lengths):
    mask = torch.ones(batch, k_len, dtype=torch.bool)
    for b, length in enumerate(lengths):
        mask[b, :length] = False
    return mask.to(DEVICE)


def check(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None, seed=0,
          backward=True):
    """Run triton, the same-dtype baseline and the float64 reference; assert under the policy."""
    dtype = q.dtype
    out = triton_attention.triton_attention(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                            is_causal=is_causal, scale=scale)
    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    gen = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(out.shape, generator=gen).to(DEVICE, dtype)

    base_inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base_out = attention_contract.composition(*base_inputs, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, scale=scale)
    ref_inputs = [t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v)]
    ref_mask = attn_mask
    if attn_mask is not None:
        ref_mask = attn_mask.to("cpu") if attn_mask.dtype == torch.bool else attn_mask.to("cpu", torch.float64)
    ref_kpm = key_padding_mask.to("cpu") if key_padding_mask is not None else None
    ref_out = reference.attention(*ref_inputs, attn_mask=ref_mask, key_padding_mask=ref_kpm,
                                  is_causal=is_causal, scale=scale)

    batch, heads, q_len, _ = q.shape
    masks = dict(attn_mask=ref_mask, key_padding_mask=ref_kpm, is_causal=is_causal)
    empty = reference.empty_query_rows(q_len, k.shape[2], batch, heads, **masks)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        # a float mask's -inf entries mask too
        allowed = reference.attention_allowed(q_len, k.shape[2], batch, **masks)
        empty = (~allowed.any(-1, keepdim=True)).expand(batch, heads, q_len, 1)
    results = [judge("out", out, ref_out, base_out, dtype, valid=~empty, must_be_zero=empty)]
    assert torch.isfinite(out).all(), "non-finite output"
    if backward:
        grads = torch.autograd.grad(out, (q, k, v), dout)
        base_grads = torch.autograd.grad(base_out, base_inputs, dout)
        ref_grads = torch.autograd.grad(ref_out, ref_inputs, dout.to("cpu", torch.float64))
        results.append(judge("dq", grads[0], ref_grads[0], base_grads[0], dtype, must_be_zero=empty))
        unused = None
        if key_padding_mask is not None:
            unused = ref_kpm.view(batch, 1, -1, 1)
        results.append(judge("dk", grads[1], ref_grads[1], base_grads[1], dtype, must_be_zero=unused))
        results.append(judge("dv", grads[2], ref_grads[2], base_grads[2], dtype, must_be_zero=unused))
    failed = [r.reason for r in results if not r.passed]
    assert not failed, "\n".join(failed)
    return out


# --------------------------------------------------------------------------- dtypes, head dims, shapes
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes_key_padding(dtype):
    batch, k_len = 3, size(50, 1000)
    q, k, v = make_inputs(batch, 2, 2, size(37, 777), k_len, 64, dtype, seed=1)
    check(q, k, v, key_padding_mask=padding_mask(batch, k_len, [k_len, k_len // 3, 1]))


@pytest.mark.parametrize("head_dim", [16, 40, 80, 96, 160, 256])
def test_head_dims_not_powers_of_two(head_dim):
    q, k, v = make_inputs(2, 2, 2, size(19, 300), size(23, 515), head_dim, torch.float16, seed=head_dim)
    check(q, k, v, is_causal=True)


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (1, 17), (17, 1), (33, 70), (70, 33)])
def test_sequence_lengths_differ(q_len, k_len):
    if ON_GPU:
        q_len, k_len = q_len * 61, k_len * 59
    q, k, v = make_inputs(2, 2, 2, q_len, k_len, 32, torch.float32, seed=q_len + k_len)
    check(q, k, v)
    check(q, k, v, is_causal=True)


@pytest.mark.skipif(not ON_GPU, reason="long sequences are for the GPU run (the interpreter is slow)")
@pytest.mark.parametrize("q_len,k_len,head_dim", [(4097, 4097, 64), (150, 8192, 128), (1000, 1, 32)])
def test_long_sequences_gpu(q_len, k_len, head_dim):
    q, k, v = make_inputs(1, 2, 1, q_len, k_len, head_dim, torch.bfloat16, seed=7)
    check(q, k, v, key_padding_mask=padding_mask(1, k_len, [k_len - k_len // 4]), is_causal=True)


# --------------------------------------------------------------------------- GQA, strides
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1)])
def test_gqa_and_mqa_without_repeating_kv(heads, kv_heads):
    batch, k_len = 2, size(45, 600)
    q, k, v = make_inputs(batch, heads, kv_heads, size(30, 500), k_len, 32, torch.bfloat16, seed=heads + kv_heads)
    check(q, k, v, key_padding_mask=padding_mask(batch, k_len, [k_len - 7, 20]), is_causal=True)


def test_strided_bshd_views_are_read_in_place():
    batch, k_len = 2, size(40, 700)
    q, k, v = make_inputs(batch, 3, 3, size(29, 650), k_len, 48, torch.float16, seed=3, layout="bshd")
    assert not q.is_contiguous()
    out = check(q, k, v, key_padding_mask=padding_mask(batch, k_len, [k_len, 9]))
    # the output keeps q's (B, S, H, D) memory layout: transposing back is free
    assert out.transpose(1, 2).is_contiguous()


def test_sliced_packed_qkv():
    """q, k, v as slices of one packed (B, S, 3, H, D) projection: non-dense strides."""
    batch, seq, heads, head_dim = 2, size(26, 333), 2, 32
    packed = torch.randn(batch, seq, 3, heads, head_dim).to(DEVICE, torch.float32)
    q, k, v = (packed[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3))
    check(q, k, v, is_causal=True)


# --------------------------------------------------------------------------- masks
def test_key_padding_with_causal_and_empty_rows():
    """Causal + left padding leaves the first query rows of item 1 with no key: exact zeros,
    zero gradients. Item 2 is all padding."""
    batch, seq = 3, size(40, 513)
    q, k, v = make_inputs(batch, 2, 2, seq, seq, 32, torch.float16, seed=11)
    kpm = torch.zeros(batch, seq, dtype=torch.bool)
    kpm[1, : seq // 3] = True      # leading padding: rows < seq/3 see nothing under causal
    kpm[2, :] = True
    check(q, k, v, key_padding_mask=kpm.to(DEVICE), is_causal=True)


@pytest.mark.parametrize("mask_shape", ["q,k", "b,1,1,k", "1,h,q,1", "b,h,q,k", "h,1,k"])
def test_bool_attn_mask_any_broadcastable_shape(mask_shape):
    batch, heads, q_len, k_len = 2, 2, size(21, 300), size(37, 400)
    dims = {"b": batch, "h": heads, "q": q_len, "k": k_len, "1": 1}
    shape = [dims[c] for c in mask_shape.split(",")]
    gen = torch.Generator().manual_seed(len(mask_shape))
    mask = (torch.rand(shape, generator=gen) > 0.3).to(DEVICE)
    q, k, v = make_inputs(batch, heads, heads, q_len, k_len, 32, torch.float32, seed=5)
    check(q, k, v, attn_mask=mask)


def test_bool_mask_broadcast_is_not_expanded_in_memory():
    """A (1, 1, Sq, Sk) mask expanded to (B, H, Sq, Sk) has zero strides: read in place."""
    batch, heads, seq = 2, 2, size(24, 256)
    base = torch.ones(seq, seq, dtype=torch.bool).tril().to(DEVICE)
    mask = base.expand(batch, heads, seq, seq)
    assert mask.stride()[:2] == (0, 0)
    q, k, v = make_inputs(batch, heads, heads, seq, seq, 16, torch.float32, seed=6)
    check(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_additive_mask_with_inf_rows_and_padding(dtype):
    batch, heads, q_len, k_len = 2, 2, size(20, 400), size(30, 500)
    gen = torch.Generator().manual_seed(3)
    bias = torch.randn(batch, 1, q_len, k_len, generator=gen) * 2
    bias[:, :, ::4, ::2] = float("-inf")
    bias[0, 0, 3, :] = float("-inf")           # a fully masked row through the float mask
    q, k, v = make_inputs(batch, heads, heads, q_len, k_len, 40, dtype, seed=8)
    check(q, k, v, attn_mask=bias.to(DEVICE, dtype), key_padding_mask=padding_mask(batch, k_len, [k_len, 13]))


def test_every_mask_at_once_with_gqa_and_scale():
    batch, heads, kv_heads, q_len, k_len = 2, 4, 2, size(33, 700), size(41, 900)
    gen = torch.Generator().manual_seed(4)
    allowed = (torch.rand(1, heads, q_len, k_len, generator=gen) > 0.2).to(DEVICE)
    q, k, v = make_inputs(batch, heads, kv_heads, q_len, k_len, 80, torch.float16, seed=9)
    check(q, k, v, attn_mask=allowed, key_padding_mask=padding_mask(batch, k_len, [k_len - 5, 17]),
          is_causal=True, scale=0.3)


def test_large_logits_and_one_valid_key():
    batch, seq = 2, size(24, 300)
    q, k, v = make_inputs(batch, 2, 2, seq, seq, 32, torch.bfloat16, seed=12, logit_scale=30.0)
    check(q, k, v, key_padding_mask=padding_mask(batch, seq, [1, seq]))


def test_per_batch_lengths_equal_key_padding():
    batch, seq = 3, size(45, 600)
    q, k, v = make_inputs(batch, 2, 2, seq, seq, 32, torch.float32, seed=13)
    lengths = torch.tensor([seq, seq // 2, 0])
    by_lengths = triton_attention.triton_attention(q, k, v, key_lengths=lengths.to(DEVICE), is_causal=True)
    by_mask = triton_attention.triton_attention(
        q, k, v, key_padding_mask=padding_mask(batch, seq, lengths.tolist()), is_causal=True)
    # the same answer (compiled variants may round differently: not bitwise)
    torch.testing.assert_close(by_lengths, by_mask)
    assert (by_lengths[2] == 0).all() and (by_mask[2] == 0).all()


def test_padding_with_holes_and_leading_padding():
    """Key padding that is not a suffix (holes, left padding) is read key by key."""
    batch, seq = 3, size(50, 700)
    q, k, v = make_inputs(batch, 2, 2, seq, seq, 32, torch.bfloat16, seed=21)
    kpm = torch.zeros(batch, seq, dtype=torch.bool)
    kpm[0, ::3] = True                  # holes
    kpm[1, : seq // 2] = True           # left padding
    kpm[2, seq // 4: seq // 2] = True   # a gap in the middle
    check(q, k, v, key_padding_mask=kpm.to(DEVICE))
    check(q, k, v, key_padding_mask=kpm.to(DEVICE), is_causal=True)


@pytest.mark.parametrize("head_dim", [32, 128])    # the forward's two loop forms (kernels.py: D >= 128)
@pytest.mark.parametrize("padding", ["suffix", "holes"])
def test_padded_keys_huge_scores_change_nothing(padding, head_dim):
    """dq and (at head dims <= 64) the forward read the mask only when it has holes, behind a
    branch: keys whose scores overflow exp2 where padded leave every output and gradient as clean
    padded keys do (kept rows bit for bit), and the padded keys' dk and dv are exactly zero. (fp32:
    the pointer / one-launch backward; the descriptor dk/dv has its own test below.)"""
    batch, seq = 2, size(80, 1000)
    q, k, v = make_inputs(batch, 2, 2, seq, seq, head_dim, torch.float32, seed=5)
    kpm = torch.zeros(batch, seq, dtype=torch.bool)
    if padding == "suffix":
        kpm[0, seq - seq // 3:] = True
        kpm[1, seq // 2:] = True
    else:
        kpm[0, 1::3] = True
        kpm[1, seq // 4: seq // 2] = True
    kpm = kpm.to(DEVICE)
    huge = k.detach().clone()
    huge[kpm[:, None, :, None].expand_as(huge)] = 1e4     # scores ~1e4 * |q|: exp2 overflows
    results = []
    for keys in (k.detach(), huge):
        leaves = [t.detach().clone().requires_grad_() for t in (q, keys, v)]
        out = triton_attention.triton_attention(*leaves, key_padding_mask=kpm, is_causal=False)
        out.backward(torch.ones_like(out))
        results.append((out, *(t.grad for t in leaves)))
    kept = ~kpm[:, None, :, None]
    for planted in results[1]:
        assert torch.isfinite(planted).all()
    for i in (0, 1):     # out, dq: every row
        assert torch.equal(results[0][i], results[1][i])
    for i in (2, 3):     # dk, dv: kept rows equal, padded rows exactly zero
        assert torch.equal(results[0][i] * kept, results[1][i] * kept)
        assert (results[1][i].masked_select(~kept.expand_as(results[1][i])) == 0).all()


def test_prepared_launches_follow_the_gradient_strides():
    """Launches are prepared once per call signature and reused. The backward's signature
    includes dout's strides: the same values given contiguous and as a (B, S, H, D) view must
    give the same gradients, bit for bit, in either order."""
    q, k, v = make_inputs(2, 2, 2, 33, 40, 32, torch.float32, seed=5)
    kpm = padding_mask(2, 40, [40, 17])
    gen = torch.Generator().manual_seed(9)
    dout_bshd = torch.randn(2, 33, 2, 32, generator=gen).to(DEVICE)
    strided = dout_bshd.transpose(1, 2)
    contiguous = strided.contiguous()
    grads = {}
    for name, dout in (("contiguous", contiguous), ("strided", strided), ("contiguous again", contiguous)):
        out = triton_attention.triton_attention(q, k, v, key_padding_mask=kpm)
        grads[name] = torch.autograd.grad(out, (q, k, v), dout)
    for name in ("strided", "contiguous again"):
        for got, want in zip(grads[name], grads["contiguous"]):
            assert torch.equal(got, want), name


def test_the_backward_reuses_the_forwards_plan(monkeypatch):
    """Host time: a forward+backward step derives its call signature once (the forward's); the
    backward finds its launches through the forward's plan by dout's strides, and takes its
    delta buffer from the forward's lse allocation; nothing else is allocated but the outputs."""
    from gpuparity.backends.triton_attention import launch
    q, k, v = make_inputs(2, 2, 1, 20, 24, 16, torch.float32, seed=3)
    kpm = padding_mask(2, 24, [24, 9])
    dout = torch.randn(2, 2, 20, 16, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    first = torch.autograd.grad(triton_attention.triton_attention(q, k, v, key_padding_mask=kpm), (q, k, v), dout)
    keys, empties, likes = [], [], []
    real_key, real_empty, real_like = launch._plan_key, torch.empty, torch.empty_like
    monkeypatch.setattr(launch, "_plan_key", lambda *a, **kw: keys.append(1) or real_key(*a, **kw))
    monkeypatch.setattr(launch.torch, "empty", lambda *a, **kw: empties.append(a) or real_empty(*a, **kw))
    monkeypatch.setattr(launch.torch, "empty_like", lambda *a, **kw: likes.append(a) or real_like(*a, **kw))
    again = torch.autograd.grad(triton_attention.triton_attention(q, k, v, key_padding_mask=kpm), (q, k, v), dout)
    assert len(keys) == 1
    # lse and delta together (the kernels scan the key padding themselves); the output and the
    # three gradients
    assert len(empties) == 1 and len(likes) == 4
    for got, want in zip(again, first):
        assert torch.equal(got, want)


@pytest.mark.parametrize("heads,kv_heads,layout", [
    (2, 2, "bhsd"), (4, 2, "bhsd"), (2, 2, "bshd"), (4, 2, "bshd"),
    (2, 2, "mixed"),    # q (B, S, H, D), k and v (B, H, S, D)
])
def test_the_eager_backward_gives_each_gradient_its_inputs_layout(heads, kv_heads, layout):
    """dq, dk, dv have q's, k's and v's layouts, each its own allocation, and equal the gradients
    of attention_backward called directly, bit for bit; a leaf's .grad accumulates."""
    from gpuparity.backends.triton_attention import launch
    q, k, v = make_inputs(2, heads, kv_heads, 20, 24, 16, torch.float32, seed=5,
                          layout="bhsd" if layout == "mixed" else layout)
    if layout == "mixed":
        q = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
        assert not q.is_contiguous()
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    kpm = padding_mask(2, 24, [24, 11])
    grads = torch.autograd.grad(triton_attention.triton_attention(q, k, v, key_padding_mask=kpm), (q, k, v), dout)
    assert len({g.untyped_storage().data_ptr() for g in grads}) == 3
    for grad, x in zip(grads, (q, k, v)):
        assert grad.shape == x.shape and grad.stride() == x.stride()
    masks = launch.prepare_masks(q, k, key_padding_mask=kpm)
    out, lse = launch.attention_forward(q.detach(), k.detach(), v.detach(), masks, False, 16 ** -0.5)
    apart = launch.attention_backward(dout, q.detach(), k.detach(), v.detach(), out, lse, masks, False, 16 ** -0.5)
    for got, want in zip(grads, apart):
        assert torch.equal(got, want)
    leaf = [t.detach().requires_grad_() for t in (q, k, v)]
    for _ in range(2):
        triton_attention.triton_attention(*leaf, key_padding_mask=kpm).backward(dout)
    for x, want in zip(leaf, grads):
        torch.testing.assert_close(x.grad, 2 * want)


def _descriptor_launches(monkeypatch):
    """Count the dk/dv launches that go through tensor descriptors."""
    from gpuparity.backends.triton_attention import launch
    calls = []
    real = launch._DescriptorLaunch.__call__

    def counted(self, q, *rest):
        calls.append(bool(q.data_ptr() & 15) is False)
        return real(self, q, *rest)
    monkeypatch.setattr(launch._DescriptorLaunch, "__call__", counted)
    return calls


def _assert_descriptors_change_no_bit(monkeypatch, q, k, v, dout, **kwargs):
    """The split backward's gradients with the pointer dk/dv kernel (GPUPARITY_ATTENTION_TMA=0) and
    through tensor descriptors (=1, launched once), equal bit for bit and finite."""
    from gpuparity.backends.triton_common import clear_plans
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "split")
    grads = {}
    for tma in ("0", "1"):
        monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", tma)
        clear_plans()
        calls = _descriptor_launches(monkeypatch)
        out = triton_attention.triton_attention(q, k, v, **kwargs)
        grads[tma] = torch.autograd.grad(out, (q, k, v), dout)
        assert calls == ([] if tma == "0" else [True])
    for with_tma, without in zip(grads["1"], grads["0"]):
        assert torch.isfinite(with_tma).all()
        assert torch.equal(with_tma, without)


@pytest.mark.parametrize("q_len,k_len", [("odd", "odd"), ("even", "odd"), ("short", "odd")])
@pytest.mark.parametrize("tma", ["0", "1"])
def test_causal_program_orders_change_no_bit(q_len, k_len, tma, monkeypatch):
    """Interleaved rows and the folded dk/dv grid (tiles.causal_order) run the same programs in
    another order: the forward and every gradient equal launch order's bit for bit, with an odd
    number of key blocks (one folded program takes the middle block alone), Sq != Sk (top-left
    causal), GQA, key padding with a hole, on both dk/dv forms; the default passes the float64
    referee."""
    from gpuparity.backends.triton_common import clear_plans
    block_n = tiles.tile_config("dkdv", torch.device(DEVICE), 64, torch.bfloat16, 96).block_n
    block_m = tiles.tile_config("fwd", torch.device(DEVICE), 64, torch.bfloat16, 96).block_m
    sizes = {"odd": 3 * block_n - 5, "even": 4 * block_m, "short": block_m + 3}
    q_len, k_len = sizes[q_len], sizes[k_len]
    q, k, v = make_inputs(2, 4, 2, q_len, k_len, 64, torch.bfloat16, seed=11)
    kpm = padding_mask(2, k_len, [k_len, k_len - block_n + 2])
    kpm[1, 2] = True   # a hole
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(12)).to(DEVICE, q.dtype)
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "split")
    monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", tma)
    results = {}
    try:
        for order in ("launch", "interleave", "fold"):
            monkeypatch.setenv("GPUPARITY_ATTENTION_ORDER", order)
            clear_plans()
            out = triton_attention.triton_attention(q, k, v, key_padding_mask=kpm, is_causal=True)
            results[order] = (out, *torch.autograd.grad(out, (q, k, v), dout))
        for order in ("interleave", "fold"):
            for got, want in zip(results[order], results["launch"]):
                assert torch.isfinite(got).all()
                assert torch.equal(got, want), order
        monkeypatch.delenv("GPUPARITY_ATTENTION_ORDER")
        clear_plans()
        check(q, k, v, key_padding_mask=kpm, is_causal=True)
    finally:
        clear_plans()


def test_causal_order_choices(monkeypatch):
    cpu, few = torch.device("cpu"), 256
    assert tiles.causal_order("dkdv", True, False, few, cpu) == tiles.ORDER_FOLD
    assert tiles.causal_order("dq", True, False, few, cpu) == tiles.ORDER_LAST_FIRST
    assert tiles.causal_order("fwd", False, False, few, cpu) == tiles.ORDER_LAUNCH     # no causality: as launched
    assert tiles.causal_order("dkdv", True, True, few, cpu) == tiles.ORDER_LAUNCH      # a window: as launched
    monkeypatch.setattr(tiles.triton_common, "sm_count", lambda device: 132)
    many = tiles.SMALL_GRID_PER_SM * 132 + 1
    assert tiles.causal_order("fwd", True, False, many, cpu) == tiles.ORDER_LAUNCH     # a large grid: as launched
    assert tiles.causal_order("fwd", True, False, many - 1, cpu) == tiles.ORDER_LAST_FIRST
    monkeypatch.setenv("GPUPARITY_ATTENTION_ORDER", "interleave")
    assert tiles.causal_order("dkdv", True, False, many, cpu) == tiles.ORDER_FIRST_FIRST
    assert tiles.causal_order("fwd", True, False, many, cpu) == tiles.ORDER_LAST_FIRST
    monkeypatch.setenv("GPUPARITY_ATTENTION_ORDER", "launch")
    assert tiles.causal_order("fwd", True, False, few, cpu) == tiles.ORDER_LAUNCH
    monkeypatch.setenv("GPUPARITY_ATTENTION_ORDER", "sideways")
    with pytest.raises(ValueError, match="GPUPARITY_ATTENTION_ORDER: expected one of"):
        tiles.causal_order("fwd", True, False, few, cpu)


@pytest.mark.parametrize("layout,heads,kv_heads", [("bhsd", 4, 2), ("bshd", 2, 2), ("bshd", 4, 1)])
def test_tensor_descriptor_dkdv_equals_the_pointer_kernel(layout, heads, kv_heads, monkeypatch):
    """The dk/dv kernel reading q and dout through tensor descriptors (Hopper's TMA; forced here with
    GPUPARITY_ATTENTION_TMA=1, which the interpreter runs too) gives the pointer kernel's bits, on
    both layouts, GQA, causal, key padding with holes; and passes the float64 referee."""
    from gpuparity.backends.triton_common import clear_plans
    block = tiles.tile_config("dkdv", torch.device(DEVICE), 64, torch.bfloat16, 96).block_m
    q_len = 3 * block
    q, k, v = make_inputs(2, heads, kv_heads, q_len, 80, 64, torch.bfloat16, seed=8, layout=layout)
    kpm = padding_mask(2, 80, [80, 50])
    kpm[1, 3] = True   # a hole
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE, q.dtype)
    _assert_descriptors_change_no_bit(monkeypatch, q, k, v, dout, key_padding_mask=kpm, is_causal=True)
    calls = _descriptor_launches(monkeypatch)
    check(q, k, v, key_padding_mask=kpm, is_causal=True)
    assert calls == [True]
    clear_plans()


@pytest.mark.parametrize("causal", [False, True])
def test_tensor_descriptor_dkdv_zeroes_padded_keys_rows_at_the_end(causal, monkeypatch):
    """The descriptor dk/dv does not mask padded keys' probabilities tile by tile: it skips blocks of
    padding alone and zeroes padded keys' rows of dk and dv at the end. Keys whose scores overflow
    exp2 where padded (leading padding, a wholly padded block, a late hole, an all-padding item, a
    suffix; GQA) leave everything finite: out and dq bit-equal the pointer kernel's on clean keys,
    kept rows of dk and dv too, padded rows exactly zero."""
    from gpuparity.backends.triton_common import clear_plans
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "split")
    cfg = tiles.tile_config("dkdv", torch.device(DEVICE), 64, torch.bfloat16, 96)
    q_len, k_len = 2 * cfg.block_m, 2 * cfg.block_n + 9
    q, k, v = make_inputs(3, 4, 2, q_len, k_len, 64, torch.bfloat16, seed=14)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(15)).to(DEVICE, q.dtype)
    kpm = torch.zeros(3, k_len, dtype=torch.bool)
    kpm[0, :3] = True                                  # leading padding
    kpm[0, cfg.block_n: 2 * cfg.block_n] = True        # a wholly padded block between kept keys
    kpm[0, -2] = True                                  # a late hole
    kpm[1, :] = True                                   # nothing kept
    kpm[2, k_len - 20:] = True                         # a suffix
    kpm = kpm.to(DEVICE)
    huge = k.detach().clone()
    huge[kpm[:, None, :, None].expand_as(huge)] = 1e4
    results = {}
    for tma, keys in (("0", k.detach()), ("1", huge)):
        monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", tma)
        clear_plans()
        calls = _descriptor_launches(monkeypatch)
        leaves = [t.detach().clone().requires_grad_() for t in (q, keys, v)]
        out = triton_attention.triton_attention(*leaves, key_padding_mask=kpm, is_causal=causal)
        results[tma] = (out, *torch.autograd.grad(out, leaves, dout))
        assert calls == ([] if tma == "0" else [True])
    kept = ~kpm[:, None, :, None]
    assert all(torch.isfinite(t).all() for t in results["1"])
    assert torch.equal(results["1"][0], results["0"][0]) and torch.equal(results["1"][1], results["0"][1])
    for clean, planted in zip(results["0"][2:], results["1"][2:]):
        assert torch.equal(planted * kept, clean * kept)
        assert (planted.masked_select(~kept.expand_as(planted)) == 0).all()
    clear_plans()


@pytest.mark.parametrize("feature", ["window_softcap", "bool_mask", "additive_mask", "key_lengths", "dropout",
                                     "q_bshd_dout_bhsd"])
def test_tensor_descriptor_dkdv_keeps_every_feature(feature, monkeypatch):
    """Every feature the dk/dv program has, through the descriptor loads: the pointer kernel's bits."""
    from gpuparity.backends.triton_common import clear_plans
    block = tiles.tile_config("dkdv", torch.device(DEVICE), 64, torch.bfloat16, 96).block_m
    q_len, k_len = 2 * block, 72
    layout = "bshd" if feature == "q_bshd_dout_bhsd" else "bhsd"
    q, k, v = make_inputs(2, 4, 2, q_len, k_len, 64, torch.bfloat16, seed=11, layout=layout)
    gen = torch.Generator().manual_seed(12)
    kwargs = {}
    if feature == "window_softcap":
        kwargs = dict(window=(20, 5), softcap=10.0, is_causal=True)
    elif feature == "bool_mask":
        kwargs = dict(attn_mask=(torch.rand(1, 4, q_len, k_len, generator=gen) > 0.3).to(DEVICE))
    elif feature == "additive_mask":
        kwargs = dict(attn_mask=torch.randn(q_len, k_len, generator=gen).to(DEVICE, torch.bfloat16))
    elif feature == "key_lengths":
        kwargs = dict(key_lengths=torch.tensor([k_len, 33]).to(DEVICE))
    elif feature == "dropout":
        kwargs = dict(dropout_p=0.2, seed=1234)
    dout = torch.randn(2, 4, q_len, 64, generator=gen).to(DEVICE, q.dtype)   # (B, H, S, D) whatever q's layout
    _assert_descriptors_change_no_bit(monkeypatch, q, k, v, dout, **kwargs)
    clear_plans()


def test_tensor_descriptors_only_where_every_tile_stays_in_its_head(monkeypatch):
    """A q_len that is not a multiple of the query step, a head dim that is not a power of two,
    fp32, a q or dout that does not start 16-byte aligned: the pointer kernel serves."""
    from gpuparity.backends.triton_common import clear_plans
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "split")
    monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", "1")
    cfg = tiles.tile_config("dkdv", torch.device(DEVICE), 64, torch.bfloat16, 96)
    assert tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 2 * cfg.block_m, 40, 64, cfg)
    assert not tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 2 * cfg.block_m + 1, 40, 64, cfg)
    assert not tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 2 * cfg.block_m, 40, 48, cfg)
    assert not tiles.tma_backward(torch.device(DEVICE), torch.float32, 2 * cfg.block_m, 40, 64, cfg)
    monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", "0")
    assert not tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 2 * cfg.block_m, 40, 64, cfg)
    monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", "auto")
    assert tiles.tma_backward(torch.device("cpu"), torch.bfloat16, 2 * cfg.block_m, 40, 64, cfg) is False
    # auto: Hopper-family GPUs, head dims from 64, long sequences (the descriptor launch's host time)
    monkeypatch.setattr(tiles, "family", lambda device: "nvidia_sm90")
    monkeypatch.setattr(tiles.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 1024, 1024, 128, cfg) is (1024 % cfg.block_m == 0)
    assert not tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 1024, 1024, 32, cfg)
    assert not tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 1024, 1024, 256, cfg)
    assert not tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 512, 512, 128, cfg)
    monkeypatch.setattr(tiles.torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert not tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 1024, 1024, 128, cfg)   # unmeasured
    monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", "yes")
    with pytest.raises(ValueError, match="GPUPARITY_ATTENTION_TMA"):
        tiles.tma_backward(torch.device(DEVICE), torch.bfloat16, 64, 64, 64, cfg)
    monkeypatch.setenv("GPUPARITY_ATTENTION_TMA", "1")
    # unaligned: q a view starting one element into its storage
    clear_plans()
    calls = _descriptor_launches(monkeypatch)
    base = torch.randn(2 * 2 * 2 * cfg.block_m * 64 + 1).to(DEVICE, torch.bfloat16)
    q = base[1:].view(2, 2, 2 * cfg.block_m, 64).detach().requires_grad_()
    k, v = (torch.randn(2, 2, 40, 64).to(DEVICE, torch.bfloat16).requires_grad_() for _ in range(2))
    out = triton_attention.triton_attention(q, k, v)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert calls == [False]    # called, and handed to the pointer kernel
    clear_plans()


@pytest.mark.parametrize("which", ["key_padding_mask", "attn_mask"])
def test_a_mask_changed_in_place_before_backward_raises(which):
    """The masks are saved for backward like q, k and v: refilling a mask buffer between forward
    and backward (e.g. for the next micro-batch) is an error, not silently wrong gradients."""
    q, k, v = make_inputs(2, 2, 2, 16, 16, 32, torch.float32, seed=6)
    mask = padding_mask(2, 16, [16, 9]) if which == "key_padding_mask" else \
        torch.ones(16, 16, dtype=torch.bool, device=DEVICE).tril()
    out = triton_attention.triton_attention(q, k, v, **{which: mask})
    mask.logical_not_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def test_float_mask_that_requires_grad_is_refused():
    q, k, v = make_inputs(1, 1, 1, 8, 8, 16, torch.float32)
    bias = torch.zeros(8, 8, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask.*requires grad"):
        triton_attention.triton_attention(q, k, v, attn_mask=bias)


# --------------------------------------------------------------------------- determinism, dropout
def test_backward_is_bitwise_deterministic():
    batch, heads, kv_heads, seq = 2, 4, 1, size(40, 1024)
    q, k, v = make_inputs(batch, heads, kv_heads, seq, seq, 64, torch.bfloat16, seed=14)
    kpm = padding_mask(batch, seq, [seq, seq // 2])
    dout = torch.randn(q.shape).to(DEVICE, q.dtype)
    runs = []
    for _ in range(2):
        out = triton_attention.triton_attention(q, k, v, key_padding_mask=kpm)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def _backward_forms_used():
    from gpuparity.backends.triton_attention import launch
    return {len(launches) for plan in launch._PLANS._plans.values() if hasattr(plan, "backward")
            for launches in plan.backward.values()}


@pytest.mark.parametrize("form", ["fused", "split"])
def test_both_backward_forms_against_the_reference(form, monkeypatch):
    """The one-launch backward (dk/dv computing delta itself) and the two-launch one (delta from
    the dq kernel) on hostile inputs: GQA, an odd head dim, Sq != Sk, key padding with holes,
    an additive mask with a -inf row, causal; then window + softcap; then dropout, where both
    forms must apply the same mask."""
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", form)
    triton_attention.clear_plans()
    q, k, v = make_inputs(2, 4, 2, 45, 70, 24, torch.float32, seed=21)
    kpm = padding_mask(2, 70, [70, 33])
    kpm[1, 5] = True   # a hole
    bias = torch.randn(45, 70, generator=torch.Generator().manual_seed(22)).to(DEVICE)
    bias[7] = float("-inf")
    check(q, k, v, attn_mask=bias, key_padding_mask=kpm, is_causal=True)
    assert _backward_forms_used() == {1 if form == "fused" else 2}
    out = triton_attention.triton_attention(q, k, v, key_padding_mask=kpm, window=(9, 3), softcap=4.0)
    ref_in = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ref = reference.attention(*ref_in, key_padding_mask=kpm.cpu(), window=(9, 3), softcap=4.0)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(23)).to(DEVICE)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), dout),
                         torch.autograd.grad(ref, ref_in, dout.cpu().double())):
        torch.testing.assert_close(got.cpu().double(), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("head_dim", [40, 128])
@pytest.mark.parametrize("padding", ["suffix", "holes"])
def test_both_dq_loop_forms_against_the_reference_and_each_other(padding, head_dim, monkeypatch):
    """dq with a key padding mask: one set of loops reading the mask behind a branch, or
    (tiles.split_kpm_dq) loops without reads for a suffix and loops at pipeline depth 1 for holes.
    Both against float64, with causal and GQA, and the two forms' gradients equal to each other
    (the same arithmetic in the same order)."""
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "split")
    seq = size(70, 600)
    q, k, v = make_inputs(2, 4, 2, seq, seq, head_dim, torch.bfloat16, seed=31)
    kpm = padding_mask(2, seq, [seq, seq // 2])
    if padding == "holes":
        kpm[0, 3::5] = True
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(32)).to(DEVICE, q.dtype)
    grads = {}
    for split in ("0", "1"):
        monkeypatch.setenv("GPUPARITY_ATTENTION_DQ_SPLIT", split)
        triton_attention.clear_plans()
        check(q, k, v, key_padding_mask=kpm, is_causal=True)
        out = triton_attention.triton_attention(q, k, v, key_padding_mask=kpm, is_causal=True)
        grads[split] = torch.autograd.grad(out, (q, k, v), dout)
    for one_loop, split_loops in zip(grads["0"], grads["1"]):
        torch.testing.assert_close(one_loop, split_loops, rtol=0, atol=0)
    monkeypatch.setenv("GPUPARITY_ATTENTION_DQ_SPLIT", "sometimes")
    with pytest.raises(ValueError, match="GPUPARITY_ATTENTION_DQ_SPLIT: expected one of"):
        tiles.split_kpm_dq(q.device, 40)


def test_dq_split_rule():
    assert tiles.split_kpm_dq_default("nvidia_sm90", 128) and tiles.split_kpm_dq_default("nvidia_sm90", 96)
    assert not tiles.split_kpm_dq_default("nvidia_sm90", 64) and not tiles.split_kpm_dq_default("nvidia_sm90", 256)
    for fam in ("nvidia", "amd_cdna", "amd_rdna", "interpreter"):
        assert not tiles.split_kpm_dq_default(fam, 128)


def test_the_two_backward_forms_apply_the_same_dropout(monkeypatch):
    q, k, v = make_inputs(1, 2, 1, 30, 30, 16, torch.float32, seed=24)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(25)).to(DEVICE)
    grads = {}
    for form in ("fused", "split"):
        monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", form)
        triton_attention.clear_plans()
        out = triton_attention.triton_attention(q, k, v, dropout_p=0.25, seed=77)
        grads[form] = torch.autograd.grad(out, (q, k, v), dout)
    for fused, split in zip(grads["fused"], grads["split"]):
        torch.testing.assert_close(fused, split, rtol=1e-5, atol=1e-5)


def test_backward_form_rule_and_its_override(monkeypatch):
    cfg, other_warps = tiles.TileConfig(64, 32, 4, 3), tiles.TileConfig(64, 32, 8, 3)
    bf16 = torch.bfloat16
    monkeypatch.delenv("GPUPARITY_ATTENTION_BACKWARD", raising=False)
    assert tiles.fused_backward(256, 32, cfg, cfg, bf16) and tiles.fused_backward(128, 64, cfg, cfg, bf16)
    assert tiles.fused_backward(150, 20, cfg, cfg, bf16)                                     # padded to 32
    assert not tiles.fused_backward(257, 32, cfg, cfg, bf16) and not tiles.fused_backward(197, 64, cfg, cfg, bf16)
    assert not tiles.fused_backward(16, 32, cfg, other_warps, bf16)   # one launch has one warp count
    assert not tiles.fused_backward(16, 32, cfg, cfg, torch.float32)   # fp32: dk/dv need the dq kernel's delta
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "split")
    assert not tiles.fused_backward(16, 32, cfg, cfg, bf16)
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "fused")
    assert tiles.fused_backward(8192, 128, cfg, cfg, bf16)
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", "one")
    with pytest.raises(ValueError, match="GPUPARITY_ATTENTION_BACKWARD: expected one of"):
        tiles.fused_backward(16, 32, cfg, cfg, bf16)


def test_dropout_is_repeatable_and_its_gradient_is_right():
    batch, heads, seq, head_dim = 1, 2, size(20, 128), 32
    q, k, v = make_inputs(batch, heads, heads, seq, seq, head_dim, torch.float32, seed=15)
    kpm = padding_mask(batch, seq, [seq - 3])

    def run(q_, k_, v_):
        return triton_attention.triton_attention(q_, k_, v_, key_padding_mask=kpm, dropout_p=0.3, seed=1234)

    out = run(q, k, v)
    torch.testing.assert_close(out, run(q, k, v), rtol=0, atol=0)
    plain = triton_attention.triton_attention(q, k, v, key_padding_mask=kpm)
    assert not torch.allclose(out, plain)
    # gradient against central differences along a random direction (fixed seed: f is smooth)
    dout = torch.randn(out.shape).to(DEVICE)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    eps = 1e-2
    for index, grad in enumerate(grads):
        direction = torch.randn(grad.shape).to(DEVICE)
        plus = [t.detach().clone() for t in (q, k, v)]
        minus = [t.detach().clone() for t in (q, k, v)]
        plus[index] += eps * direction
        minus[index] -= eps * direction
        numeric = ((run(*plus) - run(*minus)) * dout).sum().item() / (2 * eps)
        analytic = (grad * direction).sum().item()
        assert math.isclose(numeric, analytic, rel_tol=2e-2, abs_tol=1e-3), (index, numeric, analytic)


def test_dropout_drops_the_requested_fraction():
    """With v = identity the output rows are the (dropped, rescaled) probabilities."""
    seq = size(32, 128)
    q = torch.randn(1, 1, seq, seq).to(DEVICE)
    k = torch.randn(1, 1, seq, seq).to(DEVICE)
    v = torch.eye(seq).view(1, 1, seq, seq).to(DEVICE)
    probs = triton_attention.triton_attention(q, k, v)
    dropped = triton_attention.triton_attention(q, k, v, dropout_p=0.25, seed=7)
    kept = dropped != 0
    fraction = 1.0 - kept.float().mean().item()
    assert abs(fraction - 0.25) < 0.06
    torch.testing.assert_close(dropped[kept], probs[kept] / 0.75, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- configs, backend
def test_tile_configs_cover_every_head_dim_and_dtype():
    for fam in triton_attention.CONFIGS:
        for kernel in ("fwd", "dkdv", "dq"):
            for head_dim in (1, 16, 40, 64, 80, 96, 128, 160, 256):
                for dtype in (torch.float16, torch.float32):
                    table = triton_attention.CONFIGS[fam][kernel]
                    bucket = triton_attention._bucket(head_dim)
                    elem = 4 if dtype == torch.float32 else 2
                    keys = [(b, elem) for b in triton_attention.BUCKETS if b >= bucket and (b, elem) in table]
                    assert keys, (fam, kernel, head_dim, dtype)
                    cfg = table[keys[0]]
                    assert cfg.block_m >= 16 and cfg.block_n >= 16, (fam, kernel, head_dim)


def test_short_key_configs_apply_only_to_short_keys(monkeypatch):
    # tile_config reads `family` from tiles.py, where it is defined (the package re-exports it)
    monkeypatch.setattr(tiles, "family", lambda device: "nvidia_sm90")
    short = triton_attention.SHORT_CONFIGS["nvidia_sm90"]["fwd"][(32, 2)]
    general = triton_attention.CONFIGS["nvidia_sm90"]["fwd"][(32, 2)]
    assert short != general
    cpu = torch.device("cpu")
    at = triton_attention.SHORT_KEYS
    assert triton_attention.tile_config("fwd", cpu, 32, torch.bfloat16, at) == short
    assert triton_attention.tile_config("fwd", cpu, 32, torch.bfloat16, at + 1) == general
    assert triton_attention.tile_config("fwd", cpu, 32, torch.bfloat16) == general
    assert triton_attention.tile_config("fwd", cpu, 32, torch.float32, 16) == \
        triton_attention.CONFIGS["nvidia_sm90"]["fwd"][(64, 4)]   # no short fp32 entry: the general one


def test_alibi_configs_apply_only_to_calls_with_alibi(monkeypatch):
    monkeypatch.setattr(tiles, "family", lambda device: "nvidia_sm90")
    cpu = torch.device("cpu")
    alibi = triton_attention.ALIBI_CONFIGS["nvidia_sm90"]["dkdv"][(64, 2)]
    general = triton_attention.CONFIGS["nvidia_sm90"]["dkdv"][(64, 2)]
    assert alibi != general
    assert triton_attention.tile_config("dkdv", cpu, 64, torch.bfloat16, 512, alibi=True) == alibi
    assert triton_attention.tile_config("dkdv", cpu, 64, torch.bfloat16, 512) == general
    assert triton_attention.tile_config("dq", cpu, 64, torch.bfloat16, 512, alibi=True) == \
        triton_attention.CONFIGS["nvidia_sm90"]["dq"][(64, 2)]     # no ALiBi entry: the general one
    assert triton_attention.tile_config("dkdv", cpu, 64, torch.float32, 512, alibi=True) == \
        triton_attention.CONFIGS["nvidia_sm90"]["dkdv"][(64, 4)]


def test_aot_specs_compile_the_alibi_tiles_with_alibi_on():
    specs = triton_attention.aot_specs()
    for fam, kernels in triton_attention.ALIBI_CONFIGS.items():
        for kernel, table in kernels.items():
            for (bucket, elem), cfg in table.items():
                tile = f"m{cfg.block_m}n{cfg.block_n}w{cfg.num_warps}s{cfg.num_stages}"
                for prefix in (f"attention.{kernel}.{fam}.", f"attention_varlen.{kernel}.{fam}."):
                    found = [s for s in specs if s.name.startswith(prefix) and tile in s.name
                             and s.constexprs.get("HAS_ALIBI")]
                    assert found, (prefix, tile)


def test_aot_specs_name_every_shipped_config():
    specs = triton_attention.aot_specs()
    names = {s.name for s in specs}
    assert len(names) == len(specs)
    for fam, targets in triton_attention.FAMILY_TARGETS.items():
        tables = [(kernel, table) for kernel, table in triton_attention.CONFIGS[fam].items()]
        tables += list(triton_attention.SHORT_CONFIGS.get(fam, {}).items())
        for kernel, table in tables:
            for (bucket, elem), cfg in table.items():
                tag = (f"attention.{kernel}.{fam}.", f".{'bf16' if elem == 2 else 'fp32'}.m{cfg.block_m}n{cfg.block_n}"
                       f"w{cfg.num_warps}s{cfg.num_stages}")
                matching = [s for s in specs if s.name.startswith(tag[0]) and tag[1] in s.name]
                assert matching and all(s.targets == targets for s in matching), (fam, kernel, bucket, elem)


def test_config_overrides_from_json(tmp_path):
    path = tmp_path / "configs.json"
    saved = dict(triton_attention.CONFIGS["nvidia"]["fwd"])
    path.write_text('{"nvidia": {"fwd": {"64,2": [32, 16, 2, 1]}}}')
    try:
        triton_attention.load_overrides(str(path))
        assert triton_attention.CONFIGS["nvidia"]["fwd"][(64, 2)] == triton_attention.TileConfig(32, 16, 2, 1)
    finally:
        triton_attention.CONFIGS["nvidia"]["fwd"].clear()
        triton_attention.CONFIGS["nvidia"]["fwd"].update(saved)


def test_registered_backend_reasons():
    from gpuparity import dispatch
    backend = dispatch.get("attention", "triton")
    problem = dispatch.Problem("attention", torch.device(DEVICE), torch.float32, "float_mask",
                               (("head_dim", 512), ("mask_requires_grad", True)))
    reasons = " ".join(backend.reasons(problem))
    assert "head_dim 512" in reasons and "requires grad" in reasons
    fp64 = dispatch.Problem("attention", torch.device(DEVICE), torch.float64)
    assert "float64" in " ".join(backend.reasons(fp64))


# --------------------------------------------------------------------------- window / softcap
def test_window_skips_whole_key_blocks_forward_and_backward():
    """Key blocks outside every row's window are never read: NaN planted in them (which a
    visited, masked block would spread through 0 * NaN) leaves outputs and gradients finite,
    and the rows' results equal those of clean inputs. Interpreter tiles are 32 x 32; GPU tiles
    up to 128 x 128, hence the longer sequence there (no checked row block reaches a NaN block)."""
    seq, bad_from, checked = size(96, 1024), size(64, 512), size(32, 256)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, seq, 16, generator=gen).to(DEVICE) for _ in range(3))
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, bad_from:], v_bad[:, :, bad_from:] = float("nan"), float("nan")   # seen by rows >= bad_from - 4 only
    outs = []
    for kk, vv in ((k, v), (k_bad, v_bad)):
        leaves = [t.clone().requires_grad_() for t in (q, kk, vv)]
        out = triton_attention.triton_attention(*leaves, window=(4, 0))
        out[:, :, :checked].sum().backward()    # rows before `checked`: their windows end before it
        outs.append((out[:, :, :checked].detach(), leaves[0].grad[:, :, :checked], leaves[1].grad[:, :, :checked]))
    for clean, planted in zip(*outs):
        assert torch.isfinite(planted).all()
        torch.testing.assert_close(planted, clean)
