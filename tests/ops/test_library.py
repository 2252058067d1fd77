"""The ops as torch.library custom ops: opcheck passes for each, torch.compile(fullgraph=True)
over the ops, the nn drop-ins and a patched model has zero graph breaks and the eager
gradients, torch.export gives a graph of gpuparity:: ops, and the backward serves with the
backend the forward used."""
from __future__ import annotations

import pytest
import torch

import gpuparity
from gpuparity import dispatch
from gpuparity.checks import selection
from gpuparity.ops import library
from gpuparity.ops import swiglu as _swiglu  # noqa: F401 - registers gpuparity::swiglu and its twin
from gpuparity.ops import norms as _norms  # noqa: F401 - registers gpuparity::rms_norm, ::layer_norm and twins
from gpuparity.ops import rotary as _rotary  # noqa: F401 - registers gpuparity::apply_rotary(_pair) and twins

from device_env import TEST_DEVICE

DEVICE = torch.device(TEST_DEVICE)
# Named backends keep these tests free of probing; one test below goes through "auto".
NORM_BACKEND = "torch"
ATTN_BACKEND = "sdpa_math"
ROPE_BACKEND = "composition"


def randn(*shape, grad=True, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE, dtype=dtype).requires_grad_(grad)


def rotary_tables(seqlen, rotary_dim):
    angle = torch.arange(seqlen, device=DEVICE)[:, None] * torch.rand(rotary_dim // 2, device=DEVICE)
    return angle.cos(), angle.sin()


def padding(batch, k_len, lengths):
    return torch.arange(k_len, device=DEVICE)[None, :] >= torch.tensor(lengths, device=DEVICE)[:, None]


# ----------------------------------------------------------------------------- opcheck
OPCHECK_CASES = {
    "rms_norm": lambda: (torch.ops.gpuparity.rms_norm, (randn(3, 5, 8), [8], randn(8), None, NORM_BACKEND)),
    "rms_norm-no-weight": lambda: (torch.ops.gpuparity.rms_norm, (randn(2, 7), [7], None, 1e-6, NORM_BACKEND)),
    "layer_norm": lambda: (torch.ops.gpuparity.layer_norm, (randn(4, 2, 6), [2, 6], randn(2, 6), randn(2, 6),
                                                            1e-5, NORM_BACKEND)),
    "attention-padding-gqa": lambda: (torch.ops.gpuparity.attention, (
        randn(2, 4, 5, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 8), None, padding(2, 6, [6, 3]), False, None, False,
        ATTN_BACKEND)),
    "attention-causal": lambda: (torch.ops.gpuparity.attention, (
        randn(1, 2, 5, 8), randn(1, 2, 5, 8), randn(1, 2, 5, 8), None, None, True, 0.3, False, ATTN_BACKEND)),
    "attention-float-mask-grad": lambda: (torch.ops.gpuparity.attention, (
        randn(1, 2, 3, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 4), randn(1, 1, 3, 5), None, False, None, True,
        ATTN_BACKEND)),
    "rotary-half": lambda: (torch.ops.gpuparity.apply_rotary, (
        randn(2, 5, 3, 8), *rotary_tables(7, 6), False, 2, None, None, None, ROPE_BACKEND)),
    "rotary-varlen-interleaved": lambda: (torch.ops.gpuparity.apply_rotary, (
        randn(9, 2, 8), *rotary_tables(9, 8), True, 0, torch.tensor([0, 1], device=DEVICE),
        torch.tensor([0, 4, 9], device=DEVICE, dtype=torch.int32), None, ROPE_BACKEND)),
    # a composition has no pair launch: the op's body rotates q and k one after the other
    "rotary-pair": lambda: (torch.ops.gpuparity.apply_rotary_pair, (
        randn(2, 5, 4, 8), randn(2, 5, 2, 8), *rotary_tables(7, 8), False, False, ROPE_BACKEND)),
}


# The triton_op twins (gpuparity::<op>_kernels, torch >= 2.6): the same bodies, traced by inductor
# with their Triton launches wrapped; here served by the torch backends (opcheck runs them eagerly
# and under fake tensors, autograd and AOT dispatch).
if library.TRITON_OP:
    OPCHECK_CASES.update({
        "rms_norm_kernels": lambda: (torch.ops.gpuparity.rms_norm_kernels,
                                     (randn(3, 5, 8), [8], randn(8), None, NORM_BACKEND)),
        "layer_norm_kernels": lambda: (torch.ops.gpuparity.layer_norm_kernels,
                                       (randn(4, 6), [6], randn(6), randn(6), 1e-5, NORM_BACKEND)),
        "attention_kernels": lambda: (torch.ops.gpuparity.attention_kernels, (
            randn(2, 4, 5, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 8), None, padding(2, 6, [6, 3]), True, None,
            False, ATTN_BACKEND)),
        "apply_rotary_kernels": lambda: (torch.ops.gpuparity.apply_rotary_kernels, (
            randn(2, 5, 3, 8), *rotary_tables(7, 6), False, 2, None, None, None, ROPE_BACKEND)),
        "swiglu_kernels": lambda: (torch.ops.gpuparity.swiglu_kernels, (randn(3, 8), randn(3, 8), "torch")),
        "apply_rotary_pair_kernels": lambda: (torch.ops.gpuparity.apply_rotary_pair_kernels, (
            randn(2, 5, 4, 8), randn(2, 5, 2, 8), *rotary_tables(7, 8), True, True, ROPE_BACKEND)),
    })


@pytest.mark.parametrize("case", sorted(OPCHECK_CASES))
def test_opcheck(case):
    op, args = OPCHECK_CASES[case]()
    if case.endswith("_kernels"):
        # a twin serves static shapes only (library._kernels_traceable; the opaque op takes
        # dynamic ones): its body keys the backend choice on concrete sizes
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration",
                                                    "test_faketensor", "test_aot_dispatch_static"))
    else:
        torch.library.opcheck(op, args)


