"""gpuparity.attention(dropout_p=...): forward and backward against the float64 reference with the
mask gpuparity.attention_dropout_mask regenerates (a mask off by one column fails), the dropped
fraction and E[out] statistically, repeatability for a seed, argument errors, who may serve it
(auto verifies with a same-mask self-check) and the torch.library op under torch.compile."""
from __future__ import annotations

import math

import pytest
import torch
from device_env import TEST_DEVICE  # sets TRITON_INTERPRET=1 on the CPU before triton imports

import gpuparity  # noqa: E402
from gpuparity import dispatch, reference  # noqa: E402
from gpuparity.registry import Backend, BackendUnavailable, register, unregister  # noqa: E402
from gpuparity.contracts.attention import composition  # noqa: E402
from gpuparity.backends.triton_attention.launch import SEED_LIMIT, dropout_seed  # noqa: E402
from gpuparity.checks import selection  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402
from gpuparity.ops import dropout as dropout_ops  # noqa: E402
from gpuparity.ops.attention import attention, attention_problem, explain_attention  # noqa: E402

DEVICE = torch.device(TEST_DEVICE)
P = 0.3


def qkv(batch=2, heads=4, kv_heads=2, q_len=19, k_len=37, head_dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, q_len, head_dim), (batch, kv_heads, k_len, head_dim), (batch, kv_heads, k_len, head_dim))
    return [torch.randn(*shape, generator=gen).to(DEVICE) for shape in shapes]


def padding(batch, k_len, lengths):
    return (torch.arange(k_len).view(1, k_len) >= torch.tensor(lengths).view(batch, 1)).to(DEVICE)


def run(q, k, v, grad, seed, **kwargs):
    """out and q/k/v grads of gpuparity.attention with dropout, torch seeded with `seed`."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(seed)
    out = attention(*leaves, dropout_p=P, **kwargs)
    out.backward(grad)
    return [out.detach().cpu()] + [t.grad.detach().cpu() for t in leaves]


def kernel_seed(seed):
    torch.manual_seed(seed)
    return dropout_ops.draw_seed(DEVICE)


def same_mask_failures(q, k, v, keep, got, grad, **masks):
    """The tolerance policy's verdicts of `got` (out, dq, dk, dv) against float64 with `keep`."""
    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ref = reference.attention_dropout(*ref_leaves, keep, P, **masks)
    ref.backward(grad.cpu().double())
    base_leaves = [t.detach().cpu().requires_grad_() for t in (q, k, v)]   # same mask, in the call's dtype
    base = reference.attention_dropout(*base_leaves, keep, P, **masks)
    base.backward(grad.cpu())
    empty = reference.empty_query_rows(q.shape[2], k.shape[2], q.shape[0], q.shape[1],
                                       **{name: value for name, value in masks.items() if name != "softcap"})
    results = [judge("out", got[0], ref, base, q.dtype, valid=~empty, must_be_zero=empty)]
    results += [judge(name, mine, theirs.grad, baseline.grad, q.dtype) for name, mine, theirs, baseline in
                zip(("dq", "dk", "dv"), got[1:], ref_leaves, base_leaves)]
    return [r.reason for r in results if not r.passed]


CASES = {
    "plain": dict(),
    "gqa-padding-causal": dict(key_padding_mask=[37, 20], is_causal=True),
    "window-softcap": dict(window=(5, 3), softcap=4.0),
}


def masks_of(case):
    kwargs = dict(CASES[case])
    if "key_padding_mask" in kwargs:
        kwargs["key_padding_mask"] = padding(2, 37, kwargs["key_padding_mask"])
    return kwargs


@pytest.mark.parametrize("case", sorted(CASES))
def test_triton_dropout_equals_the_reference_with_the_regenerated_mask(case):
    q, k, v = qkv()
    masks = masks_of(case)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    got = run(q, k, v, grad, 11, backend="triton", **masks)
    keep = gpuparity.attention_dropout_mask(2, 4, 19, 37, P, kernel_seed(11), DEVICE).cpu()
    ref_masks = {name: (value.cpu() if isinstance(value, torch.Tensor) else value) for name, value in masks.items()}
    assert not same_mask_failures(q, k, v, keep, got, grad, **ref_masks)
    # a mutant: the mask off by one column must fail the same check
    assert same_mask_failures(q, k, v, keep.roll(1, dims=-1), got, grad, **ref_masks)


