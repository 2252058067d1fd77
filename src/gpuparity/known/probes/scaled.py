"""Probes of the scaled and grouped matmuls (torch._scaled_mm with a float8 output, torch._grouped_mm
in a loop) against exact or float64 answers. Each decision is a small function of the outputs, so a
test can hand it a wrong output and see it confirm."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch

from .base import finding, first_line, inconclusive, judge, probe, randn, summarize, sync

# float8 e4m3 has 3 mantissa bits: one rounding is at most half a step, 2^-4 of the value.
E4M3_HALF_STEP = 2.0 ** -4


def scale_result_finding(out_scaled: torch.Tensor, out_unscaled: torch.Tensor, accumulated: torch.Tensor,
                         scale: float) -> Dict[str, Any]:
    """Decide pytorch/pytorch#190449 from two float8 outputs of one product: `out_scaled` asked for
    scale_result=`scale`, `out_unscaled` for 1.0; `accumulated` is the exact product (float64).
    Confirmed when the two outputs are identical (scale_result ignored) or `out_scaled` is off
    `scale * accumulated` by more than one float8 rounding (half a step of e4m3)."""
    scaled = out_scaled.detach().to("cpu", torch.float64)
    unscaled = out_unscaled.detach().to("cpu", torch.float64)
    exact = accumulated.detach().to("cpu", torch.float64) * scale
    nonzero = exact != 0
    rel = float(((scaled - exact).abs()[nonzero] / exact.abs()[nonzero]).max()) if nonzero.any() else 0.0
    ignored = bool(torch.equal(scaled, unscaled)) and bool((exact != accumulated.to("cpu", torch.float64)).any())
    divided = bool(torch.allclose(scaled, accumulated.to("cpu", torch.float64) / scale, rtol=E4M3_HALF_STEP, atol=0))
    measured = {"max_rel_err": rel, "scale": scale, "ignored": ignored}
    if ignored:
        return finding(True, f"_scaled_mm with a float8 output ignored scale_result={scale:g}: the output equals "
                             f"the one with scale_result=1 (max relative error vs {scale:g} x product {rel:.3g})",
                       **measured)
    if rel > E4M3_HALF_STEP and divided:
        return inconclusive(f"_scaled_mm applied scale_result={scale:g} as a divisor (output = product / scale), "
                            f"not as the scale of the output this issue is about", **measured)
    failed = rel > E4M3_HALF_STEP
    return finding(failed, f"_scaled_mm float8 output with scale_result={scale:g}: max relative error vs the exact "
                           f"scaled product {rel:.3g} ({'more' if failed else 'no more'} than one e4m3 rounding, "
                           f"{E4M3_HALF_STEP:g})", **measured)


@probe(gpu=True)
def scaled_mm_scale_result(dev: torch.device) -> Dict[str, Any]:
    """torch._scaled_mm(out_dtype=float8_e4m3fn, scale_result=0.5) on small integer operands (K=16,
    so the product and its half are exact in e4m3) against the exact answer (pytorch/pytorch#190449)."""
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9) and not torch.version.hip:
        return inconclusive(f"float8 matmul needs compute capability >= 8.9, this GPU has "
                            f"{'.'.join(map(str, torch.cuda.get_device_capability(dev)))}")
    fp8 = torch.float8_e4m3fn
    generator = torch.Generator().manual_seed(0)
    # entries in {-2, 0, 2}: the product is a multiple of 4 of size <= 64, so it, its half and its
    # double are all exact in e4m3 (the answer has no rounding to blur a wrong scale)
    a = (2 * torch.randint(-1, 2, (32, 16), generator=generator)).float()
    b = (2 * torch.randint(-1, 2, (32, 16), generator=generator)).float()
    accumulated = a.double() @ b.double().t()
    one = torch.tensor(1.0, device=dev)
    try:
        a8, b8 = a.to(dev, fp8), b.to(dev, fp8).t()     # b column-major, as cuBLASLt wants
        outs = [torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, scale_result=torch.tensor(s, device=dev),
                                 out_dtype=fp8) for s in (0.5, 1.0)]
        sync(dev)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return inconclusive(f"torch._scaled_mm with a float8 output cannot run here: {first_line(exc)}")
    if isinstance(outs[0], tuple):   # older torch returned (out, amax)
        outs = [out[0] for out in outs]
    return scale_result_finding(outs[0], outs[1], accumulated, 0.5)


def repeated_grouped_mm_finding(outputs: Sequence[torch.Tensor], ref: torch.Tensor,
                                baseline: torch.Tensor) -> Dict[str, Any]:
    """Decide pytorch/pytorch#186365 from the outputs of the same bf16 grouped matmul run in a loop:
    confirmed when any run is outside the tolerance policy against float64 (`ref`, with the per-group
    torch.mm `baseline`). How many distinct results the loop gave is reported either way."""
    comparisons = [judge(f"_grouped_mm run {index}", out, ref, baseline, torch.bfloat16)
                   for index, out in enumerate(outputs)]
    distinct: List[torch.Tensor] = []
    for out in outputs:
        if not any(torch.equal(out, seen) for seen in distinct):
            distinct.append(out)
    result = summarize(comparisons, f"bf16 _grouped_mm after a broadcast division, {len(outputs)} runs in a loop "
                                    f"({len(distinct)} distinct result{'s' * (len(distinct) != 1)})")
    result["distinct_results"] = len(distinct)
    return result


@probe(gpu=True)
def grouped_mm_repeat(dev: torch.device, runs: int = 8) -> Dict[str, Any]:
    """torch._grouped_mm on x / scale (bf16, scale broadcast over rows) and 4 expert weights, run
    `runs` times in a loop; every run against float64 (pytorch/pytorch#186365)."""
    groups, rows, width, out_width = 4, 256, 128, 64
    x = randn((rows, width), dev, torch.bfloat16, 1)
    scale = randn((1, width), dev, torch.bfloat16, 2).abs() + 0.5
    weight = randn((groups, width, out_width), dev, torch.bfloat16, 3)
    offs = torch.arange(1, groups + 1, dtype=torch.int32, device=dev) * (rows // groups)
    try:
        outputs = []
        for _ in range(runs):
            divided = x / scale
            outputs.append(torch._grouped_mm(divided, weight, offs=offs).detach().cpu())
        sync(dev)
    except (RuntimeError, TypeError, NotImplementedError, AttributeError) as exc:
        return inconclusive(f"torch._grouped_mm cannot run here: {first_line(exc)}")
    divided = (x / scale).detach()
    bounds = [0] + offs.tolist()
    ref = torch.cat([divided[lo:hi].cpu().double() @ weight[g].cpu().double()
                     for g, (lo, hi) in enumerate(zip(bounds, bounds[1:]))])
    baseline = torch.cat([(divided[lo:hi] @ weight[g]).cpu() for g, (lo, hi) in enumerate(zip(bounds, bounds[1:]))])
    return repeated_grouped_mm_finding(outputs, ref, baseline)
