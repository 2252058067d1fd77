"""Safe `torch.compile`: compile, run, check the answer against a float64 run of the same
model, and fall down a list of backends on an exception or a wrong answer.

The float64-referee rule (as the TorchDynamo accuracy minifier): the compiled output passes
when its RMSE against the float64 output is at most max(2 x eager's RMSE against float64,
floor). gpuparity states RMSE relative to the reference's RMS, which is exactly the relative
L2 error of gpuparity.tolerance, so the floor is the tolerance floor of the output's dtype
(docs/design.md). Where the model cannot run in float64, the compiled output is compared with
eager under the floor alone.
"""
from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import tolerance
from .model_inputs import as_call, flatten_tensors, map_tensors

DEFAULT_BACKENDS = ("inductor", "aot_eager", "eager")
COMPILE_ISSUES = ("COMPILE-ROCM-LOOPCARRIED", "COMPILE-ROCM-MI3XX", "COMPILE-SM120-BF16", "COMPILE-PRE-VOLTA")
SCHEMA_VERSION = 1

BackendSpec = Union[str, Callable]


class CompileFallbackWarning(UserWarning):
    """safe_compile did not use the first backend of its list."""


@dataclasses.dataclass
class Attempt:
    backend: str
    status: str                     # "ok" | "wrong" | "error"
    err: Optional[float] = None     # relative RMSE against float64 (worst output)
    eager_err: Optional[float] = None
    allowed: Optional[float] = None
    max_abs: Optional[float] = None
    reason: str = ""
    seconds: float = 0.0


@dataclasses.dataclass
class CompileChoice:
    """What safe_compile chose and why; attached to its result as `.gpuparity_compile`."""
    backend: str
    attempts: List[Attempt]
    referee: str
    known_issues: List[str]
    message: str = ""
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def fell_back(self) -> bool:
        return bool(self.attempts) and self.attempts[0].backend != self.backend

    @property
    def wrong_answer(self) -> bool:
        return any(a.status == "wrong" for a in self.attempts)

    def to_dict(self) -> Dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "backend": self.backend, "fell_back": self.fell_back,
                "wrong_answer": self.wrong_answer, "referee": self.referee, "known_issues": self.known_issues,
                "message": self.message, "notes": self.notes,
                "attempts": [dataclasses.asdict(a) for a in self.attempts]}


# --------------------------------------------------------------------------- helpers
def _backend_name(backend: BackendSpec) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)


def _device_of(model, inputs) -> torch.device:
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    for tensor in params + flatten_tensors(inputs, sort_keys=True):
        return tensor.device
    return torch.device("cpu")


