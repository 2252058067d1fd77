"""`gpuparity.patch(model)`: swap torch.nn modules for gpuparity's verified drop-ins in place,
keeping their weights. Each drop-in class (gpuparity.nn) declares `from_torch(module)` and names
the torch class it replaces in `REPLACES`; the table below is the one list of drop-ins. Hugging
Face transformers models also go through gpuparity.integrations.transformers. This module sits
above both: nn/ (the drop-in modules) and integrations/ (the adapters) import neither each other
nor it.

A module is swapped only where the swap wins on this device family in the mode the model runs
(`mode=`): `PRIORS` holds, per family and mode, the kinds of module left and why, from the
measurements its comments cite. A user can still force a kind (`force=`).

With backend="auto", patch() also hands the calls the swapped modules will make (`first_calls`:
each op at the model's dtype and device, shapes from its modules) to ops/select.py `prepare`,
which verifies their candidates in the kept worker in the background, so that the model's first
forward finds the verdicts stored or waits only for the rest (where checks run in a worker: a
GPU, or GPUPARITY_PROBE=subprocess)."""
from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .integrations.summary import PatchEntry, PatchSummary  # noqa: F401 - re-exported
from .nn import LayerNorm, MultiheadAttention, RMSNorm
from .registry import Problem

LOG = logging.getLogger("gpuparity")
# every drop-in (gpuparity.nn), each naming the torch class it replaces in REPLACES
DROP_INS = (MultiheadAttention, RMSNorm, LayerNorm)


MODES = ("auto", "eager", "compiled")
KINDS = ("attention", "rms_norm", "layer_norm", "rotary", "swiglu", "loss")

_FUSED = ("inductor fuses the plain {what} with its neighbours under torch.compile (no extra read and write of "
          "the activations), which a separate kernel cannot")
# device family -> mode -> kind -> why a module of that kind is left in that mode (absent: swapped).
# A prior, shipped per family: eager, every kind swapped (a Llama training step on an H200,
# benchmarks/records/h200/patch-model-2026-11-27.md: the whole patch 1.18x sdpa, attention alone
# 1.17x; each op's `auto` still picks, per call, the fastest backend verified here, the torch
# composition where nothing beats it). Compiled: attention and the rotation swapped, everything
# else left to inductor (benchmarks/records/h200/patch-compiled-2026-11-27.md, 8 layers, 2 x 2048
# tokens: attention alone 1.10x compiled sdpa, attention + the chunked fused loss 1.05x; the norm
# and SwiGLU modules are left because inductor fuses their plain forms into their neighbours at
# the memory bandwidth, where a kernel of ours is a fusion barrier). The rotation: inductor
# recomputes cos and sin for every element of q and k in its own pointwise kernels (3x the
# bandwidth time), where the rotary kernel reads the table the model built once: on an H100 the
# patched compiled step went from 26.42 to 25.70 ms with it (kernels: 774 -> 263 us a step;
# benchmarks/records/h100/model-training-2026-11-27.md, "The rotation under torch.compile"). The
# loss: traced, the Triton backend is one pass (ops/library_ce.py) where the logits fit: the LM
# head's GEMMs as inductor's, one row kernel for loss and gradient instead of inductor's two
# fp32 sweeps (kernels 493 -> 205-229 us a step, the step 26.11 -> 25.43 ms on an H100; same record,
# "Night"). Under compile a swapped op's backend is still auto's choice at
# trace time.
_COMPILED_LEFT = {
    "rms_norm": _FUSED.format(what="RMSNorm"),
    "layer_norm": _FUSED.format(what="LayerNorm"),
    "swiglu": _FUSED.format(what="silu(gate) * up")}
