"""Hugging Face rotary: the module-level apply_rotary_pos_emb that a patched model's attention
calls is served by gpuparity.apply_rotary; other models in the process keep transformers' own."""
from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn

from .. import caches
from . import hub
from .summary import PatchEntry, PatchSummary
from ..ops.rotary import apply_rotary_pair
from .swap import mark, qualname, serves

FUNCTION = "apply_rotary_pos_emb"
# model_type of the families whose apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) the tests
# check: rotate_half convention, cos/sin (B|1, S, D) with the two halves equal.
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")
# parameters after (q, k, cos, sin) that HF's function may take: position_ids (unused, 4.x) and unsqueeze_dim
_OPTIONAL = ("position_ids", "unsqueeze_dim")
ROTARY_MODULE = re.compile(r"Rotary(Pos)?Emb(edding)?$")


class _Serving(threading.local):
    """The backends of the patched attention forwards running in this thread, innermost last.

    The switch that makes the shared module-level wrapper serve only patched models: a forward
    pre-hook on each patched attention module pushes, an always-called forward hook pops. A
    contextvar would be the natural scope, but dynamo cannot trace ContextVar.set (a graph break
    under torch.compile(fullgraph=True)); a threading.local's list traces (its mutation is a
    replayed side effect) and, like a contextvar, keeps other threads' models out."""

    def __init__(self):
        self.backends: List[str] = []


_SERVING = _Serving()


def _enter(module: nn.Module, args) -> None:
    # None: this forward keeps transformers' rotation (patch(mode=...) left it for this mode)
    _SERVING.backends.append(module.gpuparity_rotary_backend if serves(module) else None)


def _leave(module: nn.Module, args, output) -> None:
    if _SERVING.backends:   # always_call: also after an exception in the forward
        _SERVING.backends.pop()


def _rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim,
            backend: str) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """HF's (q_embed, k_embed) from gpuparity.apply_rotary, or None when the call is not one it
    takes as is (then transformers' function serves it). Only shapes, dtypes and flags are read:
    no device value, so the check costs no synchronisation and traces without a guard on data."""
    if unsqueeze_dim == 1:      # q, k: (B, H, S, D)
        seq_dim = 2
    elif unsqueeze_dim == 2:    # q, k: (B, S, H, D)
        seq_dim = 1
    else:
        return None
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return None    # mrope's (3, B, S, D) cos, or q/k of another layout
    batch, seqlen, dim = q.shape[0], q.shape[seq_dim], q.shape[-1]
    if (dim % 2 or cos.shape[-1] != dim or cos.shape[1] != seqlen or cos.shape[0] not in (1, batch)
            or k.shape[0] != batch or k.shape[seq_dim] != seqlen or k.shape[-1] != dim):
        return None    # partial rotary (cos narrower than the head) or shapes HF broadcasts otherwise
    if not (q.dtype == k.dtype == cos.dtype == sin.dtype) or not (q.device == k.device == cos.device == sin.device):
        return None    # HF's products would promote (e.g. bf16 q with fp32 cos gives fp32)
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return None    # apply_rotary gives no gradient for cos/sin
    half = dim // 2
    if cos.shape[0] == 1 or batch == 1:
        # one table for the batch: the first half of the (duplicated) last dim, a strided view
        tables, rows = (cos[0, :, :half], sin[0, :, :half]), None
    else:
        # per-item cos/sin (per-item position ids, e.g. left padding): the batch as one sequence of
        # B * S positions whose table row r is (item r // S, position r % S): exact for any
        # position ids, a view when q/k's (B, S) dims are, and no device offsets to validate
        tables = (cos.reshape(batch * seqlen, dim)[:, :half], sin.reshape(batch * seqlen, dim)[:, :half])
        rows = batch * seqlen
    flash = []
    for x in (q, k):
        x = x.transpose(1, 2) if seq_dim == 2 else x     # (B, S, H, D), apply_rotary's layout
        flash.append(x if rows is None else x.reshape(1, rows, *x.shape[2:]))
    # q and k in one launch each way where the Triton kernel serves both
    out = []
    for rotated in apply_rotary_pair(*flash, *tables, backend=backend):
        if rows is not None:
            rotated = rotated.reshape(batch, seqlen, *rotated.shape[2:])
        out.append(rotated.transpose(1, 2) if seq_dim == 2 else rotated)
    return out[0], out[1]


# plain function -> where unsqueeze_dim sits after (q, k, cos, sin), or None (not that signature)
_UNSQUEEZE_INDEX = caches.register("integrations.transformers_rotary.unsqueeze_index", {})


