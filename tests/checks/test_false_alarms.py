"""Correct implementations must never fail the battery. torch's own CPU SDPA kernel (flash
attention for CPU) failed cases by effects a correct computation has, which the tolerance
policy now models (tolerance.error_floor): its bf16 backward adds each block of 256 queries or
512 keys into the bf16 gradient (a long reduction), and fp32 exponentials of logits of ~120
carry ~u*120 of error, rounded more often by a flash algorithm than by the composition."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpuparity import tolerance
from gpuparity.checks import execute, families
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.dispatch import get as get_backend


def _fold(attn_mask, keep):
    """attn_mask with the positions where the bool `keep` is False masked out."""
    if attn_mask is None:
        return keep
    return attn_mask & keep if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~keep, float("-inf"))


def sdpa(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """A correct --impl: torch's SDPA with the key padding folded into the mask, and causal too
    where there is a mask (torch refuses a mask together with is_causal; both are top-left
    aligned); a query row with no key left is 0, as the contract says (torch's GPU kernels leave
    what they leave there)."""
    if key_padding_mask is not None:
        attn_mask = _fold(attn_mask, ~key_padding_mask[:, None, None, :])
    if is_causal and attn_mask is not None:
        attn_mask = _fold(attn_mask, torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril())
        is_causal = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    if attn_mask is None:
        return out
    keep = attn_mask if attn_mask.dtype == torch.bool else ~torch.isneginf(attn_mask)
    return out.masked_fill(~keep.any(-1, keepdim=True), 0)


ALL = {"out", "grad_q", "grad_k", "grad_v"}


@pytest.mark.parametrize("case, dtype, base_seed, raised", [
    # before: grad_q 1.07e-5 > 1e-5 (logits up to ~114)
    ("large_logits_x30", "float32", 0, ALL),
    # before: grad_q 1.82e-5 > 1.48e-5 (massive-activation rows, logits ~ +120)
    ("values.massive_pos_bool_mask", "float32", 1, ALL),
    # before: grad_v 0.0102 > 0.01 (grad_k and grad_v sum 16448 query rows)
    ("long.sq16448_sk64_bool", "bfloat16", 0, {"grad_k", "grad_v"}),
    # before: grad_q 0.0205 > 0.01 (out and grad_q sum 131136 keys)
    ("long.sq8_sk131136_padding", "bfloat16", 0, {"out", "grad_q"}),
])
def test_torch_cpu_sdpa_passes_where_it_used_to_false_alarm(case, dtype, base_seed, raised):
    spec = get_spec("attention")
    params = families.lookup(spec, case).params
    seed = execute.task_seed(base_seed, "attention", case, dtype)
    torch_dtype = execute.dtype_from_name(dtype)
    status, comparisons, reason = execute.run_case("attention", sdpa, params, torch_dtype, torch.device("cpu"),
                                                   seed, get_backend("attention", "composition").fn)
    assert status == Status.PASS, reason
    # the bound moved where the named effect is, not wholesale: the other outputs keep the policy's
    flat = {c.name: tolerance.allowed_error(c.baseline_err, torch_dtype) for c in comparisons}
    assert {c.name for c in comparisons if c.allowed > flat[c.name]} == raised


# --------------------------------------------------------------------------- layer_norm's cancelling rows (issue 45)
def layer_norm_fp32_statistics(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm with fp32 statistics, output in x's dtype (torch's native CPU bf16 kernel is
    the known issue TORCH-CPU-BF16-LN-GRAD, 6-19% off in grad_weight on these rows)."""
    up = (lambda t: None if t is None else t.float())
    return F.layer_norm(x.float(), normalized_shape, up(weight), up(bias), eps).to(x.dtype)


