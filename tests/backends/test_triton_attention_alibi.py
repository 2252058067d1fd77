"""ALiBi inside the Triton attention kernels (dense and varlen) against the float64 referee, forward
and backward: FlashAttention's bias -slope * |i + Sk - Sq - j| on the scaled scores, slopes per head
or per batch item and head, with Sq != Sk both ways, causal, key padding, bool masks, window and
softcap, GQA, both backward forms and sizes that leave partial tiles. Interpreter on the CPU (small
shapes); compiled on the GPU with GPUPARITY_TEST_DEVICE=cuda."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE as DEVICE, require_device, size

pytest.importorskip("triton")

from gpuparity import reference  # noqa: E402
from gpuparity.contracts import attention as attention_contract  # noqa: E402
from gpuparity.backends.triton_attention import triton_attention, triton_attention_varlen  # noqa: E402
from gpuparity.backends.triton_common import clear_plans  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402

require_device()
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


def alibi_bias(slopes, q_len, k_len, shift=None):
    """float64 (B or 1, H, Sq, Sk): -slope * |i + shift - j|, shift = Sk - Sq (FlashAttention)."""
    shift = k_len - q_len if shift is None else shift
    i = torch.arange(q_len, dtype=torch.float64).view(q_len, 1)
    j = torch.arange(k_len, dtype=torch.float64).view(1, k_len)
    slopes = slopes.detach().cpu().double().reshape(-1, slopes.shape[-1], 1, 1)
    return -slopes * (i + shift - j).abs()


def inputs(batch, heads, kv_heads, q_len, k_len, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, h, n, head_dim, generator=gen).to(DEVICE, dtype).requires_grad_()
               for h, n in ((heads, q_len), (kv_heads, k_len), (kv_heads, k_len)))
    dout = torch.randn(batch, heads, q_len, head_dim, generator=gen).to(DEVICE, dtype)
    return q, k, v, dout


def check_dense(q, k, v, dout, slopes, *, attn_mask=None, key_padding_mask=None, is_causal=False, window=None,
                softcap=None, scale=None):
    """triton_attention(alibi_slopes=) against the float64 reference given the bias as a float mask,
    and the same-dtype composition with that mask as the baseline, under the tolerance policy."""
    dtype = q.dtype
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    flags = dict(is_causal=is_causal, window=window, softcap=softcap, scale=scale)
    out = triton_attention(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, alibi_slopes=slopes,
                           **flags)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    bias = alibi_bias(slopes, q_len, k_len)
    if attn_mask is not None:   # a bool mask folded into the bias: -inf where not allowed
        bias = bias.masked_fill(~attn_mask.cpu(), float("-inf"))
    ref_inputs = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    kpm = None if key_padding_mask is None else key_padding_mask.cpu()
    ref_out = reference.attention(*ref_inputs, attn_mask=bias, key_padding_mask=kpm, **flags)
    ref_grads = torch.autograd.grad(ref_out, ref_inputs, dout.cpu().double())
    base_inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    base_out = attention_contract.composition(*base_inputs, attn_mask=bias.to(DEVICE, dtype), key_padding_mask=key_padding_mask,
                                **flags)
    base_grads = torch.autograd.grad(base_out, base_inputs, dout)
    allowed = reference.attention_allowed(q_len, k_len, batch, attn_mask=bias, key_padding_mask=kpm,
                                          is_causal=is_causal, window=window)
    empty = (~allowed.any(-1, keepdim=True)).expand(batch, heads, q_len, 1)
    results = [judge("out", out, ref_out, base_out, dtype, valid=~empty, must_be_zero=empty)]
    for name, mine, want, base in zip(("grad_q", "grad_k", "grad_v"), grads, ref_grads, base_grads):
        results.append(judge(name, mine, want, base, dtype))
    failed = [r.reason for r in results if not r.passed]
    assert not failed, failed


# (B, H, Hkv, Sq, Sk, D): Sq < Sk, Sq > Sk, Sq = Sk with partial tiles (the interpreter's tiles are
# 32 x 32; on a GPU the sizes grow past several tiles)
SHAPES = {
    "sq_lt_sk_gqa": (2, 4, 2, size(7, 77), size(19, 300), 16),
    "sq_gt_sk": (2, 4, 4, size(19, 300), size(7, 77), 32),
    "remainders_d40": (1, 2, 1, size(37, 517), size(45, 645), 40),
    # several tiles on both sides of every row block's diagonal: the kernels' linear bias on tiles
    # wholly before or after it, the |distance| form on tiles across it
    "tiles_both_sides": (1, 2, 1, size(100, 700), size(130, 900), 16),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("masks", ["none", "causal", "key_padding", "bool_window_softcap"])
def test_dense_alibi_forward_and_backward(shape, per_batch, masks):
    batch, heads, kv_heads, q_len, k_len, head_dim = SHAPES[shape]
    q, k, v, dout = inputs(batch, heads, kv_heads, q_len, k_len, head_dim, torch.float32, seed=len(shape))
    gen = torch.Generator().manual_seed(3)
    slopes = (torch.rand((batch, heads) if per_batch else (heads,), generator=gen) * 0.5 + 0.05).to(DEVICE)
    kwargs = {}
    if masks == "causal":
        kwargs = dict(is_causal=True)
    elif masks == "key_padding":
        kpm = torch.zeros(batch, k_len, dtype=torch.bool)
        kpm[-1, k_len // 3:] = True
        kwargs = dict(key_padding_mask=kpm.to(DEVICE))
    elif masks == "bool_window_softcap":
        keep = torch.rand(1, heads, q_len, k_len, generator=gen) > 0.2
        kwargs = dict(attn_mask=keep.to(DEVICE), window=(5, 3), softcap=4.0, scale=0.4)
    check_dense(q, k, v, dout, slopes, **kwargs)


@pytest.mark.parametrize("form", ["fused", "split"])
def test_both_backward_forms_and_bf16(form, monkeypatch):
    """The one-launch backward and the dq + dk/dv pair (tiles.fused_backward), in bf16."""
    monkeypatch.setenv("GPUPARITY_ATTENTION_BACKWARD", form)
    clear_plans()
    q, k, v, dout = inputs(2, 4, 2, size(21, 200), size(35, 333), 32, torch.bfloat16, seed=7)
    slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [1.0, 0.3, 0.01, 0.2]], device=DEVICE)
    check_dense(q, k, v, dout, slopes, is_causal=True)
    clear_plans()


@pytest.mark.parametrize("masks", ["causal", "key_padding"])
def test_head_dim_64_bf16_with_alibis_own_dkdv_tile(masks):
    """D 64 in bf16 with the two-launch backward: the dk/dv tile ALiBi calls get on Hopper
    (tiles.ALIBI_CONFIGS; elsewhere the general table's), at sizes that leave partial tiles of it."""
    batch, heads, q_len, k_len = 2, 4, size(33, 517), size(47, 645)
    q, k, v, dout = inputs(batch, heads, 2, q_len, k_len, 64, torch.bfloat16, seed=11)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    if masks == "causal":
        check_dense(q, k, v, dout, slopes, is_causal=True)
    else:
        kpm = torch.arange(k_len).view(1, k_len) >= torch.tensor([k_len, k_len - size(9, 101)]).view(2, 1)
        check_dense(q, k, v, dout, slopes, key_padding_mask=kpm.to(DEVICE))


@pytest.mark.parametrize("head_dim,dtype", [(16, torch.float32), (64, torch.bfloat16)])
def test_varlen_alibi_per_sequence(head_dim, dtype):
    """Each sequence's own Sq, Sk decide its bias (bottom-right on its lengths): the kernels against
    the dense referee run sequence by sequence, with an empty query sequence and Sq > Sk; D 64 in
    bf16 is where Hopper gives ALiBi its own dk/dv tile (tiles.ALIBI_CONFIGS)."""
    q_lens, k_lens = [size(5, 100), size(17, 300), 0, size(9, 64)], [size(9, 150), size(6, 200), 4, size(40, 64)]
    heads, kv_heads = 4, 2
    gen = torch.Generator().manual_seed(5)
    cu_q = torch.tensor([0] + q_lens).cumsum(0).to(DEVICE, torch.int32)
    cu_k = torch.tensor([0] + k_lens).cumsum(0).to(DEVICE, torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=gen).to(DEVICE, dtype).requires_grad_()
    k, v = (torch.randn(sum(k_lens), kv_heads, head_dim, generator=gen).to(DEVICE, dtype).requires_grad_()
            for _ in range(2))
    dout = torch.randn(q.shape, generator=gen).to(DEVICE, dtype)
    slopes = (torch.rand(len(q_lens), heads, generator=gen) * 0.5 + 0.05).to(DEVICE)
    out = triton_attention_varlen(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=True, alibi_slopes=slopes)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_inputs = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    pieces = []
    for b, (ql, kl) in enumerate(zip(q_lens, k_lens)):
        qs, ks = sum(q_lens[:b]), sum(k_lens[:b])
        qb, kb, vb = (t[s:s + n].transpose(0, 1).unsqueeze(0) for t, s, n in
                      ((ref_inputs[0], qs, ql), (ref_inputs[1], ks, kl), (ref_inputs[2], ks, kl)))
        allowed = torch.ones(ql, kl, dtype=torch.bool).tril(kl - ql)   # bottom-right causal
        bias = alibi_bias(slopes[b:b + 1], ql, kl).masked_fill(~allowed, float("-inf"))
        pieces.append(reference.attention(qb, kb, vb, attn_mask=bias)[0].transpose(0, 1))
    ref_out = torch.cat(pieces)
    ref_grads = torch.autograd.grad(ref_out, ref_inputs, dout.cpu().double())
    for name, mine, want in zip(("out", "grad_q", "grad_k", "grad_v"), (out, *grads), (ref_out, *ref_grads)):
        # against float64: the policy's floor for the dtype, as the composition's own error would be
        result = judge(name, mine, want, want.to(mine.dtype), dtype)
        assert result.passed, result.reason


def test_alibi_slopes_are_checked_naming_the_argument():
    q, k, v, _ = inputs(2, 4, 2, 5, 7, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="alibi_slopes: expected shape"):
        triton_attention(q, k, v, alibi_slopes=torch.ones(3, device=DEVICE))
    with pytest.raises(TypeError, match="alibi_slopes: expected a float32 tensor"):
        triton_attention(q, k, v, alibi_slopes=torch.ones(4, dtype=torch.float64, device=DEVICE))
    cu = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="alibi_slopes: expected shape"):
        triton_attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 5, 5,
                                alibi_slopes=torch.ones(2, 4, device=DEVICE))


