"""The softmax, matmul, conv2d and cross_entropy contracts (battery-only ops: no public function):
float64 references, plain compositions and the battery's cases, the ops whose vendor libraries
(cuBLAS/hipBLASLt, cuDNN/MIOpen) most often disagree with the CPU."""
from __future__ import annotations

import math
from typing import List

import torch
import torch.nn.functional as F

from ..registry import Backend
from ..numerics import cudnn_tf32, matmul_tf32
from .base import TILE_OFFSETS, Case, Covering, OpSpec, family, named_view, randn, tf32_precision, tile_size, view_members


# --------------------------------------------------------------------------- the float64 references
def softmax(x, dim: int = -1):
    return torch.softmax(x, dim=dim)


def matmul(a, b):
    return torch.matmul(a, b)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)


def cross_entropy(logits, target, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean"):
    return F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction)


class _ListedSpec(OpSpec):
    """Specs whose cases are plain dicts: families' members are DEFAULTS + overrides."""
    CASES: List[Case] = []
    DEFAULTS: dict = {}
    FAMILIES: list = []

    def cases(self):
        return self.CASES

    def families(self):
        return self.FAMILIES

    def make_case(self, name, level="default", **overrides):
        return Case(name, {**self.DEFAULTS, **overrides}, level)


# --------------------------------------------------------------------------- the trusted composition (the op's "composition" backend)
def softmax_composition(x, dim=-1):
    """exp / sum in the input dtype, as a model would write it."""
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def matmul_composition(a, b):
    """Products in the input dtype, summed with an fp32 accumulator: no GEMM library involved."""
    return (a.unsqueeze(-1) * b.unsqueeze(-3)).float().sum(dim=-2).to(a.dtype)


