"""Which backend and kernel actually ran: `gpuparity.explain(model, inputs)` runs one forward and
backward and lists every attention, norm, softmax, loss and rotary call the model made, with the
backend that served it (SDPA's own choice from torch's selection function; gpuparity's
dispatched backend; torch for the other F.* calls), the kernels a profiled rerun of the same
call launches (GPU kernel names; on the CPU the aten ops and backward nodes), and the known
issues whose regime the call falls inside (marked confirmed when the issue's probe fails here).

Calls with the same signature (op, backend, shapes, dtype, options) are one row with a count.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any, Callable, Dict, List, Optional

import torch

from .shadow import capture, ops

LOG = logging.getLogger("gpuparity")

__all__ = ["explain", "ExplainReport"]

# transformers' rotary helper, plain torch ops in the model's own modeling module
MODEL_ROTARY = ops.OpKind("model apply_rotary_pos_emb", "rotary",
                          (("q", ops._NO_DEFAULT), ("k", ops._NO_DEFAULT), ("cos", ops._NO_DEFAULT),
                           ("sin", ops._NO_DEFAULT)), ("q", "k"), reference=None, baseline=None)
_SDPA_BACKEND = {"cudnn": "sdpa_cudnn", "flash": "sdpa_flash", "efficient": "sdpa_efficient", "math": "sdpa_math"}


@dataclasses.dataclass
class ExplainReport:
    rows: List[Dict[str, Any]]
    device: str
    notes: List[str]

    def to_dict(self) -> Dict[str, Any]:
        from . import platform
        return {"schema_version": 1, "platform": platform.collect(), "device": self.device, "rows": self.rows,
                "notes": self.notes}


class _Recorder:
    """A capture listener that records every call with its signature and the module it ran in."""

    def __init__(self):
        self.calls: List[Dict[str, Any]] = []
        self.first: Dict[tuple, Dict[str, Any]] = {}
        self.module_stack: List[str] = []

    def on_call(self, kind, original, args, kwargs, backend):
        bound = kind.bind(args, kwargs)
        if hasattr(original, "bind_extra"):
            bound.update(original.bind_extra(args[0]))
        label = backend if backend is not None else (
            f"sdpa {ops.sdpa_choice(bound)}" if kind is ops.SDPA else "torch")
        described = ops.describe_args(bound, kind)
        grads = tuple(sorted(n for n in kind.tensors if isinstance(bound.get(n), torch.Tensor)
                             and bound[n].requires_grad and torch.is_grad_enabled()))
        key = (kind.name, label, repr(described["shapes"]), described["dtype"], repr(described["options"]), grads)
        entry = {"key": key, "module": self.module_stack[-1] if self.module_stack else ""}
        if key not in self.first:
            copies = {n: (v.detach().clone().requires_grad_(n in grads) if isinstance(v, torch.Tensor) else v)
                      for n, v in bound.items()}
            self.first[key] = {"kind": kind, "backend": label, "described": described, "bound": copies,
                               "original": original, "grads": grads, "args": args, "kwargs": kwargs}
        self.calls.append(entry)
        return original(*args, **kwargs)


def _watch_model_rotary(model: torch.nn.Module, recorder: _Recorder) -> List[tuple]:
    """Route the `apply_rotary_pos_emb` of the model's modeling modules through the recorder."""
    restored = []
    for module_name in {type(m).__module__ for m in model.modules()}:
        module = sys.modules.get(module_name)
        fn = getattr(module, "apply_rotary_pos_emb", None)
        if not callable(fn) or getattr(fn, "__gpuparity_watched__", None):
            continue

        def watched(*args, _fn=fn, **kwargs):
            if capture.inside_watched_call():
                return _fn(*args, **kwargs)
            with capture.DEPTH:
                return recorder.on_call(MODEL_ROTARY, _fn, args, kwargs, "model code (torch ops)")
        watched.__gpuparity_watched__ = fn
        setattr(module, "apply_rotary_pos_emb", watched)
        restored.append((module, fn))
    return restored


