"""The monitor's checks, off the training's hot path: a background thread takes the copies made
at a sampled call and judges them against the float64 reference under the tolerance policy
(`tolerance.py`): output, and when the backward ran, every input gradient the call
produced, with the upstream gradient the run itself fed it.

Where the check runs (`where_to_check`): a CPU call on the CPU; a GPU call, by default, on its
own GPU in float64 on a side CUDA stream when that GPU has full-rate float64 (A100, H100, H200,
B200, MI200/MI300), since on the host a 2048-token attention's float64 reference is seconds of
CPU beside the training's own host thread (measured: +7.5% / +20% step time on an H200), while
on such a GPU it is milliseconds. The side stream waits for an event recorded right after the
copies, never the other way round, so the run's stream is never held up; a check that would
not fit in the GPU's free memory runs on the CPU instead."""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import queue
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch

from .. import tolerance
from ..checks.results import Comparison
from . import slices
from .ops import OpKind

LOG = logging.getLogger("gpuparity")


@dataclasses.dataclass
class SampledCall:
    """What a sampled call left behind: detached copies (on the call's device until the worker
    moves them), made before any later in-place change could touch them."""
    kind: OpKind
    backend: str
    index: int                     # the call's number among this op's calls (0-based)
    step: int
    args: Dict[str, Any]           # bound arguments; tensors are copies
    out: torch.Tensor
    described: Dict[str, Any]      # ops.describe_args
    precision: Optional[str] = None
    grad_out: Optional[torch.Tensor] = None
    grads: Dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)   # "grad_<name>" -> copy
    note: Optional[str] = None
    slice_above: Optional[int] = None   # attention checked on one slice above this many score elements
    ready: Any = None              # a CUDA event recorded on the run's stream after the copies

    def mark_ready(self) -> None:
        """Record (on the current stream, the one the copies were made on) when they exist; a
        check on a side stream waits for this event."""
        if self.out is not None and self.out.device.type == "cuda":
            self.ready = torch.cuda.Event()
            self.ready.record(torch.cuda.current_stream(self.out.device))

    @property
    def has_backward(self) -> bool:
        return self.grad_out is not None


def _move(value, device: torch.device, dtype=None):
    if isinstance(value, torch.Tensor):
        value = value.detach().to(device)
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        return value
    return value