def conv2d_composition(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """im2col (unfold) + batched matmul in fp32: no convolution library involved."""
    batch, _, height, width = x.shape
    out_ch, in_per_group, kh, kw = weight.shape
    cols = F.unfold(x.float(), (kh, kw), dilation=dilation, padding=padding, stride=stride)
    cols = cols.view(batch, groups, in_per_group * kh * kw, -1)
    w = weight.float().reshape(groups, out_ch // groups, -1)   # a transposed or sliced weight too
    out = torch.einsum("gok,bgkl->bgol", w, cols).reshape(batch, out_ch, -1)
    pad = (padding, padding) if isinstance(padding, int) else tuple(padding)
    st = (stride, stride) if isinstance(stride, int) else tuple(stride)
    dil = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    out_h = (height + 2 * pad[0] - dil[0] * (kh - 1) - 1) // st[0] + 1
    out_w = (width + 2 * pad[1] - dil[1] * (kw - 1) - 1) // st[1] + 1
    out = out.view(batch, out_ch, out_h, out_w)
    if bias is not None:
        out = out + bias.float().view(1, -1, 1, 1)
    return out.to(x.dtype)


def cross_entropy_composition(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    logp = torch.log_softmax(logits.float(), dim=-1)
    valid = target != ignore_index
    safe_target = target.masked_fill(~valid, 0)
    nll = -logp.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    loss = ((1 - label_smoothing) * nll + label_smoothing * smooth).masked_fill(~valid, 0.0)
    if reduction == "sum":
        return loss.sum().to(logits.dtype)
    if reduction == "none":
        return loss.to(logits.dtype)
    return (loss.sum() / valid.sum()).to(logits.dtype)


# registered by backends.load in the order its line of gpuparity.manifest gives (after torch's own)
COMPOSITIONS = tuple(Backend("composition", op, fn, "plain composition in the input dtype (trusted baseline)",
                             fallback=True)
                     for op, fn in (("softmax", softmax_composition), ("matmul", matmul_composition),
                                    ("conv2d", conv2d_composition), ("cross_entropy", cross_entropy_composition)))


# --------------------------------------------------------------------------- softmax
class SoftmaxSpec(_ListedSpec):
    op = "softmax"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["torch"], "cpu": ["torch"]}
    signature = "fn(x, dim=-1)"
    grad_inputs = ("x",)
    reference_fn = staticmethod(softmax)
    CASES = [
        Case("rows_17", dict(shape=(4, 17), dim=-1, scale=1.0), "quick"),
        Case("odd_781", dict(shape=(2, 781), dim=-1, scale=1.0), "quick"),
        # x30 saturates the softmax: torch's fp16/bf16 backward (from the saved, rounded output)
        # then loses the tiny gradient on every vendor alike, so x30 checks the forward only
        # (overflow handling) and x4 checks the gradient (x8 still loses ~1% from the bf16 output).
        Case("large_logits_x30_fwd", dict(shape=(3, 150), dim=-1, scale=30.0, forward_only=True), "quick"),
        Case("large_logits_x4", dict(shape=(3, 150), dim=-1, scale=4.0), "quick"),
        Case("partial_neg_inf", dict(shape=(4, 33), dim=-1, scale=1.0, neg_inf=True), "quick"),
        Case("dim1_of_3d", dict(shape=(3, 50, 7), dim=1, scale=1.0)),
        Case("width_1", dict(shape=(5, 1), dim=-1, scale=1.0)),
        Case("width_4097", dict(shape=(2, 4097), dim=-1, scale=3.0)),
        Case("transposed_view", dict(shape=(40, 9), dim=-1, scale=1.0, transposed=True)),
        Case("width_32768", dict(shape=(2, 32768), dim=-1, scale=5.0), "full"),
    ]
    DEFAULTS = dict(shape=(4, 33), dim=-1, scale=1.0)
    FAMILIES = [
        family("sizes", [(f"width_{n}", dict(shape=(3, n))) for n in (1025, 63, 65, 127, 129, 255, 257, 1023,
                                                                           2049, 4095, 8193)]),
        family("values", [("near_max", dict(shape=(3, 64), values={"x": {"peak": 1e38, "max_frac": 0.5}},
                                                forward_only=True)),
                              ("denormal_mix", dict(shape=(3, 64), values={"x": "denormal_mix"})),
                              ("constant_rows", dict(shape=(3, 64), values={"x": "constant_rows"}))]),
        family("layouts", view_members(("x",), ("offset", "sliced", "transposed", "expanded"))),
        family("dims", [("dim0_of_2d", dict(shape=(33, 5), dim=0)), ("dim1_of_4d", dict(shape=(2, 17, 3, 4), dim=1)),
                            ("batch_5x3", dict(shape=(5, 3, 40)))]),
    ]

    def make_inputs(self, p, gen):
        x = randn(gen, *p["shape"], scale=p["scale"])
        if p.get("neg_inf"):
            x[:, ::3] = float("-inf")
        if p.get("transposed"):
            x = x.t().contiguous()
        return {"x": x}

    def call(self, fn, inputs, p):
        x = inputs["x"].t() if p.get("transposed") else inputs["x"]
        return fn(x, dim=p["dim"])

    def timing_params(self):
        return dict(shape=(1024, 1024), dim=-1, scale=1.0)


# --------------------------------------------------------------------------- matmul
class MatmulSpec(_ListedSpec):
    op = "matmul"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["torch"], "cpu": ["torch"]}
    signature = "fn(a, b)"
    grad_inputs = ("a", "b")
    reference_fn = staticmethod(matmul)
    CASES = [
        Case("odd_17x33x9", dict(a=(17, 33), b=(33, 9)), "quick"),
        Case("square_64", dict(a=(64, 128), b=(128, 64)), "quick"),
        Case("batched", dict(a=(3, 17, 31), b=(3, 31, 5)), "quick"),
        Case("transposed_b", dict(a=(20, 24), b=(24, 12), b_transposed=True)),
        Case("k_1000", dict(a=(8, 1000), b=(1000, 8))),
        Case("large_m_600000", dict(a=(600000, 4), b=(4, 4))),  # GEMM-GFX1201-LARGEM
        Case("broadcast_batch", dict(a=(2, 3, 10, 16), b=(16, 6))),
        Case("k_4097", dict(a=(64, 4097), b=(4097, 64)), "full"),
    ]
    DEFAULTS = dict(a=(17, 33), b=(33, 9))
    FAMILIES = [
        # m or n == 1 (rocBLAS fp32 at 16-bit precision), tile edges of 16/32/64/128
        family("sizes", [("m1_n65", dict(a=(1, 64), b=(64, 65))), ("n1_m129", dict(a=(129, 32), b=(32, 1))),
                             ("k_127", dict(a=(31, 127), b=(127, 33))), ("k_129_m65", dict(a=(65, 129), b=(129, 63))),
                             ("m192_n64_k65", dict(a=(192, 65), b=(65, 64))), ("k_1", dict(a=(33, 1), b=(1, 17)))],
                   anchors=2),
        family("layouts", [("both_transposed", dict(a=(20, 24), b=(24, 12), views={"a": "transposed",
                                                                                    "b": "transposed"}))]
                   + view_members(("a", "b"), ("offset", "sliced", "transposed"), base=dict(a=(20, 24), b=(24, 12)))),
        family("batch", [("batch_5", dict(a=(5, 9, 17), b=(5, 17, 6))),
                             ("broadcast_b", dict(a=(3, 4, 8, 16), b=(16, 5))),
                             ("batch_expanded", dict(a=(4, 9, 17), b=(4, 17, 6), views={"b": "expanded"}))]),
        family("values", [("denormal_mix", dict(a=(16, 32), b=(32, 16), values={"a": "denormal_mix"}))]),
    ]

    def make_inputs(self, p, gen):
        b_shape = tuple(p["b"])
        b = randn(gen, *(b_shape[::-1] if p.get("b_transposed") else b_shape))
        return {"a": randn(gen, *p["a"]), "b": b}

    def call(self, fn, inputs, p):
        b = inputs["b"].t() if p.get("b_transposed") else inputs["b"]
        return fn(inputs["a"], b)

    def precision(self, dtype, device):
        return tf32_precision(dtype, device, matmul_tf32())

    def timing_params(self):
        return dict(a=(512, 512), b=(512, 512))


# --------------------------------------------------------------------------- conv2d
class Conv2dSpec(_ListedSpec):
    op = "conv2d"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["torch"], "cpu": ["torch"]}
    signature = "fn(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)"
    grad_inputs = ("x", "weight", "bias")
    reference_fn = staticmethod(conv2d)
    CASES = [
        Case("k3_pad1", dict(x=(2, 3, 17, 17), w=(8, 3, 3, 3), stride=1, padding=1), "quick"),
        Case("stride2_groups2", dict(x=(2, 4, 15, 13), w=(6, 2, 3, 3), stride=2, padding=1, groups=2), "quick"),
        Case("dilation2", dict(x=(1, 3, 20, 20), w=(4, 3, 3, 3), dilation=2, padding=2)),
        Case("pointwise_1x1", dict(x=(2, 16, 9, 9), w=(32, 16, 1, 1))),
        Case("channels_last", dict(x=(2, 8, 12, 12), w=(8, 8, 3, 3), padding=1, channels_last=True)),
        Case("depthwise", dict(x=(2, 8, 14, 14), w=(8, 1, 5, 5), padding=2, groups=8)),
        Case("large_image", dict(x=(1, 3, 128, 128), w=(16, 3, 7, 7), stride=2, padding=3), "full"),
    ]
    DEFAULTS = dict(x=(2, 3, 17, 17), w=(8, 3, 3, 3), stride=1, padding=1)
    FAMILIES = [
        family("sizes", [("image_33_channels_65", dict(x=(1, 65, 33, 9), w=(4, 65, 3, 3))),
                             ("image_1x1", dict(x=(3, 4, 1, 1), w=(5, 4, 1, 1), padding=0)),
                             ("channels_1", dict(x=(2, 1, 16, 16), w=(4, 1, 3, 3)))]),
        family("batch", [("batch_5", dict(x=(5, 3, 9, 9), w=(4, 3, 3, 3)))]),
        family("layouts", view_members(("x", "weight"), ("offset", "transposed"))),
        family("values", [("denormal_mix", dict(values={"x": "denormal_mix"}))]),
    ]

    def make_inputs(self, p, gen):
        w_shape = p["w"]
        fan_in = w_shape[1] * w_shape[2] * w_shape[3]
        return {"x": randn(gen, *p["x"]), "weight": randn(gen, *w_shape, scale=fan_in ** -0.5),
                "bias": randn(gen, w_shape[0], scale=0.1)}

    def call(self, fn, inputs, p):
        x = inputs["x"]
        if p.get("channels_last"):
            x = x.contiguous(memory_format=torch.channels_last)
        return fn(x, inputs["weight"], inputs["bias"], p.get("stride", 1), p.get("padding", 0),
                  p.get("dilation", 1), p.get("groups", 1))

    def precision(self, dtype, device):
        return tf32_precision(dtype, device, cudnn_tf32())

    def timing_params(self):
        return dict(x=(8, 32, 28, 28), w=(32, 32, 3, 3), padding=1)


