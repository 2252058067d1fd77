"""Hugging Face transformers: gpuparity's verified attention as attn_implementation="gpuparity",
and patch_model() (called by gpuparity.patch) swapping transformers' RMSNorms in place."""
from __future__ import annotations

import inspect
import logging
import re
import sys
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from .. import caches
from .summary import PatchEntry, PatchSummary
from ..ops.attention import attention
from ..ops.norms import rms_norm
from .transformers_loss import patch_causal_lm_loss
from .transformers_mlp import patch_mlps
from .transformers_rotary import patch_rotary
from .transformers_cache import train_without_cache
from .swap import mark, qualname, serves, swapped_subclass

LOG = logging.getLogger("gpuparity")
NAME = "gpuparity"
# transformers versions this module is tested with: AttentionInterface (4.48+) and the mask
# interface that builds a mask for a registered implementation (masking_utils, 4.53+).
MIN_VERSION = (4, 53)
MAX_VERSION = (6, 0)  # exclusive; the 6.x API is unknown
SUPPORTED = ">=4.53,<6"

# model_type -> family name, for the families the tests cover.
FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma",
            "gemma2": "Gemma-2", "bert": "BERT", "roberta": "RoBERTa", "vit": "ViT", "esm": "ESM"}

# RMSNorm class name -> (eps attribute, computes x * (1 + weight)).
RMS_NORMS: Dict[str, Tuple[str, bool]] = {
    "LlamaRMSNorm": ("variance_epsilon", False),
    "MistralRMSNorm": ("variance_epsilon", False),
    "Qwen2RMSNorm": ("variance_epsilon", False),
    "Qwen3RMSNorm": ("variance_epsilon", False),
    "GemmaRMSNorm": ("eps", True),
    "Gemma2RMSNorm": ("eps", True),
}


def _import():
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("transformers is not installed: pip install 'gpuparity[hf]' (transformers "
                          f"{SUPPORTED})") from exc
    return transformers


def version_tuple(text: str) -> Tuple[int, int]:
    numbers = re.findall(r"\d+", text)[:2]
    return tuple(int(n) for n in numbers + ["0"] * (2 - len(numbers)))  # type: ignore[return-value]