def _unsqueeze_index(original: Callable) -> Optional[int]:
    """Where unsqueeze_dim sits among the arguments after (q, k, cos, sin), or None when the
    function's signature is not (q, k, cos, sin[, position_ids][, unsqueeze_dim])."""
    if original in _UNSQUEEZE_INDEX:
        return _UNSQUEEZE_INDEX[original]
    try:
        params = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        params = []
    rest = params[4:]
    index = None
    if len(params) >= 4 and all(name in _OPTIONAL for name in rest) and rest == sorted(rest, key=_OPTIONAL.index):
        index = rest.index("unsqueeze_dim") if "unsqueeze_dim" in rest else len(rest)
    _UNSQUEEZE_INDEX[original] = index
    return index


def _serve(original: Callable, plain: Callable, backend: Optional[str], q, k, cos, sin, args, kwargs):
    """One call of HF's apply_rotary_pos_emb: gpuparity's rotation on `backend` when the call's
    shapes are ones it takes, else `original` (transformers' function as the model holds it, the
    hub's module or the plain function; `plain` is the plain one, whose signature is read)."""
    if backend is not None:
        index = _unsqueeze_index(plain)
        if index is not None:
            unsqueeze_dim = kwargs.get("unsqueeze_dim", args[index] if len(args) > index else 1)
            rotated = _rotate(q, k, cos, sin, unsqueeze_dim, backend)
            if rotated is not None:
                return rotated
    return original(q, k, cos, sin, *args, **kwargs)


def _wrapper(original: Callable) -> Callable:
    """The module global that replaces transformers' function: gpuparity's rotation inside a
    patched attention forward (when the call's shapes are ones it takes), HF's anywhere else."""
    plain = hub.hub_function_original(original)

    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        backends = _SERVING.backends
        return _serve(original, plain, backends[-1] if backends else None, q, k, cos, sin, args, kwargs)

    apply_rotary_pos_emb.gpuparity_original = original
    return apply_rotary_pos_emb


# backend -> the layer class served for transformers' "rotary_pos_emb" kernel name
_HUB_LAYERS = caches.register("integrations.transformers_rotary.hub_layers", {})
# the forward signature kernels checks a layer against: transformers 5.25's function, with self
_HUB_SIGNATURE = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                    for name in ("self", "q", "k", "cos", "sin")]
                                   + [inspect.Parameter("unsqueeze_dim", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                        default=1)])
_FAMILY_MODULES = tuple(f"transformers.models.{family}.modeling_{family}" for family in FAMILIES)


def hub_layer(backend: str = "auto") -> type:
    """The layer gpuparity serves for transformers' kernel-hub name "rotary_pos_emb" (transformers
    >= 5.25 with `kernels`): a stateless nn.Module, as kernels requires, whose forward kernels
    validates as transformers' `(q, k, cos, sin, unsqueeze_dim=1)`.

    Inside an attention forward patched by gpuparity.patch it rotates on that patch's backend (or
    keeps transformers' rotation where patch(mode=...) left it); in a model a user kernelized with
    `gpuparity.integrations.kernel_hub.kernel_mapping()`, on `backend`, for the families whose
    rotation gpuparity has checked (FAMILIES). Any other call runs transformers' own function."""
    if backend not in _HUB_LAYERS:
        def forward(self, *args, **kwargs):
            original = hub.hub_function_original(self)
            if original is None or len(args) < 4:
                raise TypeError(f"{FUNCTION}: gpuparity's hub layer serves a kernel-hub function of "
                                f"transformers called as (q, k, cos, sin, ...), got {type(self).__name__} "
                                f"with {len(args)} positional arguments")
            backends = _SERVING.backends
            chosen = backends[-1] if backends else backend
            if getattr(original, "__module__", None) not in _FAMILY_MODULES:
                chosen = None    # a family whose rotation gpuparity has not checked
            return _serve(original, original, chosen, *args[:4], args[4:], kwargs)

        forward.__signature__ = _HUB_SIGNATURE
        _HUB_LAYERS[backend] = type("GpuparityApplyRotaryPosEmb", (nn.Module,), {
            "forward": forward, "can_torch_compile": True, "has_backward": True, "__module__": __name__})
    return _HUB_LAYERS[backend]


def hub_repository(backend: str = "auto") -> hub.LocalLayer:
    """The `kernels` repository that loads hub_layer(backend)."""
    return hub.LocalLayer("rotary_pos_emb", f"backend={backend}", lambda: hub_layer(backend))


def _calls_rotary(module: nn.Module) -> bool:
    forward = inspect.unwrap(type(module).forward)
    code = getattr(forward, "__code__", None)
    return code is not None and FUNCTION in code.co_names


