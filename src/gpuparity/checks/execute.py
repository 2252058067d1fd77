"""Run one battery case on one implementation, forward and backward, against the float64
reference and the same-dtype baseline, under the tolerance policy. In-process: the worker
(isolation) and the probes call this."""
from __future__ import annotations

import os
import statistics
import time
import traceback
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..dispatch import BackendUnavailable, get as get_backend
from .. import targets, tolerance
from .families import apply_values, apply_views
from .results import Comparison, Status, clip
from ..contracts import OpSpec, get_spec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64", "half": "float16",
                 "float": "float32"}


def dtype_from_name(name: str) -> torch.dtype:
    key = DTYPE_ALIASES.get(name, name)
    if key not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES) + sorted(DTYPE_ALIASES)}, got {name!r}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def task_seed(base_seed: int, op: str, case: str, dtype: str) -> int:
    """A per-case seed that does not depend on which other cases run."""
    return (base_seed * 1_000_003 + zlib.crc32(f"{op}/{case}/{dtype}".encode())) % (2 ** 31)


class ImplError(Exception):
    """A user implementation could not be loaded."""


def load_impl(target: str) -> Callable:
    """'pkg.module:fn' or 'path/to/file.py:fn' (targets.load), as an ImplError naming --impl."""
    try:
        obj = targets.load(target)
    except targets.TargetError as exc:
        if exc.part == "form":
            raise ImplError(f"--impl: expected 'package.module:function' or 'file.py:function', got {target!r}") from None
        if exc.part == "file":
            raise ImplError(f"--impl: file {os.path.abspath(exc.module)} does not exist") from None
        raise ImplError(f"--impl: {exc}") from exc.__cause__
    if not callable(obj):
        raise ImplError(f"--impl: {target!r} is a {type(obj).__name__}, not a callable")
    return obj


def resolve_fn(op: str, backend: str, impl: Optional[str]) -> Callable:
    if impl:
        return load_impl(impl)
    return get_backend(op, backend).fn


def _round_inputs(inputs: Dict[str, Any], spec: OpSpec, dtype: torch.dtype) -> Dict[str, Any]:
    """Round floating inputs to the dtype under test, kept as float64 on the CPU."""
    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value.to(dtype).to(torch.float64)
        out[name] = value
    return out


def make_inputs(spec: OpSpec, params: Dict[str, Any], dtype: torch.dtype, gen: torch.Generator) -> Dict[str, Any]:
    """The case's float64 inputs, with its family's value regime (params "values") applied;
    specs whose inputs depend on the dtype under test (finfo.min masks) read params["dtype"]."""
    raw = spec.make_inputs({**params, "dtype": dtype_name(dtype)}, gen)
    return apply_values(raw, params.get("values"), dtype, gen)


def _forward_backward(spec: OpSpec, fn: Callable, inputs: Dict[str, Any], params: Dict[str, Any],
                      grad_out, expect_dtype: torch.dtype, expect_device: torch.device,
                      who: str, expect_shape=None) -> Tuple[Any, Dict[str, Optional[torch.Tensor]], List[str]]:
    """(output, gradients by "grad_<name>", problems found with the output's type). grad_out: the
    output's gradient, None (forward only) or a function of the output's shape that makes it (the
    referee's: one forward serves both)."""
    leaves = {}
    for name in spec.grad_inputs:
        value = inputs.get(name)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value.detach().clone().requires_grad_(True)
            inputs = {**inputs, name: value}
            leaves[name] = value
    # a family's layout regime: one input as a view with an odd offset, stride 0, ... (the
    # gradients still reach the leaves above)
    inputs = apply_views(inputs, params.get("views"))
    out = spec.call(fn, inputs, params)
    if callable(grad_out) and isinstance(out, torch.Tensor):
        grad_out = grad_out(tuple(out.shape))
    problems = []
    if not isinstance(out, torch.Tensor):
        return out, {}, [f"{who} returned {type(out).__name__}, expected a torch.Tensor"]
    if expect_shape is not None and tuple(out.shape) != tuple(expect_shape):
        problems.append(f"{who} returned the wrong shape {tuple(out.shape)}, expected {tuple(expect_shape)}")
    if out.dtype != expect_dtype:
        problems.append(f"{who} returned dtype {dtype_name(out.dtype)}, expected {dtype_name(expect_dtype)}")
    if out.device.type != expect_device.type:
        problems.append(f"{who} returned a tensor on {out.device}, expected {expect_device}")
    grads: Dict[str, Optional[torch.Tensor]] = {}
    if leaves and grad_out is not None and out.requires_grad and not problems:
        out.backward(grad_out.to(out.device, out.dtype).reshape(out.shape))
        grads = {f"grad_{name}": leaf.grad for name, leaf in leaves.items()}
    elif leaves and grad_out is not None and not out.requires_grad and not problems:
        problems.append(f"{who}: the output does not require grad (the autograd graph is broken)")
    return out, grads, problems


