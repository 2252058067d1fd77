"""The residual_norm contract (the pre-norm block's residual add fused with its RMSNorm or
LayerNorm): argument checks and `Problem`, float64 reference, plain composition and the
battery's cases: odd hidden sizes and the 16/32/64/128 tile boundaries, single rows, no
residual, residual_in_fp32 in every dtype, a float32 residual beside a 16-bit x, huge-mean rows,
strided and transposed x; gradients of x, residual, weight and bias, through both outputs.

    new_residual = x (* rowscale[..., None]) + residual
                                    (float32 when residual_in_fp32, else the residual's dtype;
                                     no residual: x, cast the same way)
    out = norm(new_residual) * weight (+ 1 when zero_centered_weight) (+ bias),
          in out_dtype (None: x's dtype)

rowscale (one factor per row, FlashAttention's, e.g. stochastic depth) is not differentiated.

The names follow FlashAttention's `layer_norm_fn(x, weight, bias, residual=None, eps,
prenorm, residual_in_fp32, is_rms_norm, ...)` (module flash_attn.ops.triton.layer_norm); the two
outputs are what it returns with prenorm=True. Where they differ: its residual_in_fp32 only
applies when no residual is passed (a given residual keeps its dtype); here it always means a
float32 new_residual. The norm is taken of new_residual as stored (rounded to its dtype), so
`out` is exactly the norm of the tensor the caller carries on.
"""
from __future__ import annotations

import math
import numbers
from typing import List, Optional

import torch

from ..numerics import default_rms_eps
from ..registry import Backend, Problem
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_tensor
from .base import (LARGE_NORM, TILE_OFFSETS, TILES, Case, Covering, OpSpec, family, named_view, randn, tile_size,
                   view_members)
from .norms import RMS_SPEC as NORM_SPEC, WIDTH_SCALES
from .signature import Arg, Signature

# gpuparity.residual_norm's signature, its torch.library op's (outputs: out, new_residual and the
# saved statistics) and the backends' (contracts/signature.py). rowscale, zero_centered_weight
# and out_dtype came after the op's first schema: they follow `backend` there.
RESIDUAL_NORM = Signature("residual_norm", (
    Arg("x", "Tensor", grad=True),
    Arg("residual", "Tensor?", grad=True),
    Arg("weight", "Tensor", grad=True),
    Arg("bias", "Tensor?", None, grad=True),
    Arg("eps", "float?", None, keyword=True),
    Arg("norm", "str", "rms", keyword=True),
    Arg("residual_in_fp32", "bool", False, keyword=True),
    Arg("rowscale", "Tensor?", None, keyword=True, appended=True),
    Arg("zero_centered_weight", "bool", False, keyword=True, appended=True),
    Arg("out_dtype", "ScalarType?", None, keyword=True, appended=True),
    Arg("backend", "str", "auto", keyword=True, backend=False),
), outputs=("out", "new_residual", "stats"))
# gpuparity::residual_norm_backward (and its triton_op twin), the backward op residual_norm's
# autograd formula calls with the gradients of out and new_residual (None: zero) and what the
# forward saved; x_dtype and has_residual what dx and dresidual are. rowscale and
# zero_centered_weight came after its first schema.
RESIDUAL_NORM_BACKWARD = Signature("residual_norm_backward", (
    Arg("grad_out", "Tensor?"),
    Arg("grad_new_residual", "Tensor?"),
    Arg("new_residual", "Tensor"),
    Arg("weight", "Tensor"),
    Arg("bias", "Tensor?"),
    Arg("stats", "Tensor"),
    Arg("eps", "float?"),
    Arg("norm", "str"),
    Arg("x_dtype", "ScalarType"),
    Arg("has_residual", "bool"),
    Arg("backend", "str"),
    Arg("rowscale", "Tensor?", None, appended=True),
    Arg("zero_centered_weight", "bool", False, appended=True),
), outputs=("dx", "dresidual", "dweight", "dbias"), public=False)

NORMS = ("rms", "layer")
LAYER_NORM_EPS = 1e-5   # F.layer_norm's default, as gpuparity.layer_norm's


# --------------------------------------------------------------------------- the call: arguments checked, and the Problem the dispatcher gets
def new_residual_dtype(x: torch.Tensor, residual: Optional[torch.Tensor], residual_in_fp32: bool) -> torch.dtype:
    if residual_in_fp32:
        return torch.float32
    return x.dtype if residual is None else residual.dtype