def _halves_left(model: nn.Module) -> Optional[str]:
    """Why the model's cos/sin may not have two equal halves (what taking the first half
    assumes), or None: each rotary module is run once on four positions and its output read."""
    rotaries = [(path, m) for path, m in model.named_modules() if ROTARY_MODULE.search(type(m).__name__)]
    if not rotaries:
        return "no *RotaryEmbedding module found to check that cos/sin hold two equal halves"
    for path, module in rotaries:
        inv_freq = getattr(module, "inv_freq", None)
        if not isinstance(inv_freq, torch.Tensor):
            return f"{path}: no inv_freq buffer; its cos/sin halves could not be checked"
        if inv_freq.is_meta:
            continue   # weights not materialised yet: the values cannot be read, the class is a checked family's
        try:
            with torch.no_grad():
                probe = torch.zeros(1, device=inv_freq.device)
                cos, sin = module(probe, torch.arange(4, device=inv_freq.device)[None])
        except Exception as exc:   # noqa: BLE001 - any failure means "not the form we checked"
            return f"{path}: running it on 4 positions failed ({type(exc).__name__}: {exc})"
        half = cos.shape[-1] // 2
        if cos.shape[-1] % 2 or not (torch.equal(cos[..., :half], cos[..., half:])
                                     and torch.equal(sin[..., :half], sin[..., half:])):
            return f"{path}: its cos/sin do not repeat one half (not the rotate_half layout gpuparity reads)"
    return None


def patch_rotary(model: nn.Module, *, backend: str = "auto", summary: Optional[PatchSummary] = None,
                 wanted: Optional[Callable[[nn.Module], bool]] = None, plan=None) -> PatchSummary:
    """Serve the rotary of `model`'s attention modules with gpuparity.apply_rotary: the modeling
    module's apply_rotary_pos_emb becomes (once, for every model) a wrapper that only rotates
    with gpuparity inside a forward of an attention module patched here. Idempotent."""
    summary = PatchSummary() if summary is None else summary
    sites = [(path, m) for path, m in model.named_modules()
             if _calls_rotary(m) and (wanted is None or wanted(m)) and not hasattr(m, "gpuparity_rotary_backend")]
    for path, module in model.named_modules():
        if ROTARY_MODULE.search(type(module).__name__) and (wanted is None or wanted(module)):
            summary.left.append(PatchEntry(path, qualname(module), (
                "rotary: this module builds cos/sin and stays transformers'; the rotation "
                f"({FUNCTION}) is listed under the attention modules")))
    if not sites:
        return summary
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILIES:
        reason = f"model_type {model_type!r} is not a family whose {FUNCTION} gpuparity has checked"
    else:
        reason = (None if plan is None else plan.left("rotary")) or _halves_left(model)
    for path, module in sites:
        modeling = sys.modules[type(module).__module__]
        current = getattr(modeling, FUNCTION)
        original = getattr(current, "gpuparity_original", current)
        plain = hub.hub_function_original(original)
        # the attention's own copy of the hub function (kernels keys it by the kernel name)
        hub_func = next((f for f in hub.kernel_funcs(module).values() if type(f) is type(original)), None)
        why = reason
        if why is None and plain is None:
            why = f"{modeling.__name__}.{FUNCTION} is a {type(original).__name__}, not a function gpuparity has read"
        elif why is None and _unsqueeze_index(plain) is None:
            why = (f"{modeling.__name__}.{FUNCTION}{inspect.signature(plain)} is not "
                   "(q, k, cos, sin[, position_ids][, unsqueeze_dim])")
        if why is not None:
            summary.left.append(PatchEntry(path, qualname(module), f"rotary: {why}; transformers' {FUNCTION} kept"))
            continue
        route = None
        if hub_func is not None:
            # transformers' kernel hub: this attention's own hub function serves gpuparity's layer
            # (kernels' kernelize with gpuparity's mapping only); other models are untouched
            try:
                hub.kernelize_with(hub_func, hub_repository(backend), hub.kernel_device(module))
                route = "through transformers' kernel hub (kernels.kernelize, layer rotary_pos_emb)"
            except Exception as exc:  # noqa: BLE001 - a kernels release that refuses: the wrapper still serves
                hub_refused = f"{type(exc).__name__}: {exc}"
        if route is None:
            if current is original:
                setattr(modeling, FUNCTION, _wrapper(original))
            route = f"the module's {FUNCTION} wrapped" + (
                f"; the kernel hub refused gpuparity's layer ({hub_refused})" if hub_func is not None else "")
        module.gpuparity_rotary_backend = backend
        module.register_forward_pre_hook(_enter, prepend=True)
        module.register_forward_hook(_leave, always_call=True)
        summary.replaced.append(PatchEntry(path, qualname(module), (
            f"rotary: {FUNCTION} -> gpuparity.apply_rotary (backend={backend!r}, {route}; cos/sin's first half, "
            "per-item cos/sin as one table; a call of another shape or dtype falls back to transformers' per call)"
            + mark(module, plan, "rotary"))))
    return summary
