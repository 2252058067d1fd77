"""Record, for every module call in execution order, its inputs and outputs, the gradients
with respect to its outputs, and its own backward (the vector-Jacobian product of the call:
gradients with respect to its inputs and its own parameters), plus the platform, seed and
fingerprints of weights and inputs. `trace.compare` and `trace.replay` read what this writes.

Naming: a module's trace key is its name in `model.named_modules()` ("(model)" for the model
itself); a module called again gets "name#1", "name#2", ... Tensor keys say where a tensor was
first seen ("blocks.0.attn:out", "blocks.0:in.args.0"); a tensor passed on unchanged keeps its
first key, so the trace knows which module produced each input. A call's output always gets a
key of its own ("mlp:out"), also when it is a tensor seen before (its last child's output, or its
own input: meta "alias_of" names the earlier key): whether a module makes a new tensor or returns
its child's may differ between runs (a module that rescales only in low precision), and each run
must still hold that call's own output under the same key, so its own step is judged. Calls that
take such a tensor later see the latest key: the outermost call that returned it.
"""
from __future__ import annotations

import collections
import datetime
import fnmatch
import math
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import platform
from ..model_inputs import as_call, flatten_tensors, map_tensors
from . import store

ROOT = "(model)"
_OPAQUE = "opaque"


def probe_weights(shape: Sequence[int]) -> torch.Tensor:
    """Fixed random weights for the default loss, derived from the shape alone (the same on
    every machine). A plain sum would hide errors: the gradient of sum(softmax(x)) is zero."""
    numel = int(np.prod(shape)) if len(shape) else 1
    seed = zlib.crc32(f"gpuparity-probe-loss-{tuple(int(s) for s in shape)}".encode())
    values = np.random.RandomState(seed).standard_normal(numel).astype(np.float32)
    return torch.from_numpy(values).reshape(tuple(shape))


def probe_loss(output) -> Optional[torch.Tensor]:
    """sum over floating outputs of <output, fixed random weights> / sqrt(numel), in float32."""
    total = None
    for tensor in flatten_tensors(output):
        if not tensor.is_floating_point() or not tensor.requires_grad:
            continue
        weights = probe_weights(tuple(tensor.shape)).to(tensor.device)
        term = (tensor.float() * weights).sum() / math.sqrt(max(tensor.numel(), 1))
        total = term if total is None else total + term
    return total


def _storable(tensor: torch.Tensor) -> bool:
    return (tensor.layout == torch.strided and not tensor.is_complex()
            and tensor.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                 torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool))


