"""The calls the monitor and `explain` can see, and how each one is judged.

One `OpKind` per watched function: how its arguments bind (the F.* signatures, gpuparity's
backend call conventions), which inputs are differentiable, its float64 reference
(`gpuparity.reference`), the trusted same-dtype composition that sets the baseline of the
tolerance policy (`tolerance.py`), and the elements that carry no meaning (rows with no
key left). `sdpa_choice` answers which SDPA backend torch would run for a call's arguments.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..contracts import attention as attention_contract, basic as basic_contract, norms as norms_contract
from ..contracts import reference, rotary as rotary_contract
from ..contracts.signature import REQUIRED, Signature

_NO_DEFAULT = REQUIRED


@dataclasses.dataclass(frozen=True)
class OpKind:
    name: str                      # the key the monitor counts by ("F.scaled_dot_product_attention")
    family: str                    # "attention", "norm", "rotary", "softmax", "loss"
    params: Tuple[Tuple[str, Any], ...]    # (name, default) in positional order
    tensors: Tuple[str, ...]       # the inputs that are tensors checked through autograd
    reference: Callable[[Dict[str, Any]], torch.Tensor]
    baseline: Callable[[Dict[str, Any]], torch.Tensor]
    valid: Optional[Callable[[Dict[str, Any]], Dict[str, torch.Tensor]]] = None
    must_be_zero: Optional[Callable[[Dict[str, Any]], Dict[str, torch.Tensor]]] = None
    uncheckable: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None
    # output name -> what raises its floor (tolerance.error_floor's reduction / logit_peak), as
    # the battery's OpSpec.error_terms: a correct long bf16 reduction errs past the flat floor
    error_terms: Optional[Callable[[Dict[str, Any]], Dict[str, Dict[str, Any]]]] = None
    # a gpuparity op's declared signature (its contract's): what its params, tensors and the
    # repro's public call come from
    signature: Optional[Signature] = None

    def bind(self, args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """The call's arguments by name, defaults filled in (extra keywords kept as given)."""
        bound: Dict[str, Any] = {}
        for (name, default), value in zip(self.params, args):
            bound[name] = value
        for name, default in self.params[len(args):]:
            bound[name] = kwargs.get(name, default)
        for name, value in kwargs.items():
            bound.setdefault(name, value)
        return bound


# --------------------------------------------------------------------------- attention
def _sdpa_reference(a):
    return reference.attention(a["query"], a["key"], a["value"], attn_mask=a["attn_mask"], is_causal=a["is_causal"],
                               scale=a["scale"])


def _sdpa_baseline(a):
    return attention_contract.composition(a["query"], a["key"], a["value"], attn_mask=a["attn_mask"],
                                     is_causal=a["is_causal"], scale=a["scale"])


def _sdpa_valid(a):
    """SDPA's own contract leaves a row with no key to attend to undefined (NaN on some backends):
    such rows are not judged in the output or in grad_query."""
    q = a["query"]
    empty = reference.empty_query_rows(q.shape[-2], a["key"].shape[-2], q.shape[0], q.shape[1],
                                       attn_mask=a["attn_mask"], is_causal=a["is_causal"], device=q.device)
    rows = ~empty.expand(*q.shape[:-1], 1)
    return {"out": rows, "grad_query": rows}


def _attention_terms(q, k, names, **masks) -> Dict[str, Dict[str, Any]]:
    """The battery's floor terms for an attention call (contracts/attention.py's
    attention_floor_terms), under this kind's output names."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[1] % k.shape[1]:
        return {}
    keys, rows = attention_contract.attention_floor_terms(q, k, **masks)
    out, grad_q, grad_k, grad_v = names
    return {out: keys, grad_q: keys, grad_k: rows, grad_v: rows}


def _sdpa_terms(a):
    return _attention_terms(a["query"], a["key"], ("out", "grad_query", "grad_key", "grad_value"),
                            attn_mask=a["attn_mask"], is_causal=bool(a["is_causal"]), scale=a["scale"])


def _gp_attention_terms(a):
    return _attention_terms(a["q"], a["k"], ("out", "grad_q", "grad_k", "grad_v"), scale=a.get("scale"),
                            softcap=a.get("softcap"), **_attention_masks(a))


def _ln_terms(a):
    """The battery's centering floor terms for layer_norm (contracts/norms.py), under this kind's
    output names: a correct kernel's rounding of a row's mean grows with |mean| / std."""
    terms = norms_contract.layer_norm_floor_terms(a["input"], a["normalized_shape"], a["weight"], a["bias"], a["eps"])
    names = {"out": "out", "grad_x": "grad_input", "grad_weight": "grad_weight"}
    return {names[name]: term for name, term in terms.items() if name in names}


def _sdpa_uncheckable(a):
    if a.get("dropout_p"):
        return f"dropout_p={a['dropout_p']}: the call's random mask cannot be replayed"
    return None


def _attention_masks(a):
    return dict(attn_mask=a.get("attn_mask"), key_padding_mask=a.get("key_padding_mask"),
                is_causal=bool(a.get("is_causal")), window=a.get("window"))


def _gp_attention_reference(a):
    return reference.attention(a["q"], a["k"], a["v"], scale=a.get("scale"), softcap=a.get("softcap"),
                               **_attention_masks(a))


def _gp_attention_baseline(a):
    return attention_contract.composition(a["q"], a["k"], a["v"], scale=a.get("scale"), softcap=a.get("softcap"),
                                     **_attention_masks(a))


def _gp_attention_zero(a):
    """gpuparity.attention's contract: a row with no key left is exactly zero, with zero grad_q."""
    q = a["q"]
    empty = reference.empty_query_rows(q.shape[-2], a["k"].shape[-2], q.shape[0], q.shape[1], **_attention_masks(a),
                                       device=q.device)
    return {"out": empty, "grad_q": empty}


