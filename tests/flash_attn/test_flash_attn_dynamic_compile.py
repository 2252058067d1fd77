"""torch.compile(dynamic=True, fullgraph=True) over the FlashAttention-surface functions and the
gpuparity ops with a torch.library path: two sizes through one compiled function give eager's
outputs and gradients. Under dynamic shapes a Problem feature computed from a size (head_dim,
hidden, "large") is symbolic; the traced selection defers the choice to the custom op's body
then (ops/library.py traced_backend), where it once failed with "SymNodeVariable() is not a
constant" (FlashAttention's test_rotary_emb_qkv with compiled=True on the H100). Backend
aot_eager: dynamo and autograd's tracing are what is tested; inductor's CPU compile is too slow
for the suite."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, require_device  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity
from gpuparity.flash_attn.layers.rotary import apply_rotary_emb, apply_rotary_emb_qkv_
from gpuparity.flash_attn.losses.cross_entropy import CrossEntropyLoss
from gpuparity.flash_attn.ops.triton.layer_norm import layer_norm_fn, rms_norm_fn
from gpuparity.ops import library

require_device()
DEVICE = torch.device(TEST_DEVICE)
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _outputs_and_grads(step, inputs, grads):
    """step(*inputs) -> a tensor or tuple; (outputs, gradients of a weighted sum of them w.r.t. the
    float inputs, or the first `grads` of them)."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point() and (grads is None or i < grads))
              if isinstance(t, torch.Tensor) else t for i, t in enumerate(inputs)]
    out = step(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.float() * torch.linspace(-1, 1, o.numel(), device=o.device).view(o.shape)).sum() for o in outs)
    wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    return [o.detach() for o in outs], torch.autograd.grad(loss, wanted)


def assert_dynamic_compile_matches_eager(step, make_inputs, sizes=(5, 9), atol=1e-5, grads=None):
    """One torch.compile(dynamic=True, fullgraph=True) of step, called at each size: eager's
    outputs and gradients (the second size runs the same graph, its sizes symbolic)."""
    compiled = torch.compile(step, dynamic=True, fullgraph=True, backend="aot_eager")
    for n in sizes:
        inputs = make_inputs(n)
        want, got = _outputs_and_grads(step, inputs, grads), _outputs_and_grads(compiled, inputs, grads)
        for w, g in zip(want[0] + list(want[1]), got[0] + list(got[1])):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=atol)


def _randn(*shape):
    return torch.randn(*shape, device=DEVICE)


