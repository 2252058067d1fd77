"""gpuparity.attention_varlen (packed sequences, flash_attn_varlen_func's layout): the Triton kernels
(the interpreter on the CPU) and the composition fallback against float64 under the tolerance policy,
forward and backward, with empty sequences, GQA, bottom-right causal, window and softcap; packed
equals each sequence alone through the dense API; bad arguments name themselves."""
from __future__ import annotations

import pytest
import torch
from device_env import ON_GPU, TEST_DEVICE, require_device, size  # sets TRITON_INTERPRET=1 on the CPU

pytest.importorskip("triton")

import gpuparity  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402
from gpuparity.registry import Backend, register, unregister  # noqa: E402
from gpuparity.ops.attention import attention  # noqa: E402
from gpuparity.ops.varlen import (attention_varlen, attention_varlen_reference, empty_rows,  # noqa: E402
                                  explain_attention_varlen)
from gpuparity.contracts.varlen import bottom_right_allowed, composition_varlen  # noqa: E402

require_device()
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")
DEVICE = torch.device(TEST_DEVICE)
# One sequence of a single query, one of 17, an empty query sequence (with keys), Sq > Sk (rows
# before the diagonal see nothing under causal) and one longer than a tile (several q/k blocks).
Q_LENS = [1, 17, 0, 5, size(40, 300)]
K_LENS = [4, 17, 3, 2, size(70, 520)]


def cumulative(lengths, dtype=torch.int32):
    return torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(DEVICE, dtype)


def packed_inputs(q_lens=Q_LENS, k_lens=K_LENS, heads=4, kv_heads=2, head_dim=16, dtype=torch.float32, seed=0,
                  logit_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=gen) * logit_scale
    k = torch.randn(sum(k_lens), kv_heads, head_dim, generator=gen)
    v = torch.randn(sum(k_lens), kv_heads, head_dim, generator=gen)
    return [t.to(DEVICE, dtype) for t in (q, k, v)], cumulative(q_lens), cumulative(k_lens)


def run(backend, qkv, cu_q, cu_k, grad, **kwargs):
    leaves = [t.clone().requires_grad_() for t in qkv]
    out = attention_varlen(*leaves, cu_q, cu_k, int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max()),
                           backend=backend, **kwargs)
    out.backward(grad)
    return [out.detach().cpu()] + [t.grad.detach().cpu() for t in leaves]


def check(backend, qkv, cu_q, cu_k, **kwargs):
    """Output and dq/dk/dv of `backend` against float64, the composition's error as the baseline."""
    grad = torch.randn(qkv[0].shape, generator=torch.Generator().manual_seed(7)).to(DEVICE, qkv[0].dtype)
    mine = run(backend, qkv, cu_q, cu_k, grad, **kwargs)
    base = run("composition", qkv, cu_q, cu_k, grad, **kwargs)
    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in qkv]
    ref = attention_varlen_reference(*ref_leaves, cu_q.cpu(), cu_k.cpu(), **kwargs)
    ref.backward(grad.cpu().double())
    empty = empty_rows(cu_q.cpu(), cu_k.cpu(), causal=kwargs.get("causal", False),
                       window=kwargs.get("window")).view(-1, 1, 1)
    results = [judge("out", mine[0], ref, base[0], qkv[0].dtype, valid=~empty, must_be_zero=empty)]
    for name, got, theirs, baseline in zip(("dq", "dk", "dv"), mine[1:], ref_leaves, base[1:]):
        results.append(judge(name, got, theirs.grad, baseline, qkv[0].dtype))
    for result in results:
        assert result.passed, result.reason
    return mine, empty


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window=(3, 2)),
    "causal_window": dict(causal=True, window=(6, -1)),
    "softcap": dict(softcap=2.0),
    "causal_softcap_scale": dict(causal=True, softcap=5.0, scale=0.3),
}


