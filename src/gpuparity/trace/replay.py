"""Replay a trace on this machine: run every recorded module call on the *recorded* inputs
(and, for the backward, the recorded output gradients), and compare with the recorded outputs.
Each module's own error is then separated from the error it inherited, without touching the
model as a whole (no graph breaks, no marked outputs perturbing what is measured).

Verdict per call: pass when err(here vs recorded) <= max(2 * baseline, floor), where baseline is
the smaller of the two runs' errors against a float64 replay of the same module on the CPU
(the policy of docs/design.md with the better run as the baseline; the floor alone when no float64
replay is possible). The module named is the first failing call none of whose recorded
sub-calls fails: the deepest module whose own computation is wrong.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import torch

from .. import platform as _platform
from . import spec as _spec
from . import store
from .compare import allowed_error, tensor_error, tensor_floor
from .record import ROOT

SCHEMA_VERSION = 1


class _NotReplayable(Exception):
    pass


@dataclasses.dataclass
class ReplayRow:
    index: int
    direction: str              # "forward" | "backward"
    key: str
    module: str
    type: str
    depth: int
    leaf: bool
    status: str = "ok"          # ok | diverged | error | skipped
    tensor: str = ""
    err: Optional[float] = None              # here vs recorded
    allowed: Optional[float] = None
    max_abs: Optional[float] = None
    worst_index: Optional[List[int]] = None
    recorded_err64: Optional[float] = None   # recorded run vs float64 replay
    here_err64: Optional[float] = None       # this machine vs float64 replay
    deviates: Optional[str] = None           # "recorded" | "here" | "both": which side float64 disagrees with
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("diverged", "error")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ReplayResult:
    trace: Dict[str, Any]
    here: Dict[str, Any]
    identity: str
    forward: List[ReplayRow]
    backward: List[ReplayRow]
    culprit_forward: Optional[ReplayRow]
    culprit_backward: Optional[ReplayRow]
    notes: List[str]

    @property
    def passed(self) -> bool:
        return self.culprit_forward is None and self.culprit_backward is None

    def to_dict(self) -> Dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "kind": "gpuparity-trace-replay",
            "platform": _platform.current(), "trace": self.trace, "here": self.here,
            "identity": self.identity, "passed": self.passed,
            "culprit_forward": self.culprit_forward.to_dict() if self.culprit_forward else None,
            "culprit_backward": self.culprit_backward.to_dict() if self.culprit_backward else None,
            "forward": [r.to_dict() for r in self.forward],
            "backward": [r.to_dict() for r in self.backward],
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- inputs
class _Decoder:
    """Rebuilds a call's arguments from the trace, on a device, optionally in float64."""

    def __init__(self, trace: store.Trace, device, float64: bool, need_grad: Set[str]):
        self.trace, self.device, self.float64, self.need_grad = trace, device, float64, need_grad
        self.leaves: Dict[str, torch.Tensor] = {}

    def tensor(self, key: str) -> torch.Tensor:
        if key in self.leaves:  # the same tensor passed twice (q = k = v) must stay one tensor
            return self.leaves[key]
        meta = self.trace.tensor_meta[key]
        if meta.get("sampled"):
            raise _NotReplayable(f"{key} was sampled (max_elements={meta['sampled']}); "
                                 "record without --max-elements (or --include this module) to replay it")
        value = self.trace.tensor(key).to(self.device)
        if self.float64 and value.is_floating_point():
            value = value.to(torch.float64)
        if key in self.need_grad and value.is_floating_point():
            value.requires_grad_(True)
        self.leaves[key] = value
        return value

    def decode(self, enc, path: str = "input"):
        if isinstance(enc, dict):
            if "tensor" in enc:
                return self.tensor(enc["tensor"])
            if "tuple" in enc:
                return tuple(self.decode(v, f"{path}.{i}") for i, v in enumerate(enc["tuple"]))
            if "list" in enc:
                return [self.decode(v, f"{path}.{i}") for i, v in enumerate(enc["list"])]
            if "dict" in enc:
                return {k: self.decode(v, f"{path}.{k}") for k, v in enc["dict"].items()}
            if "float" in enc:
                return float(enc["float"])
            if "dtype" in enc:
                return store.dtype_from_name(enc["dtype"])
            if "device" in enc:
                return torch.device(self.device)
            if "opaque" in enc:
                raise _NotReplayable(f"{path} is a {enc['opaque']}, which a trace cannot hold")
        return enc