# --------------------------------------------------------------------------- cross-entropy
# The argument space as dimensions (the `cover` family, checks/covering.py). The vocabulary sits
# on and off the tiles 16..128 at one, two and eight tiles, and on and off the triton backend's
# block of 4096 columns (backends/triton_cross_entropy.py LOSS_FWD: one block up to 4096, a loop
# of blocks past it); rows on and off 128; the target's form (some rows ignored, a padded suffix,
# all, classes 0 and c - 1) with each ignore_index (the default -100, -1, a valid class), label
# smoothing, each reduction, the logits' and the target's layout and storage, and value regimes.
# 32000 classes: the listed vocab_32000 (--level full).
CE_TILES = (16, 32, 64, 128, 4096)
CE_MULTIPLES = (1, 2, 8)
CE_TARGETS = ("plain", "some_ignored", "padded", "all_ignored", "class0", "last_class")
CE_IGNORE = ("default", "minus_one", "valid_class")
CE_LAYOUTS = ("contiguous", "row_stride", "logits_sliced", "logits_transposed", "logits_offset", "logits_expanded")
CE_VALUES = {"normal": {}, "large": dict(scale=30.0), "huge": dict(scale=3000.0), "near_one_hot": dict(peak=12.0),
             "denormal": dict(values={"logits": "denormal_mix"}), "tiny": dict(scale=1e-3)}
