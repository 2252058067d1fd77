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
from gpuparity.ops import library_ce as _library_ce  # noqa: F401 - registers gpuparity::linear_cross_entropy (imported lazily by the op)

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


# ----------------------------------------------------------------------------- traced one pass
def _graph_ops(fn, *args):
    """(targets of the forward graph, of the backward graph) as aot_eager traces `fn`."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    graphs = []

    def record(gm, example_inputs):
        graphs.append({str(node.target) for node in gm.graph.nodes if node.op == "call_function"})
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend=backend)(*args)
    out.backward()
    torch._dynamo.reset()
    return graphs


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("softcap", [None, 6.0])
def test_traced_triton_one_pass_matches_float64(reduction, softcap):
    """Under compile the Triton backend's loss is the LM head's GEMM, one row op and the
    backward's GEMMs in the graph (no chunked op); loss and all three gradients, with ignored
    rows, a softcap and grad_output != 1, agree with float64 autograd."""
    hidden, weight, target, bias = _inputs()

    def step(h, w, b):
        return 2.5 * gpuparity.linear_cross_entropy(h, w, target, bias=b, reduction=reduction, softcap=softcap,
                                                    backend="triton")

    forward, backward = _graph_ops(step, hidden, weight, bias)
    # the opaque op under the interpreter; on a GPU the triton_op, which AOT traces into its launch
    assert forward & {"gpuparity.cross_entropy_rows.default", "gpuparity.cross_entropy_rows_kernels.default",
                      "triton_kernel_wrapper_functional"}, forward
    assert "gpuparity.linear_cross_entropy.default" not in forward
    assert "aten.mm.default" in backward
    torch._dynamo.reset()
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(hidden, weight, bias)
    grads = torch.autograd.grad(out, (hidden, weight, bias))
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (hidden, weight, bias))
    logits = torch.nn.functional.linear(h64, w64, b64)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    ref = 2.5 * torch.nn.functional.cross_entropy(logits.reshape(-1, 30), target.reshape(-1), reduction=reduction)
    ref_grads = torch.autograd.grad(ref, (h64, w64, b64))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)
    torch._dynamo.reset()


def test_traced_one_pass_only_within_its_bytes(monkeypatch):
    """Logits above ONE_PASS_BYTES (or reduction "none") keep the chunked op."""
    from gpuparity.ops import library_ce
    hidden, weight, target, bias = _inputs()
    monkeypatch.setattr(library_ce, "ONE_PASS_BYTES", 10 * 30 * 4 - 1)

    def step(h, w, b):
        return gpuparity.linear_cross_entropy(h, w, target, bias=b, backend="triton")

    forward, _ = _graph_ops(step, hidden, weight, bias)
    assert "gpuparity.linear_cross_entropy.default" in forward and "gpuparity.cross_entropy_rows.default" not in forward


def test_cross_entropy_rows_opcheck():
    logits = torch.randn(6, 30, device=DEVICE)
    target = torch.randint(0, 30, (6,), device=DEVICE)
    target[1] = -100
    torch.library.opcheck(torch.ops.gpuparity.cross_entropy_rows, (logits, target, torch.tensor(0.2, device=DEVICE), -100, None),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("form", ["whole_row", "looping"])
@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("into", ["in_place", "new_buffer"])
def test_triton_row_kernel_forms_match_float64(monkeypatch, form, softcap, into):
    """The row kernel's two forms (the row held in registers; blocks swept twice, here 3 blocks
    with a ragged last one) and both gradient destinations: loss, logsumexp and the scaled
    gradient of each row against float64, ignored rows zero, extreme logits included."""
    from gpuparity.backends import triton_cross_entropy as tce
    if form == "looping":
        monkeypatch.setattr(tce, "WHOLE_ROW_MAX", 8)
        monkeypatch.setattr(tce, "MAX_BLOCK_V", 16)
    rows, vocab = 7, 37
    logits = torch.randn(rows, vocab, device=DEVICE) * 4
    logits[2, 5] = 80.0                      # one dominant logit: exp of the rest underflows
    logits[3] = -60.0
    target = torch.randint(0, vocab, (rows,), device=DEVICE)
    target[4] = -100
    target[2] = 36                           # the last column, in the ragged block
    scale = torch.linspace(0.5, 2.0, rows, device=DEVICE)
    loss, lse = torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE)
    work = logits.clone()
    grad = work if into == "in_place" else torch.empty_like(work)
    tce.triton_rows(work, target, loss, lse, scale, -100, softcap, True, grad_out=None if into == "in_place" else grad)
    z = logits.double().requires_grad_()
    capped = z if softcap is None else softcap * torch.tanh(z / softcap)
    per_row = torch.nn.functional.cross_entropy(capped, target, ignore_index=-100, reduction="none")
    (want_grad,) = torch.autograd.grad((per_row * scale.double()).sum(), z)
    valid = target != -100
    torch.testing.assert_close(loss.double(), per_row.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double()[valid], torch.logsumexp(capped, -1).detach()[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), want_grad, rtol=1e-4, atol=1e-6)
    if into == "new_buffer":
        torch.testing.assert_close(work, logits)         # the logits themselves untouched
