"""The linear_cross_entropy contract (an LM head's loss without the logits): its argument checks
and `Problem`, float64 reference and the battery's cases (its composition is the chunked driver
of backends/ce_composition.py, which the Triton backend runs too, and is registered there): ignored and
all-ignored targets, large logits, a vocabulary past one kernel block, a biting softcap, many
chunks, every reduction; gradients of hidden, weight and bias against float64."""
from __future__ import annotations

import numbers
from typing import List

import torch
import torch.nn.functional as F

from ..registry import Problem
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor
from .base import INDEX_DTYPES, Case, OpSpec, check_softcap, family, randn, view_members
from .signature import Arg, Signature

# gpuparity.linear_cross_entropy's signature, its torch.library op's (outputs: the loss and, for
# mean/sum, the gradients computed with it; `wanted`: which of them) and the backends'
# (contracts/signature.py)
LINEAR_CROSS_ENTROPY = Signature("linear_cross_entropy", (
    Arg("hidden", "Tensor", grad=True),
    Arg("weight", "Tensor", grad=True),
    Arg("target", "Tensor"),
    Arg("bias", "Tensor?", None, keyword=True, grad=True),
    Arg("ignore_index", "SymInt", -100, keyword=True),
    Arg("reduction", "str", "mean", keyword=True),
    Arg("softcap", "float?", None, keyword=True),
    Arg("wanted", "bool[]", public=False, backend=False, appended=True),
    Arg("backend", "str", "auto", keyword=True, backend=False),
), outputs=("loss", "grad_hidden", "grad_weight", "grad_bias"))
# gpuparity::linear_cross_entropy_backward, the backward op of reduction "none" (its gradients
# recomputed from grad, the per-row losses' gradient; `wanted`: which of them)
LINEAR_CROSS_ENTROPY_BACKWARD = Signature("linear_cross_entropy_backward", (
    Arg("grad", "Tensor"),
    Arg("hidden", "Tensor"),
    Arg("weight", "Tensor"),
    Arg("target", "Tensor"),
    Arg("bias", "Tensor?"),
    Arg("ignore_index", "SymInt"),
    Arg("softcap", "float?"),
    Arg("backend", "str"),
    Arg("wanted", "bool[]", appended=True),
), outputs=("grad_hidden", "grad_weight", "grad_bias"), public=False)


# --------------------------------------------------------------------------- the call: arguments checked, and the Problem the dispatcher gets
def linear_cross_entropy_problem(hidden, weight, target, bias, ignore_index, reduction, softcap) -> Problem:
    """Validate linear_cross_entropy's arguments and describe the call for the dispatcher."""
    expect_tensor("hidden", hidden, dtypes=FLOAT_DTYPES)
    expect_tensor("weight", weight, ndim=(2,), dtypes=FLOAT_DTYPES)
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"weight: expected shape (V, H) with H = hidden.shape[-1], got {describe(weight)} "
                         f"for hidden {describe(hidden)}")
    expect_tensor("target", target, dtypes=INDEX_DTYPES)
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"target: expected shape {tuple(hidden.shape[:-1])} (hidden's without its last dim), "
                         f"got {describe(target)}")
    if bias is not None:
        expect_tensor("bias", bias, ndim=(1,), dtypes=FLOAT_DTYPES)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape ({weight.shape[0]},) (V), got {describe(bias)}")
    expect_same_dtype("hidden", hidden, weight=weight, bias=bias)
    expect_same_device("hidden", hidden, weight=weight, target=target, bias=bias)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index: expected an int, got {describe(ignore_index)}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction: expected 'mean', 'sum' or 'none', got {reduction!r}")
    softcap = check_softcap(softcap)
    features = (("vocab", int(weight.shape[0])), ("hidden", int(weight.shape[1])), ("bias", bias is not None),
                ("reduction", reduction))
    if softcap is not None:
        features += (("softcap", softcap),)
    return Problem("linear_cross_entropy", hidden.device, hidden.dtype,
                   "softcap" if softcap is not None else "default", features)


