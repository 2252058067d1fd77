"""gpuparity.flash_attn's dense functions against a float64 referee in FlashAttention's terms,
forward and backward: bottom-right causal and window with Sq < Sk and Sq > Sk, ALiBi (per head and
per batch item) with masks and GQA, softcap, the packed variants, the log-sum-exp output, and
gpuparity.attention(return_lse=True) with SDPA's top-left convention."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, require_device, size  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity
import gpuparity.flash_attn as flash_attn
from gpuparity.flash_attn import _compose as C
from fa_reference import check, grads, reference

require_device()
DEVICE = torch.device(TEST_DEVICE)


def inputs(batch=2, q_len=5, k_len=9, heads=4, kv_heads=2, head_dim=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, q_len, heads, head_dim), (batch, k_len, kv_heads, head_dim), (batch, k_len, kv_heads, head_dim))
    qkv = [torch.randn(s, generator=gen).to(DEVICE, dtype) for s in shapes]
    grad = torch.randn(shapes[0], generator=gen).to(DEVICE, dtype)
    return qkv, grad


def check_dense(qkv, grad, backend="composition", **kwargs):
    """flash_attn_func with kwargs against the referee (float64) and its call-dtype baseline."""
    ref_kwargs = {name: kwargs[name] for name in ("causal", "softcap") if name in kwargs}
    ref_kwargs["window"] = tuple(int(w) for w in kwargs.get("window_size", (-1, -1)))
    ref_kwargs["alibi"] = kwargs.get("alibi_slopes")
    ref_kwargs["scale"] = kwargs.get("softmax_scale")
    with flash_attn.backends(attention=backend):
        mine = grads(lambda q, k, v: flash_attn.flash_attn_func(q, k, v, **kwargs), qkv, grad)
    ref = grads(lambda q, k, v: reference(q, k, v, **ref_kwargs)[0], [t.cpu().double() for t in qkv], grad.cpu())
    base = grads(lambda q, k, v: reference(q, k, v, dtype=q.dtype, **ref_kwargs)[0], qkv, grad)
    empty = reference(*qkv, **ref_kwargs)[2]
    check(mine, ref, base, qkv[0].dtype, must_be_zero=empty.view(*empty.shape, 1, 1).expand(mine[0].shape).cpu())
    return empty


# (Sq, Sk) both ways; windows that stay a top-left window after the shift and ones that cannot
# (on a GPU run, FlashAttention's test sizes: 113 x 203 and 1024 x 128)
@pytest.mark.parametrize("lengths", [(size(5, 113), size(9, 203)), (size(9, 1024), size(4, 128))])
@pytest.mark.parametrize("flags", [dict(causal=True), dict(window_size=(2, 1)), dict(window_size=(0, 3)),
                                   dict(causal=True, window_size=(3, 5)), dict(window_size=(-1, 0)),
                                   dict(window_size=torch.tensor([1, 0]))])
def test_bottom_right_causal_and_window(lengths, flags):
    qkv, grad = inputs(q_len=lengths[0], k_len=lengths[1])
    empty = check_dense(qkv, grad, **flags)
    if lengths[0] > lengths[1] and flags.get("causal"):
        assert empty[:, 0].all() and not empty[:, -1].any()   # rows above the bottom-right diagonal see nothing


def test_bottom_right_on_the_triton_kernel_bf16():
    qkv, grad = inputs(q_len=7, k_len=12, dtype=torch.bfloat16)
    check_dense(qkv, grad, backend="triton", causal=True, softcap=4.0)


@pytest.mark.parametrize("lengths", [(6, 11), (7, 7)])
@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("flags", [dict(), dict(causal=True), dict(window_size=(3, 2))])
def test_alibi_with_masks_and_gqa(lengths, per_batch, flags):
    qkv, grad = inputs(q_len=lengths[0], k_len=lengths[1])
    shape = (2, 4) if per_batch else (4,)
    slopes = (torch.rand(shape, generator=torch.Generator().manual_seed(5)) * 0.5 + 0.1).to(DEVICE)
    check_dense(qkv, grad, alibi_slopes=slopes, **flags)


def test_alibi_on_the_triton_kernel_sq_greater_than_sk():
    qkv, grad = inputs(q_len=10, k_len=6)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    check_dense(qkv, grad, backend="triton", causal=True, alibi_slopes=slopes, softmax_scale=0.3)


def test_alibi_is_relative_to_the_bottom_right_diagonal():
    """By hand: q = 0 leaves only the bias; Sq=1, Sk=3, slope ln 2: weights of keys 0, 1, 2 are
    proportional to 1/4, 1/2, 1 (distances 2, 1, 0 from the query at key position 2)."""
    q = torch.zeros(1, 1, 1, 8, device=DEVICE)
    k = torch.zeros(1, 3, 1, 8, device=DEVICE)
    v = torch.eye(3, 8, device=DEVICE).view(1, 3, 1, 8)
    with flash_attn.backends(attention="composition"):
        out = flash_attn.flash_attn_func(q, k, v, alibi_slopes=torch.tensor([0.6931471805599453], device=DEVICE))
    torch.testing.assert_close(out[0, 0, 0, :3].cpu(), torch.tensor([1.0, 2.0, 4.0]) / 7, rtol=1e-5, atol=1e-6)


def test_packed_variants_match_and_reach_the_packed_gradient():
    qkv, grad = inputs(q_len=6, k_len=6, kv_heads=4)
    q, k, v = qkv
    packed = torch.stack([q, k, v], dim=2).requires_grad_()
    kv = torch.stack([k, v], dim=2).requires_grad_()
    with flash_attn.backends(attention="composition"):
        want = flash_attn.flash_attn_func(q, k, v, causal=True)
        got = flash_attn.flash_attn_qkvpacked_func(packed, causal=True)
        got_kv = flash_attn.flash_attn_kvpacked_func(q, kv, causal=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_kv, want)
    got.backward(grad)
    leaves = [t.detach().requires_grad_() for t in qkv]
    with flash_attn.backends(attention="composition"):
        flash_attn.flash_attn_func(*leaves, causal=True).backward(grad)
    torch.testing.assert_close(packed.grad, torch.stack([t.grad for t in leaves], dim=2))


def _no_bias(*args, **kwargs):
    raise AssertionError("a (B, H, Sq, Sk) ALiBi bias was built: the call did not run ALiBi inside the Triton kernels")


@pytest.mark.parametrize("backend", ["composition", "triton"])
def test_return_attn_probs_gives_the_lse(backend, monkeypatch):
    """gpuparity.attention's lse pass; with ALiBi on the Triton kernels, their own log-sum-exp."""
    if backend == "triton":
        monkeypatch.setattr(C, "alibi_bias", _no_bias)
    qkv, _ = inputs(q_len=7, k_len=4)
    slopes = torch.full((4,), 0.3, device=DEVICE)
    with flash_attn.backends(attention=backend):
        out, lse, s_dmask = flash_attn.flash_attn_func(*qkv, causal=True, alibi_slopes=slopes, softcap=3.0,
                                                       return_attn_probs=True)
    _, want, empty = reference(*[t.cpu().double() for t in qkv], causal=True, alibi=slopes, softcap=3.0)
    assert s_dmask is None and lse.dtype == torch.float32 and lse.shape == (2, 4, 7)
    assert empty.any()
    # FlashAttention's kernels report +inf for a row that sees no key
    assert torch.isposinf(lse.cpu()[empty.view(2, 1, 7).expand(2, 4, 7)]).all()
    torch.testing.assert_close(lse.cpu().double()[~torch.isinf(want)], want[~torch.isinf(want)], rtol=1e-5,
                               atol=1e-5)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("masks", [dict(is_causal=True), dict(window=(2, 1)),
                                   dict(key_padding_mask="pad", attn_mask="bias")])
