"""One-machine model check (`gpuparity model`): the model on its device in its dtype against a
float64 CPU run of the same weights and inputs, module by module, naming the first module whose
own computation diverges beyond the tolerance policy.

How (docs/user-guide.md, "Check a whole model on one machine"): both runs are recorded in memory
with the trace recorder and compared with `trace.compare` (each module's error against the error
it inherited). A module flagged there is blamed only if, fed the reference's inputs (rounded to
the device run's dtypes), its device result still differs from its float64 result on those same
inputs by more than the policy allows; the one named is the first such call none of whose
sub-calls is blamed (as `trace replay` names it). With `include`, no whole float64 copy is made:
each matching module is checked alone on the inputs the device run recorded for it.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import caches
from .. import platform as _platform
from . import spec as _spec
from . import store
from .compare import TraceComparison, compare
from .record import ROOT, record_in_memory
from .padding import PaddingCheck, check_padding
from .store import MemoryTrace
from .replay import ReplayRow, _Decoder, _NotReplayable, _culprit, _pair_outputs

SCHEMA_VERSION = 1
KIND = "gpuparity-model-check"
RAM_ENV = "GPUPARITY_HOST_RAM_BYTES"   # overrides the RAM this check assumes it may use
REFERENCE = "cpu float64"


class ModelTooBig(ValueError):
    """The float64 CPU copy (weights, gradients, activations) would not fit in RAM."""


class CannotCompare(ValueError):
    """The model's forward draws random numbers even in eval mode: no two runs can match (exit 2)."""


class _Rounded(store.Trace):
    """The reference trace's tensors as the device run holds them: each floating tensor cast to
    the dtype the device run recorded under the same key (else the model's dtype)."""

    def __init__(self, reference: store.Trace, device_run: store.Trace, model_dtype: torch.dtype):
        super().__init__(reference.path, reference.meta)
        self._reference, self._device_meta, self._dtype = reference, device_run.tensor_meta, model_dtype

    def tensor(self, key: str) -> torch.Tensor:
        value = self._reference.tensor(key)
        if not value.is_floating_point():
            return value
        name = self._device_meta.get(key, {}).get("dtype")
        return value.to(store.dtype_from_name(name) if name else self._dtype)


@dataclasses.dataclass
class OwnRow(ReplayRow):
    """One module call (one direction) re-run on the same inputs on the device and in float64:
    err is device vs float64; status also "unconfirmed" (flagged by the comparison, impossible
    to re-run: the comparison's verdict stands)."""
    inherited: float = 0.0       # what its sub-modules' errors allow it (compare's rule)
    known_issue: Optional[str] = None    # a confirmed known issue of the op this module is (torch's, not the model's)
    known_issue_text: str = ""           # that issue in words, with its remedy

    @property
    def failed(self) -> bool:
        return self.status in ("diverged", "error", "unconfirmed")


@dataclasses.dataclass
class ModelCheck:
    spec: str
    factory_args: Dict[str, Any]
    device: str
    dtype: Optional[str]
    include: List[str]
    comparison: Optional[TraceComparison]
    forward: List[OwnRow]
    backward: List[OwnRow]
    culprit_forward: Optional[OwnRow]
    culprit_backward: Optional[OwnRow]
    memory: Dict[str, Any]
    notes: List[str]
    padding: Optional[PaddingCheck] = None
    mode: str = "as built"       # "as built", or "eval" when training-mode randomness was switched off

    @property
    def passed(self) -> bool:
        return (self.culprit_forward is None and self.culprit_backward is None
                and (self.padding is None or self.padding.passed))

    def to_dict(self) -> Dict[str, Any]:
        report = _platform.current()
        return {
            "schema_version": SCHEMA_VERSION, "kind": KIND, "platform": report,
            "machine": _platform.summary_line(report), "spec": self.spec, "factory_args": self.factory_args,
            "device": self.device, "dtype": self.dtype, "reference": REFERENCE,
            "mode": "include" if self.include else "full", "include": self.include, "passed": self.passed,
            "culprit_forward": self.culprit_forward.to_dict() if self.culprit_forward else None,
            "culprit_backward": self.culprit_backward.to_dict() if self.culprit_backward else None,
            "forward": [r.to_dict() for r in self.forward], "backward": [r.to_dict() for r in self.backward],
            "comparison": self.comparison.to_dict() if self.comparison is not None else None,
            "padding": self.padding.to_dict() if self.padding is not None else None,
            "run_mode": self.mode, "memory": self.memory, "notes": self.notes,
        }