def _pair_outputs(enc, value, path: str = "output") -> List[Tuple[str, Any]]:
    """(recorded tensor key, value computed here) for every tensor of a recorded output."""
    if isinstance(enc, dict):
        if "tensor" in enc:
            return [(enc["tensor"], value)]
        for kind in ("tuple", "list"):
            if kind in enc:
                if not isinstance(value, (tuple, list)) or len(value) != len(enc[kind]):
                    raise _NotReplayable(f"{path}: recorded a {kind} of {len(enc[kind])}, got {type(value).__name__} here")
                return [p for i, (e, v) in enumerate(zip(enc[kind], value)) for p in _pair_outputs(e, v, f"{path}.{i}")]
        if "dict" in enc:
            if not isinstance(value, dict):
                raise _NotReplayable(f"{path}: recorded a dict, got {type(value).__name__} here")
            return [p for k, e in enc["dict"].items() for p in _pair_outputs(e, value.get(k), f"{path}.{k}")]
    return []


# --------------------------------------------------------------------------- one call
def _run(module, decoder: _Decoder, call: Dict[str, Any]):
    args = decoder.decode(call["inputs"]["args"], "args")
    kwargs = decoder.decode(call["inputs"]["kwargs"], "kwargs")
    return module(*args, **kwargs)


def _norms(out: torch.Tensor, ref: torch.Tensor) -> Optional[Tuple[float, float]]:
    """(||out - ref||, ||ref||) in float64, inf when out has NaN/Inf; None when not comparable."""
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor) or out.shape != ref.shape:
        return None
    out64, ref64 = out.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(out64).all():
        return math.inf, float(torch.linalg.vector_norm(ref64))
    return float(torch.linalg.vector_norm(out64 - ref64)), float(torch.linalg.vector_norm(ref64))


def _relative(pairs: List[Optional[Tuple[float, float]]]) -> Optional[float]:
    if not pairs or any(p is None for p in pairs):
        return None
    diff = math.sqrt(sum(d * d for d, _ in pairs))
    ref = math.sqrt(sum(r * r for _, r in pairs))
    return diff / ref if ref > 0 else diff