def _module_paths(model: torch.nn.Module, recorder: _Recorder) -> List[Any]:
    handles = []
    for path, module in model.named_modules():
        def pre(mod, args, _path=path or "(model)"):
            recorder.module_stack.append(_path)

        def post(mod, args, out):
            if recorder.module_stack:
                recorder.module_stack.pop()
        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    return handles


def _scalar(out) -> torch.Tensor:
    """The scalar to differentiate: a model output's .loss when it has one, else a fixed
    projection of its first floating tensor (logits)."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if not isinstance(out, torch.Tensor):
        candidates = out.values() if isinstance(out, dict) else (out if isinstance(out, (tuple, list)) else [])
        out = next((v for v in candidates if isinstance(v, torch.Tensor) and v.is_floating_point()), None)
        if out is None:
            raise TypeError("explain: the model returned no floating tensor to differentiate; pass loss_fn")
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    return (out * weights).float().sum()


def _call_model(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _kernels(first: Dict[str, Any], backward: bool) -> Dict[str, List[str]]:
    """Rerun one recorded call alone under the profiler: the device kernels it launches (on a
    GPU), or its top-level aten ops and backward nodes (on the CPU)."""
    from torch.profiler import ProfilerActivity, profile
    bound = first["bound"]
    kind = first["kind"]
    device = next(v.device for n, v in bound.items() if isinstance(v, torch.Tensor))
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fresh = {n: (v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v)
             for n, v in bound.items()}
    call_args = {n: v for n, v in fresh.items() if not n.startswith("_")}
    names = [p for p, _ in kind.params]
    positional = [call_args.pop(n) for n in names[:len(first["args"])] if n in call_args]
    if hasattr(first["original"], "bind_extra"):
        call_args = {}
    result: Dict[str, List[str]] = {}
    with capture.DEPTH:
        with profile(activities=activities) as prof:
            out = first["original"](*positional, **call_args)
            if cuda:
                torch.cuda.synchronize(device)
        result["forward"] = _names(prof, cuda, backward=False)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        outs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        if backward and outs:
            with profile(activities=activities) as prof:
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
                if cuda:
                    torch.cuda.synchronize(device)
            result["backward"] = _names(prof, cuda, backward=True)
    return result


def _names(prof, cuda: bool, backward: bool) -> List[str]:
    seen: List[str] = []
    for event in prof.events():
        if cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA or "Memcpy" in event.name or "Memset" in event.name:
                continue
            name = event.name
        elif backward:
            if not event.name.startswith("autograd::engine::evaluate_function: "):
                continue
            name = event.name.split(": ", 1)[1]
        else:
            # top-level aten ops, and the private implementations they call (which SDPA kernel)
            parent = event.cpu_parent
            top = parent is None or not parent.name.startswith("aten::")
            impl = (not top and event.name.startswith("aten::_") and
                    (parent.cpu_parent is None or not parent.cpu_parent.name.startswith("aten::")))
            if not event.name.startswith("aten::") or not (top or impl):
                continue
            name = event.name
        if name in ("torch::autograd::GraphRoot", "torch::autograd::AccumulateGrad"):
            continue
        if name not in seen:
            seen.append(name)
    return seen


def _regime_matches(first: Dict[str, Any], device: torch.device) -> List[Dict[str, Any]]:
    """Known-issue avoid entries whose op, backend, dtype, device and regime match this call."""
    from .known import avoid, engine
    kind, bound = first["kind"], first["bound"]
    if kind.family != "attention":
        return []
    if kind is ops.SDPA:
        backend = _SDPA_BACKEND.get(first["backend"].split(" ")[1] if " " in first["backend"] else "", None)
        if backend is None:
            return []
        q, k, v = bound["query"], bound["key"], bound["value"]
        masks = dict(attn_mask=bound.get("attn_mask"), is_causal=bool(bound.get("is_causal")), scale=bound.get("scale"))
    else:
        backend = first["backend"]
        q, k, v = bound["q"], bound["k"], bound["v"]
        masks = {n: bound.get(n) for n in ("attn_mask", "key_padding_mask", "is_causal", "scale", "window", "softcap")
                 if bound.get(n) is not None}
    from .contracts.attention import attention_problem
    with torch.enable_grad():
        problem = attention_problem(q, k, v, **masks)
    in_regime = getattr(avoid, "in_regime", None)
    found = []
    for issue in engine.load_issues():
        for entry in avoid._entries(issue):
            if not entry.matches("attention", backend, str(q.dtype).replace("torch.", ""), device.type):
                continue
            when = getattr(entry, "regime", None)
            if when is not None and (in_regime is None or not in_regime(when, problem)):
                continue
            regime = avoid.regime_text(when) if when is not None and hasattr(avoid, "regime_text") else "every call"
            found.append({"id": issue["id"], "regime": regime})
    return found


def explain(model: torch.nn.Module, inputs: Any, *, loss_fn: Optional[Callable] = None, backward: bool = True,
            kernels: bool = True, known: bool = True) -> ExplainReport:
    """Run model(inputs) forward (and backward unless backward=False) and report, for each
    distinct attention / norm / softmax / loss / rotary call, which backend and kernels ran.

    inputs: one tensor, a tuple of positional arguments or a dict of keyword arguments.
    loss_fn(output) -> scalar (default: output.loss when present, else a fixed projection).
    kernels: profile a rerun of each distinct call for its kernel names. known: mark calls inside
    a known issue's regime and run those issues' probes here to say whether they are confirmed."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    recorder = _Recorder()
    handles = _module_paths(model, recorder)
    restored = _watch_model_rotary(model, recorder)
    modules = capture.watch_rms_norm_modules(model)
    notes = []
    unseen = capture.compiled_note(model)
    if unseen:
        notes.append(unseen)
    capture.install(recorder)
    try:
        with torch.enable_grad():
            out = _call_model(model, inputs)
            if backward:
                loss = loss_fn(out) if loss_fn is not None else _scalar(out)
                loss.backward()
    finally:
        capture.uninstall(recorder)
        capture.unwatch_modules(modules)
        for module, fn in restored:
            setattr(module, "apply_rotary_pos_emb", fn)
        for handle in handles:
            handle.remove()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rows = []
    for key, first in recorder.first.items():
        calls = [c for c in recorder.calls if c["key"] == key]
        row = {"op": first["kind"].name, "family": first["kind"].family, "backend": first["backend"],
               "calls": len(calls), "modules": sorted({c["module"] for c in calls}),
               **first["described"], "requires_grad": list(first["grads"]), "kernels": {}, "known_issues": []}
        if kernels:
            try:
                row["kernels"] = _kernels(first, backward and bool(first["grads"]))
            except Exception as exc:  # noqa: BLE001 - a rerun that fails is a note on its row
                row["kernels_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if known:
            row["known_issues"] = _regime_matches(first, device)
        rows.append(row)
    if known:
        _confirm(rows, device, notes)
    return ExplainReport(rows, str(device), notes)


def _confirm(rows: List[Dict[str, Any]], device: torch.device, notes: List[str]) -> None:
    """Run the probes of the issues some call falls under; each mark gets the status here."""
    ids = sorted({m["id"] for row in rows for m in row["known_issues"]})
    if not ids:
        return
    from .known import engine
    try:
        results = {r.id: r.status for r in engine.evaluate(probes=True, device=str(device), ids=ids)}
    except Exception as exc:  # noqa: BLE001 - unconfirmed marks stay, with why
        notes.append(f"known-issue probes could not run: {type(exc).__name__}: {exc}")
        results = {}
    for row in rows:
        for mark in row["known_issues"]:
            mark["status"] = results.get(mark["id"], "not probed")
        row["in_confirmed_regime"] = any(m["status"] == engine.CONFIRMED for m in row["known_issues"])
