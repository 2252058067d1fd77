"""Linear cross entropy without the (tokens, vocab) logits: the chunked driver both backends share
(forward computes the loss and, when wanted, the gradients chunk by chunk; backward scales them),
its torch-ops row step ("composition", the trusted fallback) and the materialising baseline ("torch").

Memory: one chunk of fp32 logits (rows x vocab) at a time, reused in place for the gradient;
grad_weight / grad_bias accumulate in fp32 and are cast to the parameters' dtypes at the end of
the forward. The row count follows Liger-Kernel's heuristic (tokens / ceil(vocab / hidden), a
power of two), capped at CHUNK_BYTES of fp32 logits.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from .registry import Backend, register

# The most bytes one chunk of fp32 logits may take.
CHUNK_BYTES = 256 * 1024 * 1024
REDUCTIONS = ("mean", "sum", "none")

# rows_fn(logits, target, loss_out, scale, ignore_index, softcap, write_grad): per row of the
# chunk `logits` (rows, V) in the compute dtype (contiguous, owned by the caller): loss_out[r] =
# logsumexp(z_r) - z_r[target_r] with z = softcap * tanh(logits / softcap) when softcap is set,
# 0 where target == ignore_index; when write_grad, logits is overwritten with
# d(loss_r)/d(logits_r) * scale[r] (scale: a 0-d or (rows,) tensor), zero rows where ignored.
RowsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, Optional[float], bool], None]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logit math in fp32 whatever the input dtype (float64 stays float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_rows(n: int, vocab: int, hidden: int) -> int:
    """Rows per chunk: Liger's tokens / ceil(V / H) rounded up to a power of two, at most
    CHUNK_BYTES of fp32 logits, at least 1."""
    per_row = max(1, -(-vocab // max(hidden, 1)))
    rows = 1 << max(0, (-(-max(n, 1) // per_row) - 1).bit_length())
    return max(1, min(rows, CHUNK_BYTES // (4 * max(vocab, 1)), max(n, 1)))


def torch_rows(logits, target, loss_out, scale, ignore_index, softcap, write_grad) -> None:
    """The row step in torch ops (one extra chunk-sized temporary for logsumexp / the softcap slope)."""
    valid = target != ignore_index
    safe = target.masked_fill(~valid, 0).long()
    if softcap is not None:
        logits.div_(softcap).tanh_()
        slope = (1.0 - logits.square()) if write_grad else None   # d(c tanh(y/c))/dy = 1 - tanh^2
        logits.mul_(softcap)
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, safe[:, None])[:, 0]
    loss_out.copy_((lse - picked).masked_fill(~valid, 0.0))
    if not write_grad:
        return
    logits.sub_(lse[:, None]).exp_()
    logits.scatter_add_(1, safe[:, None], torch.full_like(picked[:, None], -1.0))
    if softcap is not None:
        logits.mul_(slope)
    logits.mul_(scale.reshape(-1, 1) if scale.dim() else scale)
    logits.masked_fill_(~valid[:, None], 0.0)


def _accumulate(acc: torch.Tensor, grad: torch.Tensor, rows: torch.Tensor) -> None:
    """acc (V, H) += grad(rows, V).T @ rows(rows, H) in acc's dtype. Half inputs: per block of
    vocab rows, each product a temporary no larger than the logits chunk (no fp32 copy of them)."""
    if grad.dtype == acc.dtype:
        acc.addmm_(grad.t(), rows)
        return
    vocab, hidden = acc.shape
    block = max(1, min(vocab, grad.numel() // max(hidden, 1)))
    for start in range(0, vocab, block):
        acc[start:start + block].add_(torch.mm(grad[:, start:start + block].t(), rows))


def chunked(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
            ignore_index: int, softcap: Optional[float], row_scale: Optional[torch.Tensor],
            wanted: Tuple[bool, bool, bool], rows_fn: RowsFn, chunk: Optional[int] = None):
    """One pass over hidden (N, H) in chunks: (per-row losses (N,) in the compute dtype,
    grad_hidden, grad_weight, grad_bias) with the gradients of sum_r row_scale[r] * loss_r
    (row_scale a 0-d or (N,) tensor; gradients None where not wanted or row_scale is None)."""
    n, vocab = hidden.shape[0], weight.shape[0]
    cdt = compute_dtype(hidden.dtype)
    grads = row_scale is not None and any(wanted)
    losses = torch.empty(n, dtype=cdt, device=hidden.device)
    grad_h = torch.empty_like(hidden, memory_format=torch.contiguous_format) if grads and wanted[0] else None
    grad_w = torch.zeros(weight.shape, dtype=cdt, device=hidden.device) if grads and wanted[1] else None
    grad_b = (torch.zeros(vocab, dtype=cdt, device=hidden.device)
              if grads and wanted[2] and bias is not None else None)
    step = chunk or chunk_rows(n, vocab, hidden.shape[1])
    for start in range(0, n, step):
        rows = hidden[start:start + step]
        logits = F.linear(rows, weight, bias)
        logits = logits.to(cdt).contiguous()     # the fp32 chunk the row step owns
        scale = losses.new_zeros(())
        if grads:
            scale = row_scale if row_scale.dim() == 0 else row_scale[start:start + step]
        rows_fn(logits, target[start:start + step], losses[start:start + step], scale, ignore_index, softcap, grads)
        if not grads:
            continue
        if grad_b is not None:
            grad_b += logits.sum(0)
        low = logits if logits.dtype == hidden.dtype else logits.to(hidden.dtype)
        del logits
        if grad_h is not None:
            torch.mm(low, weight, out=grad_h[start:start + step])
        if grad_w is not None:
            _accumulate(grad_w, low, rows)
        del low
    if grad_w is not None:
        grad_w = grad_w.to(weight.dtype)
    if grad_b is not None:
        grad_b = grad_b.to(bias.dtype)
    return losses, grad_h, grad_w, grad_b


def reduce_rows(losses: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return losses
    total = losses.sum()
    return total * mean_scale(target, ignore_index, losses.dtype) if reduction == "mean" else total


def mean_scale(target: torch.Tensor, ignore_index: int, dtype: torch.dtype) -> torch.Tensor:
    """1 / (number of targets not ignored), 1 when all are (the mean is then 0, not NaN); no sync."""
    return 1.0 / (target != ignore_index).sum().clamp(min=1).to(dtype)


def forward_saving(rows_fn: RowsFn, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted):
    """(loss, saved): for mean/sum the gradients of the loss (computed here, chunk by chunk);
    for none nothing (the backward recomputes with its per-row grad_output)."""
    hidden2, target1 = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    wanted = tuple(bool(w) for w in wanted)
    scale = None
    if reduction != "none" and any(wanted):
        cdt = compute_dtype(hidden.dtype)
        scale = mean_scale(target1, ignore_index, cdt) if reduction == "mean" else torch.ones((), dtype=cdt,
                                                                                             device=hidden.device)
    losses, gh, gw, gb = chunked(hidden2, weight, bias, target1, ignore_index, softcap, scale, wanted, rows_fn)
    loss = reduce_rows(losses, target1, ignore_index, reduction)
    gh = None if gh is None else gh.reshape(hidden.shape)
    return (loss.reshape(target.shape) if reduction == "none" else loss), (gh, gw, gb)


def backward_from(rows_fn: RowsFn, grad, saved, hidden, weight, target, bias, ignore_index, reduction, softcap,
                  wanted):
    """(grad_hidden, grad_weight, grad_bias), None where not wanted."""
    if reduction != "none":
        grad = grad.reshape(())
        return tuple(None if g is None else g * grad.to(g.dtype) for g in saved)
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    scale = grad.reshape(-1).to(compute_dtype(hidden.dtype))
    _, gh, gw, gb = chunked(hidden2, weight, bias, target.reshape(-1), ignore_index, softcap, scale,
                            tuple(bool(w) for w in wanted), rows_fn)
    return (None if gh is None else gh.reshape(hidden.shape)), gw, gb


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss with its gradients from the forward. mean/sum: backward multiplies the saved
    gradients by grad_output in place (as Liger does: no second copy of grad_weight), so a
    second backward through the same graph is refused; none: backward recomputes in chunks."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, spec):
        rows_fn, ignore_index, reduction, softcap = spec
        needs = ctx.needs_input_grad
        wanted = (needs[0], needs[1], bias is not None and needs[2])
        loss, saved = forward_saving(rows_fn, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted)
        ctx.spec, ctx.wanted, ctx.used = spec, wanted, False
        ctx.save_for_backward(*(saved if reduction != "none" else (hidden, weight, bias, target)))
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        rows_fn, ignore_index, reduction, softcap = ctx.spec
        if reduction == "none":
            hidden, weight, bias, target = ctx.saved_tensors
            grads = backward_from(rows_fn, grad, (), hidden, weight, target, bias, ignore_index, reduction,
                                  softcap, ctx.wanted)
            return (*grads, None, None)
        if ctx.used:
            raise RuntimeError("linear_cross_entropy: its backward ran twice on one graph; the gradients are "
                               "computed in the forward and scaled in place, so call the op again for a second "
                               "backward (retain_graph=True is not supported with reduction 'mean' or 'sum')")
        ctx.used = True
        scale = grad.reshape(())
        grads = tuple(None if g is None else g.mul_(scale.to(g.dtype)) for g in ctx.saved_tensors)
        return (*grads, None, None)


def run(rows_fn: RowsFn, hidden, weight, target, bias=None, ignore_index=-100, reduction="mean", softcap=None):
    """The op through `rows_fn`, differentiable when an input needs a gradient."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not needs_grad:
        return forward_saving(rows_fn, hidden, weight, target, bias, ignore_index, reduction, softcap,
                              (False, False, False))[0]
    return _LinearCrossEntropy.apply(hidden, weight, bias, target, (rows_fn, ignore_index, reduction, softcap))