def reference_linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                   softcap=None):
    """The float64 referee: the whole logits, log_softmax, the mean over targets not ignored
    (0 when every target is)."""
    logits = F.linear(hidden.double(), weight.double(), None if bias is None else bias.double())
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat = target.reshape(-1).long()
    valid = flat != ignore_index
    logp = torch.log_softmax(logits.reshape(-1, weight.shape[0]), dim=-1)
    losses = -logp.gather(1, flat.masked_fill(~valid, 0)[:, None])[:, 0] * valid
    if reduction == "none":
        return losses.reshape(target.shape)
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / valid.sum().clamp(min=1)


def _case(name, level="default", **params) -> Case:
    defaults = dict(shape=(13,), vocab=50, hidden=16, bias=True, scale=2.0, ignore="none", reduction="mean",
                    softcap=None)
    defaults.update(params)
    return Case(name, defaults, level, kind="softcap" if defaults["softcap"] else None)


CASES: List[Case] = [
    _case("basic", "quick"),
    _case("ignored_rows", "quick", shape=(20,), vocab=37, hidden=8, bias=False, ignore="every_third"),
    # every target ignored: the mean is 0 (not NaN) and every gradient exactly 0
    _case("all_ignored", "quick", shape=(6,), vocab=20, hidden=8, ignore="all"),
    # logits with a spread of ~40: a logsumexp without its running max overflows exp in fp32
    _case("large_logits", "quick", shape=(12,), vocab=64, scale=40.0, ignore="every_third"),
    # a vocabulary one block of the Triton kernel (4096) and 37 past it: the last block is partial
    _case("vocab_past_block", "quick", shape=(5,), vocab=4133, hidden=8),
    # logits of ~20 capped at 5: the cap bites, and so does its slope in the gradient
    _case("softcap", "quick", shape=(12,), vocab=40, scale=20.0, softcap=5.0, ignore="every_third"),
    _case("reduction_sum", shape=(11,), vocab=30, reduction="sum", ignore="every_third"),
    _case("reduction_none", shape=(9,), vocab=33, reduction="none", ignore="every_third"),
    _case("batched_3d", shape=(2, 7), vocab=45, hidden=12, ignore="every_third"),
    # 150 tokens, 64 classes, hidden 8: 32 tokens per chunk, five chunks (the last partial)
    _case("many_chunks", shape=(150,), vocab=64, hidden=8, ignore="every_third"),
    _case("softcap_none_reduction", shape=(2, 5), vocab=70, scale=15.0, softcap=3.0, reduction="none"),
    _case("vocab_32000", "full", shape=(16,), vocab=32000, hidden=64, ignore="every_third"),
]


