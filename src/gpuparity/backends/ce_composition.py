"""Linear cross entropy without the (tokens, vocab) logits: the chunked driver both backends share
(forward computes the loss and, when wanted, the gradients chunk by chunk; backward scales them),
its torch-ops steps ("composition", the trusted fallback) and the materialising baseline ("torch").

Two passes, each holding one logits block of at most a chunk's size (fp32, or the GEMM's dtype
for native steps, see Steps):
1. token chunks (rows x vocab): the loss and logsumexp of each row and, when grad_hidden is
   wanted, the row's gradient in place, then grad_hidden = grad @ W for the chunk (one GEMM);
2. vocab blocks (tokens x cols), only when grad_weight / grad_bias are wanted: the block's logits
   again, its gradient from the saved logsumexp, then grad_weight[block] = grad.T @ hidden, one
   GEMM over every token straight into the parameter's dtype.
So every gradient element is rounded once (fp32 accumulation inside the GEMM), nothing is
accumulated across chunks (no fp32 weight-sized buffer, no elementwise adds: the one-pass form
spent ~4 ms of a Llama step on them), at the price of one more logits GEMM. The row count
follows Liger-Kernel's heuristic (tokens / ceil(vocab / hidden), a power of two), capped at
CHUNK_BYTES of fp32 logits; a vocab block takes the same bytes.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from ..registry import Backend, register

# The most bytes one chunk of fp32 logits may take.
CHUNK_BYTES = 256 * 1024 * 1024

# rows(logits, target, loss_out, lse_out, scale, ignore_index, softcap, write_grad): per row of the
# chunk `logits` (rows, V) in the compute dtype (contiguous, owned by the caller): loss_out[r] =
# logsumexp(z_r) - z_r[target_r] and lse_out[r] = logsumexp(z_r), with z = softcap *
# tanh(logits / softcap) when softcap is set; loss 0 where target == ignore_index (lse then
# unspecified); when write_grad, logits is overwritten with d(loss_r)/d(logits_r) * scale[r]
# (scale: a 0-d or (rows,) tensor), zero rows where ignored.
RowsFn = Callable[..., None]
# cols(logits, target, lse, scale, ignore_index, softcap, start): `logits` (N, C) are columns
# start..start+C of every row's logits; overwritten with the gradient as rows would write it,
# from the lse of pass 1 (scale a 0-d or (N,) tensor).
ColsFn = Callable[..., None]


class Steps(NamedTuple):
    """A backend's two kernels-or-torch-ops steps (see RowsFn / ColsFn). native: the steps take
    the logits in the GEMM's own dtype (bf16 / fp16 / fp32) and do their math in fp32 registers
    (the Triton kernels): no fp32 copy of a chunk, and the gradient is rounded to that dtype once,
    where the GEMM that reads it would round it anyway. Else the logits are converted to the
    compute dtype first (the torch ops' steps)."""
    rows: RowsFn
    cols: ColsFn
    native: bool = False


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logit math in fp32 whatever the input dtype (float64 stays float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_rows(n: int, vocab: int, hidden: int) -> int:
    """Rows per chunk: Liger's tokens / ceil(V / H) rounded up to a power of two, at most
    CHUNK_BYTES of fp32 logits, at least 1."""
    per_row = max(1, -(-vocab // max(hidden, 1)))
    rows = 1 << max(0, (-(-max(n, 1) // per_row) - 1).bit_length())
    return max(1, min(rows, CHUNK_BYTES // (4 * max(vocab, 1)), max(n, 1)))


def vocab_cols(n: int, vocab: int, rows: int) -> int:
    """Columns per vocab block of pass 2: the bytes of a (rows, vocab) chunk, a multiple of 64
    when that many fit (GEMM tiles), at least 1, at most vocab."""
    cols = max(1, rows * vocab // max(n, 1))
    if cols >= 64:
        cols -= cols % 64
    return min(cols, vocab)


def _capped(logits: torch.Tensor, softcap: Optional[float], write_grad: bool) -> Optional[torch.Tensor]:
    """logits <- softcap * tanh(logits / softcap) in place; returns the slope 1 - tanh^2 (when
    write_grad), d(c tanh(y/c))/dy."""
    if softcap is None:
        return None
    logits.div_(softcap).tanh_()
    slope = (1.0 - logits.square()) if write_grad else None
    logits.mul_(softcap)
    return slope


def _finish_grad(probs: torch.Tensor, slope, scale: torch.Tensor, valid: torch.Tensor) -> None:
    if slope is not None:
        probs.mul_(slope)
    probs.mul_(scale.reshape(-1, 1) if scale.dim() else scale)
    probs.masked_fill_(~valid[:, None], 0.0)


def torch_rows(logits, target, loss_out, lse_out, scale, ignore_index, softcap, write_grad) -> None:
    """The row step in torch ops (one extra chunk-sized temporary for logsumexp / the softcap slope)."""
    valid = target != ignore_index
    safe = target.masked_fill(~valid, 0).long()
    slope = _capped(logits, softcap, write_grad)
    lse = torch.logsumexp(logits, dim=-1)
    lse_out.copy_(lse)
    picked = logits.gather(1, safe[:, None])[:, 0]
    loss_out.copy_((lse - picked).masked_fill(~valid, 0.0))
    if not write_grad:
        return
    logits.sub_(lse[:, None]).exp_()
    logits.scatter_add_(1, safe[:, None], torch.full_like(picked[:, None], -1.0))
    _finish_grad(logits, slope, scale, valid)


def torch_cols(logits, target, lse, scale, ignore_index, softcap, start) -> None:
    """The vocab-block step in torch ops."""
    valid = target != ignore_index
    slope = _capped(logits, softcap, True)
    logits.sub_(lse[:, None].to(logits.dtype)).exp_()
    local = target.long() - start
    inside = valid & (local >= 0) & (local < logits.shape[1])
    logits.scatter_add_(1, local.clamp(0, logits.shape[1] - 1)[:, None], -inside.to(logits.dtype)[:, None])
    _finish_grad(logits, slope, scale, valid)


TORCH_STEPS = Steps(torch_rows, torch_cols)


def _owned(logits: torch.Tensor, cdt: torch.dtype, steps: Steps) -> torch.Tensor:
    return logits.contiguous() if steps.native else logits.to(cdt).contiguous()


def _low(logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return logits if logits.dtype == dtype else logits.to(dtype)


def chunked(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
            ignore_index: int, softcap: Optional[float], row_scale: Optional[torch.Tensor],
            wanted: Tuple[bool, bool, bool], steps: Steps, chunk: Optional[int] = None):
    """The two passes over hidden (N, H): (per-row losses (N,) in the compute dtype, grad_hidden,
    grad_weight, grad_bias) with the gradients of sum_r row_scale[r] * loss_r (row_scale a 0-d or
    (N,) tensor; gradients None where not wanted or row_scale is None)."""
    n, vocab = hidden.shape[0], weight.shape[0]
    cdt = compute_dtype(hidden.dtype)
    grads = row_scale is not None and any(wanted)
    want_h = grads and wanted[0]
    want_w = grads and wanted[1]
    want_b = grads and wanted[2] and bias is not None
    losses = torch.empty(n, dtype=cdt, device=hidden.device)
    lse = torch.empty(n, dtype=cdt, device=hidden.device)
    grad_h = torch.empty_like(hidden, memory_format=torch.contiguous_format) if want_h else None
    step = chunk or chunk_rows(n, vocab, hidden.shape[1])
    for start in range(0, n, step):
        rows = hidden[start:start + step]
        logits = _owned(F.linear(rows, weight, bias), cdt, steps)      # the chunk the row step owns
        scale = losses.new_zeros(())
        if want_h:
            scale = row_scale if row_scale.dim() == 0 else row_scale[start:start + step]
        steps.rows(logits, target[start:start + step], losses[start:start + step], lse[start:start + step], scale,
                   ignore_index, softcap, want_h)
        if want_h:
            torch.mm(_low(logits, hidden.dtype), weight, out=grad_h[start:start + step])
        del logits
    grad_w = torch.empty_like(weight, memory_format=torch.contiguous_format) if want_w else None
    grad_b = torch.empty_like(bias, memory_format=torch.contiguous_format) if want_b else None
    if want_w or want_b:
        cols = vocab_cols(n, vocab, step)
        for start in range(0, vocab, cols):
            stop = min(start + cols, vocab)
            logits = _owned(F.linear(hidden, weight[start:stop], None if bias is None else bias[start:stop]), cdt,
                            steps)
            steps.cols(logits, target, lse, row_scale, ignore_index, softcap, start)
            if grad_b is not None:
                grad_b[start:stop] = logits.sum(0)
            if grad_w is not None:
                torch.mm(_low(logits, hidden.dtype).t(), hidden, out=grad_w[start:stop])
            del logits
    return losses, grad_h, grad_w, grad_b


def reduce_rows(losses: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return losses
    total = losses.sum()
    return total * mean_scale(target, ignore_index, losses.dtype) if reduction == "mean" else total


def mean_scale(target: torch.Tensor, ignore_index: int, dtype: torch.dtype) -> torch.Tensor:
    """1 / (number of targets not ignored), 1 when all are (the mean is then 0, not NaN); no sync."""
    return 1.0 / (target != ignore_index).sum().clamp(min=1).to(dtype)


def forward_saving(steps: Steps, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted):
    """(loss, saved): for mean/sum the gradients of the loss (computed here, chunk by chunk);
    for none nothing (the backward recomputes with its per-row grad_output)."""
    hidden2, target1 = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    wanted = tuple(bool(w) for w in wanted)
    scale = None
    if reduction != "none" and any(wanted):
        cdt = compute_dtype(hidden.dtype)
        scale = mean_scale(target1, ignore_index, cdt) if reduction == "mean" else torch.ones((), dtype=cdt,
                                                                                             device=hidden.device)
    losses, gh, gw, gb = chunked(hidden2, weight, bias, target1, ignore_index, softcap, scale, wanted, steps)
    loss = reduce_rows(losses, target1, ignore_index, reduction)
    gh = None if gh is None else gh.reshape(hidden.shape)
    return (loss.reshape(target.shape) if reduction == "none" else loss), (gh, gw, gb)


def backward_from(steps: Steps, grad, saved, hidden, weight, target, bias, ignore_index, reduction, softcap,
                  wanted):
    """(grad_hidden, grad_weight, grad_bias), None where not wanted."""
    if reduction != "none":
        grad = grad.reshape(())
        return tuple(None if g is None else g * grad.to(g.dtype) for g in saved)
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    scale = grad.reshape(-1).to(compute_dtype(hidden.dtype))
    _, gh, gw, gb = chunked(hidden2, weight, bias, target.reshape(-1), ignore_index, softcap, scale,
                            tuple(bool(w) for w in wanted), steps)
    return (None if gh is None else gh.reshape(hidden.shape)), gw, gb


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss with its gradients from the forward. mean/sum: backward multiplies the saved
    gradients by grad_output in place (as Liger does: no second copy of grad_weight), so a
    second backward through the same graph is refused; none: backward recomputes in chunks."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, spec):
        steps, ignore_index, reduction, softcap = spec
        needs = ctx.needs_input_grad
        wanted = (needs[0], needs[1], bias is not None and needs[2])
        loss, saved = forward_saving(steps, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted)
        ctx.spec, ctx.wanted, ctx.used = spec, wanted, False
        ctx.save_for_backward(*(saved if reduction != "none" else (hidden, weight, bias, target)))
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        steps, ignore_index, reduction, softcap = ctx.spec
        if reduction == "none":
            hidden, weight, bias, target = ctx.saved_tensors
            grads = backward_from(steps, grad, (), hidden, weight, target, bias, ignore_index, reduction,
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


def run(steps: Steps, hidden, weight, target, bias=None, ignore_index=-100, reduction="mean", softcap=None):
    """The op through `steps`, differentiable when an input needs a gradient."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not needs_grad:
        return forward_saving(steps, hidden, weight, target, bias, ignore_index, reduction, softcap,
                              (False, False, False))[0]
    return _LinearCrossEntropy.apply(hidden, weight, bias, target, (steps, ignore_index, reduction, softcap))


# ----------------------------------------------------------------------------- backends
def composition_linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                     softcap=None):
    return run(TORCH_STEPS, hidden, weight, target, bias, ignore_index, reduction, softcap)


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
    return forward_saving(TORCH_STEPS, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted)


def _from(grad, saved, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted):
    return backward_from(TORCH_STEPS, grad, saved, hidden, weight, target, bias, ignore_index, reduction, softcap,
                         wanted)


ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
register(Backend("composition", "linear_cross_entropy", composition_linear_cross_entropy,
                 "chunked F.linear + fp32 logsumexp in torch ops, gradients in the forward (trusted fallback)",
                 dtypes=ALL_DTYPES, fallback=True, forward_saving=_saving, backward_from=_from))
register(Backend("torch", "linear_cross_entropy", materialized_linear_cross_entropy,
                 "F.linear + F.cross_entropy on the whole (tokens, vocab) fp32 logits: the battery's baseline; "
                 "never chosen by auto (its memory grows with tokens x vocab)", dtypes=ALL_DTYPES, probed=False))
