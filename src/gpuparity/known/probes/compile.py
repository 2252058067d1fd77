"""Probes of torch.compile (inductor): a masked pooling and a bf16 block against eager and
float64; a missing toolchain cannot tell, a failing compile can confirm."""
from __future__ import annotations

import time
from typing import Any, Dict

import torch

from .base import finding, first_line, grad_leaves, inconclusive, judge, probe, randn, summarize, sync, upcast


ENVIRONMENT_PROBLEMS = ("InvalidCxxCompiler", "No working C++ compiler", "Failed to find C compiler",
                        "Cannot find a working triton installation", "Python.h: No such file",
                        "not found in PATH", "CalledProcessError", "cannot find -l")


def _compile_failure(exc: BaseException, confirms: bool = True) -> Dict[str, Any]:
    """A compile error as a finding: a missing toolchain cannot tell; otherwise the failure
    confirms the entry when a failing compile is its symptom (confirms=True), else cannot tell."""
    text = f"{type(exc).__name__}: {exc}"
    if any(marker in text for marker in ENVIRONMENT_PROBLEMS):
        return inconclusive(f"torch.compile cannot run on this machine (a toolchain problem, not this issue): "
                            f"{first_line(exc)}")
    if not confirms:
        return inconclusive(f"torch.compile failed, so the compiled result could not be checked: {first_line(exc, 400)}")
    return finding(True, f"torch.compile failed: {first_line(exc, 400)}")


def masked_pooling(x, mask, weight):
    """Attention pooling over valid positions plus a masked mean: the pattern of user story 1.
    x (B, S, D); mask (B, S) bool, True = valid; weight (D, 1)."""
    scores = (x @ weight).squeeze(-1).masked_fill(~mask, float("-inf"))
    any_valid = mask.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~any_valid, 0.0), dim=-1).masked_fill(~mask, 0.0)
    pooled = (probs.unsqueeze(-1) * x).sum(dim=1)
    count = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    mean = (x * mask.unsqueeze(-1)).sum(dim=1) / count
    return torch.where(any_valid, pooled + mean, torch.zeros_like(pooled))


@probe
def compile_masked_pooling(dev: torch.device) -> Dict[str, Any]:
    """torch.compile (inductor) of a masked attention-pooling function, fwd+bwd, against eager
    and float64. Long rows force looped reductions over the bool mask."""
    batch, seq, dim = 4, 2048, 16
    x = randn((batch, seq, dim), dev, torch.float32, 1)
    weight = randn((dim, 1), dev, torch.float32, 2)
    generator = torch.Generator().manual_seed(3)
    mask = torch.rand((batch, seq), generator=generator) > 0.4
    mask[1, :] = False  # an all-padding sequence
    mask = mask.to(dev)

    def run(fn, inputs):
        leaves = grad_leaves(inputs)
        out = fn(leaves[0], mask.to(leaves[0].device), leaves[1])
        out.backward(torch.ones_like(out))
        return out, leaves[0].grad

    eager_out, eager_grad = run(masked_pooling, (x, weight))
    ref_out, ref_grad = run(masked_pooling, (upcast(x, False), upcast(weight, False)))
    try:
        import torch._dynamo as dynamo
        dynamo.reset()
        compiled = torch.compile(masked_pooling, backend="inductor", dynamic=False)
        start = time.monotonic()
        out, grad = run(compiled, (x, weight))
        sync(dev)
        seconds = time.monotonic() - start
    except Exception as exc:  # noqa: BLE001 - any compile failure is the finding
        return _compile_failure(exc)
    result = summarize([judge("compiled out", out, ref_out, eager_out, torch.float32),
                        judge("compiled dx", grad, ref_grad, eager_grad, torch.float32)],
                       "torch.compile of masked attention pooling vs eager (fp32, fwd+bwd)")
    result["compile_s"] = round(seconds, 2)
    return result


@probe
def compile_bf16_block(dev: torch.device) -> Dict[str, Any]:
    """Embedding + Linear + RMSNorm under bf16 autocast, compiled vs eager vs float64."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 256)
            self.linear = torch.nn.Linear(256, 256)
            self.scale = torch.nn.Parameter(torch.ones(256))

        def forward(self, tokens):
            h = self.linear(self.embed(tokens))
            h = h.float()
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale

    block = Block().to(dev)
    tokens = torch.randint(0, 1000, (8, 128), generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        eager = block(tokens)
    reference_block = Block().double()
    reference_block.load_state_dict({k: v.double().cpu() for k, v in block.state_dict().items()})
    ref = reference_block(tokens.cpu())
    try:
        import torch._dynamo as dynamo
        dynamo.reset()
        compiled = torch.compile(block, backend="inductor")
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = compiled(tokens)
        sync(dev)
    except Exception as exc:  # noqa: BLE001
        return _compile_failure(exc, confirms=False)
    return summarize([judge("compiled bf16 block", out, ref, eager, torch.bfloat16)],
                     "compiled embedding+linear+RMSNorm under bf16 autocast vs eager")


def run_compiled(dev: torch.device, fn, *args, autocast_dtype=None):
    """(output, None) from `fn` compiled with inductor (fresh dynamo state) on `args`, under autocast
    to `autocast_dtype` when given; (None, finding) when the compile fails (cannot tell: the result
    could not be checked)."""
    import contextlib
    try:
        import torch._dynamo as dynamo
        dynamo.reset()
        compiled = torch.compile(fn, backend="inductor", dynamic=False)
        context = torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with context:
            out = compiled(*args)
        sync(dev)
    except Exception as exc:  # noqa: BLE001 - any compile failure is reported, not raised
        return None, _compile_failure(exc, confirms=False)
    return out, None


def layer_norm_reciprocal(x):
    """The pytorch/pytorch#186577 pattern: a layer_norm whose output feeds a division-like epilogue."""
    return torch.reciprocal(torch.abs(torch.nn.functional.layer_norm(x, [x.shape[-1]])) + 1e-6)