@pytest.mark.parametrize("backend", ["triton", "composition"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_reference(backend, case):
    qkv, cu_q, cu_k = packed_inputs(logit_scale=3.0 if "softcap" in case else 1.0)
    _, empty = check(backend, qkv, cu_q, cu_k, **CASES[case])
    if case.startswith("causal"):
        assert empty.any()  # the Sq > Sk sequence has rows before its diagonal


def test_triton_mha_bf16_and_int64_cu_seqlens():
    qkv, cu_q, cu_k = packed_inputs(heads=2, kv_heads=2, dtype=torch.bfloat16)
    check("triton", qkv, cu_q.long(), cu_k.long(), causal=True)


def test_triton_reads_strided_packed_qkv():
    """q, k, v as views of one packed (total, 3, H, D) tensor, as a fused qkv projection gives."""
    lens = [9, 0, 33]
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(sum(lens), 3, 2, 16, generator=gen).to(DEVICE)
    views = list(qkv.unbind(1))
    assert not views[0].is_contiguous()
    check("triton", views, cumulative(lens), cumulative(lens), causal=True)


def test_causal_is_bottom_right_aligned():
    """By hand: equal scores (q = 0) make each row the mean of the values it may see. Sq=2, Sk=4:
    query 0 sees keys 0..2, query 1 keys 0..3. Sq=3, Sk=2: query 0 sees nothing, 1 key 0, 2 keys 0..1."""
    k_lens, q_lens = [4, 2], [2, 3]
    v = torch.eye(16)[: sum(k_lens)].view(-1, 1, 16).to(DEVICE)
    q = torch.zeros(sum(q_lens), 1, 16, device=DEVICE)
    expected = torch.zeros(5, 16)
    expected[0, :3] = 1 / 3
    expected[1, :4] = 1 / 4
    expected[3, 4] = 1.0
    expected[4, 4:6] = 1 / 2
    for backend in ("triton", "composition"):
        out = attention_varlen(q, v, v, cumulative(q_lens), cumulative(k_lens), 3, 4, causal=True, backend=backend)
        torch.testing.assert_close(out[:, 0].cpu(), expected, atol=1e-6, rtol=0)


def test_packed_equals_each_sequence_alone():
    """Each sequence through the dense API (its bottom-right mask as attn_mask) gives the packed rows."""
    qkv, cu_q, cu_k = packed_inputs()
    out = attention_varlen(*qkv, cu_q, cu_k, max(Q_LENS), max(K_LENS), causal=True, window=(5, 1), backend="triton")
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(Q_LENS)):
        if Q_LENS[b] == 0:
            continue
        q, k, v = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t, lo, hi in (
            (qkv[0], starts_q[b], starts_q[b + 1]), (qkv[1], starts_k[b], starts_k[b + 1]),
            (qkv[2], starts_k[b], starts_k[b + 1])))
        mask = bottom_right_allowed(Q_LENS[b], K_LENS[b], True, (5, 1), DEVICE)
        alone = attention(q, k, v, attn_mask=mask, backend="triton")[0].transpose(0, 1)
        torch.testing.assert_close(out[starts_q[b]:starts_q[b + 1]], alone, atol=1e-5, rtol=1e-5)


def test_equal_lengths_match_dense_causal_and_window():
    """With Sq == Sk per sequence bottom-right and top-left agree: the dense is_causal/window path."""
    lens = [7, 19]
    qkv, cu, _ = packed_inputs(q_lens=lens, k_lens=lens)
    out = attention_varlen(*qkv, cu, cu, 19, 19, causal=True, window=(4, -1), softcap=3.0, backend="triton")
    for b, (lo, hi) in enumerate(zip(cu.tolist()[:-1], cu.tolist()[1:])):
        q, k, v = (t[lo:hi].transpose(0, 1).unsqueeze(0) for t in qkv)
        alone = attention(q, k, v, is_causal=True, window=(4, -1), softcap=3.0, backend="triton")[0].transpose(0, 1)
        torch.testing.assert_close(out[lo:hi], alone, atol=1e-5, rtol=1e-5)


def test_auto_uses_triton_once_the_battery_verified_it(monkeypatch):
    from gpuparity.checks import priors
    # ranked first on every device family (the CPU prior puts the composition first), so that
    # auto verifies the kernel on its quick cases and then uses it
    for family in priors.PRIORS:
        monkeypatch.setitem(priors.PRIORS[family], "attention_varlen", ["triton"])
    qkv, cu_q, cu_k = packed_inputs()
    explained = explain_attention_varlen(*qkv, cu_q, cu_k, max(Q_LENS), max(K_LENS), causal=True, softcap=3.0)
    assert explained["chosen"] == "triton", explained["candidates"]
    rows = {row["name"]: row for row in explained["candidates"]}
    assert rows["triton"]["status"] == "verified", rows["triton"]
    out = gpuparity.attention_varlen(*qkv, cu_q, cu_k, max(Q_LENS), max(K_LENS), causal=True, softcap=3.0)
    assert out.shape == qkv[0].shape


def test_auto_never_picks_a_backend_that_fails_the_battery(monkeypatch):
    from gpuparity.checks import priors

    def off_by_a_bit(q, k, v, *args, **kwargs):
        return composition_varlen(q, k, v, *args, **kwargs) * 1.01

    # ranked first on every device family, so that auto checks it before anything else
    for family in priors.PRIORS:
        monkeypatch.setitem(priors.PRIORS[family], "attention_varlen", ["planted_wrong"])

    register(Backend("planted_wrong", "attention_varlen", off_by_a_bit, "a planted wrong backend",
                     device_types=("cpu", "cuda")))
    try:
        qkv, cu_q, cu_k = packed_inputs()
        explained = explain_attention_varlen(*qkv, cu_q, cu_k, max(Q_LENS), max(K_LENS))
        rows = {row["name"]: row for row in explained["candidates"]}
        assert rows["planted_wrong"]["status"] == "failed-probe"
        assert rows["planted_wrong"]["reason"].startswith("failed "), rows["planted_wrong"]
        assert explained["chosen"] != "planted_wrong"
    finally:
        unregister("attention_varlen", "planted_wrong")