def run_case(op: str, fn: Callable, params: Dict[str, Any], dtype: torch.dtype, device: torch.device,
             seed: int, baseline_fn: Optional[Callable] = None,
             repro: Optional[Dict[str, Any]] = None) -> Tuple[Status, List[Comparison], str]:
    """One case: (status, comparisons, reason). `repro`: {"stem": path without extension, and
    op/backend/impl/case names}: also write a standalone repro of this check (checks/repro.py)."""
    spec = get_spec(op)
    if repro is None:
        return _run_case(spec, fn, params, dtype, device, seed, baseline_fn)[:3]
    from . import repro as repro_module
    impl_fn, reference_fn = fn, get_spec(op).repro_reference()
    # the implementation's inputs saved as they went in (a sticky device error leaves none to copy after)
    impl_call = repro_module.CallRecorder(fn, snapshot=True)
    ref_call = repro_module.CallRecorder(spec.reference_fn)
    fn = impl_call.wrapped
    spec = _with_reference(spec, ref_call.wrapped)
    sdpa = None
    if not repro.get("impl") and repro.get("backend") in repro_module.SDPA_KERNELS:
        # the repro calls torch's SDPA as the backend did: record that call, judged by the reference
        import torch.nn.functional as F
        sdpa = repro_module.CallRecorder(F.scaled_dot_product_attention, snapshot=True)
        F.scaled_dot_product_attention = sdpa.wrapped
    try:
        status, comparisons, reason, grad_out = _run_case(spec, fn, params, dtype, device, seed, baseline_fn)
    finally:
        if sdpa is not None:
            F.scaled_dot_product_attention = sdpa.fn
    if sdpa is not None and sdpa.args:
        impl_call = ref_call = sdpa
        reference_fn = get_spec(op).reference_fn   # the SDPA call is judged by the op's own reference
    if status != Status.SKIP and impl_call.args:
        repro_module.write(repro["stem"], op=op, backend=repro.get("backend", ""), impl=repro.get("impl"),
                           case=repro.get("case", ""), dtype=dtype_name(dtype), device=str(device), seed=seed,
                           impl_call=impl_call, ref_call=ref_call, reference_fn=reference_fn, impl_fn=impl_fn,
                           grad_out=grad_out, bounds={c.name: c.allowed for c in comparisons}, reason=reason)
    return status, comparisons, reason


def _with_reference(spec: OpSpec, reference_fn: Callable) -> OpSpec:
    """A shallow copy of `spec` whose reference is `reference_fn` (the recorded one)."""
    import copy
    twin = copy.copy(spec)
    twin.reference_fn = reference_fn
    return twin


