"""The cross_entropy op's "triton" backend (cross_entropy_loss's two kernels, FlashAttention's loss)
passes the battery against float64, a kernel that drops a column fails it, and cross_entropy_loss
runs the kernels only where that backend's verdict passed: after a FAIL it runs the torch steps."""
from __future__ import annotations

import pytest
import torch

import gpuparity.flash_attn as flash_attn
from gpuparity import dispatch, priors
from gpuparity.backends import triton_cross_entropy as kernels
from gpuparity.checks import execute, selection, verdicts
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.flash_attn.ops.triton.cross_entropy import cross_entropy_loss
from gpuparity.registry import Problem

from device_env import TEST_DEVICE

DEVICE = torch.device(TEST_DEVICE)
OP = "cross_entropy"
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")
CASES = [c.name for c in get_spec(OP).cases() if c.level in ("quick", "default")]


def run_case(fn, case_name, dtype, seed=0):
    spec = get_spec(OP)
    case = next(c for c in spec.cases() if c.name == case_name)
    return execute.run_case(OP, fn, case.params, dtype, DEVICE, seed, dispatch.get(OP, spec.baseline_backend).fn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_battery_cases_pass(case, dtype):
    status, comparisons, reason = run_case(dispatch.get(OP, "triton").fn, case, dtype)
    assert status == Status.PASS, reason
    assert {c.name for c in comparisons} >= {"grad_logits"}, [c.name for c in comparisons]


def _drop_last_column(monkeypatch):
    """A planted backward kernel whose mask drops the vocabulary's last column (left zero)."""
    real = kernels.loss_backward

    def dropping(*args, **kwargs):
        out = real(*args, **kwargs)
        out[:, -1] = 0
        return out

    monkeypatch.setattr(kernels, "loss_backward", dropping)


def test_a_kernel_that_drops_a_column_fails_the_battery(monkeypatch):
    _drop_last_column(monkeypatch)
    status, comparisons, reason = run_case(kernels.triton_cross_entropy, "classes_10", torch.float32)
    assert status == Status.FAIL
    assert {c.name for c in comparisons if not c.passed} == {"grad_logits"}, reason


def test_float64_is_refused_with_its_reason():
    problem = Problem(OP, DEVICE, torch.float64)
    assert dispatch.get(OP, "triton").reasons(problem) == ["triton: no float64 kernel (has float16, bfloat16, float32)"]


@pytest.fixture
def triton_first(tmp_path, monkeypatch):
    """An empty verdict cache, checks in this process (the planted kernel is seen), and "triton"
    ranked first for the cross_entropy op on this device; the loss kernels' forward calls on
    cross_entropy_loss's (6, 21) logits (the battery's cases have no 21-class one)."""
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPARITY_PROBE", "inprocess")
    monkeypatch.setenv(selection.REFINE, "off")
    monkeypatch.delenv(selection.TRUST_UNPROBED, raising=False)
    monkeypatch.setitem(priors.PRIORS[priors.family(DEVICE)], OP, ["triton", "torch", "composition"])
    verdicts.clear_cache()
    calls = []
    real = kernels.loss_forward
    monkeypatch.setattr(kernels, "loss_forward", lambda *a, **k: calls.extend([1] if a[0].shape == (6, 21) else []) or real(*a, **k))
    yield calls
    verdicts.clear_cache()


def _loss_and_grad():
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(6, 21, generator=gen) * 2).to(DEVICE).requires_grad_()
    labels = torch.randint(0, 21, (6,), generator=gen).to(DEVICE)
    labels[2] = -100
    losses, _ = cross_entropy_loss(logits, labels, label_smoothing=0.1)
    losses.sum().backward()
    want = torch.nn.functional.cross_entropy(logits.detach().double(), labels, label_smoothing=0.1, reduction="none")
    torch.testing.assert_close(losses.detach().double(), want, rtol=1e-5, atol=1e-6)
    return logits.grad


def _triton_verdict():
    problem = Problem(OP, DEVICE, torch.float32, "default")
    return verdicts.load(verdicts.cache_path(DEVICE))[verdicts.verdict_key(problem, dispatch.get(OP, "triton"))]


def test_cross_entropy_loss_runs_the_kernels_once_their_verdict_passed(triton_first):
    with flash_attn.backends(cross_entropy="auto"):
        _loss_and_grad()
    assert _triton_verdict()["passed"] and triton_first == [1], str(_triton_verdict())


def test_cross_entropy_loss_falls_back_when_the_kernels_fail_the_battery(triton_first, monkeypatch):
    _drop_last_column(monkeypatch)
    with flash_attn.backends(cross_entropy="auto"):
        grad = _loss_and_grad()
    assert not _triton_verdict()["passed"] and triton_first == []
    assert grad[:, -1].abs().sum() > 0   # the torch steps' gradient, last column included