# --------------------------------------------------------------------------- memory
def available_ram(ram_bytes: Optional[int] = None) -> Tuple[int, str]:
    """(bytes this check may use, where the number came from)."""
    if ram_bytes is not None:
        return int(ram_bytes), "ram_bytes"
    if os.environ.get(RAM_ENV):
        try:
            return int(float(os.environ[RAM_ENV])), RAM_ENV
        except ValueError:
            raise ValueError(f"{RAM_ENV}: expected a number of bytes, got {os.environ[RAM_ENV]!r}") from None
    try:
        import psutil
        return int(psutil.virtual_memory().available), "psutil"
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "/proc/meminfo"
    except OSError:
        pass
    return 2 ** 62, "unknown"  # nothing to measure with: do not refuse


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _numel(module: torch.nn.Module) -> int:
    return sum(t.numel() for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point())


def _refuse(what: str, need: int, have: int, source: str, include: Sequence[str], example: str) -> None:
    if need <= have:
        return
    way_out = (f"narrow --include (now {', '.join(include)})" if include else
               f"check part of it with --include PATTERN (e.g. --include '{example}'), which copies only the "
               "matching submodules and feeds each the inputs the device run recorded for it")
    raise ModelTooBig(f"{what} needs about {_size(need)}, more than the {_size(have)} of RAM available "
                      f"({source}); {way_out}")


def _example_pattern(model: torch.nn.Module) -> str:
    names = [n for n, m in model.named_modules() if n and any(True for _ in m.children())]
    return f"{names[min(1, len(names) - 1)]}*" if names else "NAME"


# --------------------------------------------------------------------------- re-running one call
class _Call(torch.nn.Module):
    """Makes one recorded call a model the recorder can run: the module is its child `m`."""
    INNER = "m"

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.m = module

    def forward(self, args, kwargs):
        return self.m(*args, **kwargs)


def _loss_from(source: store.Trace, call: Dict[str, Any]) -> Callable:
    """The loss whose gradient for each output of the call is the gradient `source` recorded for
    it (cast to the output's dtype), so the re-run's backward starts where the run's did."""
    def loss_fn(output):
        total = None
        for key, value in _pair_outputs(call["outputs"], output):
            if isinstance(value, torch.Tensor) and value.requires_grad and source.has(f"grad:{key}"):
                grad = source.tensor(f"grad:{key}").to(value.device, value.dtype)
                term = (value * grad).sum()
                total = term if total is None else total + term
        return total
    return loss_fn


def _renamer(call: Dict[str, Any]) -> Callable[[str], str]:
    """Names in a re-run ("m", "m.fc", "m:out") -> the model's ("blocks.0", "blocks.0.fc", "blocks.0:out")."""
    inside = "" if call["module"] == ROOT else call["module"] + "."
    pattern = re.compile(r"(?:^|(?<=[:\s('\"]))" + _Call.INNER + r"(?=[.:#\s)'\"]|$)(\.)?")
    return lambda text: pattern.sub(lambda m: inside if m.group(1) else call["key"], text or "")


def _rows_of(direction: str, call: Dict[str, Any], rows, subcalls: Dict[str, Dict[str, Any]]) -> List[OwnRow]:
    """A re-run's comparison -> its failing sub-calls (first failing row of each), then the call
    itself (its output, own code or own backward: the first failing row of it, else its worst)."""
    rename = _renamer(call)
    picked: Dict[str, Any] = {}
    for row in rows:
        if row.key in ("(model)", "(outside recorded modules)") or (row.key in picked and not picked[row.key].passed):
            continue
        if row.key == _Call.INNER or not row.passed:
            best = picked.get(row.key)
            if best is None or (not row.passed) or _ratio(row) > _ratio(best):
                picked[row.key] = row
    out = []
    for key, row in picked.items():
        if key == _Call.INNER:
            continue
        sub = subcalls.get(key, {})
        out.append(OwnRow(0, direction, rename(key), rename(row.module), row.type,
                          call["depth"] + sub.get("depth", 1) - 1, row.leaf, status="diverged", tensor=rename(row.tensor),
                          err=row.err, inherited=row.inherited, allowed=row.allowed, max_abs=row.max_abs,
                          worst_index=row.worst_index, reason=rename(row.reason)))
    fields = (call["key"], call["module"], call["type"], call["depth"], call["leaf"])
    row = picked.get(_Call.INNER)
    if row is None:
        out.append(OwnRow(0, direction, *fields, status="skipped", reason="the re-run recorded nothing to compare"))
        return out
    reason = rename(row.reason) + (" (in its own code, between its sub-modules)"
                                   if row.what == "own code" and not row.passed else "")
    out.append(OwnRow(0, direction, *fields, status="ok" if row.passed else "diverged", tensor=rename(row.tensor),
                      err=row.err, inherited=row.inherited, allowed=row.allowed, max_abs=row.max_abs,
                      worst_index=row.worst_index, reason=reason))
    return out