PRIORS: Dict[str, Dict[str, Dict[str, str]]] = {
    "nvidia": {"eager": {}, "compiled": dict(_COMPILED_LEFT)},
    # no kernels of ours on a CPU: the torch compositions either way, traced inline by inductor
    "cpu": {"eager": {}, "compiled": {**_COMPILED_LEFT, "rotary": (
        "no rotary kernel on this device: transformers' own rotation, which inductor compiles"), "loss": (
        "no cross-entropy kernel on this device: transformers' loss, which inductor compiles (the "
        "chunked linear_cross_entropy saves the logits' memory; force=('loss',) to trade speed for it)")}},
    # the NVIDIA table, for the same reasons, but the rotation and the loss not measured compiled on ROCm
    "amd": {"eager": {}, "compiled": {**_COMPILED_LEFT, "rotary": (
        "not measured under torch.compile on ROCm (on an H100 the rotary kernel beat inductor's "
        "rotation); transformers' own rotation, which inductor compiles"), "loss": (
        "not measured under torch.compile on ROCm (on an H100 the one-pass cross-entropy beat "
        "inductor's); transformers' loss, which inductor compiles")}},
}


def device_family(model: nn.Module) -> str:
    """"nvidia", "amd" or "cpu": the model's parameters' device, else the GPU this process sees
    (a model is often patched before .to("cuda"))."""
    param = next(iter(model.parameters()), None)
    device_type = param.device.type if param is not None and param.device.type not in ("meta", "cpu") else (
        "cuda" if torch.cuda.is_available() else "cpu")
    if device_type != "cuda":
        return "cpu"
    return "amd" if getattr(torch.version, "hip", None) else "nvidia"


@dataclass(frozen=True)
class Plan:
    """Where each kind of module is swapped: `serves(kind)` = (eagerly, under torch.compile), and
    why one is left (`left(kind)`), for the model's device family and the mode asked for."""
    family: str
    mode: str
    force: Tuple[str, ...] = ()

    def why_left(self, kind: str, mode: str) -> Optional[str]:
        if kind in self.force:
            return None
        return PRIORS[self.family][mode].get(kind)

    def serves(self, kind: str) -> Tuple[bool, bool]:
        eager, compiled = self.why_left(kind, "eager") is None, self.why_left(kind, "compiled") is None
        if self.mode == "eager":
            return (eager, eager)     # compiled anyway: what was swapped serves there too
        if self.mode == "compiled":
            return (compiled, compiled)
        return (eager, compiled)

    def left(self, kind: str) -> Optional[str]:
        """Why no call of this kind is served by gpuparity (None when some are)."""
        if any(self.serves(kind)):
            return None
        why = self.why_left(kind, "compiled" if self.mode == "compiled" else "eager") or \
            self.why_left(kind, "compiled")
        return f"{why} (device family {self.family}, mode={self.mode!r}; force=({kind!r},) swaps it anyway)"

    def note(self, kind: str) -> str:
        """What a swapped module's summary line adds when it serves in one mode only."""
        eager, compiled = self.serves(kind)
        if eager and not compiled:
            return f"; under torch.compile transformers' own runs ({self.why_left(kind, 'compiled')})"
        if compiled and not eager:
            return f"; eagerly transformers' own runs ({self.why_left(kind, 'eager')})"
        return ""


def make_plan(model: nn.Module, mode: str, force) -> Plan:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if force is True:
        force = KINDS
    if isinstance(force, str) or force is None:
        raise TypeError(f"force: expected an iterable of kinds from {KINDS} (or True for all), got {force!r}")
    force = tuple(force)
    unknown = [k for k in force if k not in KINDS]
    if unknown:
        raise ValueError(f"force: expected kinds from {KINDS}, got {unknown}")
    return Plan(device_family(model), mode, force)


def _drop_in_table() -> Dict[type, type]:
    return {cls.REPLACES: cls for cls in DROP_INS}


def _is_transformers_model(model: nn.Module) -> bool:
    # a PreTrainedModel instance means transformers is already imported: never import it here
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, getattr(transformers, "PreTrainedModel", ()))


# drop-in class name -> its kind in PRIORS
_DROP_IN_KINDS = {"MultiheadAttention": "attention", "RMSNorm": "rms_norm", "LayerNorm": "layer_norm"}