def test_return_lse_is_the_kernels_natural_log_sum_exp():
    q, k, v, _ = inputs(2, 4, 2, 9, 6, 16, torch.float32, seed=2)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    out, lse = triton_attention(q, k, v, is_causal=True, alibi_slopes=slopes, return_lse=True)
    torch.testing.assert_close(out, triton_attention(q, k, v, is_causal=True, alibi_slopes=slopes))
    scores = q.detach().cpu().double() @ k.detach().cpu().double().repeat_interleave(2, 1).transpose(-1, -2) / 4.0
    scores = scores + alibi_bias(slopes, 9, 6)
    scores = scores.masked_fill(~torch.ones(9, 6, dtype=torch.bool).tril(), float("-inf"))   # top-left causal
    want = torch.logsumexp(scores, -1)
    assert not lse.requires_grad and torch.isfinite(lse).all()   # top-left causal: every row sees key 0
    torch.testing.assert_close(lse.cpu().double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alibi", [True, False])
def test_key_lengths_put_each_items_diagonal_at_its_length(alibi):
    """With key_lengths (FlashAttention's KV cache: cache_seqlens), query i sits at key position
    i + len_b - Sq: the bias follows each item's own length, forward and backward; keys past an
    item's length get zero dk and dv (with or without ALiBi: they were visited in the item's last
    block and got gradients before)."""
    q, k, v, dout = inputs(3, 4, 2, 3, size(40, 300), 16, torch.float32, seed=4)
    k_len = k.shape[2]
    lengths = [k_len, 17, 1]
    slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [0.3, 0.2, 0.1, 0.05], [1.0, 0.5, 0.5, 0.5]], device=DEVICE)
    slopes = slopes if alibi else torch.zeros_like(slopes)
    out = triton_attention(q, k, v, key_lengths=torch.tensor(lengths, device=DEVICE),
                           alibi_slopes=slopes if alibi else None)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    bias = torch.cat([alibi_bias(slopes[b:b + 1], 3, k_len, shift=length - 3) for b, length in enumerate(lengths)])
    kpm = torch.arange(k_len).view(1, k_len) >= torch.tensor(lengths).view(3, 1)
    ref_inputs = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ref_out = reference.attention(*ref_inputs, attn_mask=bias, key_padding_mask=kpm)
    ref_grads = torch.autograd.grad(ref_out, ref_inputs, dout.cpu().double())
    for name, mine, want in zip(("out", "grad_q", "grad_k", "grad_v"), (out, *grads), (ref_out, *ref_grads)):
        result = judge(name, mine, want, want.to(mine.dtype), torch.float32)
        assert result.passed, result.reason