def check_residual_norm_inputs(x, residual, weight, bias=None, eps=None, norm="rms", residual_in_fp32=False,
                               rowscale=None, zero_centered_weight=False, out_dtype=None) -> None:
    """Validate residual_norm's arguments; each error names the argument, what it got, what it needs."""
    expect_tensor("x", x, dtypes=FLOAT_DTYPES)
    if x.dim() == 0:
        raise ValueError(f"x: expected at least 1 dimension (the hidden size last), got {describe(x)}")
    if residual is not None:
        expect_tensor("residual", residual, dtypes=FLOAT_DTYPES)
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(f"residual: expected the shape of x {tuple(x.shape)}, got {describe(residual)}")
        if residual.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"residual: expected the dtype of x ({str(x.dtype).replace('torch.', '')}) or float32, "
                            f"got {describe(residual)}")
    hidden = (x.shape[-1],)
    expect_tensor("weight", weight, dtypes=FLOAT_DTYPES)
    if tuple(weight.shape) != hidden:
        raise ValueError(f"weight: expected shape {hidden} (the last dimension of x), got {describe(weight)}")
    if bias is not None:
        expect_tensor("bias", bias, dtypes=FLOAT_DTYPES)
        if tuple(bias.shape) != hidden:
            raise ValueError(f"bias: expected shape {hidden} (the last dimension of x), got {describe(bias)}")
    expect_same_device("x", x, residual=residual, weight=weight, bias=bias)
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0):
        raise ValueError(f"eps: expected a float >= 0 or None, got {describe(eps)}")
    if norm not in NORMS:
        raise ValueError(f"norm: expected one of {NORMS}, got {describe(norm)}")
    if not isinstance(residual_in_fp32, bool):
        raise TypeError(f"residual_in_fp32: expected a bool, got {describe(residual_in_fp32)}")
    if rowscale is not None:
        expect_tensor("rowscale", rowscale, dtypes=FLOAT_DTYPES)
        if tuple(rowscale.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"rowscale: expected shape {tuple(x.shape[:-1])} (x's shape without its last "
                             f"dimension, one factor per row), got {describe(rowscale)}")
        expect_same_device("x", x, rowscale=rowscale)
    if not isinstance(zero_centered_weight, bool):
        raise TypeError(f"zero_centered_weight: expected a bool, got {describe(zero_centered_weight)}")
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype: expected None or one of {[str(d) for d in FLOAT_DTYPES]}, "
                        f"got {describe(out_dtype)}")


def default_eps(norm: str, dtype: torch.dtype) -> float:
    """eps=None: what gpuparity.rms_norm / gpuparity.layer_norm use (torch's defaults)."""
    return default_rms_eps(dtype) if norm == "rms" else LAYER_NORM_EPS


def residual_norm_problem(x, residual, weight, bias, norm: str, residual_in_fp32: bool) -> Problem:
    """The dispatcher's description of a validated call; its kind is the norm ("rms", "layer")."""
    return problem_of(x.device, x.dtype, x.shape, residual is not None,
                      new_residual_dtype(x, residual, residual_in_fp32), bias is not None, norm)


def problem_of(device, dtype, shape, has_residual: bool, residual_dtype, has_bias: bool, norm: str) -> Problem:
    """The same Problem from what a call's tensors were (the backward op rebuilds it so)."""
    features = (("hidden", int(shape[-1])), ("residual", has_residual),
                ("residual_dtype", str(residual_dtype).replace("torch.", "")),
                ("bias", has_bias), ("large", math.prod(shape) >= LARGE_NORM))
    return Problem("residual_norm", device, dtype, norm, features)


# --------------------------------------------------------------------------- the float64 reference
def reference_residual_norm(x, residual, weight, bias=None, eps=None, norm="rms", residual_in_fp32=False,
                            rowscale=None, zero_centered_weight=False, out_dtype=None):
    """(out, new_residual) in float64: the sum exact, the norm over the last dimension."""
    x = x.double()
    if rowscale is not None:
        x = x * rowscale.detach().double()[..., None]
    s = x if residual is None else x + residual.double()
    eps = default_eps(norm, torch.float64) if eps is None else eps
    if norm == "rms":
        y = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    else:
        mean = s.mean(dim=-1, keepdim=True)
        y = (s - mean) * torch.rsqrt((s - mean).pow(2).mean(dim=-1, keepdim=True) + eps)
    y = y * (weight.double() + 1.0 if zero_centered_weight else weight.double())
    if bias is not None:
        y = y + bias.double()
    return y, s


