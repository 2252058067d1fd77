"""A patched decoder's training forward builds no key/value cache unless asked (called by
patch_model).

transformers' decoders default to use_cache=True (config.use_cache), so a training forward
also returns every layer's keys and values in a cache that the step throws away. Eagerly that
costs a copy of each layer's keys and values; under torch.compile the cache is an output of the
graph, so its backward also zero-fills a gradient for every cached tensor and adds it to the
key and value gradients. On an H100 (8-layer compiled Llama, 2 x 2048 tokens) the step's wall
time moved within run-to-run noise with the rule: -0.20 ms for sdpa, -0.16 and +0.03 ms for the
patch (benchmarks/records/h100/model-training-2026-11-28.md).

The rule, applied by a forward pre-hook on the decoder's base model: while the model is in
training mode with gradients enabled, a call that passes no cache and leaves use_cache unset
(None, the causal-LM heads' default) runs with use_cache=False. An explicit use_cache=True, a
cache passed in, model.eval() or torch.no_grad() (generate() passes use_cache itself) keep
transformers' behaviour."""
from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from .summary import PatchEntry, PatchSummary

MARK = "gpuparity_training_cache_hook"
REASON = ("training forward: no key/value cache unless use_cache=True is passed (model.train(), gradients on, "
          "no cache given; a cache the step throws away costs copies and, under torch.compile, a zero gradient "
          "added to every layer's keys and values)")
# what transformers' decoders call the cache they are handed (older and newer releases)
CACHE_ARGUMENTS = ("past_key_values", "cache")


def _no_training_cache(module: nn.Module, args: tuple, kwargs: dict):
    if not (module.training and torch.is_grad_enabled()) or len(args) > 1:
        return None
    if kwargs.get("use_cache") is not None or any(kwargs.get(name) is not None for name in CACHE_ARGUMENTS):
        return None
    return args, {**kwargs, "use_cache": False}


def _base(model: nn.Module) -> nn.Module:
    base = getattr(model, "base_model", model)
    return base if isinstance(base, nn.Module) else model


def _generates(model: nn.Module) -> bool:
    try:
        return bool(model.can_generate())
    except Exception:  # noqa: BLE001 - not a transformers model, or an older one: no rule
        return False


def train_without_cache(model: nn.Module, summary: PatchSummary) -> None:
    """Register the rule above on the decoder of a model that generates (a causal LM head;
    once). Encoder-decoder models, encoders (BERT: its config has use_cache too, nothing reads
    it there) and decoders whose forward takes no use_cache are left as they are."""
    base = _base(model)
    if getattr(base, MARK, False):
        return
    config = getattr(model, "config", None)
    if (config is None or getattr(config, "is_encoder_decoder", False) or not getattr(config, "use_cache", False)
            or not _generates(model)):
        return
    try:
        parameters = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return
    if "use_cache" not in parameters or not any(name in parameters for name in CACHE_ARGUMENTS):
        return
    base.register_forward_pre_hook(_no_training_cache, with_kwargs=True)
    setattr(base, MARK, True)
    path = next((name for name, module in model.named_modules() if module is base), "")
    summary.replaced.append(PatchEntry(path or "(model)", f"{type(base).__module__}.{type(base).__name__}", REASON))