# ----------------------------------------------------------------------------- compile
def graph_breaks(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count


def compiled_matches_eager(fn, inputs, atol=1e-5):
    """fullgraph compile (aot_eager: the same graph, no codegen) gives eager's outputs and grads."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    results = []
    for run in (fn, compiled):
        for t in inputs:
            t.grad = None
        out = run(*inputs)
        out.square().sum().backward()
        results.append((out.detach(), [t.grad.clone() for t in inputs if t.requires_grad]))
    (eager_out, eager_grads), (comp_out, comp_grads) = results
    torch.testing.assert_close(comp_out, eager_out, atol=atol, rtol=1e-4)
    for eager_grad, comp_grad in zip(eager_grads, comp_grads):
        torch.testing.assert_close(comp_grad, eager_grad, atol=atol, rtol=1e-4)


def norms_model(x, w, b):
    h = gpuparity.rms_norm(x, (x.shape[-1],), w, backend=NORM_BACKEND)
    return gpuparity.layer_norm(h, (x.shape[-1],), w, b, backend=NORM_BACKEND)


def attention_model(q, k, v):
    pad = padding(q.shape[0], k.shape[2], [k.shape[2], 2])
    return gpuparity.attention(q, k, v, key_padding_mask=pad, backend=ATTN_BACKEND)


def rotary_model(x, cos, sin):
    return gpuparity.apply_rotary(x, cos, sin, seqlen_offsets=3, backend=ROPE_BACKEND)


MODELS = {
    "norms": (norms_model, lambda: (randn(2, 3, 16), randn(16), randn(16))),
    "attention": (attention_model, lambda: (randn(2, 4, 5, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 8))),
    "rotary": (rotary_model, lambda: (randn(2, 5, 3, 8), *rotary_tables(8, 4))),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fullgraph_compile_has_no_graph_break_and_eager_gradients(name):
    fn, make = MODELS[name]
    inputs = make()
    assert graph_breaks(fn, *inputs) == 0
    compiled_matches_eager(fn, inputs)


def test_nn_drop_ins_and_a_patched_model_compile_without_graph_breaks(monkeypatch):
    monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "1")   # patch() leaves backend="auto": no probing here
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.RMSNorm(16))
    assert len(gpuparity.patch(model)) == 2
    from gpuparity.nn.attention import MultiheadAttention
    mha = MultiheadAttention(16, 4, batch_first=True, backend=ATTN_BACKEND)
    model, mha = model.to(DEVICE), mha.to(DEVICE)

    def step(x, pad):
        h = model(x)
        return mha(h, h, h, key_padding_mask=pad, need_weights=False)[0]

    x, pad = randn(2, 5, 16), padding(2, 5, [5, 3])
    assert graph_breaks(step, x, pad) == 0
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, pad), step(x, pad), atol=1e-5, rtol=1e-4)


def test_export_traces_compositions_inline_and_keeps_kernels_as_ops():
    """torch.export: a backend that is a torch composition (sdpa, torch's rms_norm) is traced
    inline (aten ops in the graph, no gpuparity op); a Triton backend stays one gpuparity op
    (under the interpreter the opaque custom op; on a GPU the triton_op twin)."""
    class Block(torch.nn.Module):
        def __init__(self, attention_backend):
            super().__init__()
            self.attention_backend = attention_backend

        def forward(self, q, k, v, w):
            out = gpuparity.attention(q, k, v, is_causal=True, backend=self.attention_backend)
            return gpuparity.rms_norm(out, (out.shape[-1],), w, backend=NORM_BACKEND)

    args = (randn(1, 2, 4, 8, grad=False), randn(1, 2, 4, 8, grad=False), randn(1, 2, 4, 8, grad=False),
            randn(8, grad=False))
    exported = torch.export.export(Block(ATTN_BACKEND), args)
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert not [t for t in targets if t.startswith("gpuparity.")], targets
    torch.testing.assert_close(exported.module()(*args), Block(ATTN_BACKEND)(*args))
    if "triton" not in {b.name for b in dispatch.backends("attention")}:
        return
    exported = torch.export.export(Block("triton"), args)
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert targets & {"gpuparity.attention.default", "gpuparity.attention_kernels.default"}, targets
    torch.testing.assert_close(exported.module()(*args), Block("triton")(*args), atol=1e-5, rtol=1e-4)


def test_auto_resolves_when_traced_not_per_call(monkeypatch):
    """Under compile the backend is chosen once, when the graph is traced, from the verdicts
    (a planted verdict rules every backend out: the composition fallback serves); running the
    compiled graph again resolves nothing, forward or backward, and gives eager's gradients."""
    from gpuparity.ops import select
    resolved = []
    real = select.resolve_waiting   # a trace waits for its verdicts (eager first calls need not)
    monkeypatch.setattr(select, "resolve_waiting", lambda problem, backend="auto": resolved.append(backend) or
                        real(problem, backend))
    monkeypatch.setattr(selection, "verdict_for", lambda p, b: {"passed": False, "reason": "planted"})
    dispatch.forget()
    x, w = randn(3, 8), randn(8)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: gpuparity.rms_norm(x, (8,), w), fullgraph=True, backend="aot_eager")
    compiled(x, w).sum().backward()
    assert resolved == ["auto"]
    compiled(x, w).sum().backward()
    assert resolved == ["auto"], "a compiled call must not resolve again"
    original = dispatch.get("rms_norm", "composition").fn
    x.grad = w.grad = None
    compiled(x, w).sum().backward()
    expected = torch.autograd.grad(original(x, [8], w, None).sum(), [x, w])
    torch.testing.assert_close(x.grad, expected[0])
    torch.testing.assert_close(w.grad, expected[1])


def test_compiled_varlen_rotary_checks_cu_seqlens_when_it_runs():
    x = randn(9, 2, 8, grad=False)
    cos, sin = rotary_tables(9, 8)
    bad = torch.tensor([0, 6, 4, 9], device=DEVICE, dtype=torch.int32)   # not non-decreasing
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, cu: gpuparity.apply_rotary(x, cos, sin, cu_seqlens=cu, backend=ROPE_BACKEND),
                             fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="cu_seqlens"):
        compiled(x, bad)
    good = torch.tensor([0, 4, 9], device=DEVICE, dtype=torch.int32)
    torch.testing.assert_close(compiled(x, good),
                               gpuparity.apply_rotary(x, cos, sin, cu_seqlens=good, backend=ROPE_BACKEND))