class _Recorder:
    def __init__(self, model: torch.nn.Module, include: Optional[Sequence[str]], max_elements: Optional[int]):
        self.model = model
        self.max_elements = max_elements if max_elements and max_elements > 0 else None
        self.names: Dict[torch.nn.Module, str] = {}
        for name, module in model.named_modules():
            key = name or ROOT
            if include and not any(fnmatch.fnmatchcase(key, pattern) for pattern in include):
                continue
            self.names[module] = key
        self.tensors: Dict[str, torch.Tensor] = {}
        self.meta: Dict[str, Dict[str, Any]] = {}
        self.live: Dict[str, torch.Tensor] = {}
        self.versions: Dict[str, int] = {}
        self._seen: Dict[int, Tuple[torch.Tensor, int, str]] = {}
        self.calls: List[Dict[str, Any]] = []
        self.call_live: Dict[str, Tuple[torch.nn.Module, List[str], List[str]]] = {}
        self._stack: List[Dict[str, Any]] = []
        self._counts: collections.Counter = collections.Counter()
        self.seq = 0
        self.handles = []

    # ------------------------------------------------------------------ hooks
    def install(self) -> None:
        for module, name in self.names.items():
            self.handles.append(module.register_forward_pre_hook(self._make_pre(name), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._make_post(name), with_kwargs=True))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _make_pre(self, name: str):
        def pre_hook(module, args, kwargs):
            index = self._counts[name]
            self._counts[name] += 1
            key = name if index == 0 else f"{name}#{index}"
            parent = self._stack[-1]["key"] if self._stack else None
            call = {"key": key, "module": name, "call": index, "type": type(module).__name__,
                    "depth": 0 if name == ROOT else name.count(".") + 1, "parent": parent,
                    "seq_start": self.seq}
            origin = ("inline", parent) if parent is not None else ("input", None)
            input_keys: List[str] = []
            call["inputs"] = {"args": self._encode(tuple(args), f"{key}:in.args", origin, input_keys),
                              "kwargs": self._encode(dict(kwargs), f"{key}:in.kwargs", origin, input_keys)}
            call["input_tensors"] = input_keys
            self._stack.append(call)
            return None
        return pre_hook

    def _make_post(self, name: str):
        def post_hook(module, args, kwargs, output):
            call = self._stack.pop()
            call["seq_end"] = self.seq
            output_keys: List[str] = []
            call["outputs"] = self._encode(output, f"{call['key']}:out", ("output", call["key"]), output_keys)
            call["output_tensors"] = output_keys
            self.calls.append(call)
            self.call_live[call["key"]] = (module, call["input_tensors"], output_keys)
            return None
        return post_hook

    # ------------------------------------------------------------------ encoding
    def _encode(self, value, path: str, origin: Tuple[str, Optional[str]], keys: List[str]):
        if isinstance(value, torch.Tensor):
            if not _storable(value):
                return {_OPAQUE: f"Tensor(dtype={value.dtype}, layout={value.layout})"}
            key = self._tensor(value, path, origin)
            if key not in keys:
                keys.append(key)
            return {"tensor": key}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"float": repr(value)}
        if isinstance(value, tuple):
            return {"tuple": [self._encode(v, f"{path}.{i}", origin, keys) for i, v in enumerate(value)]}
        if isinstance(value, list):
            return {"list": [self._encode(v, f"{path}.{i}", origin, keys) for i, v in enumerate(value)]}
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {"dict": {k: self._encode(v, f"{path}.{k}", origin, keys) for k, v in value.items()}}
        if isinstance(value, torch.dtype):
            return {"dtype": store.dtype_name(value)}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        return {_OPAQUE: type(value).__name__}

    def _tensor(self, tensor: torch.Tensor, path: str, origin: Tuple[str, Optional[str]]) -> str:
        seen = self._seen.get(id(tensor))
        alias = None
        if seen is not None and seen[0] is tensor and seen[1] == tensor._version:
            if origin[0] != "output" or self.meta[seen[2]]["owner"] == origin[1]:
                return seen[2]
            # returned again by an enclosing call (or as its own input): keyed by that call too, one copy stored
            alias = self.meta[seen[2]].get("alias_of", seen[2])
        key = path
        suffix = 1
        while key in self.meta:
            suffix += 1
            key = f"{path}~{suffix}"
        self.meta[key] = {
            "dtype": store.dtype_name(tensor.dtype), "device": str(tensor.device), "shape": list(tensor.shape),
            "origin": origin[0], "owner": origin[1], "seq": self.seq, "requires_grad": bool(tensor.requires_grad),
        }
        self.seq += 1
        if alias is not None:
            self.meta[key]["alias_of"] = alias
            if "sampled" in self.meta[alias]:
                self.meta[key]["sampled"] = self.meta[alias]["sampled"]
        else:
            self.tensors[key] = self._stored(tensor.detach(), self.meta[key])
        self.live[key] = tensor
        self.versions[key] = tensor._version
        self._seen[id(tensor)] = (tensor, tensor._version, key)
        return key

    def _stored(self, tensor: torch.Tensor, meta: Dict[str, Any]) -> torch.Tensor:
        if self.max_elements is not None and tensor.numel() > self.max_elements:
            meta["sampled"] = self.max_elements
            tensor = store.sample(tensor, self.max_elements)
        return tensor.to("cpu", copy=True).contiguous()

    def _store_grad(self, name: str, grad: torch.Tensor, of: str, **extra) -> None:
        meta = {"dtype": store.dtype_name(grad.dtype), "device": str(grad.device), "shape": list(grad.shape),
                "origin": "grad", "of": of, **extra}
        self.meta[name] = meta
        self.tensors[name] = self._stored(grad.detach(), meta)

    def intact(self, key: str) -> bool:
        """False if the tensor was modified in place after it was recorded (its graph node moved)."""
        return self.live[key]._version == self.versions[key]

    # ------------------------------------------------------------------ backward
    def backward(self, loss: torch.Tensor, notes: List[str]) -> None:
        targets = [k for k, m in self.meta.items()
                   if m["origin"] in ("output", "input") and self.live[k].requires_grad
                   and self.live[k].is_floating_point()]
        moved = [k for k in targets if not self.intact(k)]
        if moved:
            notes.append(f"{len(moved)} tensors were modified in place after they were recorded; their "
                         f"gradients are not recorded (first: {moved[0]})")
        targets = [k for k in targets if k not in moved]
        grads = torch.autograd.grad(loss, [self.live[k] for k in targets], allow_unused=True, retain_graph=True) \
            if targets else []
        live_grads: Dict[str, torch.Tensor] = {}
        for key, grad in zip(targets, grads):
            if grad is None:
                continue
            live_grads[key] = grad
            alias = self.meta[key].get("alias_of")
            if alias is not None and f"grad:{alias}" in self.tensors:   # the same tensor's gradient: one copy
                self.meta[f"grad:{key}"] = dict(self.meta[f"grad:{alias}"], of=key, alias_of=f"grad:{alias}")
            else:
                self._store_grad(f"grad:{key}", grad, of=key)
        self._own_backward(live_grads, notes)

    def _own_backward(self, live_grads: Dict[str, torch.Tensor], notes: List[str]) -> None:
        """Each call's vector-Jacobian product, from its recorded output gradients: the gradients
        its own backward computes for its inputs and its own (direct) parameters."""
        skipped = []
        for call in self.calls:
            module, input_keys, output_keys = self.call_live[call["key"]]
            outputs = [k for k in output_keys if k in live_grads]
            if not outputs:
                continue
            if not all(self.intact(k) for k in outputs + input_keys):
                skipped.append(call["key"])
                continue
            inputs = [k for k in input_keys if self.live[k].requires_grad and self.live[k].is_floating_point()]
            params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            wrt = [self.live[k] for k in inputs] + [p for _, p in params]
            if not wrt:
                continue
            try:
                vjps = torch.autograd.grad([self.live[k] for k in outputs], wrt,
                                           grad_outputs=[live_grads[k] for k in outputs],
                                           allow_unused=True, retain_graph=True)
            except RuntimeError as exc:
                skipped.append(f"{call['key']} ({str(exc).splitlines()[0][:120]})")
                continue
            own = {"inputs": {}, "params": {}}
            for key, grad in zip(inputs, vjps[:len(inputs)]):
                if grad is not None:
                    name = f"vjp:{call['key']}:{key}"
                    self._store_grad(name, grad, of=key, call=call["key"])
                    own["inputs"][key] = name
            for (param_name, _), grad in zip(params, vjps[len(inputs):]):
                if grad is not None:
                    name = f"vjp:{call['key']}:param.{param_name}"
                    self._store_grad(name, grad, of=f"{call['module']}.{param_name}", call=call["key"])
                    own["params"][param_name] = name
            call["own_backward"] = own
        if skipped:
            notes.append(f"own backward not recorded for {len(skipped)} calls whose inputs or outputs were "
                         f"modified in place later (first: {skipped[0]})")


