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