def test_served_backend_is_remembered_for_the_backward():
    problem = dispatch.Problem("rms_norm", DEVICE, torch.float32, "default", (("hidden", 8), ("weight", True)))
    library._SERVED.clear()
    chosen = library._serve(problem, NORM_BACKEND)
    assert library._served(problem, NORM_BACKEND) is chosen


# ----------------------------------------------------------------------------- Triton's split
TRITON_CASES = {
    "rms_norm": lambda: (torch.ops.gpuparity.rms_norm, (randn(3, 16), [16], randn(16), None, "triton")),
    "layer_norm": lambda: (torch.ops.gpuparity.layer_norm, (randn(2, 3, 16), [16], randn(16), randn(16), 1e-5,
                                                            "triton")),
    "attention": lambda: (torch.ops.gpuparity.attention, (
        randn(1, 2, 5, 16), randn(1, 1, 7, 16), randn(1, 1, 7, 16), None, padding(1, 7, [4]), True, None, False,
        "triton")),
}


@pytest.mark.triton
@pytest.mark.parametrize("case", sorted(TRITON_CASES))
def test_triton_split_under_opcheck(case):
    """The Triton backends' forward_saving/backward_from (fused backward from saved statistics)
    pass opcheck, autograd through the op included."""
    pytest.importorskip("triton")
    op, args = TRITON_CASES[case]()
    backend = dispatch.get("attention" if case == "attention" else case, "triton")
    assert backend.forward_saving is not None and backend.backward_from is not None
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                                "test_aot_dispatch_dynamic"))