# --------------------------------------------------------------------------- the trusted composition (the op's "composition" backend)
def residual_norm_composition(x, residual, weight, bias=None, eps=None, norm="rms", residual_in_fp32=False,
                              rowscale=None, zero_centered_weight=False, out_dtype=None):
    """The eager pre-norm block: x * rowscale in fp32, the sum in new_residual's dtype,
    statistics and affine in fp32, the output rounded once to out_dtype (None: x's dtype)."""
    dtype, out_dtype = new_residual_dtype(x, residual, residual_in_fp32), out_dtype or x.dtype
    if rowscale is not None:
        x = x.float() * rowscale.detach().float()[..., None]
    s = x.to(dtype) if residual is None else x.to(dtype) + residual.to(dtype)
    eps = default_eps(norm, x.dtype) if eps is None else eps
    f = s.float()
    if norm == "rms":
        y = f * torch.rsqrt(f.pow(2).mean(dim=-1, keepdim=True) + eps)
    else:
        y = torch.nn.functional.layer_norm(f, f.shape[-1:], None, None, eps)
    y = y * (weight.float() + 1.0 if zero_centered_weight else weight.float())
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype), s


# registered by backends.load in the order its line of gpuparity.manifest gives
COMPOSITIONS = (Backend("composition", "residual_norm", residual_norm_composition,
                        "plain composition: the sum in the residual's dtype, fp32 statistics (trusted baseline)",
                        fallback=True),)


# --------------------------------------------------------------------------- the battery's cases
def _case(name, level="default", **params) -> Case:
    defaults = dict(shape=(4, 32), norm="rms", residual=True, residual_fp32=False, residual_in_fp32=False,
                    bias=True, eps=None, offset=0.0, layout="contiguous", rowscale=None, zero_centered=False,
                    out_fp32=False)
    defaults.update(params)
    return Case(name, defaults, level)


def _both(name, level="default", **params) -> List[Case]:
    return [_case(f"{name}_{norm}", level, norm=norm, **params) for norm in NORMS]


CASES: List[Case] = [
    *_both("rows_32", "quick"),
    *_both("odd_129", "quick", shape=(5, 129)),    # a 128-column tile and one more
    *_both("no_residual", "quick", shape=(3, 65), residual=False),
    *_both("residual_in_fp32", "quick", shape=(4, 63), residual_in_fp32=True),
    _case("hidden_1_rms", "quick", shape=(5, 1)),
    # layer norm over 1 feature is bias alone (its gradient through the norm is 0): width 3 there
    _case("hidden_3_layer", "quick", shape=(5, 3), norm="layer"),
    _case("hidden_1_layer", shape=(5, 1), norm="layer"),
    _case("hidden_3_rms", shape=(5, 3)),
    *_both("rows_1", shape=(1, 129)),
    *_both("hidden_1000", shape=(3, 1000)),
    *_both("no_residual_in_fp32", shape=(3, 33), residual=False, residual_in_fp32=True),
    # the FlashAttention pattern after the first block: a float32 residual stream beside 16-bit x
    *_both("fp32_residual_stream", shape=(4, 96), residual_fp32=True, residual_in_fp32=True),
    _case("fp32_residual_kept", shape=(4, 96), residual_fp32=True, norm="layer"),
    _case("no_bias_layer", shape=(4, 64), norm="layer", bias=False),
    _case("bias_rms", shape=(4, 64), norm="rms", bias=True),
    *_both("huge_mean", shape=(4, 256), offset=1e3),
    *_both("strided_rows", shape=(6, 40), layout="row_stride"),
    *_both("transposed_x", shape=(24, 10), layout="transposed"),
    *_both("batched_3d", shape=(2, 9, 48)),
    _case("eps_explicit", shape=(4, 96), eps=1e-3, norm="layer"),
    # FlashAttention's layer_norm_fn arguments: rowscale (with zero rows), zero-centered weight, out_dtype
    *_both("rowscale", "quick", shape=(5, 63), rowscale="random"),
    _case("rowscale_zeros_rows_1", "quick", shape=(1, 33), rowscale="zeros", norm="layer"),
    *_both("rowscale_zeros_fp32_stream", shape=(6, 129), rowscale="zeros", residual_fp32=True,
           residual_in_fp32=True),
    _case("rowscale_no_residual_in_fp32", shape=(3, 5, 17), rowscale="random", residual=False,
          residual_in_fp32=True),
    *_both("zero_centered", "quick", shape=(4, 65), zero_centered=True),
    _case("zero_centered_no_bias", shape=(1, 1000), zero_centered=True, bias=False),
    *_both("out_fp32", "quick", shape=(3, 47), out_fp32=True),
    _case("all_fa_args_layer", shape=(2, 3, 97), norm="layer", rowscale="zeros", zero_centered=True, out_fp32=True,
          residual_fp32=True, residual_in_fp32=True),
    *_both("hidden_4096", "full", shape=(8, 4096)),
    *_both("hidden_16384", "full", shape=(2, 16384)),
]

