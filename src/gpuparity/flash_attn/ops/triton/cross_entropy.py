"""FlashAttention's `flash_attn.ops.triton.cross_entropy.cross_entropy_loss` on gpuparity's
cross-entropy kernels, chosen by the verified dispatcher for the cross_entropy op ("triton": the
loss kernels, that op's Triton backend, verified by the battery like every backend; else the row
step's torch-ops twin, which is also what runs while torch.compile traces).

On the Triton backend (fp32/bf16/fp16 logits) the loss has kernels of its own
(backends/triton_cross_entropy.py, op cross_entropy's "triton"): the forward reads the logits once
for the loss, the lse and the z-loss, logit_scale, label_smoothing, lse_square_scale and
precomputed_lse (taken, as FlashAttention does, only when logit_scale == 1 and label_smoothing == 0)
applied in the kernel; the backward reads them once more and writes the gradient once (into the
logits for inplace_backward), from the saved lse, with grad_output and those scalars folded in per
row.

Elsewhere (the torch twin, float64 logits) the loss is the row step of gpuparity's linear cross
entropy (online logsumexp per row, the loss, and (softmax - onehot) * a per-row scale), forward and
backward: logit_scale != 1 scales an fp32 copy of the logits first; label_smoothing and z-loss add
torch terms to the row step's loss and lse in the forward, and to its gradient in the backward (one
scatter at the targets and one per-row constant); precomputed_lse is torch ops both ways."""
from __future__ import annotations

import numbers
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..._compose import FlashAttnArgumentError, capturing
from ...flash_attn_interface import _BACKENDS
from ....backends import ce_composition
from ....ops import select
from ....ops.linear_cross_entropy import check_targets
from ....registry import Problem
from ....validation import FLOAT_DTYPES, describe, expect_tensor

__all__ = ["cross_entropy_loss", "CrossEntropyLoss"]


def refuse_process_group(process_group) -> None:
    if process_group is not None:
        raise NotImplementedError(
            "process_group: gpuparity's cross entropy has no tensor-parallel split of the vocabulary (FlashAttention "
            "gathers the logsumexp across ranks); pass process_group=None with each rank's full logits, or gather "
            "the logits first")


def _loss_rank(problem: Problem, candidates):
    """The cross_entropy op's rank (stored timings, else the device family's priors) of the two
    ways this loss can run: the kernels ("triton") and the torch steps (the op's composition, the
    last resort). F.cross_entropy ("torch") cannot serve it (no logit_scale, z-loss or lse) and is
    left out, so it is never verified for this choice."""
    return [entry for entry in select.rank(problem, candidates) if entry[0].name == "triton" or entry[0].fallback]


def row_steps(logits: Tensor) -> ce_composition.Steps:
    """The loss kernels' steps (triton_cross_entropy.STEPS) where the cross_entropy op's "triton"
    backend, the kernels' own (verified by the battery), serves these logits, else the torch
    steps. "auto": "triton" only where its verdict passed here and it ranks before the composition
    (a GPU; on a CPU the composition comes first); while its verdict is pending, the torch steps
    (the op's baseline). backends(cross_entropy=NAME) names a backend of op cross_entropy:
    "triton", else the torch steps."""
    if torch.compiler.is_compiling():
        return ce_composition.TORCH_STEPS
    problem = Problem("cross_entropy", logits.device, logits.dtype, "default", (("vocab", int(logits.shape[1])),))
    with torch.enable_grad():   # called in the Function's forward: a check run in this process needs autograd
        chosen = select.resolve(problem, _BACKENDS["cross_entropy"], rank=_loss_rank)
    if chosen.name == "triton":
        from ....backends import triton_cross_entropy
        return triton_cross_entropy.STEPS
    return ce_composition.TORCH_STEPS


def _check(logits, labels, precomputed_lse, smoothing, logit_scale, lse_square_scale, ignore_index) -> None:
    """The arguments, with FlashAttention-shaped errors; the labels' range apart (_check_label_range)."""
    expect_tensor("logits", logits, ndim=(2,), dtypes=FLOAT_DTYPES)
    expect_tensor("labels", labels, ndim=(1,), dtypes=(torch.int32, torch.int64))
    if labels.shape[0] != logits.shape[0]:
        raise FlashAttnArgumentError(f"labels: expected ({logits.shape[0]},) (one per row of logits {describe(logits)}), "
                                     f"got {describe(labels)}")
    if labels.device != logits.device:
        raise FlashAttnArgumentError(f"labels: expected a tensor on {logits.device}, got {describe(labels)}")
    for name, value in (("label_smoothing", smoothing), ("logit_scale", logit_scale),
                        ("lse_square_scale", lse_square_scale)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}: expected a float, got {describe(value)}")
    if not logit_scale > 0:
        raise FlashAttnArgumentError(f"logit_scale: expected > 0, got {logit_scale!r}")
    if not 0 <= smoothing <= 1:
        raise FlashAttnArgumentError(f"label_smoothing: expected a float in [0, 1], got {smoothing!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index: expected an int, got {describe(ignore_index)}")
    if precomputed_lse is not None:
        expect_tensor("precomputed_lse", precomputed_lse, ndim=(1,), dtypes=FLOAT_DTYPES)
        if precomputed_lse.shape[0] != logits.shape[0] or precomputed_lse.device != logits.device:
            raise FlashAttnArgumentError(f"precomputed_lse: expected ({logits.shape[0]},) on {logits.device} (one per "
                                         f"row of logits), got {describe(precomputed_lse)}")
    if logits.shape[1] == 0:
        raise FlashAttnArgumentError(f"logits: expected at least one class, got {describe(logits)}")