CE_DIMENSIONS = (("rows", (1, 7, 127, 128, 129, 300)), ("c_tile", CE_TILES), ("c_offset", TILE_OFFSETS),
                 ("c_multiple", CE_MULTIPLES), ("target", CE_TARGETS), ("ignore_index", CE_IGNORE),
                 ("smoothing", (0.0, 0.1)), ("reduction", ("mean", "sum", "none")), ("layout", CE_LAYOUTS),
                 ("target_layout", ("contiguous", "target_sliced", "target_offset")), ("values", tuple(CE_VALUES)))


def _ce_allowed(row) -> bool:
    if row.get("c_tile") == 4096 and (row.get("c_multiple", 1) != 1 or row.get("rows", 1) > 129):
        return False   # one block of the triton backend's loop and a little more: few rows
    return True


def _ce_cover_params(row) -> dict:
    p = dict(n=row["rows"], c=tile_size(row["c_tile"], row["c_offset"], row["c_multiple"]), target=row["target"],
             ignore_index=row["ignore_index"], smoothing=row["smoothing"], reduction=row["reduction"],
             **CE_VALUES[row["values"]])
    views = {**named_view(row["target_layout"])}
    if row["layout"] == "row_stride":
        p["layout"] = "row_stride"
    else:
        views.update(named_view(row["layout"]))
    if views:
        p["views"] = views
    if (row["rows"] > 64 and row["reduction"] != "none") or row["values"] == "near_one_hot":
        # torch 2.13's CPU 16-bit cross_entropy sums the row losses in the 16-bit dtype (known
        # issue TORCH-CPU-FP16-CE-MEAN: fp16 overflows; bf16 loses 1.4-3% over 128-300 rows, an
        # fp32 sum rounded once 0.2%), and its bf16 log_softmax rounds a row's sum of exps to
        # bf16 (a near one-hot row's log p of -0.00837 comes out -0.00778, 7%; the loss of a row
        # 0 instead of 0.0038: known issue TORCH-CPU-BF16-CE-ONEHOT): 16-bit at --full
        p["half_at_full"] = True
    return p


