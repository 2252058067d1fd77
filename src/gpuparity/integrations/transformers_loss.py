"""Hugging Face causal-LM heads whose training loss is gpuparity.linear_cross_entropy: the
(tokens, vocab) logits are never made when labels are given (called by patch_model)."""
from __future__ import annotations

import functools
import inspect
import types
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .summary import PatchEntry, PatchSummary
from ..ops.linear_cross_entropy import linear_cross_entropy
from .swap import mark, serves

# Causal-LM classes whose forward is model -> lm_head -> ForCausalLMLoss (Gemma-2 with its
# final logit softcap in between), checked against their own forward by the tests.
CAUSAL_LM = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
             "Gemma2ForCausalLM")
IGNORE_INDEX = -100
REASON = "lm_head+loss -> gpuparity.linear_cross_entropy (with labels: no logits, output.logits is None)"


def causal_lm_loss(hidden: torch.Tensor, lm_head: nn.Linear, labels: Optional[torch.Tensor], *,
                   softcap: Optional[float] = None, num_items_in_batch=None, ignore_index: int = IGNORE_INDEX,
                   shift_labels: Optional[torch.Tensor] = None, backend: str = "auto") -> torch.Tensor:
    """transformers' ForCausalLMLoss on lm_head(hidden) without the logits: labels shifted by one
    (or shift_labels as given), ignore_index skipped, the mean over the labels not ignored, or
    the sum divided by num_items_in_batch when given (gradient accumulation). fp32 like HF's.
    One difference: when every label is ignored the mean is 0 here, NaN in transformers."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(hidden.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = linear_cross_entropy(hidden, lm_head.weight, shift_labels, bias=lm_head.bias, ignore_index=ignore_index,
                                reduction=reduction, softcap=softcap, backend=backend)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _var_keyword(signature: inspect.Signature) -> Optional[str]:
    return next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)


def causal_lm_forward(self, *args, **kwargs):
    """The class's forward, except with labels (and all logits kept): self.model(...), then the
    loss through gpuparity.linear_cross_entropy on the last hidden states. The output is the
    usual CausalLMOutputWithPast with logits=None (as Liger-Kernel's fused linear cross entropy
    does): the logits are exactly what this avoids making. Without labels, unchanged."""
    cls_forward = type(self).forward
    signature = inspect.signature(cls_forward)
    bound = signature.bind(self, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(signature.parameters)))            # self
    labels = arguments.pop("labels", None)
    keep = arguments.pop("logits_to_keep", 0)
    if labels is None or not (isinstance(keep, int) and keep == 0) or not serves(self):
        return cls_forward(self, *args, **kwargs)
    extra = dict(arguments.pop(_var_keyword(signature), None) or {})
    return_dict = extra.pop("return_dict", None)
    outputs = self.model(**arguments, **extra)
    hidden = outputs[0]
    softcap = getattr(self.config, "final_logit_softcapping", None)
    loss = causal_lm_loss(hidden, self.lm_head, labels, softcap=softcap,
                          num_items_in_batch=extra.get("num_items_in_batch"),
                          ignore_index=extra.get("ignore_index", IGNORE_INDEX), shift_labels=extra.get("shift_labels"),
                          backend=getattr(self, "gpuparity_loss_backend", "auto"))
    from transformers.modeling_outputs import CausalLMOutputWithPast
    fields = CausalLMOutputWithPast.__dataclass_fields__
    carried = {name: getattr(outputs, name, None) for name in ("cache", "past_key_values", "hidden_states",
                                                                 "attentions") if name in fields}
    result = CausalLMOutputWithPast(loss=loss, logits=None, **carried)
    if return_dict is False or (return_dict is None and not getattr(self.config, "return_dict", True)):
        return result.to_tuple()
    return result


def _signed_forward(cls: type) -> Callable:
    """causal_lm_forward under the class forward's name, docstring and signature (functools.wraps
    sets __wrapped__, which inspect.signature follows): transformers reads the signature of
    `model.forward` to decide what to pass (generate() passes logits_to_keep only to a forward that
    names it, and runs the LM head over the whole prompt otherwise; Trainer's remove_unused_columns
    and the tests' "does not support position_ids" skips read it too)."""
    @functools.wraps(cls.forward)
    def forward(self, *args, **kwargs):
        return causal_lm_forward(self, *args, **kwargs)

    forward.gpuparity_causal_lm = True
    return forward


def patch_causal_lm_loss(model: nn.Module, *, backend: str = "auto", summary: Optional[PatchSummary] = None,
                         wanted: Optional[Callable[[nn.Module], bool]] = None, plan=None) -> PatchSummary:
    """Give `model` (one of CAUSAL_LM) causal_lm_forward as its own forward: the instance's,
    not the class's, so other models of that class keep theirs. Idempotent."""
    summary = PatchSummary() if summary is None else summary
    cls = type(model)
    head = getattr(model, "lm_head", None)
    if cls.__name__ not in CAUSAL_LM or not cls.__module__.startswith("transformers."):
        return summary
    if wanted is not None and not (wanted(model) or (head is not None and wanted(head))):
        return summary
    if getattr(getattr(model.forward, "__func__", None), "gpuparity_causal_lm", False):
        return summary
    if type(head) is not nn.Linear or not isinstance(getattr(model, "model", None), nn.Module):
        summary.left.append(PatchEntry("lm_head", type(head).__name__, (
            "lm_head+loss: not an nn.Linear head over model.model (a wrapped or quantised head); "
            "transformers' loss is kept")))
        return summary
    left = None if plan is None else plan.left("loss")
    if left is not None:
        summary.left.append(PatchEntry("lm_head", f"{cls.__module__}.{cls.__qualname__}", f"lm_head+loss: {left}"))
        return summary
    model.forward = types.MethodType(_signed_forward(cls), model)
    model.gpuparity_loss_backend = backend
    summary.replaced.append(PatchEntry("lm_head", f"{cls.__module__}.{cls.__qualname__}",
                                       REASON + mark(model, plan, "loss")))
    return summary
