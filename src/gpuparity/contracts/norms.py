"""The rms_norm and layer_norm contracts: their argument checks and `Problem`, float64 references,
plain compositions and the battery's cases: odd widths, near-constant rows, huge means,
multi-dim normalized shapes, strided rows; gradients of x, weight and bias."""
from __future__ import annotations

import math
import numbers
from typing import List, Optional, Sequence, Tuple, Union

import torch

from ..registry import Backend, Problem
from ..numerics import default_rms_eps
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_tensor
from .base import LARGE_NORM, TILE_OFFSETS, TILES, Case, Covering, OpSpec, family, randn, tile_size, view_members
from .signature import Arg, Signature


# --------------------------------------------------------------------------- the declarations: each op's signature, once
# gpuparity.rms_norm / layer_norm, their torch.library ops (outputs: out and the saved statistics)
# and the backends' call convention all come from these (contracts/signature.py).
RMS_NORM = Signature("rms_norm", (
    Arg("x", "Tensor", grad=True),
    Arg("normalized_shape", "SymInt[]"),
    Arg("weight", "Tensor?", None, grad=True),
    Arg("eps", "float?", None),
    Arg("backend", "str", "auto", keyword=True, backend=False),
), outputs=("out", "stats"))
LAYER_NORM = Signature("layer_norm", (
    Arg("x", "Tensor", grad=True),
    Arg("normalized_shape", "SymInt[]"),
    Arg("weight", "Tensor?", None, grad=True),
    Arg("bias", "Tensor?", None, grad=True),
    Arg("eps", "float", 1e-5),
    Arg("backend", "str", "auto", keyword=True, backend=False),
), outputs=("out", "stats"))
# gpuparity::norm_backward (and its triton_op twin), the backward op both norms' autograd formulas
# call: bias None for rms_norm; `stats` what the forward saved; `wanted` which of the gradients
# (x, weight, bias) to compute, one not wanted (or of an absent parameter) an empty tensor.
NORM_BACKWARD = Signature("norm_backward", (
    Arg("grad", "Tensor"),
    Arg("x", "Tensor"),
    Arg("normalized_shape", "SymInt[]"),
    Arg("weight", "Tensor?"),
    Arg("bias", "Tensor?"),
    Arg("eps", "float?"),
    Arg("stats", "Tensor"),
    Arg("is_rms", "bool"),
    Arg("backend", "str"),
    Arg("wanted", "bool[]", appended=True),
), outputs=("dx", "dweight", "dbias"), public=False)


# --------------------------------------------------------------------------- the call: arguments checked, and the Problem the dispatcher gets
ShapeLike = Union[int, Sequence[int], torch.Size]


def normalized_tuple(name: str, normalized_shape: ShapeLike) -> Tuple[int, ...]:
    if isinstance(normalized_shape, bool):
        raise TypeError(f"{name}: expected an int or a sequence of ints, got {describe(normalized_shape)}")
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(normalized_shape)
        except TypeError:
            raise TypeError(f"{name}: expected an int or a sequence of ints, got {describe(normalized_shape)}") from None
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape):
            raise TypeError(f"{name}: expected an int or a sequence of ints, got {normalized_shape!r}")
        shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError(f"{name}: expected at least one normalized dimension, got {normalized_shape!r}")
    if any(s < 0 for s in shape):
        raise ValueError(f"{name}: expected sizes >= 0, got {shape}")
    return shape


def check_norm_inputs(x, normalized_shape: ShapeLike, weight=None, bias=None, eps=None,
                      *, eps_may_be_none: bool) -> Tuple[int, ...]:
    """Validate the arguments of F.rms_norm / F.layer_norm; returns normalized_shape as a tuple."""
    expect_tensor("x", x, dtypes=FLOAT_DTYPES)
    shape = normalized_tuple("normalized_shape", normalized_shape)
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"normalized_shape: expected the last {len(shape)} dimension(s) of x, "
                         f"got {shape} for x {describe(x)}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            continue
        expect_tensor(name, param, dtypes=FLOAT_DTYPES)
        if tuple(param.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} (normalized_shape), got {describe(param)}")
    expect_same_device("x", x, weight=weight, bias=bias)
    if eps is None:
        if not eps_may_be_none:
            raise TypeError("eps: expected a float >= 0, got None")
    elif isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"eps: expected a float >= 0{' or None' if eps_may_be_none else ''}, got {describe(eps)}")
    return shape