class LinearCrossEntropySpec(OpSpec):
    op = "linear_cross_entropy"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["triton"], "cpu": ["composition"]}
    signature = "fn(hidden, weight, target, bias=None, ignore_index=-100, reduction='mean', softcap=None)"
    grad_inputs = ("hidden", "weight", "bias")
    reference_fn = staticmethod(reference_linear_cross_entropy)
    # The plain composition that materialises the logits: the chunked "composition" is a
    # candidate like the kernel, measured against it.
    baseline_backend = "torch"

    def kind(self, params):
        return "softcap" if params.get("softcap") else "default"

    def timing_params(self):
        return _case("timing", shape=(512,), vocab=8192, hidden=256).params

    def make_inputs(self, p, gen):
        shape, vocab, hidden = tuple(p["shape"]), p["vocab"], p["hidden"]
        inputs = {"hidden": randn(gen, *shape, hidden, scale=p["scale"]),
                  "weight": randn(gen, vocab, hidden, scale=hidden ** -0.5),
                  "target": torch.randint(0, vocab, shape, generator=gen)}
        if p["bias"]:
            inputs["bias"] = randn(gen, vocab, scale=0.5)
        flat = inputs["target"].view(-1)
        if p["ignore"] == "every_third":
            flat[::3] = -100
        elif p["ignore"] == "all":
            flat[:] = -100
        return inputs

    def error_terms(self, inputs, p):
        """With the loss's gradient in inputs["grad_out"], each gradient's gradient_rounding
        (tolerance.error_floor): the shift a correct composition makes by rounding G =
        d(loss)/d(logits), grad_out included, to the dtype under test (fp16 flushes its tiny
        elements to 0); grad_hidden = G W, grad_weight = G^T hidden, grad_bias = G's rows summed."""
        grad_out, dtype = inputs.get("grad_out"), inputs.get("orig_dtype")
        if not isinstance(grad_out, torch.Tensor) or dtype is None:
            return {}
        hidden = inputs["hidden"].reshape(-1, inputs["weight"].shape[1])
        weight, bias, target = inputs["weight"], inputs.get("bias"), inputs["target"].reshape(-1)
        with torch.no_grad():
            logits = F.linear(hidden, weight, bias)
            slope = 1.0
            if p["softcap"] is not None:
                slope = 1 - torch.tanh(logits / p["softcap"]) ** 2
                logits = p["softcap"] * torch.tanh(logits / p["softcap"])
            valid = target != -100
            grad = torch.softmax(logits, -1)
            grad[valid.nonzero()[:, 0], target[valid].long()] -= 1.0
            rows = grad_out.reshape(-1) if p["reduction"] == "none" else grad_out.reshape(()).expand(len(target))
            if p["reduction"] == "mean":
                rows = rows / valid.sum().clamp(min=1)
            grad = grad * slope * (rows * valid)[:, None]
            rounded = grad.to(dtype).to(grad.dtype) - grad
            shifts = {"grad_hidden": (rounded @ weight, grad @ weight),
                      "grad_weight": (rounded.t() @ hidden, grad.t() @ hidden),
                      "grad_bias": (rounded.sum(0), grad.sum(0))}
        terms = {}
        for name, (shift, exact) in shifts.items():
            norm = float(torch.linalg.vector_norm(exact))
            if norm > 0:
                terms[name] = {"gradient_rounding": float(torch.linalg.vector_norm(shift)) / norm}
        return terms

    def call(self, fn, inputs, p):
        out = fn(inputs["hidden"], inputs["weight"], inputs["target"], inputs.get("bias"), -100, p["reduction"],
                 p["softcap"])
        # The op's loss is fp32 for half inputs (transformers' upcast loss); the battery compares
        # outputs in the dtype under test.
        return out.to(inputs["hidden"].dtype)

    def zero_masks(self, inputs, p):
        ignored = inputs["target"] == -100
        masks = {"grad_hidden": ignored[..., None]}
        if p["reduction"] == "none":
            masks["out"] = ignored
        elif bool(ignored.all()):
            masks["out"] = torch.ones((), dtype=torch.bool)
            masks["grad_weight"] = torch.ones((1, 1), dtype=torch.bool)
            masks["grad_bias"] = torch.ones((1,), dtype=torch.bool)
        return masks


FAMILIES = [
    family("sizes", [("vocab_4097_hidden_65", dict(shape=(7,), vocab=4097, hidden=65, ignore="every_third")),
                         ("vocab_4095", dict(shape=(5,), vocab=4095, hidden=16)),
                         ("vocab_8193", dict(shape=(3,), vocab=8193, hidden=8)),
                         ("tokens_129", dict(shape=(129,), vocab=64, hidden=8)),
                         ("hidden_127", dict(shape=(9,), vocab=33, hidden=127))]),
    family("batch", [("batch_3x5", dict(shape=(3, 5), vocab=40, ignore="every_third")),
                         ("batch_4x9_sum", dict(shape=(4, 9), vocab=30, reduction="sum"))]),
    family("values", [("huge_logits", dict(shape=(8,), vocab=50, scale=300.0)),
                          ("hidden_denormal", dict(shape=(8,), vocab=50, values={"hidden": "denormal_mix"}))]),
    family("layouts", view_members(("hidden", "weight"), ("offset", "sliced", "transposed"),
                                           base=dict(shape=(9,), vocab=37, hidden=12))),
]


SPEC = LinearCrossEntropySpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("reference_linear_cross_entropy",)
