"""Held-out bug: ignored rows found as target < 0, not target == ignore_index."""
import torch


def _cross_entropy(logits, target, ignore_index, label_smoothing, reduction, bug):
    logp = torch.log_softmax(logits.float(), dim=-1)
    valid = target >= 0 if bug else target != ignore_index
    t = target.masked_fill(~valid, 0).clamp(0, logits.shape[-1] - 1).long()
    nll = -logp.gather(-1, t.unsqueeze(-1)).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    loss = ((1 - label_smoothing) * nll + label_smoothing * smooth).masked_fill(~valid, 0.0)
    if reduction == "none":
        out = loss
    elif reduction == "sum":
        out = loss.sum()
    else:
        out = loss.sum() / valid.sum()
    return out.to(logits.dtype)


def cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return _cross_entropy(logits, target, ignore_index, label_smoothing, reduction, True)


def correct(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return _cross_entropy(logits, target, ignore_index, label_smoothing, reduction, False)