def _check_label_range(logits, labels, ignore_index) -> None:
    """Every label a class of logits or ignore_index (skipped while capturing: it reads the device);
    on the Triton loss kernels on a GPU the forward kernel checks instead (a device-side assert after
    it, not a few torch passes before)."""
    if not capturing(logits.device):
        try:
            check_targets(labels, logits.shape[1], int(ignore_index))
        except ValueError as exc:   # FlashAttention gives such rows no CE term; gpuparity refuses them
            raise FlashAttnArgumentError(f"labels: {exc}".replace("target: ", "")) from None


def _scaled(logits: Tensor, logit_scale: float, steps: ce_composition.Steps) -> Tuple[Tensor, bool]:
    """(the logits the row step reads, whether that tensor is a copy this call owns): scaled in
    the compute dtype (fp32; float64 stays) when logit_scale != 1, converted for the torch step."""
    dtype = ce_composition.compute_dtype(logits.dtype)
    if logit_scale != 1.0:
        return logits.to(dtype) * logit_scale, True
    if not steps.native and logits.dtype != dtype:
        return logits.to(dtype), True
    return (logits, False) if logits.stride(-1) == 1 else (logits.contiguous(), True)


class CrossEntropyLossFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, logits, labels, precomputed_lse=None, smoothing=0.0, logit_scale=1.0, lse_square_scale=0.0,
                ignore_index=-100, inplace_backward=False, process_group=None):
        refuse_process_group(process_group)
        _check(logits, labels, precomputed_lse, smoothing, logit_scale, lse_square_scale, ignore_index)
        use_lse = precomputed_lse is not None and logit_scale == 1.0 and smoothing == 0.0
        steps = row_steps(logits)
        ctx.kernels = steps.native and logits.dtype != torch.float64
        if not (ctx.kernels and logits.device.type == "cuda"):
            _check_label_range(logits, labels, ignore_index)
        ctx.spec = (float(smoothing), float(logit_scale), float(lse_square_scale), int(ignore_index),
                    bool(inplace_backward), use_lse)
        if ctx.kernels:   # the loss kernels: one read forward, one read and one write backward
            from ....backends import triton_cross_entropy
            logits = logits if logits.stride(-1) == 1 else logits.contiguous()
            losses, lse, z_losses = triton_cross_entropy.loss_forward(
                logits, labels, float(smoothing), float(logit_scale), float(lse_square_scale), int(ignore_index),
                precomputed_lse if use_lse else None)
            ctx.save_for_backward(logits, lse, labels)
            ctx.mark_non_differentiable(z_losses)
            return losses, z_losses
        rows, vocab = logits.shape
        dtype = ce_composition.compute_dtype(logits.dtype)
        valid = labels != ignore_index
        safe = labels.masked_fill(~valid, 0).long()
        z, _ = _scaled(logits, logit_scale, steps)
        if use_lse:
            lse = precomputed_lse.to(dtype)
            picked = z.gather(1, safe[:, None])[:, 0].to(dtype)
            losses = torch.where(valid, lse - picked, torch.zeros((), dtype=dtype, device=logits.device))
        else:
            losses = torch.empty(rows, dtype=dtype, device=logits.device)
            lse = torch.empty_like(losses)
            steps.rows(z, labels, losses, lse, torch.ones((), dtype=dtype, device=logits.device), int(ignore_index),
                       None, False)
        if smoothing > 0:
            # label smoothing: (1 - eps) * (lse - z_y) + eps * (lse - mean z), on the valid rows
            mean_z = z.sum(dim=1, dtype=dtype) / vocab
            losses = (1.0 - smoothing) * losses + torch.where(valid, smoothing * (lse - mean_z), 0.0)
        z_losses = torch.where(valid, lse_square_scale * lse.square(), 0.0) if lse_square_scale != 0 else \
            torch.zeros_like(losses)
        losses = losses + z_losses
        ctx.save_for_backward(logits, lse, labels)
        ctx.mark_non_differentiable(z_losses)
        return losses, z_losses

    @staticmethod
    def backward(ctx, grad_losses, grad_z_losses):
        del grad_z_losses   # z_losses are for logging only, as in FlashAttention
        logits, lse, labels = ctx.saved_tensors
        smoothing, logit_scale, lse_square_scale, ignore_index, inplace, use_lse = ctx.spec
        if ctx.kernels:
            from ....backends import triton_cross_entropy
            out = logits if inplace else torch.empty_like(logits)
            grad = triton_cross_entropy.loss_backward(grad_losses, logits, lse, labels, smoothing, logit_scale,
                                                      lse_square_scale, ignore_index, out)
            return grad, None, None, None, None, None, None, None, None
        vocab = logits.shape[1]
        dtype = ce_composition.compute_dtype(logits.dtype)
        valid = labels != ignore_index
        safe = labels.masked_fill(~valid, 0).long()
        # d loss_r / d logits_r = a_r * (p * (1 + 2 c lse) - (1 - eps) onehot - eps / V), a_r = dloss_r * logit_scale
        scale = torch.where(valid, grad_losses.to(dtype) * logit_scale, 0.0)
        steps = row_steps(logits)
        z, owned = _scaled(logits, logit_scale, steps)
        if use_lse:
            grad = (z.to(dtype) - lse[:, None]).exp_()
            grad.mul_((scale * (1.0 + 2.0 * lse_square_scale * lse))[:, None]).masked_fill_(~valid[:, None], 0.0)
            grad.scatter_add_(1, safe[:, None], -scale[:, None])
        elif smoothing == 0 and lse_square_scale == 0:
            grad = _row_gradient(steps, z, owned, labels, scale, ignore_index, logits.dtype,
                                 into_logits=inplace and not owned)
        else:
            grad = _row_gradient(steps, z, owned, labels, scale * (1.0 + 2.0 * lse_square_scale * lse), ignore_index,
                                 dtype, into_logits=False)
            grad.scatter_add_(1, safe[:, None], (scale * (2.0 * lse_square_scale * lse + smoothing))[:, None])
            if smoothing > 0:
                grad.sub_((scale * (smoothing / vocab))[:, None])
        if inplace and grad.data_ptr() != logits.data_ptr():
            grad = logits.copy_(grad) if logits.stride(-1) == 1 else grad.to(logits.dtype)
        return grad.to(logits.dtype), None, None, None, None, None, None, None, None