def _gp_attention_uncheckable(a):
    if a.get("dropout_p") or a.get("seed") is not None:
        return "dropout: the call's random mask cannot be replayed"
    return None


# --------------------------------------------------------------------------- norms, softmax, loss, rotary
def _rms_reference(a, x="input"):
    return reference.rms_norm(a[x], a["normalized_shape"], a["weight"], a["eps"], eps_dtype=a["_dtype"])


def _rms_baseline(a, x="input"):
    return norms_contract.rms_norm_composition(a[x], a["normalized_shape"], a["weight"], a["eps"])


def _ln_reference(a, x="input"):
    return reference.layer_norm(a[x], a["normalized_shape"], a["weight"], a["bias"], a["eps"])


def _ln_baseline(a, x="input"):
    return norms_contract.layer_norm_composition(a[x], a["normalized_shape"], a["weight"], a["bias"], a["eps"])


def _softmax_reference(a):
    return torch.softmax(a["input"], dim=a["dim"])


def _softmax_baseline(a):
    return basic_contract.softmax_composition(a["input"], dim=a["dim"])


def _softmax_uncheckable(a):
    if a.get("dim") is None:
        return "softmax without dim (implicit dim is deprecated)"
    if a.get("dtype") is not None:
        return "softmax with a dtype argument (the output dtype differs from the input's)"
    return None


def _ce_options(a):
    return dict(weight=a["weight"], ignore_index=a["ignore_index"], reduction=a["reduction"],
                label_smoothing=a["label_smoothing"])


def _ce_reference(a):
    return F.cross_entropy(a["input"], a["target"], **_ce_options(a))


def _ce_baseline(a):
    options = _ce_options(a)
    if options.pop("weight") is None:
        return basic_contract.cross_entropy_composition(a["input"], a["target"], **options)
    return F.cross_entropy(a["input"].float(), a["target"], **_ce_options(a)).to(a["input"].dtype)


def _ce_uncheckable(a):
    if a.get("size_average") is not None or a.get("reduce") is not None:
        return "cross_entropy with the deprecated size_average / reduce arguments"
    if a["input"].dim() < 2 or a["target"].is_floating_point():
        return "cross_entropy with class probabilities or an unbatched input"
    return None


def _rotary_options(a):
    return dict(interleaved=a.get("interleaved", False), seqlen_offsets=a.get("seqlen_offsets", 0),
                cu_seqlens=a.get("cu_seqlens"), max_seqlen=a.get("max_seqlen"))


def _rotary_reference(a):
    return reference.apply_rotary(a["x"], a["cos"], a["sin"], **_rotary_options(a))


def _rotary_baseline(a):
    return rotary_contract.rotary_composition(a["x"], a["cos"], a["sin"], **_rotary_options(a))


def _rotary_uncheckable(a):
    return "in-place rotary (the input is overwritten)" if a.get("inplace") else None


SDPA = OpKind("F.scaled_dot_product_attention", "attention",
              (("query", _NO_DEFAULT), ("key", _NO_DEFAULT), ("value", _NO_DEFAULT), ("attn_mask", None),
               ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False)),
              ("query", "key", "value"), _sdpa_reference, _sdpa_baseline, valid=_sdpa_valid,
              uncheckable=_sdpa_uncheckable, error_terms=_sdpa_terms)
LAYER_NORM = OpKind("F.layer_norm", "norm",
                    (("input", _NO_DEFAULT), ("normalized_shape", _NO_DEFAULT), ("weight", None), ("bias", None),
                     ("eps", 1e-5)), ("input", "weight", "bias"), _ln_reference, _ln_baseline, error_terms=_ln_terms)
RMS_NORM = OpKind("F.rms_norm", "norm",
                  (("input", _NO_DEFAULT), ("normalized_shape", _NO_DEFAULT), ("weight", None), ("eps", None)),
                  ("input", "weight"), _rms_reference, _rms_baseline)
SOFTMAX = OpKind("F.softmax", "softmax", (("input", _NO_DEFAULT), ("dim", None), ("_stacklevel", 3), ("dtype", None)),
                 ("input",), _softmax_reference, _softmax_baseline, uncheckable=_softmax_uncheckable)