# Groups (every triple among their dimensions, checks/covering.py): what decides the loss's
# meaning (the target's form, ignore_index, smoothing, reduction) against the vocabulary's
# place on a tile, the rows and the logits' layout. dtype_pairs: a row of `check --impl` runs in
# about one dtype, every value of every dimension meeting fp32 and bf16 in some row.
CE_GROUPS = ((("c_offset", "target", "ignore_index", "smoothing", "reduction"), 3),
             (("rows", "target", "smoothing", "reduction"), 3), (("layout", "target", "reduction"), 3))
# the largest constant the relation logit_shift adds to a row's logits (checks/relation_defs.py
# ce_logit_shift's reach): its floor allows for logits that much larger
CE_SHIFT_REACH = 64.0
COVERING = {"cross_entropy": Covering(CE_DIMENSIONS, _ce_cover_params, _ce_allowed, seed=45, groups=CE_GROUPS,
                                      dtype_pairs=True)}


def ce_ignore_index(p) -> int:
    """The ignore_index a case passes (-100 for "default", which the call leaves out)."""
    kind = p.get("ignore_index", "default")
    if isinstance(kind, int):
        return kind
    return {"default": -100, "minus_one": -1, "valid_class": p["c"] // 2}[kind]


class CrossEntropySpec(_ListedSpec):
    op = "cross_entropy"
    # speed priors per device family, fastest first (priors.py: what they mean, the records); "triton"
    # (cross_entropy_loss's kernels) is not timed against F.cross_entropy yet, so it comes after torch
    priors = {"cuda": ["torch", "triton"], "cpu": ["torch", "composition"]}
    signature = "fn(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction='mean')"
    grad_inputs = ("logits",)
    reference_fn = staticmethod(cross_entropy)
    CASES = [
        Case("classes_10", dict(n=17, c=10), "quick"),
        Case("ignore_index", dict(n=20, c=7, ignore=True), "quick"),
        Case("label_smoothing", dict(n=12, c=33, smoothing=0.1), "quick"),
        Case("large_logits_x30", dict(n=16, c=50, scale=30.0)),
        Case("vocab_1000_sum", dict(n=8, c=1000, reduction="sum")),
        Case("reduction_none", dict(n=9, c=5, reduction="none")),
        Case("vocab_32000", dict(n=32, c=32000), "full"),
    ]
    DEFAULTS = dict(n=17, c=10)
    FAMILIES = [
        family("sizes", [("classes_4097", dict(n=5, c=4097)), ("classes_127", dict(n=9, c=127)),
                             ("classes_129_ignore", dict(n=13, c=129, ignore=True)), ("rows_129", dict(n=129, c=33)),
                             ("classes_1", dict(n=7, c=1))]),
        family("values", [("huge_logits", dict(n=12, c=40, scale=3000.0)),
                              ("denormal_mix", dict(n=12, c=40, values={"logits": "denormal_mix"}))]),
        family("layouts", view_members(("logits",), ("offset", "sliced", "transposed"), base=dict(n=12, c=20))),
        family("targets", [("padded_suffix", dict(n=24, c=40, target="padded")),
                               ("custom_ignore_index", dict(n=20, c=33, target="some_ignored", ignore_index="minus_one"))]),
    ]

    def work(self, p):
        return p["n"] * p["c"]

    def make_inputs(self, p, gen):
        n, c = p["n"], p["c"]
        logits = randn(gen, n, c + (24 if p.get("layout") == "row_stride" else 0), scale=p.get("scale", 2.0))
        target = torch.randint(0, c, (n,), generator=gen)
        form = p.get("target", "some_ignored" if p.get("ignore") else "plain")
        ignore_index = ce_ignore_index(p)
        if form == "class0":
            target[::2] = 0
        elif form == "last_class":
            target[::2] = c - 1
        elif form == "some_ignored":
            target[::3] = ignore_index
        elif form == "padded":   # a padded batch: the last third of the rows ignored
            target[n - n // 3:] = ignore_index
        elif form == "all_ignored":
            target[:] = ignore_index
        if p.get("peak"):   # near one-hot rows: the target's logit far above the others
            rows = torch.arange(n)
            logits[rows, target.clamp(0, c - 1)] += p["peak"]
        return {"logits": logits, "target": target}

    def _logits(self, inputs, p):
        logits = inputs["logits"]
        return logits[:, :p["c"]] if p.get("layout") == "row_stride" else logits

    def call(self, fn, inputs, p):
        kwargs = dict(label_smoothing=p.get("smoothing", 0.0), reduction=p.get("reduction", "mean"))
        if p.get("ignore_index", "default") != "default":
            kwargs["ignore_index"] = ce_ignore_index(p)
        return fn(self._logits(inputs, p), inputs["target"], **kwargs)

    def valid_masks(self, inputs, p):
        """'mean' over no row that counts is 0 / 0 (NaN in float64 and torch): its value is not
        judged (its gradient, zeros, is). Nor is a loss past the dtype's range (a 'sum' of huge
        logits' losses in fp16): inf is its right answer there."""
        target = inputs["target"]
        if (p.get("views") or {}).get("target") == "expanded":
            target = target[:1].expand(target.shape)
        reduction = p.get("reduction", "mean")
        if reduction == "mean" and not bool((target != ce_ignore_index(p)).any()):
            return {"out": torch.zeros((), dtype=torch.bool)}
        dtype = inputs.get("orig_dtype")
        if dtype is None or reduction == "mean":
            return {}
        logits = self._logits(inputs, p).detach().to(torch.float64)
        if (p.get("views") or {}).get("logits") == "expanded":
            logits = logits[:1].expand(logits.shape)
        valid = target != ce_ignore_index(p)
        with torch.no_grad():
            rows = cross_entropy(logits, target.masked_fill(~valid, 0), label_smoothing=p.get("smoothing", 0.0),
                                 reduction="none") * valid
            out = rows.sum() if reduction == "sum" else rows
        in_range = out.abs() <= torch.finfo(dtype).max
        return {} if bool(in_range.all()) else {"out": in_range}

    def zero_masks(self, inputs, p):
        if p.get("layout") != "row_stride":
            return {}
        pad = torch.zeros_like(inputs["logits"], dtype=torch.bool)   # the columns outside the view
        pad[:, p["c"]:] = True
        return {"grad_logits": pad}

    def error_terms(self, inputs, p):
        """What raises the floor (tolerance.error_floor). logit_peak, the largest |logit| of a row
        not ignored: a kernel that forms log p = z - lse (flash style, the lse in fp32 at the size
        of the row's max) errs by |z| times fp32's roundoff where the composition's x - max is
        exact; out's logit_condition: so the loss of a row, lse - z_y, errs by u |max logit|,
        large against a near one-hot row's small loss (rows' maxima in L2 over the loss's size).
        grad_logits' gradient_rounding, 16-bit only: the shift of the gradient a correct
        kernel makes by holding the log-probabilities and the softmax in the dtype under test
        (torch's log_softmax saves its output so, and its backward forms exp(that) in it): on
        near one-hot rows the gradient is small against 1, the target's p - 1 rounds to 0 and
        each exp(log p) of the other classes carries |log p| times the dtype's rounding.
        Measured in float64 on the case's values."""
        dtype = inputs.get("orig_dtype")
        views = p.get("views") or {}
        logits = self._logits(inputs, p).detach().to(torch.float64)
        target = inputs["target"]
        if views.get("logits") == "expanded":
            logits = logits[:1].expand(logits.shape)
        if views.get("target") == "expanded":
            target = target[:1].expand(target.shape)
        valid = target != ce_ignore_index(p)
        if logits.numel() == 0 or not bool(valid.any()):
            return {}
        # the relation logit_shift's second call adds up to CE_SHIFT_REACH to a row's logits
        reach = CE_SHIFT_REACH if p.get("relation") == "logit_shift" else 0.0
        peaks = logits.abs().amax(-1) + reach
        peak = float(peaks[valid].max())
        terms = {"out": {"logit_peak": peak}, "grad_logits": {"logit_peak": peak}}
        grad_out = inputs.get("grad_out")
        with torch.no_grad():   # logit_condition: each row's lse errs by u |max logit|
            smoothing = p.get("smoothing", 0.0)
            rows = cross_entropy(logits, target.masked_fill(~valid, 0), label_smoothing=smoothing, reduction="none")
            rows = rows[valid]
            size = float(rows.abs().sum() if p.get("reduction", "mean") != "none" else torch.linalg.vector_norm(rows))
            if size > 0.0 and math.isfinite(size):
                terms["out"]["logit_condition"] = float(torch.linalg.vector_norm(peaks[valid])) / size
            # the gradient's row r, s_r (p_r - y_r), shifts by delta_r s_r p_r (p scaled by e^delta)
            probs = torch.softmax(logits, -1)
            onehot = torch.zeros_like(probs)
            onehot[valid.nonzero()[:, 0], target[valid].long()] = 1.0
            onehot = (1 - smoothing) * onehot + smoothing / probs.shape[-1]
            scale = torch.ones(len(target), dtype=torch.float64)
            if isinstance(grad_out, torch.Tensor) and p.get("reduction", "mean") == "none":
                scale = grad_out.reshape(-1).to(torch.float64).abs()
            scale = scale * valid
            shift = float(torch.linalg.vector_norm(peaks * scale * torch.linalg.vector_norm(probs, dim=-1)))
            size = float(torch.linalg.vector_norm(scale * torch.linalg.vector_norm(probs - onehot, dim=-1)))
            if size > 0.0 and math.isfinite(size):
                terms["grad_logits"]["logit_condition"] = shift / size
        if not isinstance(grad_out, torch.Tensor) or dtype is None or dtype == torch.float32:
            return terms
        with torch.no_grad():
            logp = torch.log_softmax(logits, -1)
            rounded = logp.to(dtype).to(torch.float64)
            scale = grad_out.reshape(-1).to(torch.float64) if p.get("reduction", "mean") == "none" else \
                grad_out.reshape(()).to(torch.float64).expand(len(target))
            scale = scale * valid
            exact = (logp.exp() - onehot) * scale[:, None]
            shift = (rounded.exp().to(dtype).to(torch.float64) - logp.exp()) * scale[:, None]
            norm = float(torch.linalg.vector_norm(exact))
        if norm > 0.0 and math.isfinite(norm):
            terms["grad_logits"]["gradient_rounding"] = float(torch.linalg.vector_norm(shift)) / norm
        return terms

    def timing_params(self):
        return dict(n=1024, c=8192)


SOFTMAX_SPEC = SoftmaxSpec()
MATMUL_SPEC = MatmulSpec()
CONV2D_SPEC = Conv2dSpec()
CROSS_ENTROPY_SPEC = CrossEntropySpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("softmax", "matmul", "conv2d", "cross_entropy")