def _dominant_dtype(model: torch.nn.Module, inputs) -> Optional[str]:
    counts: collections.Counter = collections.Counter()
    for tensor in list(model.parameters()) + flatten_tensors(inputs):
        if tensor.is_floating_point():
            counts[store.dtype_name(tensor.dtype)] += tensor.numel()
    return counts.most_common(1)[0][0] if counts else None


def _device_of(model: torch.nn.Module, inputs) -> str:
    for tensor in list(model.parameters()) + flatten_tensors(inputs):
        return str(tensor.device)
    return "cpu"


def _named_inputs(inputs) -> List[Tuple[str, torch.Tensor]]:
    named: List[Tuple[str, torch.Tensor]] = []

    def walk(value, path):
        if isinstance(value, torch.Tensor):
            named.append((path, value))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}.{i}")
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
    walk(inputs, "inputs")
    return named


def _grad_ready(value, grads: bool):
    """A copy of the inputs whose floating tensors require grad, so their gradients are recorded
    without touching the caller's tensors. The model gets a non-leaf clone, so an in-place op on
    its input still works."""
    def ready(t: torch.Tensor) -> torch.Tensor:
        if grads and t.is_floating_point() and not t.requires_grad:
            return t.detach().clone().requires_grad_(True).clone()
        return t
    return map_tensors(value, ready)