def test_gpuparity_attention_return_lse_is_top_left(masks):
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, n, 8, generator=gen).to(DEVICE) for n in (5, 7, 7))
    kwargs = dict(masks)
    allowed = torch.ones(5, 7, dtype=torch.bool)
    scores = q.cpu().double() @ k.cpu().double().transpose(-1, -2) * 8 ** -0.5
    if kwargs.get("is_causal"):
        allowed = allowed.tril()
    if "window" in kwargs:
        offset = torch.arange(7).view(1, 7) - torch.arange(5).view(5, 1)
        allowed = allowed & (offset >= -2) & (offset <= 1)
    allowed = allowed.view(1, 1, 5, 7).expand(2, 4, 5, 7).clone()
    if "key_padding_mask" in kwargs:
        kwargs["key_padding_mask"] = torch.zeros(2, 7, dtype=torch.bool, device=DEVICE)
        kwargs["key_padding_mask"][1, 3:] = True
        allowed[1, :, :, 3:] = False
        kwargs["attn_mask"] = torch.randn(1, 4, 5, 7, generator=gen).to(DEVICE)
        scores = scores + kwargs["attn_mask"].cpu().double()
    out, lse = gpuparity.attention(q, k, v, backend="composition", return_lse=True, **kwargs)
    torch.testing.assert_close(out, gpuparity.attention(q, k, v, backend="composition", **kwargs))
    want = torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    torch.testing.assert_close(lse.cpu().double(), want, rtol=1e-5, atol=1e-5)