def patch(model: nn.Module, *, backend: str = "auto", include=None, mode: str = "auto", force=()) -> PatchSummary:
    """Swap the supported modules of `model` in place where the swap wins here; returns a
    PatchSummary (replaced and left modules with reasons; iterating it gives the replaced paths).

    include: optional iterable of classes to swap (default: all that have a drop-in); for a
    transformers model it may also name transformers' norm and attention classes.
    mode: how the model will run. "eager" or "compiled" (torch.compile) swaps the kinds of module
    that win in that mode on this device family (PRIORS); "auto" swaps what wins in either, and
    a transformers module swapped for one mode only runs transformers' own forward in the other
    (decided when torch.compile traces it: no cost per call). The summary says why each module
    that was left was left.
    force: kinds to swap whatever PRIORS say (or an explicit attn_implementation the user chose),
    from KINDS: "attention", "rms_norm", "layer_norm", "rotary", "swiglu", "loss"; True for all.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {type(backend).__name__}")
    plan = make_plan(model, mode, force)
    include = None if include is None else tuple(include)
    summary = PatchSummary()
    if _is_transformers_model(model):
        from .integrations import transformers as hf
        hf.patch_model(model, backend=backend, include=include, summary=summary, plan=plan)
    table = _drop_in_table()
    if include is not None:
        table = {k: v for k, v in table.items() if k in include}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            replacement_cls = table.get(type(child))
            if replacement_cls is None:
                continue
            path = f"{parent_name}.{child_name}" if parent_name else child_name
            cls_name = f"{type(child).__module__}.{type(child).__name__}"
            # a drop-in has no per-call switch: it is swapped when it wins in the mode asked for
            # (eager's answer under "auto", where the model has not run yet)
            kind = _DROP_IN_KINDS.get(replacement_cls.__name__)
            why = None if kind is None else plan.why_left(kind, "compiled" if mode == "compiled" else "eager")
            if why is not None:
                summary.left.append(PatchEntry(path, cls_name, f"{why} (device family {plan.family}, mode={mode!r}; "
                                                               f"force=({kind!r},) swaps it anyway)"))
                continue
            setattr(parent, child_name, replacement_cls.from_torch(child, backend=backend))
            summary.replaced.append(PatchEntry(path, cls_name,
                                               f"-> {replacement_cls.__module__}.{replacement_cls.__name__}"))
    if backend == "auto" and summary.replaced:
        from .ops import select
        try:
            calls = first_calls(model)
        except Exception as exc:  # noqa: BLE001 - a guess that fails costs only the head start: first calls verify
            LOG.debug("gpuparity: patch() did not guess its first calls: %s: %s", type(exc).__name__, exc)
            calls = []
        select.prepare(compiled_first(calls, plan))
    return summary


# op of a first call -> its kind in PRIORS
_OP_KINDS = {"attention": "attention", "rms_norm": "rms_norm", "layer_norm": "layer_norm", "rotary": "rotary",
             "swiglu": "swiglu", "linear_cross_entropy": "loss"}


def compiled_first(calls: List[Problem], plan: Plan) -> List[Problem]:
    """`calls` with those a torch.compile'd forward resolves (the kinds the plan swaps under
    compile) ahead of the eager-only ones, each group in its own order (a decoder's forward
    order). While dynamo traces, a gpuparity op's choice waits for its verdict (ops/select.py
    resolve_waiting); an eager first call does not wait (the op's baseline serves it meanwhile),
    so the checks a trace waits for go first where the workers are fewer than the checks."""
    def eager_only(problem: Problem) -> bool:
        kind = _OP_KINDS.get(problem.op)
        return kind is not None and not plan.serves(kind)[1]
    return sorted(calls, key=eager_only)


# Token counts of the calls first_calls describes: a training batch (the 2 x 2048 tokens,
# where the norms and swiglu are "large" and ranked by the training-size timing) and a short one.
_TRAINING_TOKENS, _SHORT_TOKENS = 4096, 128


def first_calls(model: nn.Module) -> List[Problem]:
    """The backend="auto" calls a model patched here will make in its first steps, as the
    Problems its first calls will resolve (op, kind and the features the candidates' declarations
    read), at its parameters' dtype and device, shapes from its modules (built on meta tensors:
    nothing is allocated). In the order a decoder's forward meets them (norm, rotary, attention,
    MLP, loss), at a training batch's size, then at a short length where the device family's
    priors rank short and training-size calls apart (the norms and swiglu on a GPU). Attention as
    transformers calls it with an attention_mask (a tokenizer's batches carry one: causal + key
    padding); a call without one is another kind, verified at its first call. [] when the
    parameters are not where the model will run (on the CPU while a GPU is visible: moved later)."""
    from .contracts.attention import attention_problem
    from .contracts.linear_cross_entropy import linear_cross_entropy_problem
    from .contracts.norms import norm_problem
    from .contracts.rotary import rotary_problem
    from .contracts.swiglu import swiglu_problem

    param = next(iter(model.parameters()), None)
    if param is None or param.device.type == "meta" or (param.device.type == "cpu" and torch.cuda.is_available()):
        return []
    device, dtype = param.device, param.dtype
    grad = any(p.requires_grad for p in model.parameters())
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (heads and getattr(config, "hidden_size", 0) // heads)

    def meta(*shape, kind=None):
        return torch.empty(shape, device="meta", dtype=kind or dtype)

    def calls(tokens: int) -> List[Problem]:
        found = []
        seq = min(tokens, 2048)
        batch = max(1, tokens // seq)
        for module in model.modules():
            if isinstance(module, (RMSNorm, LayerNorm)) or (type(module).__name__.endswith("RMSNorm")
                                                            and hasattr(type(module), "gpuparity_original")):
                weight = module.weight
                if weight is None or getattr(module, "gpuparity_backend", getattr(module, "backend", "auto")) != "auto":
                    continue
                op = "layer_norm" if isinstance(module, LayerNorm) else "rms_norm"
                bias = getattr(module, "bias", None) if op == "layer_norm" else None
                found.append(norm_problem(op, meta(tokens, *weight.shape), tuple(weight.shape), meta(*weight.shape),
                                          None if bias is None else meta(*bias.shape)))
        if head_dim and getattr(config, "_attn_implementation", None) == "gpuparity":
            if any(hasattr(m, "gpuparity_rotary_backend") for m in model.modules()):
                found.append(rotary_problem(meta(batch, seq, heads, head_dim), meta(seq, head_dim // 2), False, 0, None))
            q, k = meta(batch, heads, seq, head_dim), meta(batch, kv_heads, seq, head_dim)
            found.append(attention_problem(q, k, k, key_padding_mask=meta(batch, seq, kind=torch.bool), is_causal=True,
                                           requires_grad=grad))
        for module in model.modules():
            if hasattr(module, "gpuparity_backend") and hasattr(type(module), "gpuparity_original") \
                    and hasattr(module, "gate_proj"):
                width = module.gate_proj.out_features
                found.append(swiglu_problem(meta(tokens, width), meta(tokens, width)))
        head = getattr(model, "lm_head", None)
        if hasattr(model, "gpuparity_loss_backend") and isinstance(head, nn.Linear):
            bias = None if head.bias is None else meta(head.out_features)
            found.append(linear_cross_entropy_problem(
                meta(tokens, head.in_features), meta(head.out_features, head.in_features), meta(tokens, kind=torch.long),
                bias, -100, "mean", getattr(config, "final_logit_softcapping", None)))
        # the problems name the device the calls will run on (meta tensors stood in for theirs)
        return [dataclasses.replace(p, device=device) for p in found]

    ordered: List[Problem] = []
    for problem in calls(_TRAINING_TOKENS) + calls(_SHORT_TOKENS):
        if problem not in ordered:
            ordered.append(problem)
    return ordered