def _row_gradient(steps, z, owned, labels, scale, ignore_index, dtype, into_logits) -> Tensor:
    """(softmax(z) - onehot) * scale per row from the row step, in `dtype`: into z where this call
    owns it (or into_logits: FlashAttention's inplace_backward), else a new buffer."""
    rows = z.shape[0]
    scratch = torch.empty(rows, dtype=scale.dtype, device=z.device)
    lse = torch.empty_like(scratch)
    if steps.native and not owned and not into_logits:
        grad = torch.empty(z.shape, dtype=dtype, device=z.device)
        steps.rows(z, labels, scratch, lse, scale, ignore_index, None, True, grad_out=grad)
        return grad
    target = z if (owned or into_logits) else z.clone()
    if steps.native and target.dtype != dtype:   # the corrections need the compute dtype
        grad = torch.empty(z.shape, dtype=dtype, device=z.device)
        steps.rows(target, labels, scratch, lse, scale, ignore_index, None, True, grad_out=grad)
        return grad
    steps.rows(target, labels, scratch, lse, scale, ignore_index, None, True)
    return target if target.dtype == dtype else target.to(dtype)


def cross_entropy_loss(logits: Tensor, labels: Tensor, precomputed_lse: Optional[Tensor] = None,
                       label_smoothing: float = 0.0, logit_scale: float = 1.0, lse_square_scale: float = 0.0,
                       ignore_index=-100, inplace_backward: bool = False,
                       process_group=None) -> Tuple[Tensor, Tensor]:
    """Per-row cross entropy of logits against labels, FlashAttention's fused loss.

    Arguments:
        logits: (batch, vocab_size); labels: (batch,) int64/int32, ignore_index rows get loss 0.
        precomputed_lse: (batch,) the logsumexp of each row, used (instead of computing it) when
            logit_scale == 1 and label_smoothing == 0.
        label_smoothing: eps, the target distribution (1 - eps) onehot + eps / vocab_size.
        logit_scale: logits multiplied by it first (> 0).
        lse_square_scale: c, adds c * lse(logits) ** 2 to each row's loss (z-loss).
        inplace_backward: the gradient is written into logits' storage (saves memory).
        process_group: refused (NotImplementedError): no tensor-parallel vocabulary here.
    Returns:
        losses: (batch,) fp32 (float64 for float64 logits), z-loss included;
        z_losses: (batch,) its z-loss part, for logging (no gradient).
    Labels outside [0, vocab_size) other than ignore_index raise (FlashAttention gives them no CE term).
    """
    return CrossEntropyLossFunction.apply(logits, labels, precomputed_lse, label_smoothing, logit_scale,
                                          lse_square_scale, ignore_index, inplace_backward, process_group)


CrossEntropyLoss = CrossEntropyLossFunction   # FlashAttention's name for the autograd.Function