def _judge(row: ReplayRow, checks: List[Dict[str, Any]], combine: bool = False) -> ReplayRow:
    """checks: [{key, recorded, recorded_meta, here, ref64, floor}] -> the row's verdict: each
    tensor alone (the worst decides), or, with `combine`, all as one relative error (for a
    call's own backward, where a bias gradient can be pure rounding noise around zero)."""
    judged = []
    for check in checks:
        here = check["here"].detach().cpu()
        here_meta = {"shape": list(here.shape), "dtype": store.dtype_name(here.dtype), "device": str(here.device)}
        result = tensor_error(check["key"], check["recorded"], check["recorded_meta"], here, here_meta)
        ref = check.get("ref64")
        judged.append({"key": check["key"], "result": result, "floor": check["floor"],
                       "rec64": _norms(check["recorded"], ref) if ref is not None else None,
                       "here64": _norms(here, ref) if ref is not None else None})
    if not judged:
        row.status, row.reason = "skipped", row.reason or "nothing to compare"
        return row
    if combine:
        worst = max(judged, key=lambda j: j["result"].get("diff_norm", math.inf)
                    if math.isfinite(j["result"]["err"]) else math.inf)
        from .compare import combined_error
        groups = [dict(worst, result=dict(worst["result"], err=combined_error([j["result"] for j in judged])),
                       floor=max(j["floor"] for j in judged),
                       rec64=[j["rec64"] for j in judged], here64=[j["here64"] for j in judged])]
    else:
        groups = [dict(j, rec64=[j["rec64"]], here64=[j["here64"]]) for j in judged]
    worst_ratio, floor = -1.0, 0.0
    for group in groups:
        rec64 = _relative(group["rec64"])
        here64 = _relative(group["here64"])
        known = [v for v in (rec64, here64) if v is not None and math.isfinite(v)]
        allowed = allowed_error(min(known) if known else 0.0, group["floor"])
        err = group["result"]["err"]
        ratio = math.inf if not math.isfinite(err) else (err / allowed if allowed > 0 else (0.0 if err == 0 else math.inf))
        if ratio > worst_ratio:
            worst_ratio, floor = ratio, group["floor"]
            row.tensor, row.err, row.allowed = group["key"], err, allowed
            row.max_abs, row.worst_index = group["result"].get("max_abs"), group["result"].get("worst_index")
            row.recorded_err64, row.here_err64 = rec64, here64
            row.reason = group["result"].get("reason", "")
    if worst_ratio <= 1.0:
        row.status = "ok"
        return row
    row.status = "diverged"
    if row.recorded_err64 is not None and row.here_err64 is not None:
        recorded_off = row.recorded_err64 > allowed_error(row.here_err64, floor)
        here_off = row.here_err64 > allowed_error(row.recorded_err64, floor)
        row.deviates = "both" if recorded_off and here_off else "recorded" if recorded_off else "here" if here_off \
            else None
    if not row.reason:
        row.reason = (f"{row.tensor}: this machine's own result differs from the recorded one by "
                      f"{row.err:.3g} (relative), allowed {row.allowed:.3g}; max abs {row.max_abs:.3g} "
                      f"at {row.worst_index}")
    return row


def _culprit(rows: List[ReplayRow], calls: Dict[str, Dict[str, Any]]) -> Optional[ReplayRow]:
    """The first failing call with no failing recorded sub-call (deepest first)."""
    failed = {r.key for r in rows if r.failed}

    def ancestors(key):
        parent = calls.get(key, {}).get("parent")
        while parent is not None:
            yield parent
            parent = calls.get(parent, {}).get("parent")

    has_failing_descendant = set()
    for key in failed:
        has_failing_descendant.update(ancestors(key))
    for row in rows:
        if row.failed and row.key not in has_failing_descendant:
            return row
    return None


def _summary(trace: store.Trace) -> Dict[str, Any]:
    report = trace.meta.get("platform", {})
    return {"path": trace.path, "device": trace.device, "dtype": trace.dtype, "spec": trace.meta.get("spec"),
            "factory_args": trace.meta.get("factory_args"), "integrity": trace.integrity,
            "machine": _platform.summary_line(report) if isinstance(report, dict) else "unknown"}


