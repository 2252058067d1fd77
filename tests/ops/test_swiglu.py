"""gpuparity.swiglu: the Triton and torch backends pass the battery spec against float64 (forward
and gradients), a wrong derivative fails it, the Triton backward keeps gate and up only (no
activation), the argument checks, and the torch.library op (opcheck, fullgraph compile)."""
from __future__ import annotations

import pytest
import torch

import gpuparity
from gpuparity.backends import triton_swiglu
from gpuparity.checks import execute
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.dispatch import get as get_backend

from device_env import TEST_DEVICE

DEVICE = torch.device(TEST_DEVICE)
OP = "swiglu"
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")
QUICK = [c.name for c in get_spec(OP).cases() if c.level == "quick"]
DEFAULT = [c.name for c in get_spec(OP).cases() if c.level == "default"]


def run_case(fn, case_name, dtype, seed=0):
    spec = get_spec(OP)
    case = next(c for c in spec.cases() if c.name == case_name)
    return execute.run_case(OP, fn, case.params, dtype, DEVICE, seed, get_backend(OP, spec.baseline_backend).fn)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", QUICK)
def test_battery_quick_cases_pass(backend, dtype, case):
    status, comparisons, reason = run_case(get_backend(OP, backend).fn, case, dtype)
    assert status == Status.PASS, reason
    assert {c.name for c in comparisons} >= {"out", "grad_gate", "grad_up"}


@pytest.mark.parametrize("case", DEFAULT)
def test_battery_default_cases_pass(case):
    status, _, reason = run_case(get_backend(OP, "triton").fn, case, torch.bfloat16)
    assert status == Status.PASS, reason


def test_a_wrong_derivative_fails_the_battery(monkeypatch):
    def silu_slope_is_sigmoid(grad, gate, up):   # drops the g * s * (1 - s) term of silu's derivative
        s = torch.sigmoid(gate.float())
        return (grad.float() * up.float() * s).to(gate.dtype), (grad.float() * gate.float() * s).to(up.dtype)

    monkeypatch.setattr(triton_swiglu, "swiglu_backward", silu_slope_is_sigmoid)
    status, comparisons, reason = run_case(triton_swiglu.triton_swiglu, "basic", torch.float32)
    assert status == Status.FAIL
    assert {c.name for c in comparisons if not c.passed} == {"grad_gate"}, reason


def _saved(fn, gate, up):
    saved = []

    def pack(t):
        saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(gate, up).sum().backward()
    return saved


def test_triton_backward_keeps_gate_and_up_not_the_activation():
    both = torch.randn(6, 2 * 40, device=DEVICE, requires_grad=True)
    gate, up = both.chunk(2, dim=-1)
    saved = _saved(lambda g, u: gpuparity.swiglu(g, u, backend="triton"), gate, up)
    assert len(saved) == 2 and {t.data_ptr() for t in saved} == {gate.data_ptr(), up.data_ptr()}
    # the eager composition keeps the activation as well (what the patch saves in an HF MLP)
    assert len(_saved(lambda g, u: gpuparity.swiglu(g, u, backend="torch"), gate, up)) == 3


@pytest.mark.parametrize("gate, up, match", [
    (torch.randn(3, 4), torch.randn(3, 5), r"up: expected the shape of gate \(3, 4\)"),
    (torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64), r"up: expected dtype float32"),
    (torch.randn(3, 4), "x", r"up: expected a torch.Tensor"),
    (torch.tensor(1.0), torch.tensor(1.0), r"at least 1-D"),
    (torch.ones(3, 4, dtype=torch.int64), torch.ones(3, 4, dtype=torch.int64), r"gate: expected"),
])
def test_arguments_are_checked(gate, up, match):
    with pytest.raises((TypeError, ValueError), match=match):
        gpuparity.swiglu(gate, up)


@pytest.mark.parametrize("backend", ["composition", "torch"])
def test_opcheck(backend):
    gate = torch.randn(3, 5, 16, device=DEVICE, requires_grad=True)
    up = torch.randn(3, 5, 16, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.gpuparity.swiglu, (gate, up, backend))


def test_compiled_fullgraph_matches_eager():
    both = torch.randn(4, 2 * 24, device=DEVICE, requires_grad=True)

    def step(x):
        gate, up = x.chunk(2, dim=-1)
        return gpuparity.swiglu(gate, up, backend="triton").square().sum()

    results = []
    torch._dynamo.reset()
    for run in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        out = run(both)
        results.append((out.detach(), *torch.autograd.grad(out, (both,))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
    assert torch._dynamo.explain(step)(both).graph_break_count == 0


@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (7,)], ids=["no_rows", "no_cols", "one_dim"])
def test_empty_and_one_dim_inputs(shape):
    gate = torch.randn(shape, device=DEVICE, requires_grad=True)
    up = torch.randn(shape, device=DEVICE, requires_grad=True)
    out = gpuparity.swiglu(gate, up, backend="triton")
    expected = torch.nn.functional.silu(gate.detach()) * up.detach()
    torch.testing.assert_close(out.detach(), expected)
    out.sum().backward()
    assert gate.grad.shape == gate.shape and up.grad.shape == up.shape
    torch.testing.assert_close(up.grad, torch.nn.functional.silu(gate.detach()))
