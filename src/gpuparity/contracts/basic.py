"""The softmax, matmul, conv2d and cross_entropy contracts (battery-only ops: no public function):
float64 references, plain compositions and the battery's cases, the ops whose vendor libraries
(cuBLAS/hipBLASLt, cuDNN/MIOpen) most often disagree with the CPU."""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from ..registry import Backend
from ..numerics import cudnn_tf32, matmul_tf32
from .base import Case, OpSpec, family, randn, tf32_precision, view_members


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
    ]

    def make_inputs(self, p, gen):
        logits = randn(gen, p["n"], p["c"], scale=p.get("scale", 2.0))
        target = torch.randint(0, p["c"], (p["n"],), generator=gen)
        if p.get("ignore"):
            target[::3] = -100
        return {"logits": logits, "target": target}

    def call(self, fn, inputs, p):
        return fn(inputs["logits"], inputs["target"], ignore_index=-100,
                  label_smoothing=p.get("smoothing", 0.0), reduction=p.get("reduction", "mean"))

    def timing_params(self):
        return dict(n=1024, c=8192)


SOFTMAX_SPEC = SoftmaxSpec()
MATMUL_SPEC = MatmulSpec()
CONV2D_SPEC = Conv2dSpec()
CROSS_ENTROPY_SPEC = CrossEntropySpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("softmax", "matmul", "conv2d", "cross_entropy")
