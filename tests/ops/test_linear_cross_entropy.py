"""gpuparity.linear_cross_entropy: both chunked backends pass the battery spec against float64
(forward and gradients, fp32/bf16/fp16), a mutant gradient fails it, memory does not grow
with tokens x vocab, the argument checks, and the torch.library op (opcheck, fullgraph compile)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpuparity
from gpuparity.backends import ce_composition
from gpuparity.checks import execute
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.dispatch import get as get_backend

from device_env import TEST_DEVICE

DEVICE = torch.device(TEST_DEVICE)
OP = "linear_cross_entropy"
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


def run_case(fn, case_name, dtype, seed=0):
    spec = get_spec(OP)
    case = next(c for c in spec.cases() if c.name == case_name)
    baseline = get_backend(OP, spec.baseline_backend).fn
    return execute.run_case(OP, fn, case.params, dtype, DEVICE, seed, baseline)


QUICK = [c.name for c in get_spec(OP).cases() if c.level == "quick"]
DEFAULT = [c.name for c in get_spec(OP).cases() if c.level == "default"]


@pytest.mark.parametrize("backend", ["composition", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", QUICK)
def test_battery_quick_cases_pass(backend, dtype, case):
    status, comparisons, reason = run_case(get_backend(OP, backend).fn, case, dtype)
    assert status == Status.PASS, reason
    assert {c.name for c in comparisons} >= {"out", "grad_hidden", "grad_weight"}


@pytest.mark.parametrize("backend", ["composition", "triton"])
@pytest.mark.parametrize("case", DEFAULT)
def test_battery_default_cases_pass(backend, case):
    status, _, reason = run_case(get_backend(OP, backend).fn, case, torch.bfloat16)
    assert status == Status.PASS, reason


def test_a_wrong_gradient_fails_the_battery():
    def slope_dropped(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean", softcap=None):
        def rows(logits, tgt, loss_out, lse_out, scale, ignore, cap, write_grad):
            ce_composition.torch_rows(logits, tgt, loss_out, lse_out, scale, ignore, cap, write_grad)
            if write_grad and cap is not None:
                logits.mul_(1.25)  # off by the slope's order of magnitude, as a dropped factor would be
        steps = ce_composition.Steps(rows, ce_composition.torch_cols)
        return ce_composition.run(steps, hidden, weight, target, bias, ignore_index, reduction, softcap)

    status, comparisons, reason = run_case(slope_dropped, "softcap", torch.float32)
    assert status == Status.FAIL
    failed = {c.name for c in comparisons if not c.passed}
    assert "out" not in failed and "grad_hidden" in failed, reason


def test_all_ignored_mean_is_zero_with_zero_grads():
    hidden = torch.randn(5, 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(11, 8, device=DEVICE, requires_grad=True)
    target = torch.full((5,), -100, device=DEVICE)
    for backend in ("composition", "triton"):
        loss = gpuparity.linear_cross_entropy(hidden, weight, target, backend=backend)
        loss.backward()
        assert loss.item() == 0.0 and loss.dtype == torch.float32
        assert torch.count_nonzero(hidden.grad) == 0 and torch.count_nonzero(weight.grad) == 0
        hidden.grad = weight.grad = None


class LargestAllocation(TorchDispatchMode):
    """The most bytes of any tensor an op created (outputs of every aten call; bytes, since
    Triton's interpreter copies a kernel's buffers as uint8)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


@pytest.mark.parametrize("backend", ["composition", "triton"])
def test_memory_does_not_grow_with_tokens_times_vocab(backend):
    tokens, vocab, hidden_size = 128, 256, 8   # small: the triton form runs under the interpreter in CI
    hidden = torch.randn(tokens, hidden_size, device=DEVICE, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, device=DEVICE, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device=DEVICE)
    with LargestAllocation() as mode:
        loss = gpuparity.linear_cross_entropy(hidden, weight, target, backend=backend)
        loss.backward()
    rows = ce_composition.chunk_rows(tokens, vocab, hidden_size)
    assert rows < tokens
    # the largest tensor is a chunk of logits or a parameter-sized gradient, far below (tokens, vocab)
    assert mode.largest == 4 * max(rows * vocab, vocab * hidden_size, tokens * hidden_size)
    assert mode.largest <= 4 * tokens * vocab // 8
    with LargestAllocation() as materialized:
        gpuparity.linear_cross_entropy(hidden, weight, target, backend="torch").backward()
    assert materialized.largest >= 4 * tokens * vocab  # the check sees a materialised (tokens, vocab)