def epilogue_finding(compiled, eager, ref) -> Dict[str, Any]:
    """Decide pytorch/pytorch#186577: the compiled output against float64 under the tolerance policy,
    eager as the baseline, over the elements where |layer_norm| > 0.1. Nearer zero the reciprocal
    magnifies a correct kernel's last-bit differences (1/|x| of 1e-4 turns 1e-7 into 1e-3), while
    the bug's errors (0.9 to 80) are wrong everywhere."""
    well_conditioned = ref.detach().to(torch.float64) < 10.0
    return summarize([judge("compiled reciprocal(|layer_norm|)", compiled, ref, eager, torch.float32,
                            valid=well_conditioned)],
                     "torch.compile of reciprocal(abs(layer_norm(x)) + 1e-6) on (64, 128) fp32 vs eager "
                     f"({int(well_conditioned.sum())} elements with |layer_norm| > 0.1)")


@probe(gpu=True)
def compile_layer_norm_reciprocal(dev: torch.device) -> Dict[str, Any]:
    """Inductor's fusion of F.layer_norm with a reciprocal epilogue against eager and float64
    (pytorch/pytorch#186577: max difference 0.9 to 80)."""
    x = randn((64, 128), dev, torch.float32, 0)
    eager = layer_norm_reciprocal(x)
    ref = layer_norm_reciprocal(upcast(x, False))
    compiled, failure = run_compiled(dev, layer_norm_reciprocal, x)
    return failure or epilogue_finding(compiled, eager, ref)


def layer_norm_then_linear(x, weight, proj):
    """LayerNorm feeding a projection under bf16 autocast: (the normalized activations as the
    matmul sees them, rounded to bf16; the projection). Where pytorch/pytorch#168126's divergence
    starts: the layer_norm runs in fp32 and its output is rounded to bf16 for the matmul."""
    normalized = torch.nn.functional.layer_norm(x, [x.shape[-1]], weight)
    low = normalized.to(torch.bfloat16) if normalized.dtype == torch.float32 else normalized
    return low, normalized @ proj


def decomposition_finding(compiled, eager, ref) -> Dict[str, Any]:
    """Decide pytorch/pytorch#168126 from (normalized bf16 activations, projection) of the compiled
    and eager runs and the float64 reference: confirmed when any compiled bf16 activation differs
    from eager's. The eager kernel is deterministic and a layer_norm that is not decomposed gives
    the same bits; the decomposition's statistics (~7e-7 apart in fp32) tip about 1e-5 of the bf16
    roundings, and downstream matmuls amplify them. How much of the projection differs, and the
    error of each against float64, are reported beside it."""
    (low_c, out_c), (low_e, out_e) = [[t.detach().cpu() for t in pair] for pair in (compiled, eager)]
    tipped = int((low_c != low_e).sum())
    projected = float((out_c != out_e).float().mean())
    ref64 = ref[1].detach().to("cpu", torch.float64)
    errors = {name: float((out.double() - ref64).abs().max() / ref64.abs().max()) for name, out in
              (("compiled", out_c), ("eager", out_e))}
    return finding(tipped > 0, f"{tipped} of {low_e.numel()} bf16 layer_norm outputs differ between compiled and "
                               f"eager ({projected:.3%} of the projection); projection max error vs float64: "
                               f"compiled {errors['compiled']:.3g}, eager {errors['eager']:.3g}",
                   tipped=tipped, projected_differ_fraction=projected, errors=errors)


@probe(gpu=True)
def compile_layer_norm_bf16(dev: torch.device) -> Dict[str, Any]:
    """LayerNorm(1024) over 2048 rows -> linear under bf16 autocast, compiled vs eager
    (pytorch/pytorch#168126: the native_layer_norm decomposition's statistics differ from the eager
    kernel's, and the bf16 rounding after it tips differently)."""
    x = randn((2048, 1024), dev, torch.float32, 0, scale=3.0) + 1.0
    weight = randn((1024,), dev, torch.float32, 1) * 0.1 + 1.0
    proj = randn((1024, 256), dev, torch.float32, 2) * 0.03
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        eager = layer_norm_then_linear(x, weight, proj)
    ref = layer_norm_then_linear(upcast(x, False), upcast(weight, False), upcast(proj, False))
    compiled, failure = run_compiled(dev, layer_norm_then_linear, x, weight, proj, autocast_dtype=torch.bfloat16)
    return failure or decomposition_finding(compiled, eager, ref)