def record(model: torch.nn.Module, inputs, path: str, **options) -> store.Trace:
    """Run `model` on `inputs` once (forward, and backward when `grads`) and write the trace to
    the directory `path`. Options: see record_in_memory."""
    meta, tensors = record_in_memory(model, inputs, **options)
    return store.save(path, meta, tensors)


def record_in_memory(model: torch.nn.Module, inputs, *, grads: bool = True,
                     include: Optional[Sequence[str]] = None, max_elements: Optional[int] = None, seed: int = 0,
                     loss_fn: Optional[Callable] = None, spec: Optional[str] = None,
                     factory_args: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    """Run `model` on `inputs` once (forward, and backward when `grads`) and return the trace
    as (metadata, {tensor key: CPU tensor}), what `record` writes (`gpuparity model` keeps both
    runs in memory).

    inputs: a tensor, a tuple/list of positional arguments or a dict of keyword arguments.
    include: fnmatch patterns of module names to record (default: all; "(model)" is the model).
    max_elements: store at most this many elements of each tensor, a fixed sample that depends
        only on the shape (the same on every machine). Replay needs full tensors.
    loss_fn: output -> scalar to differentiate; default: a fixed random projection of the
        output (see probe_loss), identical on every machine.
    spec, factory_args: how to rebuild the model (recorded for `trace replay`).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if max_elements is not None and (not isinstance(max_elements, int) or max_elements < 0):
        raise ValueError(f"max_elements: expected a positive int or None, got {max_elements!r}")
    if isinstance(include, str):
        include = [include]
    weights = store.fingerprint(list(model.named_parameters()) + list(model.named_buffers()))
    input_fingerprint = store.fingerprint(_named_inputs(inputs))
    inputs = _grad_ready(inputs, grads)
    args, kwargs = as_call(inputs)

    recorder = _Recorder(model, include, max_elements)
    if not recorder.names:
        raise ValueError(f"include: no module name matches {list(include or [])} "
                         f"(names look like {[n for n, _ in list(model.named_modules())[1:4]]})")
    notes: List[str] = []
    if model.training and any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
                              for m in model.modules()):
        notes.append("the model is in training mode with active dropout: two runs cannot match "
                     "(return model.eval() from the factory)")
    recorder.install()
    try:
        torch.manual_seed(seed)
        with torch.enable_grad() if grads else torch.no_grad():
            output = model(*args, **kwargs)
        if recorder._stack:
            raise RuntimeError("trace: a module's forward hook did not run (did a module return early "
                               "through an exception that was caught?)")
        if grads:
            loss = loss_fn(output) if loss_fn is not None else probe_loss(output)
            if loss is None or not isinstance(loss, torch.Tensor) or not loss.requires_grad:
                notes.append("no gradient recorded: the output does not require grad")
            else:
                if loss.numel() != 1:
                    raise ValueError(f"loss_fn: expected a scalar, got shape {tuple(loss.shape)}")
                recorder.backward(loss.reshape(()), notes)
    finally:
        recorder.remove()

    children = collections.Counter(c["parent"] for c in recorder.calls if c["parent"] is not None)
    for call in recorder.calls:
        call["leaf"] = children[call["key"]] == 0
    sampled = sum(1 for m in recorder.meta.values() if m.get("sampled"))
    meta = {
        "schema_version": store.SCHEMA_VERSION,
        "kind": store.KIND,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.collect(),
        "spec": spec,
        "factory_args": factory_args or {},
        "seed": seed,
        "device": _device_of(model, inputs),
        "dtype": _dominant_dtype(model, inputs),
        "model_class": type(model).__name__,
        "training": bool(model.training),
        "grads": bool(grads),
        "loss": "custom" if loss_fn is not None else "probe",
        "include": list(include or []),
        "max_elements": max_elements,
        "sampled_tensors": sampled,
        "weights": weights,
        "inputs": input_fingerprint,
        "notes": notes,
        "calls": recorder.calls,
        "tensors": recorder.meta,
    }
    return meta, recorder.tensors