BOUNDARIES = tuple(n + d for n in (16, 32, 64, 128) for d in (-1, 0, 1))
FAMILIES = [
    family("sizes", [(f"hidden_{n}_{norm}", dict(shape=(3, n), norm=norm)) for n in BOUNDARIES + (255, 257, 1025)
                     for norm in NORMS], anchors=2),
    family("rows", [("rows_1_h1000", dict(shape=(1, 1000))), ("rows_129_h33", dict(shape=(129, 33))),
                    ("rows_1_layer", dict(shape=(1, 65), norm="layer")), ("batch_5x3", dict(shape=(5, 3, 40)))]),
    family("residual", [("none_fp32", dict(residual=False, residual_in_fp32=True)),
                        ("none", dict(residual=False)),
                        ("fp32_stream_layer", dict(residual_fp32=True, residual_in_fp32=True, norm="layer")),
                        ("in_fp32_layer", dict(residual_in_fp32=True, norm="layer"))]),
    family("values", [("huge_mean_100", dict(shape=(4, 128), offset=100.0)),
                      ("constant_rows", dict(shape=(6, 64), norm="layer", values={"x": "constant_rows",
                                                                                  "residual": "constant_rows"})),
                      ("denormal_mix", dict(shape=(4, 96), values={"x": "denormal_mix"}))]),
    family("layouts", view_members(("x", "residual", "weight"), ("offset", "sliced", "transposed", "expanded"),
                                   base=dict(shape=(6, 40)))),
]


# The argument space as dimensions: the `cover` family is a covering array over them
# (checks/covering.py): the hidden size on and off every tile of 16/32/64/128, at one, two or
# 32 tiles (the norms' WIDTH_SCALES; long rows are few), the rows (up to 257), the norm, the
# residual (none, x's dtype, a float32 stream), residual_in_fp32, bias, eps, FlashAttention's
# extra arguments, each input's layout and the value regimes the norms' array has (a mean of 5
# on the residual stream).
RESIDUAL_EXTRAS = {"none": {}, "rowscale": dict(rowscale="random"), "rowscale_zeros": dict(rowscale="zeros"),
                   "zero_centered": dict(zero_centered=True), "out_fp32": dict(out_fp32=True)}
RESIDUAL_VALUES = {"normal": {}, "mean_5": dict(offset=5.0), "denormal": dict(values={"x": "denormal_mix"}),
                   "weight_denormal": dict(values={"weight": "denormal_mix"})}
RESIDUAL_DIMENSIONS = (
    ("width_tile", TILES), ("width_offset", TILE_OFFSETS), ("width_scale", tuple(WIDTH_SCALES)), ("rows", (1, 2, 17, 65, 257)),
    ("shape", ("2d", "3d")), ("norm", NORMS), ("residual", ("same", "none", "fp32_stream")),
    ("residual_in_fp32", (False, True)), ("bias", (True, False)), ("eps", (None, 1e-3)),
    ("extras", tuple(RESIDUAL_EXTRAS)), ("x_layout", ("contiguous", "row_stride", "transposed", "offset", "expanded")),
    ("other_layout", ("contiguous", "residual_sliced", "residual_offset", "residual_transposed", "weight_sliced",
                      "weight_offset")),
    ("values", tuple(RESIDUAL_VALUES)))


def _residual_allowed(row):
    if row.get("width_scale") == "long" and (row.get("rows", 1) > 2 or row.get("shape", "2d") != "2d"):
        return False   # a long row: few of them
    if row.get("x_layout") in ("transposed", "row_stride") and row.get("shape", "2d") != "2d":
        return False   # those layouts are of 2-D x
    if row.get("residual") == "none" and str(row.get("other_layout", "")).startswith("residual"):
        return False
    return True


def _residual_cover_params(row):
    width = tile_size(row["width_tile"], row["width_offset"], WIDTH_SCALES[row["width_scale"]](row["width_tile"]))
    shape = (row["rows"], width) if row["shape"] == "2d" else (2, row["rows"], width)
    p = dict(shape=shape, norm=row["norm"], residual=row["residual"] != "none",
             residual_fp32=row["residual"] == "fp32_stream", residual_in_fp32=row["residual_in_fp32"], bias=row["bias"],
             eps=row["eps"], **RESIDUAL_EXTRAS[row["extras"]], **RESIDUAL_VALUES[row["values"]])
    if row["x_layout"] in ("row_stride", "transposed"):
        p["layout"] = row["x_layout"]
    views = {"x": row["x_layout"]} if row["x_layout"] in ("offset", "expanded") else {}
    views.update(named_view(row["other_layout"]))
    if views:
        p["views"] = views
    return p


