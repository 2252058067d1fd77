"""The tolerance policy (docs/design.md), in one place.

err = relative L2 error against the float64 reference over the meaningful elements.
Pass when err <= max(2 * baseline_err, FLOOR[dtype]), where baseline_err is the error of a
plain trusted composition of the op in the same dtype on the same device (FlashAttention's
acceptance rule with a floor). NaN/Inf where the reference is finite always fails. Rows that
must be empty (fully masked attention rows) are checked separately: exactly zero, never NaN.

The floor is the error a correct computation cannot avoid, so it rises where rounding provably
grows (error_floor): with the length of a reduction a kernel may carry in the output dtype, with
the size of the logits an exponential is taken of (and, in attention's grad_q and grad_k, with
how badly the softmax backward cancels on near one-hot rows), and with how badly a row's mean
cancels in x - mean (layer_norm's rows of large |mean| / std). Each term is a rounding-error model
with the factor 2 of the baseline rule, derived in docs/verification.md.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional

import torch


@dataclasses.dataclass
class Comparison:
    """One output or gradient against the float64 reference."""
    name: str
    passed: bool
    err: Optional[float] = None          # relative L2 error over the meaningful elements
    baseline_err: Optional[float] = None  # the same for the trusted baseline composition
    allowed: Optional[float] = None       # max(2 * baseline_err, floor[dtype])
    max_abs: Optional[float] = None
    worst_index: Optional[List[int]] = None
    reason: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# Floors: about 4x the relative L2 error of rounding a random tensor to the dtype
# (unit roundoff / sqrt(3): fp32 3.4e-8, fp16 2.8e-4, bf16 2.3e-3; fp32 gets headroom for
# reductions of thousands of terms), so a near-exact baseline does not make the bar impossible,
# while a wrong formula (ignored mask, wrong scale, unbiased variance at small widths)
# still lands far above it.
FLOOR = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-2,
    # fp32 inputs computed on TF32 matrix units (10-bit mantissa, like fp16) when torch's
    # TF32 switches allow it: docs/design.md says fp32 follows torch's TF32 setting.
    "tf32": 2e-3,
}
BASELINE_FACTOR = 2.0

# The relative L2 error of one rounding of a random tensor to the dtype: unit roundoff / sqrt(3).
ROUNDING = {torch.float64: 2.0 ** -53 / math.sqrt(3), torch.float32: 2.0 ** -24 / math.sqrt(3),
            torch.float16: 2.0 ** -11 / math.sqrt(3), torch.bfloat16: 2.0 ** -8 / math.sqrt(3)}
# Reductions: a correct kernel may sum in fp32 within a tile of this many terms and add each
# tile's partial sum into an output-dtype accumulator (torch's CPU flash attention does: its
# backward adds each block of 256 queries into bf16 grad_k/grad_v, each block of 512 keys into
# bf16 grad_q). Summing K = n / tile partial sums of random sign so rounds K times, each at the
# running sum's size: relative error ROUNDING * sqrt(K / 2).
ACCUMULATION_TILE = 256
# Logits: exp(s) of a logit s held in fp32 (by every kernel, 16-bit ones too) carries a relative
# error of about u * |s|, and a flash kernel rounds such exponents about four times (the scores,
# the running max, the logsumexp, the scores again in its backward), where the composition
# baseline rounds them once: 4 roundings x the baseline factor 2, of the largest logit.
LOGIT_ROUNDINGS = 4
LOGIT_UNIT_ROUNDOFF = 2.0 ** -24
# Near one-hot rows (attention's grad_q, grad_k): dS = P * (dP - D), D = sum_j P_j dP_j, cancels
# where one key takes nearly all of a row's weight (dP - D ~ (1 - P_max) dP). A flash kernel
# normalizes each row by its logsumexp, held in fp32 at the size of the row's max logit m, so its
# recomputed P and the D it forms from its output carry a common relative error delta ~ u |m|,
# which shifts grad_q by delta * scale * D * (P K) and grad_k by delta * scale * P^T (D q): up to
# 1 / (1 - P_max) times the gradient's own size (the composition, normalizing by a sum of
# exp(s - m) with its max term exactly 1, does not pay it). The spec gives each such gradient
# `logit_condition` = ||scale |m| D (P K)|| / ||grad_q|| (the same for grad_k), the floor is the
# baseline factor 2 times u times it: one rounding of the logsumexp, worst case. torch 2.13's
# CPU flash SDPA erred 1/13 to 1/50 of u times it on Sq = 1 rows of x30 logits (2.8e-4 to 0.53;
# docs/verification.md), the composition 1/70 to 1/800 of it.
# The same rows in 16-bit: a flash backward forms D = rowsum(out * dout) from the output it stored,
# rounded to the dtype, so D errs by about u_dtype ||out * dout|| per row, where the composition
# takes D from its own dP (no rounding of out enters it). The spec gives each such gradient
# `delta_condition` = ||scale D' (P K)|| / ||grad_q|| with D' = ||out * dout|| per row (the same for
# grad_k: contracts/attention.attention_condition_sums); the floor is the baseline factor 2 times
# the dtype's unit roundoff times it. torch 2.13's CPU flash SDPA, per sequence of a varlen row
# with x30 logits in bf16 (Sq 1, 8 keys in the window, D 16): grad_q 2.09 relative against 2x the
# composition's 0.204. In fp32 the term is u32 small, under the others.
# Centering (layer_norm): a correct kernel forms each row's mean m by a reduction over the row's
# n terms in its statistics dtype (fp32 for 16-bit inputs: a 16-bit mean would be a bug, and the
# composition baseline uses fp32 too). The result is rounded at |m|'s magnitude once per level of
# a tree (pairwise, cascade or Welford-combine: ceil(log2 n) levels) and once per tile partial
# added sequentially (n / ACCUMULATION_TILE, as above); independent roundings add in quadrature,
# so a tree errs by ROUNDING * sqrt(ceil(log2 n) + n / tile) * |m|. A running sum, the plain loop
# (torch.compile's CPU kernel sums a row of x stored transposed so: 1.0e-6 relative at n = 4095,
# against 5.9e-8 of torch.mean), rounds its k-th partial sum at k |m|, so its mean errs by
# ROUNDING * |m| * sqrt(sum k^2) / n = ROUNDING * sqrt(n / 3) * |m|; a correct kernel may take
# either, and the model is the worse of the two. x - m then
# shifts every x_hat of the row by dm / sqrt(var + eps): a relative error of the mean amplified by
# the row's condition number |m| / sqrt(var + eps) (large for huge means, and for near-constant
# rows, whose variance is at or under eps). The outputs built on x_hat (out, grad_x, grad_weight;
# not grad_bias) inherit it, scaled by their own condition number with respect to the means,
# `mean_condition` (contracts/norms.layer_norm_floor_terms); the floor is the baseline factor
# 2 times the model. The variance, from centred values, carries no such amplification.
STATISTICS_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
# Materialised gradients (linear_cross_entropy): a correct composition may hold d(loss)/d(logits)
# G, grad_output's scale included, in the dtype under test (autograd through F.linear in fp16 does),
# where elements under the dtype's smallest normal keep only an absolute precision (fp16: 6.1e-5;
# p_v * grad_out / tokens over a 32000 vocabulary sit near 1e-7, most under half a subnormal step,
# rounded to 0). Those flushed elements are the small p_v, whose weight rows lean against hidden,
# so their errors add coherently, not in quadrature (2.3x a random-rounding model on vocab_32000).
# The spec gives each output L(G) its `gradient_rounding` = ||L(G.to(dtype) - G)|| / ||L(G)||, the
# shift one rounding of the exact G to the dtype makes; the floor is the baseline factor 2 times it.


def floor_for(dtype, precision: Optional[str] = None) -> float:
    if precision is not None and precision in FLOOR:
        return FLOOR[precision]
    return FLOOR.get(dtype, 1e-5)


def mean_rounding(dtype, terms: int) -> float:
    """The relative RMS error of a correct row mean over `terms` values of `dtype` (the centering
    model above): ROUNDING of the statistics dtype * sqrt(the roundings of a tree, ceil(log2 terms)
    + terms / tile, or of a running sum, terms / 3, whichever is more)."""
    if isinstance(terms, bool) or not isinstance(terms, int) or terms < 1:
        raise ValueError(f"terms: expected an int >= 1 (the values a row's mean sums), got {terms!r}")
    rounding = ROUNDING.get(STATISTICS_DTYPE.get(dtype, dtype), ROUNDING[torch.float32])
    tree = max(1, math.ceil(math.log2(terms))) + terms / ACCUMULATION_TILE
    return rounding * math.sqrt(max(tree, terms / 3))


def error_floor(dtype, precision: Optional[str] = None, reduction: Optional[int] = None,
                logit_peak: Optional[float] = None, mean_condition: Optional[float] = None,
                mean_terms: Optional[int] = None, logit_condition: Optional[float] = None,
                gradient_rounding: Optional[float] = None, delta_condition: Optional[float] = None) -> float:
    """The floor of one output: the dtype's (floor_for), raised where a correct computation errs
    more. reduction: how many terms each element of the output sums (attention's grad_v: the
    query rows, times the heads sharing a KV head); logit_peak: the largest |logit| the output
    takes an exponential of (attention's scaled scores, mask included); mean_condition: the
    output's relative condition number with respect to its rows' means (layer_norm: |mean| /
    sqrt(var + eps) of the rows, weighted as the output is), over rows of mean_terms values;
    logit_condition: the gradient's shift per unit relative error of its rows' normalization,
    in logits (attention's grad_q and grad_k on near one-hot rows, LOGIT_UNIT_ROUNDOFF above);
    gradient_rounding: the output's relative RMS error from an intermediate gradient held in the
    dtype (linear_cross_entropy's d(loss)/d(logits), rounding_rms above); delta_condition: the
    gradient's shift per unit roundoff of the dtype in the output a flash backward reads back
    (attention's grad_q and grad_k on near one-hot rows, above)."""
    floor = floor_for(dtype, precision)
    rounding = ROUNDING.get(dtype, ROUNDING[torch.float32])
    if reduction:
        floor = max(floor, BASELINE_FACTOR * rounding * math.sqrt(reduction / (2 * ACCUMULATION_TILE)))
    if logit_peak is not None and math.isfinite(logit_peak):
        floor = max(floor, BASELINE_FACTOR * LOGIT_ROUNDINGS * LOGIT_UNIT_ROUNDOFF * abs(logit_peak))
    if mean_condition is not None and math.isfinite(mean_condition) and mean_terms:
        floor = max(floor, BASELINE_FACTOR * mean_rounding(dtype, mean_terms) * abs(mean_condition))
    if logit_condition is not None and math.isfinite(logit_condition):
        floor = max(floor, BASELINE_FACTOR * LOGIT_UNIT_ROUNDOFF * abs(logit_condition))
    if gradient_rounding is not None and math.isfinite(gradient_rounding):
        floor = max(floor, BASELINE_FACTOR * abs(gradient_rounding))
    if delta_condition is not None and math.isfinite(delta_condition):
        floor = max(floor, BASELINE_FACTOR * rounding * math.sqrt(3) * abs(delta_condition))
    return floor


def allowed_error(baseline_err: Optional[float], dtype: torch.dtype, precision: Optional[str] = None,
                  reduction: Optional[int] = None, logit_peak: Optional[float] = None,
                  mean_condition: Optional[float] = None, mean_terms: Optional[int] = None,
                  logit_condition: Optional[float] = None, gradient_rounding: Optional[float] = None,
                  delta_condition: Optional[float] = None) -> float:
    floor = error_floor(dtype, precision, reduction, logit_peak, mean_condition, mean_terms, logit_condition,
                        gradient_rounding, delta_condition)
    if baseline_err is None or not math.isfinite(baseline_err):
        return floor
    return max(BASELINE_FACTOR * baseline_err, floor)


def relative_error(out: torch.Tensor, ref: torch.Tensor, valid: Optional[torch.Tensor] = None) -> float:
    """||out - ref|| / ||ref|| in float64 over the valid elements. Where the reference is exactly
    zero (a gradient that vanishes, e.g. grad_q with one key) there is no scale to be relative
    to: the root mean square of out takes its place (the inputs' scale is about 1), so rounding
    noise of a correct kernel (1e-6 per element) passes while a wrong nonzero value fails; 0/0 is 0.
    Computed where the reference is (the battery's on the CPU, the monitor's on a GPU)."""
    out = out.detach().to(ref.device, torch.float64)
    ref = ref.detach().to(torch.float64)
    if valid is not None and not bool(valid.all()):  # (indexing copies: long cases' grads are large)
        valid = valid.to(ref.device).expand_as(ref)
        out, ref = out[valid], ref[valid]
    diff = torch.linalg.vector_norm(out - ref).item()
    norm = torch.linalg.vector_norm(ref).item()
    if norm == 0.0:
        return diff / max(out.numel(), 1) ** 0.5
    return diff / norm


def unravel(flat: int, shape) -> List[int]:
    """torch.unravel_index in plain Python: torch's imports torch.fx's symbolic shapes (sympy),
    1.6 s under the GIL the first time, which the monitor's first check paid beside the run."""
    index = []
    for size in reversed(tuple(shape)):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return index[::-1]


def judge(name: str, out, ref: torch.Tensor, baseline: Optional[torch.Tensor], dtype: torch.dtype,
          valid: Optional[torch.Tensor] = None, must_be_zero: Optional[torch.Tensor] = None,
          precision: Optional[str] = None, reduction: Optional[int] = None,
          logit_peak: Optional[float] = None, mean_condition: Optional[float] = None,
          mean_terms: Optional[int] = None, logit_condition: Optional[float] = None,
          gradient_rounding: Optional[float] = None, delta_condition: Optional[float] = None) -> Comparison:
    """Judge one output (or gradient) against the float64 reference under the policy.

    valid: bool mask (broadcastable to ref) of the meaningful elements.
    must_be_zero: bool mask of the elements that must be exactly 0 (fully masked rows).
    precision: "tf32" when fp32 inputs may run on TF32 units (raises the floor accordingly).
    reduction, logit_peak, mean_condition, mean_terms, logit_condition, gradient_rounding, delta_condition: what
    raises the floor of this output (error_floor).
    Computed where the reference is: the battery's float64 reference is on the CPU; the monitor's
    is on the GPU that ran the call, where copying outputs of 10^7 elements to the host and judging
    them there took most of a check's time.
    """
    if not isinstance(out, torch.Tensor):
        return Comparison(name, False, reason=f"{name}: expected a tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(name, False, reason=f"{name}: wrong shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    where = ref.device
    out64 = out.detach().to(where, torch.float64)
    ref64 = ref.detach().to(torch.float64)
    if valid is None:
        valid_full = torch.ones_like(ref64, dtype=torch.bool)
    else:
        valid_full = valid.to(where).expand_as(ref64).clone()
    if must_be_zero is not None:
        zero_full = must_be_zero.to(where).expand_as(ref64)
        valid_full &= ~zero_full
        bad_zero = zero_full & ~(out64 == 0)
        if bad_zero.any():
            idx = [int(i) for i in bad_zero.nonzero()[0].tolist()]
            value = out64[tuple(idx)].item()
            return Comparison(name, False, reason=(
                f"{name}: a fully masked row must be exactly 0, got {value:g} at {idx} "
                f"({int(bad_zero.sum())} such elements)"), worst_index=idx)

    finite_ref = torch.isfinite(ref64)
    nonfinite = valid_full & finite_ref & ~torch.isfinite(out64)
    if nonfinite.any():
        idx = [int(i) for i in nonfinite.nonzero()[0].tolist()]
        return Comparison(name, False, reason=(
            f"{name}: {int(nonfinite.sum())} NaN/Inf values where the reference is finite, first at {idx}"),
            worst_index=idx)

    err = relative_error(out64, ref64, valid_full)
    baseline_err = None
    if baseline is not None and isinstance(baseline, torch.Tensor) and tuple(baseline.shape) == tuple(ref.shape):
        baseline_err = relative_error(baseline, ref64, valid_full)
    allowed = allowed_error(baseline_err, dtype, precision, reduction, logit_peak, mean_condition, mean_terms,
                            logit_condition, gradient_rounding, delta_condition)
    diff = (out64 - ref64).abs().masked_fill(~valid_full, 0.0)
    if diff.numel():
        flat = int(torch.argmax(diff).item())
        worst_index = unravel(flat, diff.shape)
        max_abs = float(diff.reshape(-1)[flat].item())
    else:
        worst_index, max_abs = [], 0.0
    passed = err <= allowed
    reason = "" if passed or not diff.numel() else (
        f"{name}: relative error {err:.3g} > allowed {allowed:.3g} "
        f"(baseline {baseline_err if baseline_err is None else format(baseline_err, '.3g')}); "
        f"max abs error {max_abs:.3g} at {worst_index} "
        f"(got {out64[tuple(worst_index)].item():.6g}, expected {ref64[tuple(worst_index)].item():.6g})")
    return Comparison(name, passed, err=err, baseline_err=baseline_err, allowed=allowed,
                      max_abs=max_abs, worst_index=worst_index, reason=reason)
