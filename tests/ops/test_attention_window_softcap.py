"""gpuparity.attention's sliding window (FlashAttention's window_size, top-left aligned) and
Gemma-2 logit softcap: forward and backward against the float64 reference under the tolerance
policy (Triton under the interpreter, composition and sdpa_math on the CPU), edge cases,
argument errors, the dispatcher's reasons and the torch.library op under torch.compile."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE  # sets TRITON_INTERPRET=1 on the CPU before triton imports

import gpuparity  # noqa: E402
from gpuparity import dispatch, reference  # noqa: E402
from gpuparity.contracts import attention as attention_contract  # noqa: E402
from gpuparity.registry import BackendUnavailable  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402
from gpuparity.ops.attention import attention, attention_problem  # noqa: E402


DEVICE = torch.device(TEST_DEVICE)


def qkv(batch=1, heads=2, kv_heads=1, q_len=20, k_len=20, head_dim=16, logit_scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, head_dim, generator=gen) * logit_scale
    k = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def padding(batch, k_len, lengths):
    return (torch.arange(k_len).view(1, k_len) >= torch.tensor(lengths).view(batch, 1)).to(DEVICE)


def cpu(value):
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def check(backend, q, k, v, **kwargs):
    """Forward and q/k/v gradients of `backend` against float64 under the tolerance policy."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, backend=backend, **kwargs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(q.dtype).to(DEVICE)
    out.backward(grad)
    # the referee: float64 on the CPU
    ref_leaves = [cpu(t).double().requires_grad_() for t in (q, k, v)]
    ref_kwargs = {name: (cpu(value).double() if isinstance(value, torch.Tensor) and value.is_floating_point()
                         else cpu(value)) for name, value in kwargs.items()}
    ref = reference.attention(*ref_leaves, **ref_kwargs)
    ref.backward(cpu(grad).double())
    base_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    base = attention_contract.composition(*base_leaves, **kwargs)
    base.backward(grad)
    assert not torch.isnan(out).any()
    masks = {name: cpu(kwargs[name]) for name in ("key_padding_mask", "is_causal", "window") if name in kwargs}
    empty = reference.empty_query_rows(q.shape[2], k.shape[2], q.shape[0], q.shape[1], **masks)
    results = [judge("out", cpu(out), ref, cpu(base), q.dtype, valid=~empty, must_be_zero=empty)]
    for name, mine, theirs, baseline in zip(("dq", "dk", "dv"), leaves, ref_leaves, base_leaves):
        results.append(judge(name, cpu(mine.grad), theirs.grad, cpu(baseline.grad), q.dtype))
    for result in results:
        assert result.passed, result.reason
    return cpu(out), empty