def test_far_positions_keep_the_distance_exact_near_the_diagonal():
    """A few queries at the end of a long key sequence with steep slopes: only the keys near the
    diagonal (j close to i + Sk - Sq, tens of thousands of positions from key 0) carry weight. The
    kernels build the bias from positions taken relative to each tile, so fp32 keeps the small
    distances there exact; a bias made from absolute positions (slope * 8000 and up, fp32 steps
    of about 1e-3 and more) would miss the fp32 tolerance, forward and backward. (Not with top-left is_causal:
    there these queries see only the first keys, all about Sk from the diagonal, and their weights
    hang on differences of huge biases, which no fp32 form keeps.)"""
    q, k, v, dout = inputs(1, 2, 1, 5, size(8000, 120000), 16, torch.float32, seed=6)
    slopes = torch.tensor([1.0, 0.7], device=DEVICE)
    check_dense(q, k, v, dout, slopes)


def _planted(alignment):
    """An implementation that takes alibi_slopes and gets it wrong: "ignored" (no bias) or "top_left"
    (distance |i - j|, not FlashAttention's |i + Sk - Sq - j|)."""
    from gpuparity.contracts.attention import with_alibi

    def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None, window=None,
                  softcap=None, alibi_slopes=None):
        if alignment == "top_left":
            q_len, k_len = q.shape[2], k.shape[2]
            distance = (torch.arange(q_len).view(q_len, 1) - torch.arange(k_len).view(1, k_len)).abs().to(q.device)
            bias = -alibi_slopes.reshape(-1, q.shape[1], 1, 1).float() * distance
            attn_mask = with_alibi(attn_mask, bias)
        return attention_contract.composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                                scale=scale, window=window, softcap=softcap)
    return attention