def register() -> None:
    """Register "gpuparity" with transformers' AttentionInterface (and its mask interface, so
    the model builds SDPA-style bool masks for it). Idempotent."""
    transformers = _import()
    found = version_tuple(transformers.__version__)
    if found < MIN_VERSION:
        raise ImportError(f"transformers: gpuparity's integration needs transformers {SUPPORTED}, "
                          f"got {transformers.__version__}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, compact_mask)


def compact_mask(*args, **kwargs):
    """The mask transformers builds for "gpuparity": for a plain causal (or bidirectional) mask
    without a cache (Sq == Sk), the (B, Sk) padding mask as it came (1 = token), or None without
    one; attention_forward turns it into key_padding_mask + is_causal, which the Triton kernel
    serves from per-item key bounds instead of reading a dense (B, 1, Sq, Sk) mask. Anything else
    (sliding windows, chunks, packed sequences, a cache) gets transformers' own SDPA bool mask."""
    from transformers import masking_utils
    from transformers.masking_utils import causal_mask_function, sdpa_mask
    # bidirectional_mask_function arrived after 4.53 (the hf extra's floor)
    plain_functions = (causal_mask_function, getattr(masking_utils, "bidirectional_mask_function", causal_mask_function))
    mask_function = kwargs.get("mask_function", causal_mask_function)
    kv_length = kwargs.get("kv_length")
    if "q_length" in kwargs:
        q_length = kwargs["q_length"]
    else:  # transformers < 5: cache_position holds the query positions
        positions = kwargs.get("cache_position")
        q_length = None if positions is None else positions.shape[0]
    padding = kwargs.get("attention_mask")
    plain = mask_function in plain_functions
    if (not args and plain and kv_length is not None and q_length == kv_length and kwargs.get("kv_offset", 0) == 0
            and (padding is None or (padding.dim() == 2 and padding.shape[-1] == kv_length))):
        return None if padding is None else padding.bool()
    return sdpa_mask(*args, **kwargs)


# --------------------------------------------------------------------------- attention
def hf_masks(attention_mask: Optional[torch.Tensor], key: torch.Tensor):
    """transformers' attention_mask -> (attn_mask, key_padding_mask) in gpuparity.attention's terms.

    Takes None; a 4D bool mask (True = attend, as sdpa_mask builds it); a 4D additive float mask
    (0 = attend, finfo.min = masked, as eager masks are built): values below finfo.min / 2 become
    -inf, so a row with no key left is empty (zeros from gpuparity.attention, never NaN) instead of
    a uniform average over masked keys; a 2D (B, Sk) padding mask with 1 = token, 0 = padding.
    """
    if attention_mask is None:
        return None, None
    k_len = key.shape[-2]
    if attention_mask.dim() == 2:
        return None, ~attention_mask[:, -k_len:].bool()
    if attention_mask.dim() != 4:
        raise ValueError(f"attention_mask: expected None, a (B, Sk) padding mask or a 4D (B, 1|H, Sq, Sk) mask, "
                         f"got shape {tuple(attention_mask.shape)}")
    mask = attention_mask[..., :k_len]  # a static cache's mask may be longer than the keys
    if mask.dtype == torch.bool:
        return mask, None
    if not mask.is_floating_point():  # 1 = attend, 0 = masked
        return mask.bool(), None
    masked = mask < torch.finfo(mask.dtype).min / 2
    return mask.masked_fill(masked, float("-inf")), None


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs):
    """transformers' attention function signature: query (B, H, Sq, D), key/value (B, Hkv, Sk, D)
    -> ((B, Sq, H, D), None). GQA goes to gpuparity.attention as is (no repeat_kv)."""
    if kwargs.get("output_attentions"):
        return _eager_with_weights(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    for name in ("s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise ValueError(f"{name}: gpuparity.attention does not implement it (got a value for module "
                             f"{type(module).__name__}); use attn_implementation='eager' or 'sdpa' for this model")
    attn_mask, key_padding_mask = hf_masks(attention_mask, key)
    q_len = query.shape[2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    # as HF's sdpa: a 4D mask already holds causality; one query token sees every key. A (B, Sk)
    # padding mask with Sq == Sk (compact_mask's) holds none: causality comes from the module.
    compact = attention_mask is not None and attention_mask.dim() == 2 and key.shape[2] == q_len
    causal = bool(q_len > 1) and (attention_mask is None or compact) and bool(causal)
    if causal and key.shape[2] > q_len:
        # prefill into an empty static cache: the keys past q_len are unused slots (HF's sdpa crops too)
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    extra = {"softcap": kwargs["softcap"]} if kwargs.get("softcap") else {}   # Gemma-2's logit softcap
    if dropout > 0.0:   # HF passes the config's attention dropout in training only
        extra["dropout_p"] = float(dropout)
    out = attention(query, key, value, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=causal,
                    scale=scaling, backend=getattr(module, "gpuparity_backend", "auto"), **extra)
    return out.transpose(1, 2).contiguous(), None


_LOGGED = caches.register("integrations.transformers.logged", set())  # classes whose fallback was logged


def _eager_with_weights(module: nn.Module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs):
    """A call that asks for the attention weights (output_attentions=True): gpuparity.attention
    returns none (its kernels never form the probabilities), so this call goes to the model's own
    eager_attention_forward (transformers' reference), given the additive mask eager expects."""
    modeling = sys.modules.get(type(module).__module__)
    eager = getattr(modeling, "eager_attention_forward", None)
    if eager is None:
        raise ValueError(f"output_attentions=True: {type(module).__name__}'s module has no eager_attention_forward "
                         "to return attention weights with; use attn_implementation='eager' for this call")
    if type(module) not in _LOGGED:
        _LOGGED.add(type(module))
        LOG.info("gpuparity: output_attentions=True in %s: served by transformers' eager attention for those "
                 "calls (gpuparity.attention returns no weights)", type(module).__name__)
    attn_mask, key_padding_mask = hf_masks(attention_mask, key)
    q_len, k_len = query.shape[2], key.shape[2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    compact = attention_mask is not None and attention_mask.dim() == 2 and k_len == q_len
    allowed = None
    if bool(causal) and q_len > 1 and (attention_mask is None or compact):
        # top-left, as attention_forward's is_causal (which crops a static cache's unused slots)
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()[None, None]
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    lowest = torch.finfo(query.dtype).min
    additive = None
    if allowed is not None:
        additive = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(~allowed, lowest)
    if attn_mask is not None and attn_mask.is_floating_point():
        float_mask = attn_mask.to(query.dtype).clamp(min=lowest)      # hf_masks' -inf back to eager's finfo.min
        additive = float_mask if additive is None else additive + float_mask
    kwargs.pop("output_attentions", None)
    return eager(module, query, key, value, additive, scaling=module.scaling if scaling is None else scaling,
                 dropout=dropout, **kwargs)


# --------------------------------------------------------------------------- RMSNorm
def _rms_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if weight.dtype != hidden_states.dtype or not serves(self):
        # Llama's form multiplies in the weight's dtype (type promotion); keep HF's own there
        return self.gpuparity_original.forward(self, hidden_states)
    return rms_norm(hidden_states, weight.shape, weight, getattr(self, self.gpuparity_eps_attr),
                    backend=self.gpuparity_backend)


def _rms_one_plus_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # Gemma: norm(x) * (1 + w), the sum formed in fp32 (a weight near zero keeps its low bits),
    # then in x's dtype: one rounding more than Gemma's fp32 product (tested within the policy),
    # but a weight of x's dtype is what the fused kernels take (mixed dtypes fall off them)
    if not serves(self):
        return self.gpuparity_original.forward(self, hidden_states)
    weight = (1.0 + self.weight.float()).to(hidden_states.dtype)
    return rms_norm(hidden_states, weight.shape, weight, getattr(self, self.gpuparity_eps_attr),
                    backend=self.gpuparity_backend)


_SWAPPED_CLASSES: Dict[type, type] = {}


def _swapped_class(cls: type) -> type:
    """A subclass of transformers' RMSNorm whose forward calls gpuparity.rms_norm."""
    eps_attr, one_plus = RMS_NORMS[cls.__name__]
    return swapped_subclass(cls, _rms_one_plus_forward if one_plus else _rms_forward, globals(), _SWAPPED_CLASSES,
                            gpuparity_eps_attr=eps_attr)


# --------------------------------------------------------------------------- patch
def _calls_attention_interface(module: nn.Module) -> bool:
    forward = inspect.unwrap(type(module).forward)
    code = getattr(forward, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


def _old_style_attention(model: nn.Module):
    """Innermost attention modules (class name ending in Attention) of a model whose attention
    does not call AttentionInterface."""
    for path, module in model.named_modules():
        if type(module).__name__.endswith("Attention") and not any(
                type(child).__name__.endswith("Attention") for child in module.children()):
            yield path, module


def _attention_left_reason(model: nn.Module) -> Optional[str]:
    """Why the model's attention stays HF's, or None when gpuparity's may serve it."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        return (f"model_type {model_type!r} is not a family gpuparity tests ({', '.join(FAMILIES.values())}); "
                f"attn_implementation='{NAME}' may still be set by hand")
    return None


def _dropout_note(config) -> str:
    for name in ("attention_dropout", "attention_probs_dropout_prob"):
        p = getattr(config, name, None)
        if p:
            return (f"; training with config.{name}={p}: dropout in gpuparity.attention(dropout_p={p}) "
                    "(Philox in the kernel, replayed in the backward)")
    return ""


def _explicit_choice(model: nn.Module) -> Optional[str]:
    """Why the attention implementation the user chose stays, or None when it is transformers'
    default (sdpa; eager for a class without sdpa support): an explicit attn_implementation="eager"
    (e.g. to get attention weights), a flash or flex kernel, is the user's to keep."""
    current = getattr(model.config, "_attn_implementation", None)
    if current in (None, "sdpa", NAME):
        return None
    if current == "eager" and not getattr(type(model), "_supports_sdpa", False):
        return None   # transformers' own default for this class
    return (f"attn_implementation={current!r} was chosen for this model (transformers' default would be 'sdpa') "
            f"and is kept; pass force=('attention',) to patch(), or set attn_implementation='{NAME}', to use "
            "gpuparity's")


def _set_attention(model: nn.Module) -> Optional[str]:
    """Switch the model to attn_implementation="gpuparity"; returns why not, or None."""
    register()
    try:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(NAME)
        else:
            model.config._attn_implementation = NAME
    except (ValueError, KeyError, ImportError) as exc:
        return f"transformers refused attn_implementation='{NAME}': {exc}"
    if getattr(model.config, "_attn_implementation", None) != NAME:
        return (f"{type(model).__name__} does not take a registered attention implementation "
                "(transformers kept " + repr(getattr(model.config, "_attn_implementation", None)) + ")")
    return None


def patch_model(model: nn.Module, *, backend: str = "auto", include=None,
                summary: Optional[PatchSummary] = None, plan=None) -> PatchSummary:
    """Patch a transformers PreTrainedModel in place (gpuparity.patch calls this first; the
    torch drop-ins, nn.LayerNorm included, follow there): RMSNorms of the families in RMS_NORMS
    become subclasses calling gpuparity.rms_norm; attention switches to "gpuparity" unless the
    config needs what gpuparity.attention lacks; the attention's apply_rotary_pos_emb goes to
    gpuparity.apply_rotary (transformers_rotary); silu gated MLPs go to gpuparity.swiglu
    (transformers_mlp); the causal-LM loss to gpuparity.linear_cross_entropy (transformers_loss);
    a decoder's training forward builds no key/value cache unless asked (transformers_cache).
    plan: gpuparity.patching.Plan, which kinds are swapped in which mode (None: all, everywhere)."""
    transformers = _import()
    force = () if plan is None else plan.force
    summary = PatchSummary() if summary is None else summary
    found = version_tuple(transformers.__version__)
    if found >= MAX_VERSION:
        summary.notes.append(f"transformers {transformers.__version__} is newer than the tested range {SUPPORTED}")

    def wanted(module):
        return include is None or any(type(module) is cls or
                                      getattr(type(module), "gpuparity_original", None) is cls for cls in include)

    attention_sites = [(path, m) for path, m in model.named_modules() if _calls_attention_interface(m)]
    if not attention_sites:
        for path, module in _old_style_attention(model):
            if wanted(module):
                summary.left.append(PatchEntry(path, qualname(module), (
                    f"attention: {type(module).__name__} in transformers {transformers.__version__} computes "
                    "attention itself, not through AttentionInterface (a newer transformers routes it)")))
    if attention_sites and any(wanted(m) for _, m in attention_sites):
        reason = _attention_left_reason(model) or (None if plan is None else plan.left("attention"))
        already = getattr(model.config, "_attn_implementation", None) == NAME
        if reason is None and not already and "attention" not in force:
            reason = _explicit_choice(model)
        if reason is None and not already:
            reason = _set_attention(model)
        for path, module in attention_sites:
            if not wanted(module):
                continue
            if reason is not None:
                summary.left.append(PatchEntry(path, qualname(module), f"attention: {reason}"))
            elif not already:
                module.gpuparity_backend = backend
                summary.replaced.append(PatchEntry(path, qualname(module), (
                    f"attention: attn_implementation='{NAME}' (gpuparity.attention, backend={backend!r})"
                    + _dropout_note(model.config))))

    for path, module in model.named_modules():
        cls = type(module)
        if cls.__name__ in RMS_NORMS and cls.__module__.startswith("transformers."):
            if not wanted(module):
                continue
            original = qualname(module)
            left = None if plan is None else plan.left("rms_norm")
            if left is None and RMS_NORMS[cls.__name__][1] and version_tuple(transformers.__version__) < (5,):
                left = (f"not verified on transformers {transformers.__version__}: on 4.53 a bf16 Gemma-2 with "
                        "a saturated final softcap got parameter gradients past the tolerance bound with this "
                        "swap alone (tests/integrations/test_transformers_loss.py); verified on 5.x")
            if left is not None:
                summary.left.append(PatchEntry(path, original, f"RMSNorm: {left}"))
                continue
            module.__class__ = _swapped_class(cls)
            module.gpuparity_backend = backend
            formula = "x * (1 + weight)" if RMS_NORMS[cls.__name__][1] else "x * weight"
            summary.replaced.append(PatchEntry(path, original, f"RMSNorm ({formula}) -> gpuparity.rms_norm"
                                               + mark(module, plan, "rms_norm")))
        elif cls.__module__.startswith("transformers.") and cls.__name__.endswith("RMSNorm") \
                and not hasattr(cls, "gpuparity_original"):
            summary.left.append(PatchEntry(path, qualname(module), "RMSNorm of a family gpuparity has not checked"))
    patch_rotary(model, backend=backend, summary=summary, wanted=wanted, plan=plan)
    patch_mlps(model, backend=backend, summary=summary, wanted=wanted, plan=plan)
    patch_causal_lm_loss(model, backend=backend, summary=summary, wanted=wanted, plan=plan)
    if include is None:     # a model-wide rule, not a module swap: not with a chosen list of classes
        train_without_cache(model, summary)
    return summary