COVERING = {"residual_norm": Covering(RESIDUAL_DIMENSIONS, _residual_cover_params, _residual_allowed, seed=45)}


class ResidualNormSpec(OpSpec):
    op = "residual_norm"
    # cuda: 3-7x the composition on an H100 (docs/kernels-norms-rope.md)
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["triton"], "cpu": ["composition"]}
    signature = RESIDUAL_NORM.call_line() + " -> (out, new_residual)"
    grad_inputs = ("x", "residual", "weight", "bias")
    reference_fn = staticmethod(reference_residual_norm)

    def kind(self, params):
        return params["norm"]

    def work(self, p):
        return math.prod(p["shape"])

    # timed at the norms' shapes (contracts/norms.py), so their timings compare
    def timing_params(self):
        return _case("timing", shape=NORM_SPEC.timing_params()["shape"]).params

    def large_timing_params(self):
        return _case("timing-large", shape=NORM_SPEC.large_timing_params()["shape"]).params

    def is_large(self, problem):
        return bool(problem.feature("large", False))

    def make_inputs(self, p, gen):
        shape = tuple(p["shape"])
        if p["layout"] == "row_stride":
            x = randn(gen, *shape[:-1], shape[-1] + 24)   # rows of a wider buffer
        elif p["layout"] == "transposed":
            x = randn(gen, shape[-1], *shape[:-1])
        else:
            x = randn(gen, *shape)
        inputs = {"x": x}
        # the residual stream carries the large mean, as it does in a deep model
        if p["residual"]:
            inputs["residual"] = p["offset"] + randn(gen, *shape)
        else:
            inputs["x"] = p["offset"] + x
        # zero-centered: the stored weight is the offset from 1
        inputs["weight"] = (0.0 if p.get("zero_centered") else 1.0) + 0.5 * randn(gen, shape[-1])
        if p.get("rowscale"):
            rowscale = randn(gen, *shape[:-1])
            if p["rowscale"] == "zeros":   # every other row dropped (stochastic depth), the first kept
                rowscale.reshape(-1)[1::2] = 0.0
            inputs["rowscale"] = rowscale
        if p["bias"]:
            inputs["bias"] = 0.5 * randn(gen, shape[-1])
        return inputs

    def _x_view(self, x, p):
        if p["layout"] == "row_stride":
            return x[..., : p["shape"][-1]]
        if p["layout"] == "transposed":
            return x.t()
        return x

    def call(self, fn, inputs, p):
        """Both outputs as one tensor of x's dtype, (2, *shape): out, and new_residual scaled by a
        power of two (exact) so that a large-mean stream does not drown out's error; the
        gradient then reaches both outputs."""
        x = self._x_view(inputs["x"], p)
        residual = inputs.get("residual")
        if residual is not None and p["residual_fp32"] and x.dtype != torch.float64:
            residual = residual.float()
        eps = p["eps"]
        if eps is None and x.dtype == torch.float64 and "orig_dtype" in inputs:
            eps = default_eps(p["norm"], inputs["orig_dtype"])   # the reference: the tested dtype's default
        extra = {}
        if p.get("rowscale"):
            extra["rowscale"] = inputs["rowscale"]
        if p.get("zero_centered"):
            extra["zero_centered_weight"] = True
        if p.get("out_fp32") and x.dtype != torch.float64:
            extra["out_dtype"] = torch.float32
        out, new_residual = fn(x, residual, inputs["weight"], inputs.get("bias"), eps=eps, norm=p["norm"],
                               residual_in_fp32=p["residual_in_fp32"], **extra)
        scale = 2.0 ** -math.ceil(math.log2(1.0 + abs(p["offset"])))
        # out_dtype=float32 is compared rounded to x's dtype (the harness checks x's dtype; the
        # float32 output's own accuracy: tests/ops/test_residual_norm.py)
        return torch.stack((out.to(x.dtype), (new_residual * scale).to(x.dtype)))

    def zero_masks(self, inputs, p):
        if p["layout"] != "row_stride":
            return {}
        pad = torch.zeros_like(inputs["x"], dtype=torch.bool)   # the buffer's columns outside the view
        pad[..., p["shape"][-1]:] = True
        return {"grad_x": pad}


SPEC = ResidualNormSpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("reference_residual_norm",)