# ----------------------------------------------------------------------------- backends
def composition_linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                     softcap=None):
    return run(torch_rows, hidden, weight, target, bias, ignore_index, reduction, softcap)


def materialized_linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                      softcap=None):
    """F.linear then F.cross_entropy on the whole fp32 logits, autograd for the gradients: the
    plain composition the battery measures the chunked backends against."""
    logits = F.linear(hidden, weight, bias).to(compute_dtype(hidden.dtype))
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat_target = target.reshape(-1).long()
    losses = F.cross_entropy(logits.reshape(-1, weight.shape[0]), flat_target, ignore_index=ignore_index,
                             reduction="none")
    return reduce_rows(losses, flat_target, ignore_index, reduction).reshape(
        target.shape if reduction == "none" else ())


def _saving(hidden, weight, target, bias, ignore_index, reduction, softcap, wanted):
    return forward_saving(torch_rows, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted)


def _from(grad, saved, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted):
    return backward_from(torch_rows, grad, saved, hidden, weight, target, bias, ignore_index, reduction, softcap,
                         wanted)


ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
register(Backend("composition", "linear_cross_entropy", composition_linear_cross_entropy,
                 "chunked F.linear + fp32 logsumexp in torch ops, gradients in the forward (trusted fallback)",
                 dtypes=ALL_DTYPES, fallback=True, forward_saving=_saving, backward_from=_from))
register(Backend("torch", "linear_cross_entropy", materialized_linear_cross_entropy,
                 "F.linear + F.cross_entropy on the whole (tokens, vocab) fp32 logits: the battery's baseline; "
                 "never chosen by auto (its memory grows with tokens x vocab)", dtypes=ALL_DTYPES, probed=False))
