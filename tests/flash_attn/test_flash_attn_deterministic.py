"""deterministic=True in gpuparity.flash_attn: repeated calls give bitwise-equal gradients whichever
backend auto would pick. On this CPU every real attention backend is deterministic, so auto is
made to pick a planted one whose backward rounds differently on every run (as an atomic dq
accumulation does on a GPU: SDPA's flash / efficient kernels): deterministic=False shows the
difference, deterministic=True must not (the call moves to a deterministic backend)."""
from __future__ import annotations

import itertools

import pytest
import torch
from device_env import TEST_DEVICE, require_device  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity.flash_attn as flash_attn
from gpuparity import dispatch, registry
from gpuparity.flash_attn import FlashAttnArgumentError, flash_attn_func, flash_attn_varlen_func
from gpuparity.flash_attn import _deterministic
from gpuparity.flash_attn import flash_attn_interface as fai
from gpuparity.ops import dropout, select
from gpuparity.registry import Backend

require_device()
DEVICE = torch.device(TEST_DEVICE)
PLANTED = "test_atomic_dq"
_RUNS = itertools.count(1)


class _RunDependentBackward(torch.autograd.Function):
    """Identity forward; the backward scales the gradient by 1 + run * 2^-20: different low bits
    on every run, as the arrival order of atomic adds gives."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * (1 + next(_RUNS) * 2.0 ** -20)


def _planted_fn(q, k, v, **kwargs):
    return _RunDependentBackward.apply(dispatch.get("attention", "composition").fn(q, k, v, **kwargs))


@pytest.fixture
def auto_picks_a_nondeterministic_backend(monkeypatch):
    """Backend "test_atomic_dq" registered for op attention, and auto's choice for every attention
    call (select.resolve and dropout.resolve, which gpuparity.attention and flash_attn read)."""
    planted = registry.register(Backend(name=PLANTED, op="attention", fn=_planted_fn, probed=False,
                                        opt_in=("dropout",)))

    def resolving(original):
        def resolve(problem, backend="auto", **kwargs):
            if problem.op == "attention" and backend in ("auto", PLANTED):
                return planted
            return original(problem, backend, **kwargs)
        return resolve

    monkeypatch.setattr(select, "resolve", resolving(select.resolve))
    monkeypatch.setattr(select, "resolve_waiting", resolving(select.resolve_waiting))
    monkeypatch.setattr(dropout, "resolve", resolving(dropout.resolve))
    _deterministic._CHOSEN.clear()
    yield planted
    registry.unregister("attention", PLANTED)
    _deterministic._CHOSEN.clear()


def _grads(call, *inputs, seed=0):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    torch.manual_seed(seed)   # the same dropout mask on each run
    out = call(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    return torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view(out.shape).to(out)).sum(), leaves)


def _assert_runs(call, inputs, equal: bool):
    first, second = _grads(call, *inputs), _grads(call, *inputs)
    same = all(torch.equal(a, b) for a, b in zip(first, second))
    assert same == equal, "gradients of two runs " + ("differ" if equal else "are bitwise equal")


def _dense_inputs():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 5, 4, 8, generator=gen).to(DEVICE)
    k, v = (torch.randn(2, 7, 2, 8, generator=gen).to(DEVICE) for _ in range(2))
    return q, k, v


@pytest.mark.usefixtures("auto_picks_a_nondeterministic_backend")
@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_flash_attn_func_deterministic_gradients(dropout_p):
    def call(deterministic):
        return lambda q, k, v: flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True, deterministic=deterministic)

    _assert_runs(call(False), _dense_inputs(), equal=False)   # observable: auto's backend is not deterministic
    _assert_runs(call(True), _dense_inputs(), equal=True)


@pytest.mark.usefixtures("auto_picks_a_nondeterministic_backend")
def test_qkvpacked_passes_deterministic_on():
    qkv = torch.randn(1, 6, 3, 2, 8, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    call = lambda deterministic: lambda t: flash_attn.flash_attn_qkvpacked_func(t, deterministic=deterministic)  # noqa: E731
    _assert_runs(call(False), (qkv,), equal=False)
    _assert_runs(call(True), (qkv,), equal=True)


@pytest.mark.usefixtures("auto_picks_a_nondeterministic_backend")
def test_varlen_composed_path_deterministic_gradients():
    """varlen with dropout runs through gpuparity.attention on a padded batch: the same choice."""
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(7, 2, 8, generator=gen).to(DEVICE) for _ in range(3))

    def call(deterministic):
        return lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, dropout_p=0.2, causal=True,
                                                      deterministic=deterministic)

    _assert_runs(call(False), (q, k, v), equal=False)
    _assert_runs(call(True), (q, k, v), equal=True)


def test_the_choice_and_refusals(auto_picks_a_nondeterministic_backend):
    q, k, v = (t.transpose(1, 2) for t in _dense_inputs())
    problem = fai.attention_problem(q, k, v, is_causal=True)
    assert fai._backend("attention", problem, False) == "auto"
    chosen = fai._backend("attention", problem, True)
    assert chosen in _deterministic.order("attention", DEVICE)
    with flash_attn.backends(attention=PLANTED):   # named and not deterministic: refused, not ignored
        with pytest.raises(FlashAttnArgumentError, match="deterministic: True needs an attention backend"):
            flash_attn_func(*_dense_inputs(), deterministic=True)
    with flash_attn.backends(attention="composition"):
        assert fai._backend("attention", problem, True) == "composition"


def test_auto_choice_kept_by_name_where_it_is_deterministic(monkeypatch):
    """Where auto's verified choice is deterministic (here made sdpa_math: auto's own verification
    on this CPU takes a minute), the call runs on it by name (not "auto", which a later call could
    resolve differently once a pending verdict lands); the waiting resolution is asked, not the
    eager one (which may answer with a baseline while the check runs)."""
    sdpa_math = dispatch.get("attention", "sdpa_math")
    monkeypatch.setattr(select, "resolve_waiting", lambda problem, backend="auto", **kwargs: sdpa_math)
    monkeypatch.setattr(select, "resolve", lambda *a, **k: pytest.fail("the eager resolution was asked"))
    q, k, v = (t.transpose(1, 2) for t in _dense_inputs())
    assert fai._backend("attention", fai.attention_problem(q, k, v), True) == "sdpa_math"