def _float64_reference(model, args, kwargs, device) -> Tuple[Optional[List[torch.Tensor]], str, List[str]]:
    """The model's outputs in float64 (on its device, else on the CPU)."""
    notes = []
    if not isinstance(model, torch.nn.Module):
        return None, "eager (a plain function cannot be copied to float64)", notes
    for where in ([device, torch.device("cpu")] if device.type != "cpu" else [device]):
        try:
            model64 = copy.deepcopy(model).to(device=where, dtype=torch.float64)
            cast = (lambda t, where=where: t.to(where, torch.float64) if t.is_floating_point() else t.to(where))
            with torch.no_grad():
                out = model64(*map_tensors(args, cast), **map_tensors(kwargs, cast))
            return [t.detach() for t in flatten_tensors(out, sort_keys=True)], f"float64 on {where.type}", notes
        except Exception as exc:  # noqa: BLE001 - fall back to the next referee
            notes.append(f"float64 run on {where.type} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    return None, "eager (the model did not run in float64)", notes


def _judge(name: str, outputs, eager: List[torch.Tensor], ref64: Optional[List[torch.Tensor]]) -> Attempt:
    attempt = Attempt(name, "ok")
    got = flatten_tensors(outputs, sort_keys=True)
    if len(got) != len(eager):
        attempt.status, attempt.reason = "wrong", f"returned {len(got)} tensors, eager returns {len(eager)}"
        return attempt
    worst = -1.0
    for index, (out, eager_out) in enumerate(zip(got, eager)):
        if not out.is_floating_point():
            if not torch.equal(out.cpu(), eager_out.cpu()):
                attempt.status, attempt.reason = "wrong", f"output {index} ({out.dtype}) differs from eager"
                return attempt
            continue
        ref = ref64[index] if ref64 is not None else eager_out
        baseline = eager_out if ref64 is not None else None
        result = tolerance.judge(f"output {index}", out, ref, baseline, out.dtype)
        ratio = float("inf") if result.err is None else result.err / max(result.allowed, 1e-300)
        if ratio > worst:
            worst = ratio
            attempt.err, attempt.eager_err, attempt.allowed = result.err, result.baseline_err, result.allowed
            attempt.max_abs = result.max_abs
            if not result.passed:
                attempt.status, attempt.reason = "wrong", result.reason
    return attempt


def _error_text(exc: BaseException) -> str:
    """One line naming the error. Dynamo wraps a backend's own error as BackendCompilerFailed,
    whose message says little: name the inner error instead."""
    inner = getattr(exc, "inner_exception", None) or exc.__cause__
    source = inner if inner is not None and str(inner).strip() else exc
    lines = [line.strip() for line in str(source).splitlines() if line.strip()]
    text = f"{type(source).__name__}: {lines[0][:300] if lines else ''}"
    return text if source is exc else f"{text} (raised as {type(exc).__name__})"


def known_issue_ids(reasons: str, wrong: bool, device: torch.device) -> List[str]:
    """COMPILE-* known issues that may explain a fallback: by the error text and platform facts,
    plus whatever gpuparity.known's rules say may apply on this platform."""
    from . import platform
    report = platform.current()
    text = reasons.lower()
    vendor = report.get("vendor")
    devices = report.get("devices") if isinstance(report.get("devices"), list) else []
    index = device.index or 0 if device.type == "cuda" else None
    info = devices[index] if index is not None and index < len(devices) and isinstance(devices[index], dict) else {}
    arch = str(info.get("arch", ""))
    capability = info.get("capability") or [99, 0]
    ids = []
    if "loop-carried variable" in text:
        ids.append("COMPILE-ROCM-LOOPCARRIED")
    if "too old" in text or (vendor == "nvidia" and device.type == "cuda" and list(capability) < [7, 0]):
        ids.append("COMPILE-PRE-VOLTA")
    if wrong and vendor == "amd" and arch in ("gfx942", "gfx950"):
        ids.append("COMPILE-ROCM-MI3XX")
    if wrong and vendor == "nvidia" and arch in ("sm_120", "sm_121"):
        ids.append("COMPILE-SM120-BF16")
    # the base's own rules on the same platform report (no probes: a fallback must not wait on them)
    from .known.engine import evaluate
    for result in evaluate(report, probes=False, ids=list(COMPILE_ISSUES)):
        if result.applies and result.id not in ids:
            ids.append(result.id)
    return ids


# --------------------------------------------------------------------------- public
def compile_check(model: Union[torch.nn.Module, Callable], example_inputs, *,
                  backends: Sequence[BackendSpec] = DEFAULT_BACKENDS, **compile_kwargs) -> Tuple[Callable, CompileChoice]:
    """Try each backend in order on `example_inputs`; return (the first that runs and passes
    the float64-referee rule, what happened). "eager" (no compilation) always passes.

    example_inputs: a tensor, a tuple of positional arguments, or a dict of keyword arguments.
    compile_kwargs go to torch.compile (mode, dynamic, fullgraph, options).
    """
    if not callable(model):
        raise TypeError(f"model: expected a torch.nn.Module or a function, got {type(model).__name__}")
    if not backends:
        raise ValueError("backends: expected at least one backend, got an empty list")
    args, kwargs = as_call(example_inputs)
    device = _device_of(model, example_inputs)
    notes: List[str] = []
    module = model if isinstance(model, torch.nn.Module) else None
    # The check runs the model several times: keep its buffers (BatchNorm statistics) as they
    # were, and judge dropout-free outputs.
    saved = {k: v.detach().clone() for k, v in module.named_buffers()} if module is not None else {}
    was_training = module.training if module is not None else False
    if module is not None and was_training and any(
            isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules()):
        module.eval()
        notes.append("the model has active dropout: checked in eval mode")
    try:
        with torch.no_grad():
            eager = [t.detach() for t in flatten_tensors(model(*args, **kwargs), sort_keys=True)]
        ref64, referee, ref_notes = _float64_reference(model, args, kwargs, device)
        notes.extend(ref_notes)
        attempts: List[Attempt] = []
        chosen: Optional[Callable] = None
        chosen_name = "eager"
        for backend in backends:
            name = _backend_name(backend)
            if name == "eager":
                attempts.append(Attempt("eager", "ok", reason="no compilation"))
                chosen, chosen_name = model, "eager"
                break
            start = time.perf_counter()
            try:
                compiled = torch.compile(model, backend=backend, **compile_kwargs)
                with torch.no_grad():
                    outputs = compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a compiler error is a reason to fall back
                attempts.append(Attempt(name, "error", reason=_error_text(exc), seconds=time.perf_counter() - start))
                continue
            attempt = _judge(name, outputs, eager, ref64)
            attempt.seconds = time.perf_counter() - start
            attempts.append(attempt)
            if attempt.status == "ok":
                chosen, chosen_name = compiled, name
                break
        if chosen is None:
            attempts.append(Attempt("eager", "ok", reason="every backend in the list failed; eager is the last resort"))
            chosen, chosen_name = model, "eager"
    finally:
        if module is not None:
            with torch.no_grad():
                for key, value in module.named_buffers():
                    if key in saved:
                        value.copy_(saved[key])
            module.train(was_training)

    choice = CompileChoice(chosen_name, attempts, referee, [], notes=notes)
    failed = [a for a in attempts if a.status != "ok"]
    if failed:
        reasons = "; ".join(
            f"{a.backend} {'gave a wrong answer' if a.status == 'wrong' else 'raised'}: {a.reason}" for a in failed)
        choice.known_issues = known_issue_ids(reasons, choice.wrong_answer, device)
        known = (f" Known issues that may match: {', '.join(choice.known_issues)} (see `gpuparity known-issues`)."
                 if choice.known_issues else "")
        choice.message = (f"gpuparity.safe_compile: using {chosen_name} instead of {attempts[0].backend}: "
                          f"{reasons}.{known}")
    return chosen, choice


def safe_compile(model: Union[torch.nn.Module, Callable], example_inputs, *,
                 backends: Sequence[BackendSpec] = DEFAULT_BACKENDS, warn: bool = True, **compile_kwargs):
    """torch.compile that falls back instead of failing or silently giving wrong answers.

    Compiles `model` with each backend in turn, runs it on `example_inputs`, and keeps the first
    whose output passes the float64-referee rule (see the module docstring). On a fallback it
    emits one CompileFallbackWarning naming the reason and any COMPILE-* known issue that
    matches. Returns the compiled callable (or `model` itself for eager) with the attribute
    `gpuparity_compile` (a CompileChoice) describing the choice.
    """
    chosen, choice = compile_check(model, example_inputs, backends=backends, **compile_kwargs)
    if warn and choice.message:
        warnings.warn(choice.message, CompileFallbackWarning, stacklevel=2)
    try:
        chosen.gpuparity_compile = choice
    except (AttributeError, TypeError):
        pass  # a callable that takes no attributes; the choice is in the warning
    return chosen