def test_dropped_fraction_is_binomial_and_masks_differ_by_head_and_seed():
    batch, heads, q_len, k_len = 2, 4, 64, 96
    keep = gpuparity.attention_dropout_mask(batch, heads, q_len, k_len, P, 123, DEVICE).cpu()
    n = keep.numel()
    dropped = int((~keep).sum())
    assert abs(dropped - n * P) <= 5 * math.sqrt(n * P * (1 - P)), (dropped, n * P)
    flat = keep.view(batch * heads, -1)
    assert all(not torch.equal(flat[0], flat[i]) for i in range(1, batch * heads))
    assert not torch.equal(keep, gpuparity.attention_dropout_mask(batch, heads, q_len, k_len, P, 124, DEVICE).cpu())
    assert torch.equal(keep, gpuparity.attention_dropout_mask(batch, heads, q_len, k_len, P, 123, DEVICE).cpu())
    assert gpuparity.attention_dropout_mask(1, 1, 8, 8, 0.0, 5, DEVICE).all()


def test_expected_output_is_the_output_without_dropout():
    q, k, v = qkv(batch=1, heads=2, kv_heads=2, q_len=8, k_len=24, head_dim=8)
    v = 1.0 + 0.1 * v   # values of one sign: a wrong rescaling moves the mean far more than the noise
    plain = attention(q, k, v, backend="triton").cpu().double()
    runs = torch.stack([attention(q, k, v, dropout_p=P, generator=torch.Generator().manual_seed(s),
                                  backend="triton").cpu().double() for s in range(48)])
    mean = runs.mean(0)
    bound = 4 * math.sqrt(runs.var(0).sum().item() / runs.shape[0])
    assert torch.linalg.vector_norm(mean - plain) <= bound
    # the test can fail: without the 1 / (1 - p) rescaling the mean is off by far more
    assert torch.linalg.vector_norm(mean * (1 - P) - plain) > bound


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_same_seed_same_output_and_grads_different_seed_different(backend):
    q, k, v = qkv(q_len=9, k_len=13)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    first, again, other = (run(q, k, v, grad, seed, backend=backend) for seed in (1, 1, 2))
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])
    gen_runs = [attention(q, k, v, dropout_p=P, generator=torch.Generator().manual_seed(9), backend=backend)
                for _ in range(2)]
    assert torch.equal(gen_runs[0], gen_runs[1])


def test_dropout_zero_is_the_plain_call():
    q, k, v = qkv(q_len=9, k_len=13)
    plain = attention_problem(q, k, v)
    assert attention_problem(q, k, v, dropout_p=0.0) == plain
    assert attention_problem(q, k, v, dropout_p=0.1) != plain
    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert torch.equal(attention(q, k, v, dropout_p=0.0, backend="triton"), attention(q, k, v, backend="triton"))
    assert torch.equal(torch.get_rng_state(), state)   # no seed drawn without dropout


@pytest.mark.parametrize("bad,error", [(-0.1, ValueError), (1.0, ValueError), (float("nan"), ValueError),
                                       ("0.1", TypeError), (True, TypeError)])
def test_bad_dropout_p_names_the_argument(bad, error):
    q, k, v = qkv(q_len=4, k_len=4)
    with pytest.raises(error, match="dropout_p"):
        attention(q, k, v, dropout_p=bad)


def test_bad_generator_names_the_argument():
    q, k, v = qkv(q_len=4, k_len=4)
    with pytest.raises(TypeError, match="generator"):
        attention(q, k, v, dropout_p=0.1, generator=3, backend="triton")