def replay(trace, factory: Union[str, Callable, None] = None, *, device=None,
           factory_args: Optional[Dict[str, Any]] = None, referee: bool = True, grads: bool = True) -> ReplayResult:
    """Replay every recorded module call of `trace` on this machine.

    factory: a SPEC string or a factory function (see gpuparity.trace.spec); default: the SPEC
        the trace was recorded with. factory_args override the recorded factory options (e.g.
        {"attn": "sdpa_math"} to replay a run with another attention backend).
    device: where to replay (default: cuda if available, else cpu). The model is built in the
        trace's dtype.
    referee: also replay each module in float64 on the CPU, to tell which side is off.
    """
    trace = store.load(trace)
    spec = factory if factory is not None else trace.meta.get("spec")
    if spec is None:
        raise ValueError("factory: this trace was recorded without a SPEC, so replay needs one "
                         "(gpuparity trace replay TRACE --spec module:factory)")
    device = torch.device(device or _spec.default_device())
    dtype = store.dtype_from_name(trace.dtype) if trace.dtype else None
    options = dict(trace.meta.get("factory_args") or {})
    options.update(factory_args or {})
    built = _spec.build(spec, device=device, dtype=dtype, options=options, seed=int(trace.meta.get("seed", 0)))
    model = built.model
    model.train(bool(trace.meta.get("training", False)))
    here_weights = store.fingerprint(list(model.named_parameters()) + list(model.named_buffers()))
    try:
        identity = store.match_fingerprints("weights", trace.meta["weights"], here_weights)
    except store.TraceMismatch as exc:
        raise store.TraceMismatch(f"refusing to replay {trace.path}: the model built here has {exc}") from None

    notes: List[str] = []
    modules = {name or ROOT: m for name, m in model.named_modules()}
    modules64: Dict[str, torch.nn.Module] = {}
    if referee:
        try:
            model64 = copy.deepcopy(model).to("cpu", torch.float64)
            modules64 = {name or ROOT: m for name, m in model64.named_modules()}
        except Exception as exc:  # noqa: BLE001 - the referee is optional
            notes.append(f"no float64 referee: copying the model to float64 failed ({type(exc).__name__}: {exc})")
    here_report = _platform.current()
    trace_report = trace.meta.get("platform", {})
    calls = {c["key"]: c for c in trace.calls}

    forward: List[ReplayRow] = []
    backward: List[ReplayRow] = []
    for call in trace.calls:
        row = ReplayRow(len(forward), "forward", call["key"], call["module"], call["type"], call["depth"], call["leaf"])
        forward.append(row)
        module = modules.get(call["module"])
        own = call.get("own_backward") if grads else None
        if module is None:
            row.status, row.reason = "skipped", f"the model built here has no module {call['module']!r}"
            _skip_backward(backward, call, own, row.reason)
            continue
        need_grad = set(own["inputs"]) if own else set()
        decoder = _Decoder(trace, device, False, need_grad)
        try:
            with torch.enable_grad() if own else torch.no_grad():
                out = _run(module, decoder, call)
            pairs = _pair_outputs(call["outputs"], out)
        except _NotReplayable as exc:
            row.status, row.reason = "skipped", str(exc)
            _skip_backward(backward, call, own, f"its forward replay was skipped: {exc}")
            continue
        except store.TraceCorrupt:
            raise  # a damaged trace is bad input, never a module's fault
        except Exception as exc:  # noqa: BLE001 - an error on this machine is a finding
            row.status, row.reason = "error", f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            _skip_backward(backward, call, own, "its forward replay raised here (see the forward row)")
            continue
        ref_pairs: Dict[str, torch.Tensor] = {}
        module64 = modules64.get(call["module"])
        decoder64 = _Decoder(trace, "cpu", True, need_grad)
        out64 = None
        if module64 is not None:
            try:
                with torch.enable_grad() if own else torch.no_grad():
                    out64 = _run(module64, decoder64, call)
                ref_pairs = dict(_pair_outputs(call["outputs"], out64))
            except store.TraceCorrupt:
                raise
            except Exception:  # noqa: BLE001 - e.g. a GPU-only backend: judged without a referee
                out64 = None
        checks = []
        for key, here in pairs:
            if not isinstance(here, torch.Tensor):
                row.status, row.reason = "error", f"{key}: expected a tensor here, got {type(here).__name__}"
                break
            meta = trace.tensor_meta[key]
            checks.append({"key": key, "recorded": trace.tensor(key), "recorded_meta": meta, "here": here,
                           "ref64": ref_pairs.get(key), "floor": max(
                               tensor_floor(meta, trace_report),
                               tensor_floor({"dtype": store.dtype_name(here.dtype), "device": str(here.device)},
                                            here_report))})
        if row.status == "error":
            _skip_backward(backward, call, own, "its forward output here is not a tensor (see the forward row)")
            continue
        _judge(row, checks)
        if own:
            backward.append(_replay_backward(trace, call, (module, decoder, dict(pairs)),
                                             (module64, decoder64, ref_pairs if out64 is not None else None),
                                             trace_report, here_report))
    order = {c["key"]: -c["seq_start"] for c in trace.calls}
    backward.sort(key=lambda r: order[r.key])
    for index, row in enumerate(backward):
        row.index = index
    if not modules64:
        notes.append("judged without a float64 referee (floor of the dtype only)")
    if trace.integrity.startswith("unchecked"):
        notes.append(f"trace integrity {trace.integrity}")
    return ReplayResult(_summary(trace), {"device": str(device), "machine": _platform.summary_line(here_report),
                                          "spec": spec if isinstance(spec, str) else getattr(spec, "__name__", "factory"),
                                          "factory_args": options},
                        identity, forward, backward, _culprit(forward, calls), _culprit(backward, calls), notes)