BACKENDS = ["triton", "composition", "sdpa_math"]
WINDOW_CASES = {
    "local": dict(window=(4, 2)),
    "left_only_causal": dict(window=(5, -1), is_causal=True),
    "left_0": dict(window=(0, 3)),
    "right_0": dict(window=(3, 0)),
    "diagonal_only": dict(window=(0, 0)),
    "covers_all": dict(window=(20, 20)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
def test_window_matches_the_reference(backend, case):
    q, k, v = qkv(q_len=37, k_len=37)
    check(backend, q, k, v, **WINDOW_CASES[case])


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_is_a_band_of_the_scores(backend):
    """Out of the window means out of the softmax: a key past the band changes nothing."""
    q, k, v = qkv(q_len=12, k_len=12)
    out = attention(q, k, v, window=(2, 1), backend=backend)
    v2 = v.clone()
    v2[..., 11, :] += 100.0  # key 11 is in the windows of rows 9..11 only
    out2 = attention(q, k, v2, window=(2, 1), backend=backend)
    assert torch.equal(out[..., :9, :], out2[..., :9, :])
    assert not torch.allclose(out[..., 9:, :], out2[..., 9:, :])


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_window_sq_ne_sk_and_padding_leave_empty_rows_as_zeros(backend):
    """Top-left alignment: with Sq > Sk, rows past the keys (plus the window) have no key left."""
    q, k, v = qkv(batch=2, q_len=45, k_len=20, seed=3)
    out, empty = check(backend, q, k, v, window=(1, 2), key_padding_mask=padding(2, 20, [20, 6]))
    assert empty.any()
    assert torch.equal(out.masked_fill(~empty, 0.0), torch.zeros_like(out))


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_softcap_matches_the_reference_with_hostile_logits(backend):
    q, k, v = qkv(batch=2, q_len=33, k_len=33, logit_scale=30.0, seed=4)
    check(backend, q, k, v, softcap=20.0, key_padding_mask=padding(2, 33, [33, 9]))


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_window_and_softcap_with_padding_causal_and_float_mask(backend):
    q, k, v = qkv(batch=2, heads=4, kv_heads=2, q_len=29, k_len=41, seed=5)
    bias = torch.randn(29, 41, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    check(backend, q, k, v, window=(6, 3), softcap=5.0, is_causal=True, attn_mask=bias,
          key_padding_mask=padding(2, 41, [41, 15]))


def test_triton_window_with_padding_holes_gqa_and_bf16():
    """Key padding with holes (the forward's per-tile padding path) and bf16 under the policy."""
    q, k, v = (t.to(torch.bfloat16) for t in qkv(batch=2, heads=4, kv_heads=2, q_len=40, k_len=40, seed=8))
    holes = torch.zeros(2, 40, dtype=torch.bool, device=DEVICE)
    holes[0, 5:9] = True
    holes[1, 0:3] = True
    holes[1, 30:] = True
    check("triton", q, k, v, window=(3, 5), softcap=10.0, key_padding_mask=holes)


def test_softcap_bounds_the_scores():
    """softcap c: every score lies in (-c, c), so softmax weights differ at most by exp(2c)."""
    q, k, v = qkv(q_len=8, k_len=8, logit_scale=1000.0)
    out = attention(q, k, v, softcap=0.5, backend="composition")
    plain = attention(q, k, v, backend="composition")
    assert (out - v.mean(2, keepdim=True).expand_as(out)).abs().max() < (plain - v.mean(2, keepdim=True)).abs().max()
    torch.testing.assert_close(cpu(out), reference.attention(cpu(q).double(), cpu(k).double(), cpu(v).double(),
                                                             softcap=0.5).float(),
                               atol=1e-5, rtol=1e-5)


def test_off_values_change_nothing():
    q, k, v = qkv()
    plain = attention(q, k, v, backend="composition")
    assert torch.equal(attention(q, k, v, window=(-1, -1), softcap=0.0, backend="composition"), plain)
    assert attention_problem(q, k, v, window=(-1, -1), softcap=0).kind == "none"
    assert attention_problem(q, k, v, window=(3, -1), softcap=2.0, is_causal=True).kind == "causal+window+softcap"


# --------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("window, error, text", [
    ((3,), TypeError, "window: expected"),
    ("33", TypeError, "window: expected"),
    ((1.5, 2), TypeError, "window: expected a pair"),
    ((True, 2), TypeError, "window: expected a pair"),
    ((-2, 0), ValueError, ">= -1"),
    ((21, 0), ValueError, "larger than the sequence"),
    ((0, 99), ValueError, "pass -1"),
])
def test_bad_window_names_the_argument(window, error, text):
    q, k, v = qkv(q_len=20, k_len=20)
    with pytest.raises(error, match=text):
        attention(q, k, v, window=window, backend="composition")


@pytest.mark.parametrize("softcap, error", [(-1.0, ValueError), (float("inf"), ValueError), (float("nan"), ValueError),
                                            ("5", TypeError), (True, TypeError)])
def test_bad_softcap_names_the_argument(softcap, error):
    q, k, v = qkv()
    with pytest.raises(error, match="softcap"):
        attention(q, k, v, softcap=softcap, backend="composition")


# --------------------------------------------------------------------------- dispatch
def test_backends_refuse_softcap_and_window_with_reasons():
    q, k, v = qkv(q_len=16, k_len=16)
    capped = attention_problem(q.half(), k.half(), v.half(), softcap=30.0)
    cuda_capped = type(capped)(capped.op, torch.device("cuda"), capped.dtype, capped.kind, capped.features)
    for name in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
        supports = dispatch.get("attention", name).supports
        assert any("softcap" in reason for reason in supports(cuda_capped)), name
    assert any("sliding window" in r for r in dispatch.get("attention", "sdpa_flash").supports(
        attention_problem(q, k, v, window=(2, 2))))
    assert any("flex" in r and "softcap" in r for r in dispatch.get("attention", "flex").supports(cuda_capped))
    with pytest.raises(BackendUnavailable, match="sdpa_math: SDPA has no logit softcap"):
        attention(q, k, v, softcap=30.0, backend="sdpa_math")


# --------------------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("backend", ["composition", "triton"])
def test_compile_through_the_library_op_has_no_graph_break(backend):
    q, k, v = qkv(q_len=10, k_len=10)
    kpm = padding(1, 10, [7])

    def fn(q_, k_, v_):
        return gpuparity.attention(q_, k_, v_, key_padding_mask=kpm, window=(3, 1), softcap=4.0, backend=backend)

    torch._dynamo.reset()
    assert torch._dynamo.explain(fn)(q, k, v).graph_break_count == 0
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    grads = []
    for run in (fn, compiled):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*leaves)
        out.sum().backward()
        grads.append((out.detach(), *[t.grad for t in leaves]))
    for eager, traced in zip(*grads):
        torch.testing.assert_close(traced, eager, atol=1e-5, rtol=1e-4)


def test_opcheck_with_window_and_softcap():
    q, k, v = (t.requires_grad_() for t in qkv(q_len=6, k_len=7, head_dim=8))
    torch.library.opcheck(torch.ops.gpuparity.attention,
                          (q, k, v, None, padding(1, 7, [5]), False, None, False, "sdpa_math", [2, 1], None))
    torch.library.opcheck(torch.ops.gpuparity.attention,
                          (q, k, v, None, None, True, 0.3, False, "composition", [2, -1], 3.0))