def _affine(y, weight, bias):
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def layer_norm_moments_in_input_dtype(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The bug: var = E[x^2] - E[x]^2 in x's dtype (cancels catastrophically on rows of large mean)."""
    dims = tuple(range(-len(normalized_shape), 0))
    mean = x.mean(dims, keepdim=True)
    var = (x * x).mean(dims, keepdim=True) - mean * mean
    return _affine((x - mean) * torch.rsqrt(var.clamp_min(0) + eps), weight, bias)


def layer_norm_drops_eps(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The bug: rsqrt(var), eps dropped."""
    return F.layer_norm(x, normalized_shape, weight, bias, 0.0)


def layer_norm_row0_neighbour_mean(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The bug: the first row is centred with the second row's mean (an off-by-one row index)."""
    dims = tuple(range(-len(normalized_shape), 0))
    flat = x.float().reshape(-1, *normalized_shape)
    mean = flat.mean(dims, keepdim=True)
    if flat.shape[0] > 1:
        mean = torch.cat([mean[1:2], mean[1:]])
    var = (flat - flat.mean(dims, keepdim=True)).pow(2).mean(dims, keepdim=True)
    y = ((flat - mean) * torch.rsqrt(var + eps)).reshape(x.shape).to(x.dtype)
    return _affine(y, weight, bias)


def native(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def rms_native(x, normalized_shape, weight=None, eps=None):
    return F.rms_norm(x, normalized_shape, weight, eps)


# values.drawN of layer_norm (explore's members, --explore's seed 0) that failed a correct fp32
# F.layer_norm before the centering floor: grad_weight 1.26x, 1.38x, 1.22x, 1.02x, 1.01x the
# old bound, out 1.01x; constant_rows ones that came close (0.69-0.83x); and ordinary ones.
NORM_DRAWS = (184, 144, 86, 91, 83, 80, 141, 85, 47, 49)


def _norm_cases(op):
    """huge_mean_1000 and tiny_variance / constant_rows draws of the values family: NORM_DRAWS for
    layer_norm, rms_norm's first 10 such draws (draws are per op)."""
    spec = get_spec(op)
    values = next(f for f in families.all_families(spec) if f.name == "values")
    if op == "layer_norm":
        picked = [families.drawn(spec, values, number) for number in NORM_DRAWS]
    else:
        drawn = (families.drawn(spec, values, number) for number in range(200))
        picked = [c for c in drawn if c.params["drawn_as"].startswith(("tiny_variance", "constant_rows"))][:10]
    assert {c.params["drawn_as"].split("_")[0] for c in picked} == {"tiny", "constant"}
    return [("huge_mean_1000", families.lookup(spec, "huge_mean_1000").params)] + [(c.name, c.params) for c in picked]


def _run(op, fn, case, params, dtype):
    torch_dtype = execute.dtype_from_name(dtype)
    seed = execute.task_seed(0, op, case, dtype)
    return execute.run_case(op, fn, params, torch_dtype, torch.device("cpu"), seed, get_backend(op, "composition").fn)


@pytest.mark.parametrize("op, fn, dtype", [("layer_norm", native, "float32"),
                                           ("layer_norm", layer_norm_fp32_statistics, "bfloat16"),
                                           ("rms_norm", rms_native, "float32"), ("rms_norm", rms_native, "bfloat16")])
def test_correct_norms_pass_rows_whose_mean_cancels(op, fn, dtype):
    """Before: a correct fp32 F.layer_norm failed huge_mean_1000 (grad_x 1.08e-5 > 1e-5) and the
    draws above; x - mean cancels on such rows for every correct algorithm, and the floor now
    follows that (tolerance.mean_rounding x the rows' condition number)."""
    raised = set()
    for case, params in _norm_cases(op):
        status, comparisons, reason = _run(op, fn, case, params, dtype)
        assert status == Status.PASS, f"{case}: {reason}"
        torch_dtype = execute.dtype_from_name(dtype)
        raised |= {c.name for c in comparisons if c.allowed > tolerance.allowed_error(c.baseline_err, torch_dtype)}
    # only layer_norm's x_hat-built outputs in fp32 move (fp32 statistics make the term ~1e-4:
    # under bf16's flat floor), never grad_bias
    assert raised == ({"out", "grad_x", "grad_weight"} if (op, dtype) == ("layer_norm", "float32") else set())


def _failed(fn, dtype):
    """(cases failed, cases past the flat bound of before the centering floor) of `fn`."""
    torch_dtype = execute.dtype_from_name(dtype)
    now, flat = set(), set()
    for case, params in _norm_cases("layer_norm"):
        status, comparisons, _ = _run("layer_norm", fn, case, params, dtype)
        if status != Status.PASS:
            now.add(case)
        if status != Status.PASS and (not comparisons or any(
                c.err is None or c.err > tolerance.allowed_error(c.baseline_err, torch_dtype) for c in comparisons)):
            flat.add(case)
    return now, flat


@pytest.mark.parametrize("fn, dtype, regimes", [
    (layer_norm_moments_in_input_dtype, "float32", ("huge", "tiny", "constant")),
    (layer_norm_moments_in_input_dtype, "bfloat16", ("huge", "tiny")),   # bf16 constant rows: var rounds to 0
    (layer_norm_drops_eps, "float32", ("tiny", "constant")),             # var >> eps at mean 1000: invisible
    (layer_norm_row0_neighbour_mean, "float32", ("huge", "tiny", "constant")),
    (layer_norm_row0_neighbour_mean, "bfloat16", ("huge", "tiny", "constant"))])
def test_planted_layer_norm_bugs_still_fail_where_the_floor_rose(fn, dtype, regimes):
    """The raised floor is not blind: each bug fails on exactly the cases it failed under the
    flat bound, those of every regime it shows in (huge_mean_1000, tiny_variance, constant_rows)."""
    now, flat = _failed(fn, dtype)
    assert now == flat
    kinds = {case: params.get("drawn_as", case) for case, params in _norm_cases("layer_norm")}
    for regime in regimes:
        assert {case for case in kinds if kinds[case].startswith(regime)} <= now, regime


# --------------------------------------------------------------------------- a running-sum mean (issue 45's audit)
def layer_norm_running_sum_mean(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """A correct layer_norm whose fp32 mean is a plain loop, s += x[:, k] (torch.compile's CPU
    kernel sums a row of x stored transposed so); the gradient is the exact mean's."""
    width = math.prod(normalized_shape)
    rows = x.float().reshape(-1, width)
    with torch.no_grad():
        total = torch.zeros(rows.shape[0], dtype=torch.float32)
        for k in range(width):
            total += rows[:, k]
    exact = rows.mean(-1)
    mean = (exact + (total / width - exact).detach())[:, None]
    var = (rows - mean).pow(2).mean(-1, keepdim=True)
    return _affine(((rows - mean) * torch.rsqrt(var + eps)).reshape(x.shape),
                   None if weight is None else weight.float(), None if bias is None else bias.float()).to(x.dtype)


# fp32, seed 0: the running sum failed these at 1.16x (cover3.98: rows of mean 5, spread 1e-3,
# 4095 wide, stored transposed; torch.compile's backend failed it at --level full at 1.16x too),
# 1.52x and 1.52x the tree-only model's bound, in out and grad_weight
RUNNING_SUM_CASES = ("cover3.98", "huge_mean_1000", "large_mean_100")


def test_a_running_sum_mean_passes_rows_whose_mean_cancels():
    spec = get_spec("layer_norm")
    for case in RUNNING_SUM_CASES:
        status, comparisons, reason = _run("layer_norm", layer_norm_running_sum_mean, case,
                                           families.lookup(spec, case).params, "float32")
        assert status == Status.PASS, f"{case}: {reason}"


@pytest.mark.parametrize("fn", [layer_norm_moments_in_input_dtype, layer_norm_row0_neighbour_mean])
def test_planted_layer_norm_bugs_still_fail_where_the_running_sum_raised_the_floor(fn):
    spec = get_spec("layer_norm")
    for case in RUNNING_SUM_CASES:
        status, _, reason = _run("layer_norm", fn, case, families.lookup(spec, case).params, "float32")
        assert status == Status.FAIL, f"{case}: {reason}"


# --------------------------------------------------------------------------- conv2d's composition (issue 45's audit)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv2d_composition_takes_a_transposed_weight(dtype):
    """Before: the conv2d composition (gpuparity's own backend) raised on every layout member with
    a non-contiguous weight ("view size is not compatible"): 63 ERRORs at --level full."""
    spec = get_spec("conv2d")
    case = "layouts.weight_transposed"
    status, _, reason = _run("conv2d", get_backend("conv2d", "composition").fn, case, families.lookup(spec, case).params,
                             dtype)
    assert status == Status.PASS, reason


# --------------------------------------------------------------------------- linear_cross_entropy's fp16 gradient (issue 45's audit)
class _OnGrad(torch.autograd.Function):
    """Identity forward; backward passes the incoming gradient through `change`."""

    @staticmethod
    def forward(ctx, x, change):
        ctx.change = change
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.change(grad), None


def _materialized_with(on_hidden=None, on_logits=None):
    """The "torch" backend's materialising composition (fp16 logits, fp32 cross entropy,
    autograd) with a planted change to grad_hidden or to d(loss)/d(logits) on its way back."""
    def fn(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean", softcap=None):
        assert softcap is None and reduction == "mean"
        if on_hidden is not None:
            hidden = _OnGrad.apply(hidden, on_hidden)
        logits = F.linear(hidden, weight, bias)
        if on_logits is not None:
            logits = _OnGrad.apply(logits, on_logits)
        return F.cross_entropy(logits.float().reshape(-1, weight.shape[0]), target.reshape(-1).long(),
                               ignore_index=ignore_index)
    return fn


# d(loss)/d(logits) 1% too large in grad_hidden; and held in bf16 instead of the input's fp16
lce_grad_hidden_1_01 = _materialized_with(on_hidden=lambda g: g * 1.01)
lce_logits_grad_in_bf16 = _materialized_with(on_logits=lambda g: g.to(torch.bfloat16).to(g.dtype))
# fp16, seed 0: the torch backend's grad_hidden erred 1.11e-3 and 1.51e-3 > 1e-3 (flat floor) here
LCE_CASES = ("vocab_32000", "sizes.vocab_8193")


def _lce(fn, case):
    spec = get_spec("linear_cross_entropy")
    return _run("linear_cross_entropy", fn, case, families.lookup(spec, case).params, "float16")


@pytest.mark.parametrize("case", LCE_CASES)
def test_materialized_linear_cross_entropy_passes_where_fp16_flushes_its_logits_gradient(case):
    """Before: the "torch" backend (the spec's baseline, F.linear in fp16 + fp32 cross entropy)
    failed both cases at --level full: autograd rounds d(loss)/d(logits), grad_out / tokens
    included, to fp16, where 72% of vocab_32000's elements flush to 0 (tolerance.error_floor's
    gradient_rounding). Only grad_hidden (and grad_bias's sum) moved, not the whole op."""
    status, comparisons, reason = _lce(get_backend("linear_cross_entropy", "torch").fn, case)
    assert status == Status.PASS, reason
    raised = {c.name for c in comparisons if c.allowed > tolerance.allowed_error(c.baseline_err, torch.float16)}
    assert "grad_hidden" in raised and raised <= {"grad_hidden", "grad_bias"}


# grad_hidden x 1.01 errs 1.05e-2 in both (bounds now 2.18e-3 / 2.95e-3). A bf16 d(loss)/d(logits)
# keeps fp16's flushed elements (bf16 has fp32's exponents), so its grad_hidden (1.4e-3 / 2.0e-3)
# is no worse than a correct fp16 one's: it fails in grad_weight (1.09e-3 / 1.35e-3 > 1e-3, a
# floor that did not move), as it did before.
@pytest.mark.parametrize("fn, failing", [(lce_grad_hidden_1_01, {"grad_hidden"}),
                                         (lce_logits_grad_in_bf16, {"grad_weight"})])
@pytest.mark.parametrize("case", LCE_CASES)
def test_planted_linear_cross_entropy_bugs_fail_where_the_gradient_floor_rose(fn, failing, case):
    status, comparisons, reason = _lce(fn, case)
    assert status == Status.FAIL, reason
    assert failing <= {c.name for c in comparisons if not c.passed}