def _skip_backward(backward: List[ReplayRow], call: Dict[str, Any], own, why: str) -> None:
    """A call with a recorded own backward always gets a backward row, so the backward table lists
    the same calls as `trace compare`'s; one whose forward could not be replayed is skipped, with why."""
    if own:
        row = ReplayRow(0, "backward", call["key"], call["module"], call["type"], call["depth"], call["leaf"])
        row.status, row.reason = "skipped", why
        backward.append(row)


def _vjp(trace: store.Trace, module, decoder: _Decoder, outputs: Dict[str, torch.Tensor], output_keys: List[str],
         wrt_names: List[Tuple[str, str]], float64: bool):
    """The call's own backward from the recorded output gradients."""
    grads_out = []
    for key in output_keys:
        grad = trace.tensor(f"grad:{key}").to(outputs[key].device)
        grads_out.append(grad.to(torch.float64) if float64 else grad.to(outputs[key].dtype))
    params = dict(module.named_parameters(recurse=False))
    wrt = [decoder.leaves[name] if kind == "input" else params[name] for kind, name in wrt_names]
    return torch.autograd.grad([outputs[k] for k in output_keys], wrt, grad_outputs=grads_out, allow_unused=True)


def _replay_backward(trace: store.Trace, call: Dict[str, Any], here_run, ref_run, trace_report, here_report
                     ) -> ReplayRow:
    row = ReplayRow(0, "backward", call["key"], call["module"], call["type"], call["depth"], call["leaf"])
    own = call["own_backward"]
    module, decoder, outputs = here_run
    module64, decoder64, outputs64 = ref_run
    output_keys = [k for k, t in outputs.items()
                   if trace.has(f"grad:{k}") and isinstance(t, torch.Tensor) and t.requires_grad]
    if not output_keys:
        row.status, row.reason = "skipped", "no output computed here requires grad"
        return row
    sampled = [k for k in output_keys if trace.tensor_meta[f"grad:{k}"].get("sampled")]
    if sampled:
        row.status, row.reason = "skipped", f"grad:{sampled[0]} was sampled; record without --max-elements to replay"
        return row
    params = dict(module.named_parameters(recurse=False))
    wrt_names = [("input", k) for k in own["inputs"] if k in decoder.leaves and decoder.leaves[k].requires_grad]
    wrt_names += [("param", n) for n in own["params"] if n in params and params[n].requires_grad]
    if not wrt_names:
        row.status, row.reason = "skipped", "nothing here to differentiate"
        return row
    try:
        here_grads = _vjp(trace, module, decoder, outputs, output_keys, wrt_names, False)
    except store.TraceCorrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - an error on this machine is a finding
        row.status, row.reason = "error", f"backward raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return row
    ref_grads: List[Optional[torch.Tensor]] = [None] * len(wrt_names)
    if module64 is not None and outputs64 is not None:
        try:
            ref_grads = list(_vjp(trace, module64, decoder64, outputs64, output_keys, wrt_names, True))
        except store.TraceCorrupt:
            raise
        except Exception:  # noqa: BLE001 - judged without a referee
            pass
    checks = []
    for (kind, name), here, ref in zip(wrt_names, here_grads, ref_grads):
        key = own["inputs"][name] if kind == "input" else own["params"][name]
        if here is None:
            continue
        meta = trace.tensor_meta[key]
        checks.append({"key": key, "recorded": trace.tensor(key), "recorded_meta": meta, "here": here, "ref64": ref,
                       "floor": max(tensor_floor(meta, trace_report),
                                    tensor_floor({"dtype": store.dtype_name(here.dtype), "device": str(here.device)},
                                                 here_report))})
    return _judge(row, checks, combine=True)