def test_argument_errors_name_the_argument():
    qkv, _ = inputs()
    with pytest.raises(ValueError, match="alibi_slopes: expected shape"):
        flash_attn.flash_attn_func(*qkv, alibi_slopes=torch.ones(3, device=DEVICE))
    with pytest.raises(TypeError, match="alibi_slopes: expected dtype float32"):
        flash_attn.flash_attn_func(*qkv, alibi_slopes=torch.ones(4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match="window_size"):
        flash_attn.flash_attn_func(*qkv, window_size=3)
    with pytest.raises(ValueError, match="k, v: expected"):
        flash_attn.flash_attn_func(qkv[0], qkv[1][:1], qkv[2][:1])
    with pytest.raises(TypeError, match="return_lse"):
        gpuparity.attention(*(t.transpose(1, 2) for t in qkv), return_lse=1)


def test_dropout_with_alibi_and_bottom_right_causal_on_the_triton_kernel(monkeypatch):
    """flash_attn_func(dropout_p=) is gpuparity.attention's dropout: the mask attention_dropout_mask
    regenerates for the seed torch's generator gives, forward and backward; ALiBi in the kernels."""
    from gpuparity.ops.dropout import attention_dropout_mask, draw_seed
    monkeypatch.setattr(C, "alibi_bias", _no_bias)
    qkv, grad = inputs(q_len=6, k_len=9)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    torch.manual_seed(3)
    keep = attention_dropout_mask(2, 4, 6, 9, 0.25, draw_seed(DEVICE), DEVICE).cpu()
    torch.manual_seed(3)
    with flash_attn.backends(attention="triton"):
        mine = grads(lambda q, k, v: flash_attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=True,
                                                                alibi_slopes=slopes), qkv, grad)
    flags = dict(causal=True, alibi=slopes, keep=keep, dropout_p=0.25)
    ref = grads(lambda q, k, v: reference(q, k, v, **flags)[0], [t.cpu().double() for t in qkv], grad.cpu())
    base = grads(lambda q, k, v: reference(q, k, v, dtype=q.dtype, **flags)[0], qkv, grad)
    check(mine, ref, base, qkv[0].dtype)


# Sq < Sk, Sq > Sk, Sq = Sk past a 32-key interpreter tile (partial tiles), with masks, GQA, softcap
@pytest.mark.parametrize("case", [
    dict(lengths=(6, 11), per_batch=False, flags=dict(causal=True)),
    dict(lengths=(10, 6), per_batch=True, flags=dict(window_size=(3, 2))),
    dict(lengths=(37, 37), per_batch=True, flags=dict(causal=True, softcap=5.0, softmax_scale=0.3)),
    dict(lengths=(9, 40), per_batch=False, flags=dict(window_size=(-1, 4)), dtype=torch.bfloat16),
])
def test_alibi_runs_inside_the_triton_kernels(case, monkeypatch):
    """With backend "triton" the slopes go to the kernels (forward and backward): the bias composer
    raises here, and the result meets the referee."""
    monkeypatch.setattr(C, "alibi_bias", _no_bias)
    qkv, grad = inputs(q_len=case["lengths"][0], k_len=case["lengths"][1], dtype=case.get("dtype", torch.float32))
    shape = (2, 4) if case["per_batch"] else (4,)
    slopes = (torch.rand(shape, generator=torch.Generator().manual_seed(9)) * 0.5 + 0.05).to(DEVICE)
    check_dense(qkv, grad, backend="triton", alibi_slopes=slopes, **case["flags"])


def test_other_backends_keep_the_composed_bias(monkeypatch):
    """A backend without ALiBi in its kernels (here the composition) gets the fp32 bias."""
    monkeypatch.setattr(C, "alibi_bias", _no_bias)
    qkv, _ = inputs()
    with flash_attn.backends(attention="composition"), pytest.raises(AssertionError, match="bias was built"):
        flash_attn.flash_attn_func(*qkv, alibi_slopes=torch.full((4,), 0.3, device=DEVICE))


@pytest.mark.parametrize("alibi_verdict", ["triton", "none"])
def test_auto_runs_alibi_in_the_kernels_only_where_they_passed_the_alibi_cases(alibi_verdict, monkeypatch):
    """Under auto, a call whose kind auto runs on triton takes the kernels' ALiBi only where triton
    also passed the battery's ALiBi cases here (asked as kind "<kind>+alibi"); else the composed bias."""
    from gpuparity.registry import BackendUnavailable
    from gpuparity.dispatch import get as get_backend
    from gpuparity.flash_attn import flash_attn_interface as F
    asked = []

    def resolve(problem, backend):
        asked.append(problem.kind)
        if problem.kind.endswith("+alibi") and alibi_verdict == "none":
            raise BackendUnavailable("no backend can serve this attention call")
        return get_backend("attention", "triton")
    monkeypatch.setattr(F._dropout, "resolve", resolve)
    composed = []
    real_bias = C.alibi_bias
    monkeypatch.setattr(C, "alibi_bias", lambda *a, **k: composed.append(1) or real_bias(*a, **k))
    qkv, grad = inputs(q_len=5, k_len=9)
    slopes = torch.full((4,), 0.3, device=DEVICE)
    with flash_attn.backends(attention="auto"):
        out = flash_attn.flash_attn_func(*qkv, causal=True, alibi_slopes=slopes)
    assert asked[-1].endswith("+alibi") and (bool(composed) == (alibi_verdict == "none"))
    want = reference(*[t.cpu().double() for t in qkv], causal=True, alibi=slopes)[0]
    torch.testing.assert_close(out.cpu().double(), want, rtol=2e-5, atol=2e-5)