def _hidden(shape: Tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def norm_problem(op: str, x: torch.Tensor, shape: Tuple[int, ...], weight, bias) -> Problem:
    """The dispatcher's description of a validated rms_norm / layer_norm call."""
    # "large": ranked by the training-size timing (contracts/norms.py), where the kernels'
    # time outweighs the host's; from 4M elements (2048 tokens x 2048 hidden)
    features = (("hidden", _hidden(shape)), ("weight", weight is not None), ("large", x.numel() >= LARGE_NORM))
    if op == "layer_norm":
        features += (("bias", bias is not None),)
    return Problem(op, x.device, x.dtype, "default", features)


# --------------------------------------------------------------------------- the float64 references
def _norm_dims(normalized_shape: Sequence[int]):
    return tuple(range(-len(tuple(normalized_shape)), 0))


def rms_norm(x, normalized_shape, weight=None, eps: Optional[float] = None, *, eps_dtype=None):
    """F.rms_norm; pass eps_dtype (the dtype under test) when x was upcast and eps is None."""
    if eps is None:
        eps = default_rms_eps(eps_dtype or x.dtype)
    dims = _norm_dims(normalized_shape)
    y = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps)
    return y * weight if weight is not None else y


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    dims = _norm_dims(normalized_shape)
    mean = x.mean(dim=dims, keepdim=True)
    var = (x - mean).pow(2).mean(dim=dims, keepdim=True)  # biased, as F.layer_norm
    y = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layer_norm_floor_terms(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5, block: int = 1 << 22):
    """What raises the tolerance floor of layer_norm's outputs (tolerance.error_floor's
    mean_condition and mean_terms): each output's relative condition number with respect to the
    rows' means, measured in float64 on x. A relative error d of every row's mean shifts row r's
    x_hat by d * k_r, k_r = |mean_r| / sqrt(var_r + eps) (x - mean cancels). Then
    out = w * x_hat + b errs by w_i * d * k_r: sqrt(sum_r k_r^2 * sum_i w_i^2) / ||out||;
    grad_weight = sum_r g_r * x_hat_r (g of unit scale, as the battery draws it) errs by
    sqrt(sum_r k_r^2) per element against sqrt(sum_r ms(x_hat_r)) (ms(x_hat_r) = var_r /
    (var_r + eps), below 1 when the variance is near eps); grad_x's row r, of size rstd_r, errs
    at most k_r relative (its x_hat-weighted row sum does), rows weighted by rstd_r^2. A reference
    that is exactly 0 is judged per element (tolerance.relative_error): there the norm's place
    is taken by sqrt(elements). The monitor can share it. Rows in blocks of `block` elements."""
    shape = normalized_tuple("normalized_shape", normalized_shape)
    width = _hidden(shape)
    if width == 0 or x.numel() == 0:
        return {}
    rows = x.detach().reshape(-1, width)
    w2 = None if weight is None else weight.detach().to(rows.device, torch.float64).reshape(-1)
    b = None if bias is None else bias.detach().to(rows.device, torch.float64).reshape(-1)
    kappa2 = xhat_ms = rstd_kappa2 = rstd2 = out_sq = 0.0
    for chunk in rows.split(max(1, block // width)):
        chunk = chunk.to(torch.float64)
        var, mean = torch.var_mean(chunk, dim=-1, unbiased=False, keepdim=True)
        rstd2_rows = 1.0 / (var + eps)
        kappa2_rows = mean.pow(2) * rstd2_rows
        kappa2 += float(kappa2_rows.sum())
        xhat_ms += float((var * rstd2_rows).sum())
        rstd_kappa2 += float((rstd2_rows * kappa2_rows).sum())
        rstd2 += float(rstd2_rows.sum())
        y = (chunk - mean) * rstd2_rows.sqrt()
        if w2 is not None:
            y = y * w2
        if b is not None:
            y = y + b
        out_sq += float(y.pow(2).sum())
    if not all(map(math.isfinite, (kappa2, rstd_kappa2, out_sq))):
        return {}   # eps = 0 on a constant row: the reference itself is not finite
    weight_sq = width if w2 is None else float(w2.pow(2).sum())
    terms = {"out": math.sqrt(kappa2 * weight_sq) / (math.sqrt(out_sq) if out_sq > 0 else math.sqrt(x.numel())),
             "grad_weight": math.sqrt(kappa2) / (math.sqrt(xhat_ms) if xhat_ms > 0 else 1.0),
             "grad_x": math.sqrt(rstd_kappa2 / rstd2) if rstd2 > 0 else 0.0}
    return {name: {"mean_condition": condition, "mean_terms": width} for name, condition in terms.items()}


# --------------------------------------------------------------------------- the trusted composition (the op's "composition" backend)
def rms_norm_composition(x, normalized_shape, weight=None, eps=None):
    """Statistics in fp32, output in x's dtype: the eager RMSNorm most models ship."""
    eps = default_rms_eps(x.dtype) if eps is None else eps
    y = rms_norm(x.float(), normalized_shape, None, eps).to(x.dtype)
    return y * weight if weight is not None else y


def layer_norm_composition(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    y = layer_norm(x.float(), normalized_shape, None, None, eps).to(x.dtype)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


# registered by backends.load in the order its line of gpuparity.manifest gives (after torch's own)
COMPOSITIONS = (
    Backend("composition", "rms_norm", rms_norm_composition, "plain composition in the input dtype (trusted baseline)",
            fallback=True),
    Backend("composition", "layer_norm", layer_norm_composition,
            "plain composition in the input dtype (trusted baseline)", fallback=True),
)


# --------------------------------------------------------------------------- the battery's cases
def _case(name, level="default", **params) -> Case:
    defaults = dict(shape=(4, 32), norm_dims=1, affine=True, bias=True, eps=None, offset=0.0, spread=1.0,
                    layout="contiguous")
    defaults.update(params)
    return Case(name, defaults, level)


CASES: List[Case] = [
    _case("rows_32", "quick"),
    # layer norm over 1 or 2 features is degenerate (output 0 or +-1, gradient ~0): width 3 there
    # (width 1: y = x/sqrt(x^2+eps) = sign(x); its gradient is pure cancellation: forward only)
    _case("hidden_1", "quick", shape=(5, 1), only="rms_norm", forward_only=True),
    _case("hidden_3", "quick", shape=(5, 3)),
    _case("odd_17", "quick", shape=(7, 17)),
    # mean/spread 50: a variance from E[x^2] - E[x]^2 is off by ~eps*50^2 (caught in fp32),
    # while any honest fp32 algorithm stays near eps*50, under the floor (no coin flips)
    # fp16/bf16 variants at --full only: torch 2.13's CPU bf16 layer_norm backward misses by
    # 6-11% here (known issue TORCH-CPU-BF16-LN-GRAD), fp32 statistics by 0.3%
    _case("near_constant_rows", "quick", shape=(6, 150), offset=5.0, spread=0.1, half_at_full=True),
    _case("strided_rows", "quick", shape=(6, 40), layout="row_stride"),
    _case("no_weight", "quick", shape=(3, 64), affine=False),
    _case("hidden_128_many_rows", shape=(96, 128)),
    _case("hidden_1000", shape=(3, 1000)),
    _case("hidden_4097", shape=(2, 4097)),
    _case("two_norm_dims", shape=(3, 4, 6), norm_dims=2),
    _case("batched_3d", shape=(2, 9, 48)),
    # Rows with a large mean: torch 2.13's CPU bf16 layer_norm weight gradient loses accuracy
    # as mean/std grows (1.9% at 10, 5.7% at 100; fp32 statistics: 0.3%). Extreme, so --full.
    _case("large_mean_100", "full", shape=(4, 256), offset=100.0, spread=1.0),
    _case("huge_mean_1000", "full", shape=(4, 256), offset=1e3, spread=1.0),
    _case("eps_explicit", shape=(4, 96), eps=1e-3),
    _case("tiny_values", shape=(4, 64), spread=1e-4),
    _case("transposed_view", shape=(24, 10), layout="transposed"),
    _case("hidden_8192", "full", shape=(4, 8192)),
    _case("rows_4096x768", "full", shape=(4096, 768)),
]


HIDDEN_SIZES = (63, 64, 65, 127, 128, 129, 255, 257, 511, 513, 1023, 1024, 1025, 2047, 2049, 4095, 4097, 8191,
                8193)
FAMILIES = [
    family("sizes", [("hidden_129", dict(shape=(5, 129))), ("hidden_2049", dict(shape=(3, 2049)))]
               + [(f"hidden_{h}", dict(shape=(3, h))) for h in HIDDEN_SIZES if h not in (129, 2049)], anchors=2),
    # many rows: torch 2.13's CPU fp16/bf16 layer_norm sums the weight gradient in low precision
    # (1.7% off at 257 rows; known issue TORCH-CPU-BF16-LN-GRAD), so 16-bit at --full only
    family("rows", [("rows_129", dict(shape=(129, 32), half_at_full=True)), ("rows_1", dict(shape=(1, 96))),
                        ("batch_5x3", dict(shape=(5, 3, 40))),
                        ("rows_257_h65", dict(shape=(257, 65), half_at_full=True)),
                        ("batch_3x7_two_dims", dict(shape=(3, 7, 4, 8), norm_dims=2))]),
    family("values", [("constant_rows", dict(shape=(6, 64), values={"x": "constant_rows"})),
                          ("denormal_mix", dict(shape=(4, 96), values={"x": "denormal_mix"})),
                          # fp16 near its max; fp32/bf16 as large as fp32 statistics allow
                          ("large_values", dict(shape=(4, 128), values={"x": {"peak": 1e15, "max_frac": 0.125}})),
                          ("tiny_variance", dict(shape=(4, 80), offset=1.0, spread=1e-3, half_at_full=True)),
                          ("tiny_weight", dict(shape=(4, 64), values={"weight": "denormal_mix"}))], anchors=1),
    family("layouts", [("x_offset", dict(shape=(6, 40), views={"x": "offset"}))]
               + [(label, dict(shape=(6, 40), **params)) for label, params in
                  view_members(("x",), ("sliced", "transposed", "expanded"))]
               + [("weight_offset", dict(shape=(6, 40), views={"weight": "offset"})),
                  ("weight_sliced", dict(shape=(6, 40), views={"weight": "sliced"}))]),
    # more than 2^31 elements (32-bit offsets overflow): where memory allows, at --full
    family("huge", [("rows_65536x4096", dict(shape=(65536, 4096))),
                        ("over_2pow31", dict(shape=(524289, 4096)))], sized=True, level="full"),
]


# The argument space as dimensions: the `cover` family is a covering array over them
# (checks/covering.py). The width sits on and off every tile, at one, two and 32 tiles (long:
# few rows); the rows on and off the tiles too, up to 257. Near-constant rows and means of 30
# are in since the floor models centering (layer_norm_floor_terms); means of 100+ stay with the
# families.
NORM_VALUES = {"normal": {}, "mean_5": dict(offset=5.0, spread=1.0), "denormal": dict(values={"x": "denormal_mix"}),
               "large": dict(values={"x": {"peak": 1e15, "max_frac": 0.125}}), "tiny": dict(spread=1e-4),
               "weight_denormal": dict(values={"weight": "denormal_mix"}),
               "near_constant": dict(offset=5.0, spread=1e-3), "mean_30": dict(offset=30.0, spread=1.0)}
WIDTH_SCALES = {"one": lambda tile: 1, "two": lambda tile: 2, "long": lambda tile: 32}


def _norm_dimensions(op):
    dims = [("width_tile", TILES), ("width_offset", TILE_OFFSETS), ("width_scale", tuple(WIDTH_SCALES)),
            ("rows", (1, 2, 17, 65, 257)), ("shape", ("2d", "3d", "two_norm_dims")),
            ("x_layout", ("contiguous", "row_stride", "transposed", "offset", "expanded")),
            ("weight", ("affine", "none", "sliced", "offset")), ("eps", (None, 1e-3)),
            ("values", tuple(NORM_VALUES))]
    if op == "layer_norm":
        dims.append(("bias", (True, False)))
    return tuple((name, tuple(values)) for name, values in dims)


def _norm_allowed(row):
    if row.get("width_scale") == "long" and (row.get("rows", 1) > 2 or row.get("shape", "2d") != "2d"):
        return False   # a long row: few of them
    if row.get("x_layout") in ("transposed", "row_stride") and row.get("shape", "2d") != "2d":
        return False   # those layouts are of 2-D x
    if row.get("values") == "weight_denormal" and row.get("weight", "affine") == "none":
        return False
    return True


def _norm_cover_params(op):
    return lambda row: _norm_row_params(op, row)


def _norm_row_params(op, row):
    width = tile_size(row["width_tile"], row["width_offset"], WIDTH_SCALES[row["width_scale"]](row["width_tile"]))
    rows = row["rows"]
    p: dict = dict(shape=(rows, width), norm_dims=1, affine=row["weight"] != "none", bias=row.get("bias", True),
                   eps=row["eps"], **NORM_VALUES[row["values"]])
    if row["shape"] == "3d":
        p["shape"] = (2, rows, width)
    elif row["shape"] == "two_norm_dims":
        p.update(shape=(rows, 3, width), norm_dims=2)
    if row["x_layout"] in ("row_stride", "transposed"):
        p["layout"] = row["x_layout"]
    views = {}
    if row["x_layout"] in ("offset", "expanded"):
        views["x"] = row["x_layout"]
    if row["weight"] in ("sliced", "offset"):
        views["weight"] = row["weight"]
    if views:
        p["views"] = views
    rows_in_all = p["shape"][0] * (p["shape"][1] if row["shape"] == "3d" else 1)
    if op == "layer_norm" and (rows_in_all >= 64 or row["values"] in ("mean_5", "near_constant", "mean_30")):
        # torch 2.13's CPU 16-bit layer_norm sums the weight and bias gradients in low precision,
        # worse as mean/std grows (known issue TORCH-CPU-BF16-LN-GRAD; the rows family and the
        # large-mean cases do the same)
        p["half_at_full"] = True
    return p


COVERING = {op: Covering(_norm_dimensions(op), _norm_cover_params(op), _norm_allowed, seed=45)
            for op in ("rms_norm", "layer_norm")}


class _NormSpec(OpSpec):
    def cases(self):
        return [c for c in CASES if c.params.get("only") in (None, self.op)]

    def work(self, p):
        count = 1
        for size in p["shape"]:
            count *= size
        return count

    def timing_params(self):
        return _case("timing", shape=(1024, 1024)).params

    def large_timing_params(self):
        return _case("timing-large", shape=(8192, 4096)).params

    def is_large(self, problem):
        return bool(problem.feature("large", False))

    def make_inputs(self, p, gen):
        shape = tuple(p["shape"])
        if p["layout"] == "row_stride":
            x = randn(gen, shape[0], shape[-1] + 24)  # rows of a wider buffer
        elif p["layout"] == "transposed":
            x = randn(gen, shape[-1], shape[0])
        else:
            x = randn(gen, *shape)
        x = p["offset"] + p["spread"] * x
        normalized = shape[len(shape) - p["norm_dims"]:]
        inputs = {"x": x}
        if p["affine"]:
            inputs["weight"] = 1.0 + 0.5 * randn(gen, *normalized)
            if p["bias"] and self.op == "layer_norm":
                inputs["bias"] = 0.5 * randn(gen, *normalized)
        return inputs

    def _x_view(self, inputs, p):
        x = inputs["x"]
        if p["layout"] == "row_stride":
            return x[:, : p["shape"][-1]]
        if p["layout"] == "transposed":
            return x.t()
        return x

    def normalized_shape(self, p):
        shape = tuple(p["shape"])
        return shape[len(shape) - p["norm_dims"]:]

    def zero_masks(self, inputs, p):
        if p["layout"] != "row_stride":
            return {}
        # the columns outside the view get no gradient
        pad = torch.zeros_like(inputs["x"], dtype=torch.bool)
        pad[:, p["shape"][-1]:] = True
        return {"grad_x": pad}


class RMSNormSpec(_NormSpec):
    op = "rms_norm"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": {"default": ["torch", "triton", "compile"], "large": ["triton", "torch", "compile"]},
              "cpu": ["torch", "composition"]}
    signature = RMS_NORM.call_line()
    grad_inputs = ("x", "weight")

    @staticmethod
    def reference_fn(x, normalized_shape, weight=None, eps=None):  # eps=None: dtype's eps, set by call()
        return rms_norm(x, normalized_shape, weight, eps)

    def repro_reference(self):
        return rms_norm  # reference_fn passes its arguments on unchanged

    def call(self, fn, inputs, p):
        x = self._x_view(inputs, p)
        eps = p["eps"]
        if eps is None and x.dtype == torch.float64 and "orig_dtype" in inputs:
            # the reference runs upcast: keep the default eps of the dtype under test
            eps = default_rms_eps(inputs["orig_dtype"])
        return fn(x, self.normalized_shape(p), inputs.get("weight"), eps)


class LayerNormSpec(_NormSpec):
    op = "layer_norm"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": {"default": ["torch", "triton", "compile"], "large": ["triton", "torch", "compile"]},
              "cpu": ["torch", "composition"]}
    signature = "fn(x, normalized_shape, weight=None, bias=None, eps=1e-5)"
    grad_inputs = ("x", "weight", "bias")
    reference_fn = staticmethod(layer_norm)

    def call(self, fn, inputs, p):
        eps = 1e-5 if p["eps"] is None else p["eps"]
        return fn(self._x_view(inputs, p), self.normalized_shape(p), inputs.get("weight"), inputs.get("bias"), eps)

    def error_terms(self, inputs, p):
        """out, grad_x and grad_weight: their condition number with respect to the row means
        (layer_norm_floor_terms; x - mean cancels on rows of large |mean| / std or of a variance
        near eps). grad_bias sums grad_out alone: the flat floor. rms_norm has no such term: its
        mean of squares sums positive terms, with no cancellation."""
        eps = 1e-5 if p["eps"] is None else p["eps"]
        return layer_norm_floor_terms(self._x_view(inputs, p), self.normalized_shape(p), inputs.get("weight"),
                                      inputs.get("bias"), eps)


RMS_SPEC = RMSNormSpec()
LN_SPEC = LayerNormSpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("rms_norm", "layer_norm", "default_rms_eps")