def test_backends_without_dropout_refuse_it_and_auto_verifies_with_the_same_mask(monkeypatch):
    q, k, v = qkv(q_len=9, k_len=13)
    with pytest.raises(BackendUnavailable, match="sdpa_math: does not implement dropout"):
        attention(q, k, v, dropout_p=P, backend="sdpa_math")

    def own_rng(q_, k_, v_, *, dropout_p=0.0, seed=None, **kwargs):   # dropout with another mask
        return composition(q_, k_, v_, dropout_p=dropout_p, seed=(seed or 0) + 1, **kwargs)

    # the battery (no dropout) passes everyone here; the dropout self-check decides
    monkeypatch.setattr(selection, "verdict_for", lambda p, b: {"passed": True, "reason": "planted", "time_ms": 1.0})
    register(Backend("planted_rng", "attention", own_rng, "dropout from its own RNG", device_types=("cpu", "cuda"),
                     opt_in=("dropout",)))
    try:
        rows = {row["name"]: row for row in explain_attention(q, k, v, dropout_p=P)["candidates"]}
        assert rows["planted_rng"]["status"] == "failed-probe", rows["planted_rng"]
        assert rows["planted_rng"]["reason"].startswith("dropout self-check: out")
        assert rows["triton"]["status"] == "verified", rows["triton"]
        assert rows["sdpa_math"]["status"] == "unsupported"
        assert rows["composition"]["status"] == "fallback"
        torch.manual_seed(4)
        out = attention(q, k, v, dropout_p=P)
        torch.manual_seed(4)
        assert torch.equal(out, attention(q, k, v, dropout_p=P, backend="triton"))
    finally:
        unregister("attention", "planted_rng")
        dispatch.forget()


def test_seed_from_a_device_generator_needs_no_device_read():
    class CudaLikeGenerator:   # a CUDA generator's seed and offset are host values
        device = torch.device("cuda")

        def __init__(self):
            self.offset = 8

        def initial_seed(self):
            return 42

        def get_offset(self):
            return self.offset

        def set_offset(self, offset):
            self.offset = offset

    gen = CudaLikeGenerator()
    first, second = dropout_seed(torch.device("cuda"), gen), dropout_seed(torch.device("cuda"), gen)
    assert first != second and gen.offset == 16
    assert 0 <= first < SEED_LIMIT and 0 <= second < SEED_LIMIT
    gen.offset = 8
    assert dropout_seed(torch.device("cuda"), gen) == first


# --------------------------------------------------------------------------- torch.compile
def test_compile_with_dropout_has_no_graph_break_and_replays_the_mask_in_the_backward():
    q, k, v = qkv(q_len=9, k_len=13)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)

    def fn(q_, k_, v_):
        return gpuparity.attention(q_, k_, v_, is_causal=True, dropout_p=P, backend="triton")

    torch._dynamo.reset()
    assert torch._dynamo.explain(fn)(q, k, v).graph_break_count == 0
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(21)
    out = compiled(*leaves)
    out.backward(grad)
    torch.manual_seed(21)   # the graph draws its seed as torch.randint(0, 2**30, ()) from the default generator
    seed = int(torch.randint(0, SEED_LIMIT, (), dtype=torch.int64))
    keep = gpuparity.attention_dropout_mask(2, 4, 9, 13, P, seed, DEVICE).cpu()
    got = [out.detach().cpu()] + [t.grad.cpu() for t in leaves]
    assert not same_mask_failures(q, k, v, keep, got, grad, is_causal=True)
    torch.manual_seed(22)
    assert not torch.equal(compiled(q, k, v), out.detach())   # a new seed on every run


@pytest.mark.parametrize("backend", ["composition", "triton"])
def test_opcheck_with_dropout(backend):
    q, k, v = (t.requires_grad_() for t in qkv(q_len=6, k_len=7, head_dim=8))
    torch.library.opcheck(torch.ops.gpuparity.attention,
                          (q, k, v, None, padding(2, 7, [5, 7]), False, None, False, backend, None, None, P,
                           torch.tensor(77)))


def test_the_dropout_self_check_survives_clearing_every_cache():
    """caches.clear_all empties what is registered there; the self-check case's sizes are a
    constant, so a dropout self-check after it still runs (it failed with KeyError: 'heads')."""
    from gpuparity import caches
    caches.clear_all()
    problem = attention_problem(*qkv()[:3], dropout_p=0.3)
    found = dropout_ops.verdict(problem, dispatch.get("attention", "composition"))
    assert "passed" in found
