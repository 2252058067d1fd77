"""torch.compile of the plain norm and rotary compositions, registered as backend "compile" for
rms_norm, layer_norm and rotary: the peer most users would reach for, and a dispatch option
where torch.compile works here (it failed on ROCm in user story 1, so it is probed, not assumed).

Whether torch.compile works is probed once per device type with a tiny function; the verdict is
kept in memory and on disk next to the dispatcher's probe cache, keyed by the platform fingerprint.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import types
from typing import Callable, Dict, List, Optional

import torch

from ..registry import Backend, Problem, register
from ..contracts.norms import layer_norm_composition, rms_norm_composition
from .. import caches, isolate
from ..numerics import rotate

_VERDICTS: Dict[str, Optional[str]] = caches.register("backends.compiled.verdicts", {})
_COMPILED: Dict[tuple, Callable] = caches.register("backends.compiled.compiled", {})
_LOCK = threading.Lock()


def _static_reason() -> Optional[str]:
    if not hasattr(torch, "compile"):
        return "compile: this torch has no torch.compile"
    try:
        import torch._dynamo as dynamo
    except Exception as exc:  # noqa: BLE001
        return f"compile: torch._dynamo does not import ({type(exc).__name__})"
    supported = getattr(dynamo, "is_dynamo_supported", None)
    if supported is not None:
        try:
            if not supported():
                return f"compile: torch.compile does not support Python {sys.version.split()[0]} in this torch"
        except Exception as exc:  # noqa: BLE001
            return f"compile: dynamo support check raised {type(exc).__name__}"
    return None


def _verdict_path(device_type: str) -> Optional[str]:
    try:
        from .. import platform
        from ..cachedir import cache_dir
        key = platform.fingerprint_key(platform.current(), 0 if device_type == "cuda" else None)
        return os.path.join(cache_dir(), f"compile-probe-{device_type}-{key}.json")
    except Exception:  # noqa: BLE001 - no cache is fine; we probe again
        return None


def _probe_function(t):
    return t * 2 + 1


class _NotProbed(Exception):
    """The probe could not run (its process did not answer): no verdict to keep."""


def probe_in_child(device_type: str) -> Optional[str]:
    """The probe, run in a process of its own (gpuparity.isolate.call_isolated's target)."""
    return _probe(device_type)


def _probe(device_type: str) -> Optional[str]:
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return "compile: no CUDA or ROCm GPU visible"
        if os.environ.get("TRITON_INTERPRET") == "1":
            return "compile: TRITON_INTERPRET=1 is set, inductor's GPU kernels would not compile"
    if threading.current_thread() is not threading.main_thread():
        # torch.compile's tracing (torch.fx) patches torch.nn.Module.__call__ for the whole process
        # while it runs: compiled from a background thread (the background timing, the monitor's
        # checker), it made the caller's own model calls fail mid-step ("module is not installed
        # as a submodule", seen on an H100). Off the main thread the probe runs in a process of its own.
        outcome = isolate.call_isolated("gpuparity.backends.compiled:probe_in_child", {"device_type": device_type},
                                        timeout=300.0)
        if outcome.ok:
            return outcome.value
        raise _NotProbed(f"compile: the probe's own process ended: {outcome.status}: {outcome.error}")
    try:
        compiled = torch.compile(_probe_function, fullgraph=True, dynamic=False)
        sample = torch.arange(8, dtype=torch.float32, device=device_type)
        out = compiled(sample)
        if not torch.equal(out.cpu(), torch.arange(8, dtype=torch.float32) * 2 + 1):
            return "compile: a probe function compiled but computed a wrong answer"
    except Exception as exc:  # noqa: BLE001 - a failed compile is the verdict
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"compile: torch.compile failed here ({type(exc).__name__}: {first})"
    return None


def compile_unavailable_reason(device_type: str) -> Optional[str]:
    """Why torch.compile cannot serve tensors on `device_type` here, or None if it can."""
    static = _static_reason()
    if static:
        return static
    with _LOCK:
        if device_type in _VERDICTS:
            return _VERDICTS[device_type]
        path = _verdict_path(device_type)
        if path and os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as handle:
                    _VERDICTS[device_type] = json.load(handle)["reason"]
                return _VERDICTS[device_type]
            except (OSError, ValueError, KeyError):
                pass
        try:
            reason = _probe(device_type)
        except _NotProbed as exc:   # not a verdict on torch.compile: asked again next time, nothing stored
            return str(exc)
        _VERDICTS[device_type] = reason
        if path:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as handle:
                    json.dump({"schema_version": 1, "device_type": device_type, "reason": reason}, handle)
            except OSError:
                pass
        return reason


# ----------------------------------------------------------------------------- compositions
def rotary_composition(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    """The eager rotary in x's dtype, with positions computed on the device (no host round
    trips), so torch.compile can fuse it into one kernel."""
    rotary_dim = 2 * cos.shape[-1]
    offsets_tensor = isinstance(seqlen_offsets, torch.Tensor)
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        if offsets_tensor:
            pos = torch.arange(seqlen, device=x.device).unsqueeze(0) + seqlen_offsets.long().view(batch, 1)
            c, s = cos[pos].unsqueeze(2), sin[pos].unsqueeze(2)          # (B, S, 1, rd/2)
        else:
            start = int(seqlen_offsets)
            c = cos[start:start + seqlen].view(1, seqlen, 1, -1)
            s = sin[start:start + seqlen].view(1, seqlen, 1, -1)
    else:
        rows = torch.arange(x.shape[0], device=x.device)
        bounds = cu_seqlens.long()
        # The full bounds, not bounds[1:]: inductor (torch 2.11, CUDA) fails to lower
        # searchsorted over a sliced boundaries tensor ("NotImplementedError: SliceView").
        sequence = torch.searchsorted(bounds, rows, right=True) - 1
        pos = rows - bounds[sequence]
        pos = pos + (seqlen_offsets.long()[sequence] if offsets_tensor else int(seqlen_offsets))
        c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)              # (total, 1, rd/2)
    rotated = rotate(x[..., :rotary_dim], c.to(x.dtype), s.to(x.dtype), interleaved)
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _autograd_state(tensors) -> tuple:
    """What dynamo guards on besides shapes: the grad mode (a global-state guard), each input's
    requires_grad and whether the inputs are inference tensors (their dispatch key set lacks
    the autograd keys). One compiled copy per state (see _compiled)."""
    inference = any(t is not None and t.is_inference() for t in tensors)
    if not torch.is_grad_enabled() or inference:
        return (False, inference)
    return (True, tuple(t is not None and t.requires_grad for t in tensors))


def _compiled(name: str, fn: Callable, tensors) -> Callable:
    """torch.compile(dynamic=True) of `fn` for this call's autograd state. dynamo keeps its
    compiled entries on the function's code object and guards each on the grad mode and every
    input's requires_grad and dispatch keys, so one compiled function called with grad, under
    no_grad and under inference_mode recompiled on each switch and, after eight, warned and fell
    back to eager (generate() alternates them). Each state gets its own copy of the code object:
    each copy compiles once (dynamic shapes: no recompile per sequence length either)."""
    key = (name, _autograd_state(tensors))
    compiled = _COMPILED.get(key)
    if compiled is None:
        with _LOCK:
            if key not in _COMPILED:
                code = fn.__code__.replace(co_name=f"{fn.__name__}_{len(_COMPILED)}")
                copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
                copy.__kwdefaults__ = fn.__kwdefaults__
                _COMPILED[key] = torch.compile(copy, dynamic=True)
            compiled = _COMPILED[key]
    return compiled


# Under an outer torch.compile (or export) a composition is traced inline: inductor fuses it
# with its neighbours, and no inner compiled function (with its own guards) runs in the graph.
def compiled_rms_norm(x, normalized_shape, weight=None, eps=None):
    if torch.compiler.is_compiling():
        return rms_norm_composition(x, tuple(normalized_shape), weight, eps)
    return _compiled("rms_norm", rms_norm_composition, (x, weight))(x, tuple(normalized_shape), weight, eps)


def compiled_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if torch.compiler.is_compiling():
        return layer_norm_composition(x, tuple(normalized_shape), weight, bias, eps)
    return _compiled("layer_norm", layer_norm_composition, (x, weight, bias))(
        x, tuple(normalized_shape), weight, bias, eps)


def compiled_apply_rotary(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    fn = rotary_composition if torch.compiler.is_compiling() else _compiled("rotary", rotary_composition, (x, cos, sin))
    return fn(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
              max_seqlen=max_seqlen)


def _supports(problem: Problem) -> List[str]:
    reason = compile_unavailable_reason(problem.device.type)
    return [reason] if reason else []


for _op, _fn, _what in (("rms_norm", compiled_rms_norm, "RMSNorm"),
                        ("layer_norm", compiled_layer_norm, "LayerNorm"),
                        ("rotary", compiled_apply_rotary, "rotary")):
    register(Backend(
        name="compile", op=_op, fn=_fn,
        description=f"torch.compile of the plain {_what} composition (inductor)",
        dtypes=(torch.float16, torch.bfloat16, torch.float32), availability=_static_reason, supports=_supports,
        battery_level="full", jit=True))