@pytest.mark.parametrize("backend", ["composition", "triton"])
def test_half_weight_gradient_needs_no_fp32_weight_sized_buffer(backend):
    """grad_weight comes from one GEMM per vocab block in the weight's dtype: no fp32 accumulator
    of the weight's size (the one-pass form held one, 2x a bf16 weight, at the loss's peak)."""
    tokens, vocab, hidden_size = 64, 512, 64
    hidden = torch.randn(tokens, hidden_size, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    weight = (0.1 * torch.randn(vocab, hidden_size, device=DEVICE, dtype=torch.bfloat16)).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device=DEVICE)
    with LargestAllocation() as mode:
        gpuparity.linear_cross_entropy(hidden, weight, target, backend=backend).backward()
    assert ce_composition.chunk_rows(tokens, vocab, hidden_size) * vocab < vocab * hidden_size
    assert mode.largest == 2 * vocab * hidden_size
    assert weight.grad.dtype == torch.bfloat16


def test_vocab_blocks_hold_a_chunk_of_logits():
    assert ce_composition.vocab_cols(8192, 32000, 512) == 1984          # 512 * 32000 / 8192, to a multiple of 64
    assert ce_composition.vocab_cols(4, 10, 4) == 10                    # small vocab: one block
    assert ce_composition.vocab_cols(1000, 50, 1) == 1


def test_chunk_rows_follows_liger_and_is_capped():
    assert ce_composition.chunk_rows(8192, 32000, 2048) == 512      # Liger's heuristic at issue #14's shape
    assert ce_composition.chunk_rows(1 << 20, 256000, 256) * 256000 * 4 <= ce_composition.CHUNK_BYTES
    assert ce_composition.chunk_rows(3, 10, 100) == 3


def test_second_backward_is_refused_not_wrong():
    hidden = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(9, 8, device=DEVICE)
    target = torch.randint(0, 9, (4,), device=DEVICE)
    loss = gpuparity.linear_cross_entropy(hidden, weight, target, backend="composition")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


@pytest.mark.parametrize("bad, match", [
    (dict(target=torch.tensor([0, 9, 1])), r"target: expected class indices in \[0, 9\)"),
    (dict(target=torch.tensor([0, 1])), r"target: expected shape \(3,\)"),
    (dict(weight=torch.randn(9, 5)), r"weight: expected shape \(V, H\) with H = hidden.shape\[-1\]"),
    (dict(reduction="avg"), r"reduction: expected 'mean', 'sum' or 'none'"),
    (dict(softcap=-1.0), r"softcap: expected a finite number > 0"),
    (dict(bias=torch.randn(8)), r"bias: expected shape \(9,\)"),
])
def test_arguments_are_checked(bad, match):
    args = dict(hidden=torch.randn(3, 4), weight=torch.randn(9, 4), target=torch.tensor([0, 1, -100]))
    args.update(bad)
    kwargs = {k: args.pop(k) for k in list(args) if k not in ("hidden", "weight", "target")}
    with pytest.raises((ValueError, TypeError), match=match):
        gpuparity.linear_cross_entropy(args["hidden"], args["weight"], args["target"], **kwargs)


# ----------------------------------------------------------------------------- torch.library
def _inputs(bias=True):
    hidden = torch.randn(2, 5, 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(30, 8, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 30, (2, 5), device=DEVICE)
    target[0, :2] = -100
    return hidden, weight, target, (torch.randn(30, device=DEVICE, requires_grad=True) if bias else None)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("backend", ["composition", "torch"])
def test_opcheck(reduction, backend):
    hidden, weight, target, bias = _inputs()
    torch.library.opcheck(torch.ops.gpuparity.linear_cross_entropy,
                          (hidden, weight, target, bias, -100, reduction, 4.0, backend, [True, True, True]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_compiled_fullgraph_matches_eager(reduction):
    hidden, weight, target, bias = _inputs()

    def step(h, w, b):
        loss = gpuparity.linear_cross_entropy(h, w, target, bias=b, reduction=reduction, softcap=6.0,
                                              backend="composition")
        return loss.square().sum()

    results = []
    torch._dynamo.reset()
    for run in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        out = run(hidden, weight, bias)
        results.append((out.detach(), *torch.autograd.grad(out, (hidden, weight, bias))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
    assert torch._dynamo.explain(step)(hidden, weight, bias).graph_break_count == 0