def _run(kind: OpKind, args: Dict[str, Any], dtype: torch.dtype, grad_names, grad_out):
    """The kind's function (reference when dtype is float64, baseline otherwise) on copies of
    args (already on the checking device) cast to dtype; returns (out, {grad_name: grad})."""
    device = next((v.device for v in args.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    inputs = {name: _move(value, device, dtype) for name, value in args.items()}
    leaves = {}
    for name in grad_names:
        leaf = inputs[name].clone().requires_grad_(True)
        inputs[name] = leaves[name] = leaf
    fn = kind.reference if dtype == torch.float64 else kind.baseline
    with torch.enable_grad():
        out = fn(inputs)
        grads = {}
        if grad_out is not None and leaves and out.requires_grad:
            out.backward(grad_out.to(out.dtype).reshape(out.shape))
            grads = {f"grad_{name}": leaf.grad for name, leaf in leaves.items()}
    return out.detach(), grads


class NotJudged(Exception):
    """A sampled call the reference cannot judge (its inputs were already non-finite)."""


def _finite(tensor) -> bool:
    return not tensor.is_floating_point() or bool(torch.isfinite(tensor).all())


def check_call(call: SampledCall, device: Optional[torch.device] = None) -> List[Comparison]:
    """Compare one sampled call with the float64 reference, forward and (if seen) backward, the
    reference and baseline computed on `device` (default: the CPU). A call whose inputs hold
    NaN/Inf is not judged (NotJudged): the run broke before it; one whose upstream gradient does
    is judged forward only, and `call.note` says so."""
    device = torch.device("cpu") if device is None else device
    here = functools.partial(_move, device=device)
    dtype = call.out.dtype
    args = {name: here(value) for name, value in call.args.items()}
    bad = [name for name in call.kind.tensors if isinstance(args.get(name), torch.Tensor) and not _finite(args[name])]
    if bad:
        raise NotJudged(f"non-finite inputs ({', '.join(bad)}): the run was already broken before this call")
    args["_dtype"] = dtype
    out = here(call.out)
    grad_out = here(call.grad_out) if call.has_backward else None
    if grad_out is not None and not _finite(grad_out):
        call.note = "backward not judged: the upstream gradient reaching this call was already non-finite"
        grad_out = None
        call.grads.clear()
    grads = {name: here(value) for name, value in call.grads.items()}
    scanned: List[Comparison] = []
    where = ""
    if call.kind.family == "attention" and call.slice_above is not None and slices.count(call.kind, args) > 1 \
            and _score_elements(call.kind, args) > call.slice_above:
        valid = call.kind.valid(args) if call.kind.valid else {}
        scanned = slices.scan_nonfinite([("out", out), *grads.items()], valid)
        args, out, grad_out, grads, where = slices.take(call.kind, args, out, grad_out, grads, call.index)
    grad_names = [name[len("grad_"):] for name in grads]
    ref_out, ref_grads = _run(call.kind, args, torch.float64, grad_names, None if grad_out is None else
                              grad_out.to(torch.float64))
    valid = call.kind.valid(args) if call.kind.valid else {}
    zero = call.kind.must_be_zero(args) if call.kind.must_be_zero else {}

    def judged(base_out, base_grads, terms):
        comparisons = [tolerance.judge("out", out, ref_out, base_out, dtype, valid.get("out"), zero.get("out"),
                                       call.precision, **terms.get("out", {}))]
        for name, got in grads.items():
            ref = ref_grads.get(name)
            if ref is not None:
                comparisons.append(tolerance.judge(name, got, ref, base_grads.get(name), dtype,
                                                   valid.get(name), zero.get(name), call.precision,
                                                   **terms.get(name, {})))
        return comparisons
    # The bound is max(2 x the baseline's error, the output's floor): a call within the dtype's flat
    # floor passes whatever the baseline, so the same-dtype baseline (as costly as the reference)
    # and the floor's terms (a pass over the logits) are computed only when something is above it.
    # Same verdicts, about half the work of a passing check.
    comparisons = judged(None, {}, {})
    if not all(c.passed for c in comparisons):
        terms = call.kind.error_terms(args) if call.kind.error_terms else {}
        try:
            base_out, base_grads = _run(call.kind, args, dtype, grad_names, grad_out)
        except Exception:  # noqa: BLE001 - without a baseline the floor alone decides (as the battery)
            base_out, base_grads = None, {}
        comparisons = judged(base_out, base_grads or {}, terms)
    if where:
        for comparison in comparisons:
            if comparison.reason:
                comparison.reason = f"{comparison.reason} (checked on {where})"
    return scanned + comparisons


def _score_elements(kind: OpKind, args: Dict[str, Any]) -> int:
    """B x H x Sq x Sk: the size of the float64 reference's score matrix."""
    q, k = args[kind.tensors[0]], args[kind.tensors[1]]
    return int(q.shape[:-1].numel() * k.shape[-2])


def _lower_priority() -> None:
    """Nice the checker thread (Linux: per thread; the OpenMP threads it starts inherit it), so
    the run's own threads come first on a busy host."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


# NVIDIA compute capabilities with full-rate float64 (P100, V100, A100, H100/H200, B200); the
# others run float64 at 1/32 to 1/64 of float32, where the host is the better place.
FAST_FP64_CAPABILITIES = ((6, 0), (7, 0), (8, 0), (9, 0), (10, 0))
FAST_FP64_AMD = ("gfx90a", "gfx94", "gfx95")     # MI200, MI300, MI350
CHECK_DEVICES = ("auto", "device", "cpu")
GPU_MEMORY_SHARE = 0.5   # a GPU check may take at most this share of the device's free memory


def fast_fp64(device: torch.device) -> bool:
    """Whether `device` is a GPU whose float64 runs at full rate."""
    if device.type != "cuda":
        return False
    props = torch.cuda.get_device_properties(device)
    if getattr(torch.version, "hip", None):
        return str(getattr(props, "gcnArchName", "")).startswith(FAST_FP64_AMD)
    return (props.major, props.minor) in FAST_FP64_CAPABILITIES


def where_to_check(call_device: torch.device, check_device: str) -> torch.device:
    """The device a sampled call's float64 check runs on (module docstring): "cpu" always the CPU;
    "device" the call's own device; "auto" the call's GPU when its float64 is fast, else the CPU."""
    if call_device.type == "cpu" or check_device == "cpu":
        return torch.device("cpu")
    if check_device == "device" or fast_fp64(call_device):
        return call_device
    return torch.device("cpu")


def check_bytes(call: SampledCall) -> int:
    """About the device memory a check holds at its peak: float64 copies of the inputs and, for
    attention, a handful of float64 score-sized tensors (scores, probabilities, their grads),
    of the slice where the call is checked on one."""
    tensors = [v for v in call.args.values() if isinstance(v, torch.Tensor)]
    inputs = sum(t.numel() for t in tensors) + call.out.numel() * 4
    if call.kind.family == "attention":
        scores = _score_elements(call.kind, call.args)
        if call.slice_above is not None and scores > call.slice_above:
            scores //= max(slices.count(call.kind, call.args), 1)
            inputs //= max(slices.count(call.kind, call.args), 1)
        return 8 * (2 * inputs + 6 * scores)
    return 8 * 6 * inputs


class Checker:
    """One daemon thread draining a bounded queue. `submit` never blocks: when the queue is full
    the sample is dropped and counted, so a slow check can never stall the run."""

    def __init__(self, handle: Callable[[SampledCall, Optional[List[Comparison]], Optional[str]], None],
                 max_pending: int = 2, threads: Optional[int] = None, check_device: str = "auto"):
        if check_device not in CHECK_DEVICES:
            raise ValueError(f"check_device: expected one of {CHECK_DEVICES}, got {check_device!r}")
        self._queue: "queue.Queue[Optional[SampledCall]]" = queue.Queue(maxsize=max_pending)
        self._handle = handle
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.dropped = 0
        self.busy_s = 0.0
        self._running_since: Optional[float] = None   # perf_counter() when the check now running began
        self.threads = threads if threads is not None else max(1, (os.cpu_count() or 4) // 4)
        self.check_device = check_device
        self.checked_on: Dict[str, int] = {}      # "cuda:0" / "cpu" -> checks run there
        self.moved_to_cpu = 0                      # GPU checks that did not fit the free memory
        self._streams: Dict[int, Any] = {}

    def submit(self, call: SampledCall, wait: bool = False) -> bool:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="gpuparity-monitor", daemon=True)
                self._thread.start()
        if call.ready is None:
            call.mark_ready()
        try:
            self._queue.put(call, block=wait)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def room(self) -> bool:
        return not self._queue.full()

    def busy_now(self) -> float:
        """Seconds spent checking so far, the check now running included."""
        since = self._running_since
        return self.busy_s + (time.perf_counter() - since if since is not None else 0.0)

    def _check(self, call: SampledCall) -> List[Comparison]:
        device = where_to_check(call.out.device, self.check_device)
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            if check_bytes(call) > GPU_MEMORY_SHARE * free:
                self.moved_to_cpu += 1
                device = torch.device("cpu")
        key = str(device)
        self.checked_on[key] = self.checked_on.get(key, 0) + 1
        if device.type != "cuda":
            if call.ready is not None:
                call.ready.synchronize()
            return check_call(call, device)
        stream = self._streams.get(device.index)
        if stream is None:
            stream = self._streams[device.index] = torch.cuda.Stream(device)
        with torch.cuda.device(device), torch.cuda.stream(stream):
            if call.ready is not None:
                stream.wait_event(call.ready)
            try:
                return check_call(call, device)
            finally:
                # the copies were made on the run's stream: they are released (and their memory
                # may go back to it) only once this stream is done reading them
                stream.synchronize()

    def _loop(self) -> None:
        # the checks' own F.* calls (references, baselines) must never be watched themselves
        from .capture import DEPTH
        DEPTH.__enter__()
        _lower_priority()
        capped = False
        while True:
            call = self._queue.get()
            try:
                if call is None:
                    return
                if not capped and call.out.device.type != "cpu":
                    # OpenMP thread counts are per thread: this caps the checker's own CPU work
                    # and leaves the cores to the run's host thread (not done for a CPU run,
                    # whose numbers must not depend on anything the monitor does)
                    torch.set_num_threads(self.threads)
                    capped = True
                started = self._running_since = time.perf_counter()
                try:
                    comparisons, error = self._check(call), None
                except NotJudged as exc:
                    comparisons, error = None, f"not judged: {exc}"
                except Exception as exc:  # noqa: BLE001 - a check that cannot run is reported, not raised
                    frames = traceback.extract_tb(exc.__traceback__)
                    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
                    comparisons, error = None, f"{type(exc).__name__}: {str(exc)[:300]}{where}"
                self.busy_s += time.perf_counter() - started
                self._running_since = None
                self._handle(call, comparisons, error)
            finally:
                self._queue.task_done()

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until every submitted check has run (True), or timeout seconds (False)."""
        if self._thread is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