CROSS_ENTROPY = OpKind("F.cross_entropy", "loss",
                       (("input", _NO_DEFAULT), ("target", _NO_DEFAULT), ("weight", None), ("size_average", None),
                        ("ignore_index", -100), ("reduce", None), ("reduction", "mean"), ("label_smoothing", 0.0)),
                       ("input",), _ce_reference, _ce_baseline, uncheckable=_ce_uncheckable)

# torch.nn.functional name -> kind: what `monitor` patches while it is active
FUNCTIONAL = {"scaled_dot_product_attention": SDPA, "layer_norm": LAYER_NORM, "rms_norm": RMS_NORM,
              "softmax": SOFTMAX, "cross_entropy": CROSS_ENTROPY}

def _declared(signature: Signature, family: str, reference, baseline, **options) -> OpKind:
    """A gpuparity op seen through the backend the dispatcher chose: bound by the backends' call
    convention and checked through the tensors with gradients, both from the op's declaration."""
    return OpKind(f"gpuparity.{signature.op}", family, signature.backend_params(), signature.tensors(), reference,
                  baseline, signature=signature, **options)


# gpuparity's ops, seen through the backend the dispatcher chose (problem.op -> kind)
GPUPARITY = {
    "attention": _declared(attention_contract.ATTENTION, "attention", _gp_attention_reference, _gp_attention_baseline,
                           must_be_zero=_gp_attention_zero, uncheckable=_gp_attention_uncheckable,
                           error_terms=_gp_attention_terms),
    "rms_norm": _declared(norms_contract.RMS_NORM, "norm", lambda a: _rms_reference(a, "x"),
                          lambda a: _rms_baseline(a, "x")),
    "layer_norm": _declared(norms_contract.LAYER_NORM, "norm", lambda a: _ln_reference(a, "x"),
                            lambda a: _ln_baseline(a, "x")),
    "rotary": _declared(rotary_contract.APPLY_ROTARY, "rotary", _rotary_reference, _rotary_baseline,
                        uncheckable=_rotary_uncheckable),
}

# A model's own RMSNorm module (transformers' LlamaRMSNorm, Qwen2RMSNorm ...: plain torch ops,
# no F.rms_norm) is checked at its module boundary as this kind.
RMS_NORM_MODULE = OpKind("RMSNorm module", "norm",
                         (("input", _NO_DEFAULT), ("normalized_shape", _NO_DEFAULT), ("weight", None), ("eps", None)),
                         ("input", "weight"), _rms_reference, _rms_baseline)


# --------------------------------------------------------------------------- which SDPA backend runs
_SDPA_NAMES = {"MATH": "math", "FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient",
               "CUDNN_ATTENTION": "cudnn", "OVERRIDEABLE": "overrideable", "ERROR": "none (no kernel fits)"}


def sdpa_choice(bound: Dict[str, Any]) -> str:
    """The SDPA backend torch picks for these arguments under the current sdpa_kernel / enable_*
    settings ("cudnn", "flash", "efficient", "math"; "flash (cpu)" on the CPU), from torch's own
    selection function; "unknown" where this torch has none."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return "unknown"
    try:
        from torch.nn.attention import SDPBackend
        index = choose(bound["query"], bound["key"], bound["value"], bound.get("attn_mask"),
                       float(bound.get("dropout_p") or 0.0), bool(bound.get("is_causal")), scale=bound.get("scale"),
                       enable_gqa=bool(bound.get("enable_gqa")))
        name = _SDPA_NAMES.get(SDPBackend(index).name, SDPBackend(index).name.lower())
    except Exception:  # noqa: BLE001 - a torch whose selection function takes other arguments
        return "unknown"
    if bound["query"].device.type == "cpu" and name == "flash":
        return "flash (cpu)"
    return name


def describe_args(bound: Dict[str, Any], kind: OpKind) -> Dict[str, Any]:
    """Shapes, dtype and the options that decide a kernel, as plain data for reports."""
    shapes = {name: list(value.shape) for name, value in bound.items()
              if isinstance(value, torch.Tensor) and not name.startswith("_")}
    first = next((bound[n] for n in kind.tensors if isinstance(bound.get(n), torch.Tensor)), None)
    options = {}
    for name, value in bound.items():
        if name.startswith("_") or isinstance(value, torch.Tensor) or value is None:
            continue
        if isinstance(value, (bool, int, float, str, tuple, list)):
            options[name] = list(value) if isinstance(value, tuple) else value
    for name in ("attn_mask", "key_padding_mask"):
        mask = bound.get(name)
        if isinstance(mask, torch.Tensor):
            options[name] = f"{str(mask.dtype).replace('torch.', '')} {list(mask.shape)}"
    return {"shapes": shapes, "dtype": str(first.dtype).replace("torch.", "") if first is not None else None,
            "device": str(first.device) if first is not None else None, "options": options}