def test_the_batterys_alibi_cases_pass_the_kernels_and_catch_wrong_biases():
    """`gpuparity check --op attention`'s ALiBi cases against float64: the Triton kernels pass, an
    implementation that drops the bias or aligns it top-left fails, the other backends are SKIP
    (ALiBi is opt-in), and the cases have verdicts of their own (kind "...+alibi")."""
    from gpuparity.checks.execute import run_case
    from gpuparity.checks.results import Status
    from gpuparity.contracts import get_spec
    from gpuparity.dispatch import get as get_backend
    spec = get_spec("attention")
    cases = {case.name: case for case in spec.cases() if case.params.get("alibi")}
    assert {"alibi_causal_gqa", "alibi_sq_lt_sk_per_batch"} <= set(cases)
    baseline = get_backend("attention", "composition").fn
    device = torch.device(DEVICE)
    case = cases["alibi_sq_lt_sk_per_batch"]   # Sq < Sk: top-left and bottom-right differ
    assert spec.kind(case.params) == "none+alibi"
    problem = spec.problem(case.params, torch.float32, device)
    assert get_backend("attention", "triton").reasons(problem) == []
    assert "does not implement alibi" in " ".join(get_backend("attention", "sdpa_math").reasons(problem))
    status, _, reason = run_case("attention", get_backend("attention", "triton").fn, case.params, torch.float32,
                                 device, 0, baseline_fn=baseline)
    assert status == Status.PASS, reason
    for alignment in ("ignored", "top_left"):
        status, _, _ = run_case("attention", _planted(alignment), case.params, torch.float32, device, 0,
                                baseline_fn=baseline)
        assert status == Status.FAIL, alignment


def _varlen_planted(kind):
    from gpuparity.backends.triton_attention import triton_attention_varlen

    def planted(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, window=None, softcap=None, scale=None,
                alibi_slopes=None):
        if kind == "ignored":
            alibi_slopes = None
        elif alibi_slopes is not None and alibi_slopes.dim() == 2:   # "first_row": sequence 0's slopes for all
            alibi_slopes = alibi_slopes[0]
        return triton_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window=window,
                                       softcap=softcap, scale=scale, alibi_slopes=alibi_slopes)
    return planted


def test_the_varlen_batterys_alibi_cases_pass_the_kernels_and_catch_wrong_biases():
    """`gpuparity check --op attention_varlen`'s ALiBi cases (each sequence's bias on its own
    lengths, per-batch slopes): the varlen kernels pass against float64, a kernel that drops the
    bias or gives every sequence the first one's slopes fails, the composition is SKIP (opt-in),
    and the cases have verdicts of their own, which gpuparity.flash_attn's auto path asks for."""
    from gpuparity.checks.execute import run_case
    from gpuparity.checks.results import Status
    from gpuparity.contracts import get_spec
    from gpuparity.dispatch import get as get_backend
    spec = get_spec("attention_varlen")
    case = next(c for c in spec.cases() if c.name == "alibi_causal_gqa_per_batch")
    assert spec.kind(case.params).endswith("+alibi")
    device = torch.device(DEVICE)
    problem = spec.problem(case.params, torch.float32, device)
    assert get_backend("attention_varlen", "triton").reasons(problem) == []
    assert "does not implement alibi" in " ".join(get_backend("attention_varlen", "composition").reasons(problem))
    baseline = get_backend("attention_varlen", "composition").fn
    status, _, reason = run_case("attention_varlen", get_backend("attention_varlen", "triton").fn, case.params,
                                 torch.float32, device, 0, baseline_fn=baseline)
    assert status == Status.PASS, reason
    for kind in ("ignored", "first_row"):
        status, _, _ = run_case("attention_varlen", _varlen_planted(kind), case.params, torch.float32, device, 0,
                                baseline_fn=baseline)
        assert status == Status.FAIL, kind