def _run_case(spec: OpSpec, fn: Callable, params: Dict[str, Any], dtype: torch.dtype, device: torch.device,
              seed: int, baseline_fn: Optional[Callable]):
    """run_case's body: (status, comparisons, reason, grad_out)."""
    gen = torch.Generator().manual_seed(seed)
    raw = make_inputs(spec, params, dtype, gen)
    rounded = _round_inputs(raw, spec, dtype)
    ref_inputs = {**rounded, "orig_dtype": dtype}
    cpu = torch.device("cpu")

    made: Dict[str, Optional[torch.Tensor]] = {"grad_out": None}

    def make_grad_out(shape):   # from the referee's output shape, in the same forward
        if not params.get("forward_only"):
            grad_gen = torch.Generator().manual_seed(seed + 1)
            made["grad_out"] = torch.randn(shape, generator=grad_gen, dtype=torch.float64).to(dtype).to(torch.float64)
        return made["grad_out"]

    ref_out, ref_grads, _ = _forward_backward(spec, spec.reference_fn, ref_inputs, params, make_grad_out,
                                              torch.float64, cpu, "reference")
    grad_out = made["grad_out"]

    try:
        out, grads, problems = _forward_backward(spec, fn, spec.cast_inputs(rounded, dtype, device), params,
                                                 grad_out, dtype, device, "the implementation", ref_out.shape)
        if device.type == "cuda":   # an error its kernels launched asynchronously surfaces here: the implementation's
            torch.cuda.synchronize(device)
    except BackendUnavailable as exc:
        return Status.SKIP, [], str(exc), grad_out
    except Exception as exc:  # noqa: BLE001 - an implementation that raises is a result
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
        return Status.ERROR, [], f"raised {type(exc).__name__}: {clip(exc, 400)}{where}", grad_out
    if problems:
        return Status.FAIL, [], "; ".join(problems), grad_out

    base_out, base_grads = None, {}
    if baseline_fn is not None:
        try:
            base_out, base_grads, _ = _forward_backward(spec, baseline_fn, spec.cast_inputs(rounded, dtype, device),
                                                        params, grad_out, dtype, device, "baseline")
        except Exception:  # noqa: BLE001 - without a baseline the floor alone decides
            base_out, base_grads = None, {}

    zero = spec.zero_masks(ref_inputs, params)
    valid = spec.valid_masks(ref_inputs, params)
    precision = spec.precision(dtype, device)
    # what raises each output's floor (tolerance.error_floor)
    terms = spec.error_terms(ref_inputs if grad_out is None else {**ref_inputs, "grad_out": grad_out}, params)
    comparisons = [tolerance.judge("out", out, ref_out, base_out, dtype, valid.get("out"), zero.get("out"), precision,
                                    **terms.get("out", {}))]
    for name, ref_grad in ref_grads.items():
        got = grads.get(name)
        if got is None:
            comparisons.append(Comparison(name, False, reason=f"{name}: no gradient (None) where the reference has one"))
            continue
        comparisons.append(tolerance.judge(name, got, ref_grad, base_grads.get(name), dtype, valid.get(name),
                                             zero.get(name), precision, **terms.get(name, {})))
    failed = [c for c in comparisons if not c.passed]
    status = Status.FAIL if failed else Status.PASS
    reason = "; ".join(c.reason for c in failed)
    if precision == "tf32" and not failed:
        reason = "fp32 under TF32 (torch's TF32 switch is on for this op)"
    return status, comparisons, reason, grad_out


# Device cycles the GPU sleeps before a device-time round (~30 ms at 1.7 GHz): long enough for
# the host to queue every step of the round behind it, so the round runs back to back.
SLEEP_CYCLES = 50_000_000


def time_case(op: str, fn: Callable, params: Dict[str, Any], dtype: torch.dtype, device: torch.device,
              repeats: int = 10, device_time: bool = False) -> float:
    """Median milliseconds of forward+backward on the op's timing case (for ranking backends);
    repeats=0 runs it once (compiling what it needs) and returns 0.

    Default: each step synchronised on its own (host and device time together: what a short,
    host-bound call costs). device_time=True (the training-size case on a GPU): the GPU first
    sleeps while the host queues `repeats` steps, which then run back to back; the time between
    CUDA events around them is the device's alone (a Python autograd backward costs 0.2-0.3 ms of
    host per call on an H100 host, which a training step hides behind the device's queue)."""
    spec = get_spec(op)
    gen = torch.Generator().manual_seed(0)
    inputs = spec.cast_inputs(spec.make_inputs(params, gen), dtype, device)
    for name in spec.grad_inputs:
        if isinstance(inputs.get(name), torch.Tensor) and inputs[name].is_floating_point():
            inputs[name] = inputs[name].requires_grad_(True)

    def step():
        out = spec.call(fn, inputs, params)
        out.backward(torch.ones_like(out))

    step()
    if repeats and device_time and device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        return _device_ms(step, device, repeats)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples) if samples else 0.0


def _device_ms(step: Callable[[], None], device: torch.device, repeats: int, rounds: int = 3) -> float:
    """Median over rounds of device milliseconds per step, the steps queued behind a GPU sleep."""
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        for _ in range(repeats):
            step()
        end.record()
        torch.cuda.synchronize(device)
        samples.append(start.elapsed_time(end) / repeats)
    return statistics.median(samples)
