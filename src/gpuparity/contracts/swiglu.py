"""The swiglu contract (silu(gate) * up): its argument checks and `Problem`, float64 reference,
plain composition and the battery's cases: odd widths, saturating gates (sigmoid at 0 and 1,
exp overflowing for very negative gates), the halves of a fused projection (strided rows), a
transposed view, rows wider than one kernel block; gradients of gate and up."""
from __future__ import annotations

from typing import List

import torch

from ..registry import Backend, Problem
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor
from .base import LARGE_NORM, Case, OpSpec, family, randn, view_members
from .signature import Arg, Signature

# gpuparity.swiglu's signature, its torch.library op's and the backends' (contracts/signature.py)
SWIGLU = Signature("swiglu", (
    Arg("gate", "Tensor", grad=True),
    Arg("up", "Tensor", grad=True),
    Arg("backend", "str", "auto", keyword=True, backend=False),
))
# gpuparity::swiglu_backward (and its triton_op twin), the backward op swiglu's autograd formula calls
SWIGLU_BACKWARD = Signature("swiglu_backward", (
    Arg("grad", "Tensor"),
    Arg("gate", "Tensor"),
    Arg("up", "Tensor"),
    Arg("backend", "str"),
), outputs=("dgate", "dup"), public=False)


# --------------------------------------------------------------------------- the call: arguments checked, and the Problem the dispatcher gets
def swiglu_problem(gate, up) -> Problem:
    """Validate swiglu's arguments and describe the call for the dispatcher ("large" as the
    norms': ranked by the training-size timing from 4M elements)."""
    expect_tensor("gate", gate, dtypes=FLOAT_DTYPES)
    expect_tensor("up", up, dtypes=FLOAT_DTYPES)
    if gate.dim() == 0 or tuple(up.shape) != tuple(gate.shape):
        raise ValueError(f"up: expected the shape of gate {tuple(gate.shape)} (at least 1-D), got {describe(up)}")
    expect_same_dtype("gate", gate, up=up)
    expect_same_device("gate", gate, up=up)
    return Problem("swiglu", gate.device, gate.dtype, "default", (("large", gate.numel() >= LARGE_NORM),))


def reference_swiglu(gate, up):
    """The float64 referee: gate * sigmoid(gate) * up."""
    gate = gate.double()
    return gate * torch.sigmoid(gate) * up.double()


# --------------------------------------------------------------------------- the trusted composition (the op's "composition" backend)
def swiglu_composition(gate, up):
    return gate * torch.sigmoid(gate) * up


# registered by backends.load in the order its line of gpuparity.manifest gives (after torch's own)
COMPOSITIONS = (Backend("composition", "swiglu", swiglu_composition,
                        "plain composition in the input dtype (trusted baseline)", fallback=True),)


def _case(name, level="default", **params) -> Case:
    defaults = dict(shape=(4, 64), scale=2.0, layout="contiguous")
    defaults.update(params)
    return Case(name, defaults, level)


CASES: List[Case] = [
    _case("basic", "quick"),
    _case("odd_37", "quick", shape=(7, 37)),
    # gates of ~+-100: sigmoid is exactly 0 or 1 in every dtype and exp(-g) overflows fp32 for g < -88
    _case("saturating", "quick", shape=(6, 40), scale=60.0),
    # the two halves of one (rows, 2n) projection output, as LlamaMLP-style fused weights give them
    _case("fused_halves", "quick", shape=(6, 48), layout="fused"),
    _case("batched_3d", shape=(2, 5, 48)),
    _case("wide_5632", shape=(3, 5632)),
    _case("tiny_values", shape=(4, 96), scale=1e-3),
    _case("transposed_view", shape=(24, 10), layout="transposed"),
    _case("llama_7b_rows", "full", shape=(64, 11008)),
]


class SwiGLUSpec(OpSpec):
    op = "swiglu"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": {"default": ["torch", "triton"], "large": ["triton", "torch"]}, "cpu": ["torch", "composition"]}
    signature = SWIGLU.call_line()
    grad_inputs = ("gate", "up")
    reference_fn = staticmethod(reference_swiglu)

    def timing_params(self):
        return _case("timing", shape=(1024, 2048)).params

    def large_timing_params(self):
        return _case("timing-large", shape=(4096, 5632)).params

    def is_large(self, problem):
        return bool(problem.feature("large", False))

    def make_inputs(self, p, gen):
        shape = tuple(p["shape"])
        if p["layout"] == "fused":
            # gate in the first half of its rows, up in the second half of its own: both read
            # through a row stride of 2n, as the halves of one projection are
            shape = shape[:-1] + (2 * shape[-1],)
        elif p["layout"] == "transposed":
            shape = (shape[-1], shape[0])
        return {"gate": randn(gen, *shape, scale=p["scale"]), "up": randn(gen, *shape)}

    def call(self, fn, inputs, p):
        gate, up = inputs["gate"], inputs["up"]
        if p["layout"] == "fused":
            n = p["shape"][-1]
            gate, up = gate[..., :n], up[..., n:]
        elif p["layout"] == "transposed":
            gate, up = gate.t(), up.t()
        return fn(gate, up)

    def zero_masks(self, inputs, p):
        if p["layout"] != "fused":
            return {}
        n = p["shape"][-1]
        unused_gate = torch.zeros_like(inputs["gate"], dtype=torch.bool)
        unused_gate[..., n:] = True
        return {"grad_gate": unused_gate, "grad_up": ~unused_gate}


FAMILIES = [
    family("sizes", [(f"width_{n}", dict(shape=(3, n))) for n in (1025, 63, 65, 127, 129, 255, 257, 1023, 4097,
                                                                       8193, 11009)]),
    family("rows", [("rows_129", dict(shape=(129, 32))), ("batch_5x3", dict(shape=(5, 3, 24))),
                        ("rows_1", dict(shape=(1, 200)))]),
    family("values", [("gate_denormal", dict(values={"gate": "denormal_mix", "up": "denormal_mix"})),
                          ("up_large", dict(values={"up": {"peak": 1e30, "max_frac": 0.05}})),
                          ("gate_large", dict(values={"gate": {"peak": 1e30, "max_frac": 0.05}}))]),
    family("layouts", view_members(("gate", "up"), base=dict(shape=(6, 40)))),
]


SPEC = SwiGLUSpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("reference_swiglu",)