def _tables(seqlen, rotary_dim):
    angle = torch.arange(seqlen, device=DEVICE, dtype=torch.float32)[:, None] * torch.linspace(
        0.1, 1.0, rotary_dim // 2, device=DEVICE)
    return angle.cos(), angle.sin()


@pytest.mark.parametrize("offsets", ["int", "tensor"])
def test_apply_rotary_emb_qkv_in_place(offsets):
    """FlashAttention's test_rotary_emb_qkv(compiled=True) in small: packed qkv rotated in place,
    GQA layout, seqlen_offsets an int or a per-sequence tensor."""
    def make(n):
        cos, sin = _tables(n + 3, 6)
        off = 2 if offsets == "int" else torch.tensor([0, 3], device=DEVICE)
        return _randn(2, n, 3 + 2 * 1, 8), cos, sin, off

    def step(qkv, cos, sin, off):
        return apply_rotary_emb_qkv_(qkv * 1.0, cos, sin, seqlen_offsets=off, num_heads_q=3)

    assert_dynamic_compile_matches_eager(step, make, grads=1)


def test_apply_rotary_emb_qkv_5d():
    def make(n):
        return (_randn(2, n, 3, 2, 8), *_tables(n, 8))

    assert_dynamic_compile_matches_eager(lambda qkv, cos, sin: apply_rotary_emb_qkv_(qkv * 1.0, cos, sin), make,
                                         grads=1)


def test_apply_rotary_emb_interleaved_partial():
    def make(n):
        return (_randn(2, n, 2, 10), *_tables(n, 6))

    assert_dynamic_compile_matches_eager(
        lambda x, cos, sin: apply_rotary_emb(x, cos, sin, interleaved=True), make, grads=1)


@pytest.mark.parametrize("fn, residual_in_fp32", [(layer_norm_fn, False), (rms_norm_fn, True)],
                         ids=["layer_norm_fn", "rms_norm_fn-residual_in_fp32"])
def test_norm_fn_with_residual_prenorm(fn, residual_in_fp32):
    def make(n):
        return _randn(n, 24), _randn(n, 24), _randn(24), _randn(24)

    def step(x, residual, weight, bias):
        return fn(x, weight, bias, residual=residual, prenorm=True, residual_in_fp32=residual_in_fp32)

    assert_dynamic_compile_matches_eager(step, make)


def test_norm_fn_hidden_size_dynamic():
    """The hidden size itself varies: the "hidden" feature is symbolic."""
    def make(n):
        return _randn(3, n), _randn(3, n), _randn(n)

    assert_dynamic_compile_matches_eager(lambda x, r, w: rms_norm_fn(x, w, None, residual=r), make, sizes=(16, 20))


def test_cross_entropy_loss_module():
    def make(n):
        labels = torch.arange(n, device=DEVICE) % 7
        labels[1] = -100
        return _randn(n, 7), labels

    module = CrossEntropyLoss(label_smoothing=0.1, lse_square_scale=1e-2)
    assert_dynamic_compile_matches_eager(lambda logits, labels: module(logits, labels), make)


# ----------------------------------------------------------------------------- gpuparity's ops
# (step, inputs of a size, how many leading inputs take a gradient (None: every float one)); attention
# on its composition: "auto" would verify its backends on this CPU first (a minute)
OPS = {
    "rms_norm": (lambda x, w: gpuparity.rms_norm(x, (x.shape[-1],), w), lambda n: (_randn(n, 16), _randn(16)),
                 None),
    "layer_norm": (lambda x, w, b: gpuparity.layer_norm(x, (x.shape[-1],), w, b),
                   lambda n: (_randn(n, 16), _randn(16), _randn(16)), None),
    "residual_norm": (lambda x, r, w: gpuparity.residual_norm(x, r, w, norm="layer", residual_in_fp32=True),
                      lambda n: (_randn(n, 16), _randn(n, 16), _randn(16)), None),
    "apply_rotary": (lambda x, cos, sin: gpuparity.apply_rotary(x, cos, sin),
                     lambda n: (_randn(1, n, 2, 8), *_tables(n, 8)), 1),
    "swiglu": (lambda g, u: gpuparity.swiglu(g, u), lambda n: (_randn(n, 12), _randn(n, 12)), None),
    "attention": (lambda q, k, v: gpuparity.attention(q, k, v, is_causal=True, backend="composition"),
                  lambda n: (_randn(1, 2, n, 8), _randn(1, 2, n, 8), _randn(1, 2, n, 8)), None),
    "linear_cross_entropy": (lambda h, w, t: gpuparity.linear_cross_entropy(h, w, t),
                             lambda n: (_randn(n, 8), _randn(11, 8), torch.arange(n, device=DEVICE) % 11), None),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_gpuparity_op(op):
    step, make, grads = OPS[op]
    assert_dynamic_compile_matches_eager(step, make, grads=grads)


def test_symbolic_features_defer_the_choice():
    """The unit under the tests above: a feature computed from a symbolic size defers the choice
    (the stand-in routes the call through the custom op, whose body chooses when it runs); a
    constant one is chosen while tracing."""
    seen = {}

    def step(x):
        problem = library.Problem("rms_norm", x.device, x.dtype, "default",
                                                (("hidden", x.shape[-1]), ("large", x.numel() >= 4096)))
        seen["symbolic"] = library._symbolic(problem.features)
        seen["static"] = library._static(x)
        return x * 2

    torch.compile(step, dynamic=True, fullgraph=True, backend="eager")(_randn(3, 4))
    assert seen == {"symbolic": True, "static": False}
    torch._dynamo.reset()
    torch.compile(step, dynamic=False, fullgraph=True, backend="eager")(_randn(3, 4))
    assert seen == {"symbolic": False, "static": True}
    stand_in = library._deferred("rms_norm", "auto")
    assert library.deferred(stand_in) and stand_in.name == "auto" and stand_in.forward_saving is not None
    assert library._deferred("rms_norm", "auto") is stand_in
    with pytest.raises(RuntimeError, match="deferred to run time"):
        stand_in.fn()