def _bad(**changes):
    qkv, cu_q, cu_k = packed_inputs(q_lens=[3, 5], k_lens=[4, 6])
    args = dict(q=qkv[0], k=qkv[1], v=qkv[2], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=6)
    args.update(changes)
    return args


BAD = {
    "unsorted": (dict(cu_seqlens_q=torch.tensor([0, 9, 8], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    "non_monotone_k": (dict(cu_seqlens_k=torch.tensor([0, 11, 10], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    "max_negative": (dict(max_seqlen_k=-1), TypeError, "max_seqlen_k"),
    "not_from_0": (dict(cu_seqlens_k=torch.tensor([1, 4, 10], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    "wrong_end": (dict(cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    "float_dtype": (dict(cu_seqlens_q=torch.tensor([0.0, 3.0, 8.0])), TypeError, "cu_seqlens_q"),
    "two_dims": (dict(cu_seqlens_k=torch.tensor([[0, 4, 10]], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    "batch_mismatch": (dict(cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    "max_too_small": (dict(max_seqlen_k=5), ValueError, "max_seqlen_k"),
    "max_not_int": (dict(max_seqlen_q=5.0), TypeError, "max_seqlen_q"),
    "dense_q": (dict(q=torch.zeros(1, 8, 4, 16)), ValueError, "q"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_name_themselves(case):
    changes, error, name = BAD[case]
    args = _bad(**{key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
                   for key, value in changes.items()})
    with pytest.raises(error, match=f"^{name}:"):
        attention_varlen(*args.values(), backend="composition")


def test_cu_seqlens_values_are_read_once_per_tensor_and_version(monkeypatch):
    """One host sync per cu_seqlens tensor and version, not per call: a model's layers share
    them; an in-place change is checked again."""
    from gpuparity.contracts import varlen as varlen_contract
    reads = []
    real = varlen_contract._cu_values
    monkeypatch.setattr(varlen_contract, "_cu_values", lambda cu: reads.append(cu) or real(cu))
    qkv, cu_q, cu_k = packed_inputs(q_lens=[3, 5], k_lens=[4, 6], dtype=torch.float32)
    for _ in range(3):   # three "layers"
        attention_varlen(*qkv, cu_q, cu_k, 5, 6, backend="composition")
    assert len(reads) == 2                   # q's and k's, once
    cu_k[1] = 7                              # in place: lengths 7 and 3, the longest past max_seqlen_k=6
    with pytest.raises(ValueError, match="^max_seqlen_k: expected >= the longest sequence"):
        attention_varlen(*qkv, cu_q, cu_k, 5, 6, backend="composition")
    fresh = cu_q.clone()                     # same values, another tensor: checked
    attention_varlen(*qkv, fresh, cu_k.copy_(torch.tensor([0, 4, 10], dtype=cu_k.dtype)), 5, 6, backend="composition")
    assert sum(r is fresh for r in reads) == 1


def test_window_larger_than_the_sequence_names_window():
    with pytest.raises(ValueError, match="^window: left = 9 is larger than the sequence"):
        attention_varlen(*_bad().values(), window=(9, 0), backend="composition")
    with pytest.raises(ValueError, match="^window: right = 7 is larger than the sequence"):
        attention_varlen(*_bad().values(), window=(-1, 7), backend="triton")
    with pytest.raises(ValueError, match="^window: expected left and right >= -1"):
        attention_varlen(*_bad().values(), window=(-2, 0))


@pytest.mark.skipif(ON_GPU, reason="the device check needs a second device; on the CPU cuda is absent")
def test_cu_seqlens_on_another_device_is_named():
    args = _bad()
    args["cu_seqlens_q"] = args["cu_seqlens_q"].to("meta")
    with pytest.raises(ValueError, match="^cu_seqlens_q: expected a tensor on"):
        attention_varlen(*args.values(), backend="composition")


def test_dispatcher_reasons_in_words():
    """A backend that cannot serve the call says why in explain_attention_varlen and when named;
    auto then falls back to the composition without probing anything."""
    from gpuparity.registry import BackendUnavailable
    qkv, cu_q, cu_k = packed_inputs(q_lens=[3, 5], k_lens=[4, 6], dtype=torch.float64)
    table = explain_attention_varlen(*qkv, cu_q, cu_k, 5, 6, causal=True)
    rows = {row["name"]: row for row in table["candidates"]}
    assert rows["triton"]["status"] == "unsupported" and "triton: no float64 kernel" in rows["triton"]["reason"]
    assert rows["composition"]["status"] == "fallback" and table["chosen"] == "composition"
    wide, cu_q, cu_k = packed_inputs(q_lens=[3, 5], k_lens=[4, 6], head_dim=272)
    rows = {row["name"]: row for row in explain_attention_varlen(*wide, cu_q, cu_k, 5, 6)["candidates"]}
    assert rows["triton"]["status"] == "unsupported" and "head_dim 272 > 256" in rows["triton"]["reason"]
    with pytest.raises(BackendUnavailable, match="backend='triton' cannot serve this attention_varlen call: "
                                                 "triton: head_dim 272 > 256"):
        attention_varlen(*wide, cu_q, cu_k, 5, 6, backend="triton")