def _ratio(row) -> float:
    if row.err is None:
        return -1.0
    return math.inf if not math.isfinite(row.err) or not row.allowed else row.err / row.allowed


def _own_check(source: store.Trace, call: Dict[str, Any], module, module64, device, grads: bool
               ) -> Tuple[Dict[str, List[OwnRow]], Dict[str, Dict[str, Any]]]:
    """Record one call on `source`'s inputs twice, on the device and in float64 on the CPU, from
    the same output gradients, and judge it and its sub-calls by trace.compare's rule (its
    inputs are identical, so it inherits only what its sub-modules compute inside it).
    Returns {"forward": rows, "backward": rows} and the re-run's sub-calls ({key: {"parent"}}),
    named as in the model."""
    fields = (call["key"], call["module"], call["type"], call["depth"], call["leaf"])
    runs = []
    for target, on, float64 in ((module64, "cpu", True), (module, device, False)):
        decoder = _Decoder(source, on, float64, set())
        try:
            inputs = {"args": decoder.decode(call["inputs"]["args"], "args"),
                      "kwargs": decoder.decode(call["inputs"]["kwargs"], "kwargs")}
            meta, tensors = record_in_memory(_Call(target), inputs, grads=grads, loss_fn=_loss_from(source, call))
        except _NotReplayable as exc:
            return {"forward": [OwnRow(0, "forward", *fields, status="skipped", reason=str(exc))], "backward": []}, {}
        except Exception as exc:  # noqa: BLE001 - float64: no referee; device: a finding
            what = "the float64 copy raised" if float64 else "raised"
            row = OwnRow(0, "forward", *fields, status="skipped" if float64 else "error",
                         reason=f"{what} {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            return {"forward": [row], "backward": []}, {}
        runs.append(MemoryTrace("float64" if float64 else str(device), meta, tensors))
    result = compare(runs[0], runs[1])
    rename = _renamer(call)
    inner = {c["key"]: c for c in runs[1].calls if c["key"] != "(model)"}
    subcalls = {rename(k): {"parent": rename(c["parent"]) if c["parent"] not in (None, "(model)") else call.get("parent"),
                            "depth": c["depth"]} for k, c in inner.items() if k != _Call.INNER}
    rows = {"forward": _rows_of("forward", call, result.forward, inner)}
    rows["backward"] = _rows_of("backward", call, result.backward, inner) if grads else []
    return rows, subcalls


# --------------------------------------------------------------------------- the check
def _copy_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """target's parameters and buffers := source's (any device/dtype), by name."""
    src = dict(list(source.named_parameters()) + list(source.named_buffers()))
    dst = dict(list(target.named_parameters()) + list(target.named_buffers()))
    if set(src) != set(dst) or any(src[k].shape != dst[k].shape for k in src):
        differ = sorted(set(src) ^ set(dst)) or [k for k in src if src[k].shape != dst[k].shape]
        raise ValueError(f"factory: it builds a different model on the CPU than on the device "
                         f"(first difference: {differ[0]}); model check needs the same model on both")
    with torch.no_grad():
        for name, tensor in dst.items():
            tensor.copy_(src[name].detach().to(tensor.device))


def check_model(factory: Union[str, Callable], *, device=None, dtype: Optional[torch.dtype] = None,
                factory_args: Optional[Dict[str, Any]] = None, seed: int = 0,
                include: Optional[Sequence[str]] = None, grads: bool = True,
                ram_bytes: Optional[int] = None, padding: bool = True) -> ModelCheck:
    """Check a model from a SPEC (or factory) on `device` in `dtype` against float64 on the CPU.

    device: default: the first verified GPU (gpuparity.get_device), else the CPU.
    dtype: default: the factory's.
    include: fnmatch patterns of module names ("(model)" is the model): check only these,
        each alone on the inputs the device run recorded for it (no whole float64 copy).
    ram_bytes: RAM the float64 copy may use (default: $GPUPARITY_HOST_RAM_BYTES, else what the
        system reports available); a model that needs more is refused (ModelTooBig) before the
        float64 copy is made.
    padding: also check padding invariance on the device (trace/padding.py) when the inputs hold
        a padding mask: a module that ignores its mask in every dtype agrees with float64.

    A model in training mode whose forward draws random numbers (dropout) is checked in eval
    mode, said in the notes; one that draws them in eval mode too raises CannotCompare.
    A diverging module that is one op of a known issue confirmed on this machine (torch's
    LayerNorm in bf16 on the CPU) carries the issue's id (row.known_issue).
    """
    if isinstance(include, str):
        include = [include]
    include = list(include or [])
    options = dict(factory_args or {})
    if device is None:
        from ..device import get_device
        device = get_device()
    device = torch.device(device)
    spec_name = factory if isinstance(factory, str) else getattr(factory, "__name__", "factory")
    built = _spec.build(factory, device=device, dtype=dtype, options=options, seed=seed)
    model = built.model
    have, source = available_ram(ram_bytes)
    example = _example_pattern(model)
    if include:
        import fnmatch
        picked = [(name or ROOT, m) for name, m in model.named_modules()
                  if any(fnmatch.fnmatchcase(name or ROOT, p) for p in include)]
        if not picked:
            raise ValueError(f"include: no module name matches {include} "
                             f"(names look like {[n for n, _ in list(model.named_modules())[1:4]]})")
        biggest = max(picked, key=lambda nm: _numel(nm[1]))
        weights_need = 16 * _numel(biggest[1])
        what = f"a float64 copy of {biggest[0]} ({_numel(biggest[1]):,} parameters; weights and gradients)"
    else:
        weights_need = 16 * _numel(model)
        what = f"the float64 CPU copy of {type(model).__name__} ({_numel(model):,} parameters; weights and gradients)"
    _refuse(what, weights_need, have, source, include, example)

    notes: List[str] = []
    meta_b, tensors_b, mode = _record_deterministic(model, built.inputs, device, seed, notes, grads=grads,
                                                    include=include or None, loss_fn=built.loss_fn, spec=spec_name,
                                                    factory_args=options)
    device_run = MemoryTrace(f"{device} {meta_b['dtype']}", meta_b, tensors_b)
    model_dtype = store.dtype_from_name(meta_b["dtype"]) if meta_b.get("dtype") else torch.float32
    notes += meta_b.get("notes", [])
    memory = {"available_bytes": have, "available_from": source, "weights_bytes": weights_need}

    if include:
        activations = max((8 * 3 * sum(_elements(meta_b, k) for k in c["input_tensors"] + c["output_tensors"])
                           for c in meta_b["calls"]), default=0)
        memory["activations_bytes"] = activations
        _refuse(f"{what} and its largest call's activations", weights_need + activations, have, source,
                include, example)
        forward, backward, subcalls = _check_included(device_run, model, device, grads)
        comparison = None
    else:
        activations = 16 * sum(_elements(meta_b, k) for k in meta_b["tensors"])
        memory["activations_bytes"] = activations
        _refuse(f"{what} and the float64 run's activations", weights_need + activations, have, source,
                include, example)
        comparison, forward, backward, subcalls = _check_whole(device_run, model, built.inputs, model_dtype, factory,
                                                               dtype, options, seed, device, grads)
        flagged = [r for r in comparison.forward + comparison.backward if not r.passed]
        if flagged and not any(r.failed for r in forward + backward):
            notes.append(f"the comparison flagged {len(flagged)} rows (first: {flagged[0].key}, {flagged[0].direction}), "
                         "but fed the reference's inputs no module's own computation diverges: the model amplifies "
                         "rounding there")
    calls = dict(subcalls, **{c["key"]: c for c in meta_b["calls"]})
    _label_known_issues(forward + backward, dict(model.named_modules()), device, model_dtype, notes)
    padded = check_padding(model, built.inputs, grads=grads, include=include or None, seed=seed) if padding else None
    return ModelCheck(spec_name, options, str(device), meta_b.get("dtype"), include, comparison, forward, backward,
                      _culprit(forward, calls), _culprit(backward, calls), memory, notes, padded, mode)


# --------------------------------------------------------------------------- randomness
def _rng_states(device: torch.device) -> List[torch.Tensor]:
    states = [torch.random.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def _active_dropout(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def _record_deterministic(model, inputs, device, seed, notes, **options):
    """The device run, recorded so that a float64 run can repeat it: a model in training mode with
    dropout (a module, or a forward whose draws move the random generator) runs in eval mode,
    since a run on another device and dtype cannot draw the same dropout masks even from the same
    seed; a forward that still draws random numbers in eval mode cannot be compared."""
    mode = "as built"
    eval_note = ("the model came in training mode and {what}: a run on {device} and a float64 run on the CPU "
                 "cannot draw the same random numbers, so both ran in eval mode (dropout off; batch norm, if any, "
                 "uses its running statistics); return model.eval() from the factory to say so yourself")
    if model.training and _active_dropout(model):
        model.eval()
        mode = "eval"
        notes.append(eval_note.format(what="has active dropout", device=device))
    while True:
        torch.manual_seed(seed)        # record_in_memory seeds the same way before the forward
        fresh = _rng_states(device)
        meta, tensors = record_in_memory(model, inputs, seed=seed, **options)
        if all(torch.equal(a, b) for a, b in zip(fresh, _rng_states(device))):
            return meta, tensors, mode
        if model.training:
            model.eval()
            mode = "eval"
            notes.append(eval_note.format(what="its forward draws random numbers (dropout called as a function?)",
                                          device=device))
            continue
        raise CannotCompare(f"model: its forward draws random numbers in eval mode (torch's random generator on "
                            f"{device} moved during the run): a run on {device} and a float64 run on the CPU cannot "
                            "draw the same ones, so no module can be judged; make the forward deterministic (pass "
                            "any noise in as an input) and run again")


# --------------------------------------------------------------------------- known issues
# Modules that are one op of the known-issue base (known/issues.json `avoid` entries name op and
# backend): a plain torch LayerNorm runs torch's layer_norm kernel. A subclass with its own forward
# computes something else, so it is not matched.
_KNOWN_OPS = [(torch.nn.LayerNorm, "layer_norm")] + ([(torch.nn.RMSNorm, "rms_norm")] if hasattr(torch.nn, "RMSNorm")
                                                    else [])
# (op, dtype, device) -> the avoid entries confirmed here: a probe is a process of seconds, once per process
_CONFIRMED: Dict[Tuple[str, str, str], list] = caches.register("trace.model_check.known_issues", {})


def _op_of(module: Optional[torch.nn.Module]) -> Optional[str]:
    for cls, op in _KNOWN_OPS:
        if isinstance(module, cls) and type(module).forward is cls.forward:
            return op
    return None


def _label_known_issues(rows: List[OwnRow], modules: Dict[str, torch.nn.Module], device: torch.device,
                        model_dtype: torch.dtype, notes: List[str]) -> None:
    """Label, in place, each diverging row whose module is torch's own op in a known issue
    confirmed on this machine for that op, dtype and device (its probe runs once per process)."""
    from ..known import avoid, engine
    titles = None
    for row in rows:
        if row.status != "diverged":
            continue
        module = modules.get("" if row.module == ROOT else row.module)
        op = _op_of(module)
        if op is None:
            continue
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), model_dtype)
        memo = (op, str(dtype), str(device))
        if memo not in _CONFIRMED:
            try:
                _CONFIRMED[memo] = avoid.confirmed_here(op, dtype, device, ["torch"])
            except Exception as exc:  # noqa: BLE001 - the labels are extra; the check's verdict stands
                notes.append(f"the known issues of {op} could not be evaluated here ({type(exc).__name__}: {exc})")
                continue
        for entry in _CONFIRMED[memo]:
            when = getattr(entry, "regime", None) or {}
            if "requires_grad" in when and bool(when["requires_grad"]) != (row.direction == "backward"):
                continue
            if titles is None:
                titles = {issue["id"]: issue["title"] for issue in engine.load_issues()}
            row.known_issue = entry.issue
            row.known_issue_text = (f"{row.module} is torch's {op} in {str(dtype).replace('torch.', '')} on "
                                    f"{device.type}: known issue {entry.issue} ({titles.get(entry.issue, '')}), "
                                    f"confirmed on this machine. Remedy: {entry.remedy}")
            break


def _elements(meta: Dict[str, Any], key: str) -> int:
    shape = meta["tensors"][key]["shape"]
    return int(math.prod(shape)) if shape else 1


def _check_whole(device_run, model, inputs, model_dtype, factory, dtype, options, seed, device, grads):
    """Float64 run of a CPU build given the device model's weights; compare; re-run what it flags."""
    ref_built = _spec.build(factory, device="cpu", dtype=dtype, options=options, seed=seed)
    model64 = ref_built.model.to(torch.float64)
    _copy_weights(model, model64)
    model64.train(model.training)
    meta_a, tensors_a = record_in_memory(model64, _spec._cast_inputs(inputs, "cpu", torch.float64), grads=grads,
                                         seed=seed, loss_fn=ref_built.loss_fn, spec=device_run.meta.get("spec"),
                                         factory_args=options)
    reference = MemoryTrace(REFERENCE, meta_a, tensors_a)
    comparison = compare(reference, device_run)
    flagged = {"forward": {}, "backward": {}}
    for direction in flagged:
        for row in getattr(comparison, direction):
            if not row.passed and row.key not in flagged[direction]:
                flagged[direction][row.key] = row
    source = _Rounded(reference, device_run, model_dtype)
    modules = {name or ROOT: m for name, m in model.named_modules()}
    modules64 = {name or ROOT: m for name, m in model64.named_modules()}
    calls = {c["key"]: c for c in device_run.calls}
    order = {c["key"]: (i, -c["seq_start"]) for i, c in enumerate(device_run.calls)}
    groups: Dict[str, list] = {"forward": [], "backward": []}
    subcalls: Dict[str, Dict[str, Any]] = {}
    for key in list(dict.fromkeys(list(flagged["forward"]) + list(flagged["backward"]))):
        call = calls.get(key)
        if call is None or call["module"] not in modules64:
            for direction, seen in flagged.items():
                if key in seen:
                    groups[direction].append(((math.inf, math.inf), [_unconfirmed(seen[key], "it is no recorded module call")]))
            continue
        rows, inner = _own_check(source, call, modules[call["module"]], modules64[call["module"]], device,
                                 grads and key in flagged["backward"])
        subcalls.update(inner)
        for position, direction in enumerate(("forward", "backward")):
            if key not in flagged[direction]:
                continue
            own = rows[direction]
            if not own or own[-1].status == "skipped":
                why = own[-1].reason if own else rows["forward"][-1].reason
                own = own[:-1] + [_unconfirmed(flagged[direction][key], f"it could not be re-run ({why})")]
            groups[direction].append((order[key][position], own))
    return comparison, _ordered(groups["forward"]), _ordered(groups["backward"]), subcalls


def _unconfirmed(flagged, why: str) -> OwnRow:
    """A row the comparison flagged that cannot be re-run: the comparison's verdict stands."""
    return OwnRow(0, flagged.direction, flagged.key, flagged.module, flagged.type, flagged.depth, flagged.leaf,
                  status="unconfirmed", tensor=flagged.tensor, err=flagged.err, inherited=flagged.inherited,
                  allowed=flagged.allowed, max_abs=flagged.max_abs, worst_index=flagged.worst_index,
                  reason=f"flagged by the comparison ({flagged.reason}); {why}")


def _check_included(device_run: store.Trace, model, device, grads):
    """Each recorded call against a float64 copy of its module alone, on the recorded inputs."""
    modules = {name or ROOT: m for name, m in model.named_modules()}
    order = {c["key"]: (i, -c["seq_start"]) for i, c in enumerate(device_run.calls)}
    groups: Dict[str, list] = {"forward": [], "backward": []}
    subcalls: Dict[str, Dict[str, Any]] = {}
    by_module: Dict[str, List[Dict[str, Any]]] = {}
    for call in device_run.calls:
        by_module.setdefault(call["module"], []).append(call)
    for name, calls in by_module.items():
        module64 = copy.deepcopy(modules[name]).to("cpu", torch.float64)  # one module's copy at a time
        for call in calls:
            rows, inner = _own_check(device_run, call, modules[name], module64, device,
                                     grads and bool(call.get("own_backward")))
            subcalls.update(inner)
            groups["forward"].append((order[call["key"]][0], rows["forward"]))
            groups["backward"].append((order[call["key"]][1], rows["backward"]))
        del module64
    return _ordered(groups["forward"]), _ordered(groups["backward"]), subcalls


def _ordered(groups) -> List[OwnRow]:
    """(sort key, rows of one re-run) -> one list in call order, numbered."""
    rows = [row for _, group in sorted(groups, key=lambda g: g[0]) for row in group]
    for index, row in enumerate(rows):
        row.index = index
    return rows
