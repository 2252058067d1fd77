"""`gpuparity.linear_cross_entropy`: the loss of an LM head, F.cross_entropy(F.linear(hidden,
weight, bias)) with fp32 logit math, computed in chunks of tokens so the (tokens, vocab) logits
never exist, with the backend chosen by the verified dispatcher."""
from __future__ import annotations

from typing import Optional

import torch

from . import library_ce, select
from ..contracts.linear_cross_entropy import linear_cross_entropy_problem

__all__ = ["linear_cross_entropy"]


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         bias: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
                         softcap: Optional[float] = None, backend: str = "auto") -> torch.Tensor:
    """F.cross_entropy(z, target, ignore_index=..., reduction=...) with z = F.linear(hidden, weight,
    bias) in fp32 (softcap * tanh(z / softcap) when softcap is set, as Gemma-2's final logits).

    hidden (..., H), weight (V, H) as nn.Linear's, bias (V,) or None, target (...) int64/int32
    class indices or ignore_index. reduction "mean" averages over the targets not ignored (0, not
    NaN, when every target is), "sum" sums, "none" returns target's shape. The loss is float32
    (float64 for float64 inputs) whatever the input dtype, like transformers' loss on upcast
    logits; the gradients have the inputs' dtypes.

    Memory: logits are made one chunk of tokens at a time (at most a few hundred MB); the weight's
    gradient comes from a second pass over vocabulary blocks, one GEMM per block into the
    weight's dtype (no fp32 weight-sized buffer). With mean/sum the gradients are computed in the
    forward and the backward only scales them, so a second backward through one graph is refused.
    """
    problem = linear_cross_entropy_problem(hidden, weight, target, bias, ignore_index, reduction, softcap)
    softcap = problem.feature("softcap")
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        return library_ce.traced(problem, hidden, weight, target, bias, int(ignore_index), reduction, softcap,
                                 backend)
    check_targets(target, weight.shape[0], int(ignore_index))
    chosen = select.resolve(problem, backend)
    return chosen.fn(hidden, weight, target, bias, int(ignore_index), reduction, softcap)


def check_targets(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Every target a class in [0, vocab) or ignore_index (the kernels index the logits with it).
    On a GPU a device-side assert, so the call does not wait for the GPU."""
    bad = ((target < 0) | (target >= vocab)) & (target != ignore_index)
    if target.device.type == "cpu":
        if bool(bad.any()):
            where = int(bad.nonzero()[0][0]) if target.dim() == 1 else bad.nonzero()[0].tolist()
            raise ValueError(f"target: expected class indices in [0, {vocab}) or ignore_index={ignore_index}, "
                             f"got {int(target[bad][0])} at {where}")
    elif not (target.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        torch._assert_async(~bad.any(), f"target: a class index outside [0, {vocab}) that is not ignore_index")