@pytest.mark.triton
def test_triton_split_gradients_match_the_eager_triton_path():
    pytest.importorskip("triton")
    x, w, b = randn(4, 16), randn(16), randn(16)
    fn = lambda x, w, b: gpuparity.layer_norm(gpuparity.rms_norm(x, (16,), w, backend="triton"), (16,), w, b,  # noqa: E731
                                              backend="triton")
    compiled_matches_eager(fn, [x, w, b], atol=1e-5)
    q, k, v = randn(1, 2, 5, 16), randn(1, 2, 7, 16), randn(1, 2, 7, 16)
    attn = lambda q, k, v: gpuparity.attention(q, k, v, key_padding_mask=padding(1, 7, [5]), backend="triton")  # noqa: E731
    compiled_matches_eager(attn, [q, k, v], atol=1e-5)


@pytest.mark.triton
@pytest.mark.parametrize("q_len", [2, 300])   # one backward launch and two (tiles.fused_backward)
def test_the_library_backward_scans_the_padding_as_the_eager_one(q_len):
    """The torch.library backward keeps nothing of the forward but (out, lse): its kernels scan
    the key padding themselves. On items with holes, all padding and none, its gradients are the
    eager autograd Function's, bit for bit."""
    pytest.importorskip("triton")
    from gpuparity.backends.triton_attention import triton_attention
    pad = torch.tensor([[True, False, True, False, False, True, True], [True] * 7, [False] * 7,
                        [False] * 4 + [True] * 3], device=DEVICE)
    q, k, v = randn(4, 2, q_len, 16), randn(4, 1, 7, 16), randn(4, 1, 7, 16)
    g = randn(4, 2, q_len, 16, grad=False)
    eager = torch.autograd.grad(triton_attention(q, k, v, key_padding_mask=pad), (q, k, v), g)
    traced = torch.autograd.grad(library.attention(q, k, v, None, pad, False, None, "triton"), (q, k, v), g)
    for got, want in zip(traced, eager):
        assert torch.equal(got, want)


@pytest.mark.triton
def test_rotary_pair_op_serves_the_triton_pair_launch_and_its_backward(monkeypatch):
    """The pair op with the Triton backend (the opaque op under the interpreter): opcheck passes,
    a compiled function holds one pair op and no single rotary op, and its outputs and
    gradients are the eager pair launch's."""
    monkeypatch.setenv("GPUPARITY_COMPILED_KERNELS", "twin")   # the twin on a GPU (the default is opaque)
    pytest.importorskip("triton")
    from gpuparity.backends import triton_rotary
    from gpuparity.ops.rotary import apply_rotary_pair
    launches = []
    for name in ("rotary_pair_launch", "rotary_launch"):
        real = getattr(triton_rotary, name)
        monkeypatch.setattr(triton_rotary, name, lambda *a, _real=real, _name=name, **k: launches.append(
            (_name, k["conjugate"])) or _real(*a, **k))
    q, k = randn(2, 6, 4, 8), randn(2, 6, 2, 8)
    cos, sin = rotary_tables(9, 8)
    torch.library.opcheck(torch.ops.gpuparity.apply_rotary_pair, (q, k, cos, sin, False, False, "triton"))
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    fn = lambda q, k: apply_rotary_pair(q, k, cos, sin, backend="triton")  # noqa: E731
    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=recording)(q, k)
    # the opaque op under the interpreter, its triton_op twin on a GPU
    assert [t for t in targets if "gpuparity" in t] in (["gpuparity.apply_rotary_pair"],
                                                         ["gpuparity.apply_rotary_pair_kernels"]), targets
    launches.clear()
    compiled_pair = lambda q, k: sum(o.square().sum() for o in fn(q, k))  # noqa: E731
    torch._dynamo.reset()
    grads = [torch.autograd.grad(compiled_pair(q, k), (q, k))]
    assert launches == [("rotary_pair_launch", False), ("rotary_pair_launch", True)], launches  # one each way
    launches.clear()
    compiled = torch.compile(compiled_pair, fullgraph=True, backend="aot_eager")
    grads.append(torch.autograd.grad(compiled(q, k), (q, k)))
    # traced (once per trace on a GPU, where the twin's launches become graph nodes; per call in
    # the interpreter), the pair launch both ways and never the single-tensor one
    assert {name for name, _ in launches} == {"rotary_pair_launch"}, launches
    assert {conjugate for _, conjugate in launches} == {False, True}, launches
    for got, want in zip(grads[1], grads[0]):
        assert torch.equal(got, want)
    torch._dynamo.reset()
