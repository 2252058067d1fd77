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
not fit in the GPU's free memory runs on the CPU instead.

What is computed in float64 (`check_call`, slices.py): a large call's slices, an exact
sub-problem (strided rows of a norm / softmax, heads of rotary, one batch item and KV head group
of attention), and a norm's weight gradients whole with only the weights as leaves; the whole
outputs are scanned for NaN/Inf. A check's host time is the ops it launches (each one Python's
GIL taken from the run's thread) and its host syncs, so it reads the device twice: the inputs'
NaN/Inf sums before the reference, then every small result at once (the outputs' NaN/Inf sums
and each comparison's norms and worst element, `_summary`), from which a clear pass is decided
on the host; only a comparison that is not one (near its bound, a NaN, a masked row not 0) goes
through tolerance.judge, with its baseline and its syncs. The checker waits for its GPU work by
polling an event (`Checker._settle`), so it neither spins a core nor counts that wait as the
host time that `max_overhead` bounds."""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import queue
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

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
    slice_rows_above: Optional[int] = None   # row-wise ops checked on strided rows above this many elements
    pick: Optional[int] = None     # which slice (the op's sample number; None: the call number)

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
    """value on `device` (floating tensors cast to dtype when given), detached; one tensor op at
    most, none where nothing changes (each op is host time beside the run's own thread)."""
    if not isinstance(value, torch.Tensor):
        return value
    if dtype is None or not value.is_floating_point():
        dtype = value.dtype
    if value.requires_grad:
        value = value.detach()
    if value.device != device or value.dtype != dtype:
        return value.to(device=device, dtype=dtype)
    return value


def _run(kind: OpKind, args: Dict[str, Any], dtype: torch.dtype, grad_names, grad_out):
    """The kind's function (reference when dtype is float64, baseline otherwise) on copies of
    args (already on the checking device) cast to dtype; returns (out, {grad_name: grad})."""
    device = next((v.device for v in args.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    inputs = {name: _move(value, device, dtype) for name, value in args.items()}
    leaves = {}
    for name in grad_names:
        # the cast is a tensor of its own; an argument already in dtype gets a new tensor object
        # (the copies keep requires_grad=False), sharing its data: autograd only reads a leaf's data
        leaf = inputs[name] if inputs[name] is not args[name] else inputs[name].detach()
        inputs[name] = leaves[name] = leaf.requires_grad_(True)
    fn = kind.reference if dtype == torch.float64 else kind.baseline
    with torch.enable_grad():
        out = fn(inputs)
        grads = {}
        if grad_out is not None and leaves and out.requires_grad:
            # sum(out * grad_out) has exactly grad_out as its gradient at out; a backward from a
            # scalar keeps autograd from importing torch.fx's symbolic shapes (sympy: 1.6 s of
            # the GIL) at the first check, as out.backward(grad_out) does
            (out * grad_out.to(out.dtype).reshape(out.shape)).sum().backward()
            grads = {f"grad_{name}": leaf.grad for name, leaf in leaves.items()}
    return out.detach(), grads


class NotJudged(Exception):
    """A sampled call the reference cannot judge (its inputs were already non-finite)."""


@dataclasses.dataclass
class _Part:
    """One float64 comparison of a check: the arguments it runs the reference on and the call's
    output / gradients it judges (a slice, or the whole call), `where` saying which."""
    args: Dict[str, Any]
    out: Optional[torch.Tensor]
    grad_out: Optional[torch.Tensor]
    grads: Dict[str, torch.Tensor]
    where: str = ""
    reference: Optional[Callable[[Dict[str, Any]], torch.Tensor]] = None   # a forward-only float64 output instead of kind's


def _parts(call: SampledCall, args, out, grad_out, grads) -> Tuple[List[_Part], List[Tuple[str, torch.Tensor]], Dict]:
    """What a check compares (slices.py): the parts, and the whole tensors to scan for NaN/Inf
    (with their masks of meaningful elements) when the parts do not cover them."""
    kind, pick = call.kind, call.index if call.pick is None else call.pick
    whole = [("out", out), *grads.items()]
    if kind.family == "attention":
        if call.slice_above is not None and slices.count(kind, args) > 1 and _score_elements(kind, args) > call.slice_above:
            valid = kind.valid(args) if kind.valid else {}
            sliced, s_out, s_grad_out, s_grads, where = slices.take(kind, args, out, grad_out, grads, pick)
            return [_Part(sliced, s_out, s_grad_out, s_grads, where)], whole, valid
        return [_Part(args, out, grad_out, grads)], [], {}
    layout = slices.rows_of(kind, args) if call.slice_rows_above is not None else None
    stride = slices.row_stride(layout, call.slice_rows_above) if layout is not None else 1
    if stride <= 1:
        return [_Part(args, out, grad_out, grads)], [], {}
    rows = slices.strided_rows(layout.rows, stride, pick)
    if kind.family == "loss":
        return _loss_parts(args, out, grad_out, grads, layout, rows), whole, {}
    x = kind.tensors[0]
    sliced = {**args, **layout.args, x: layout.select(args[x], rows)}
    row_grads = {name: layout.select(g, rows) for name, g in grads.items() if name == "grad_" + x}
    parts = [_Part(sliced, layout.select(out, rows), None if grad_out is None else layout.select(grad_out, rows),
                   row_grads, slices.row_label(layout, rows))]
    summed = {name: g for name, g in grads.items() if name not in row_grads}
    if summed:   # a weight's gradient sums every row: judged whole, with only the weights as leaves
        parts.append(_Part(args, None, grad_out, summed))
    return parts, whole, {}


def _loss_parts(args, out, grad_out, grads, layout: slices.Rows, rows: slice) -> List[_Part]:
    """F.cross_entropy on strided rows (slices.py): grad_input's rows from those rows' "sum"
    loss; the loss itself, when reduced, against the float64 loss in chunks."""
    sliced = {**args, "input": layout.select(args["input"], rows), "target": layout.select(args["target"], rows)}
    row_grads = {name: layout.select(g, rows) for name, g in grads.items()}
    where = slices.row_label(layout, rows)
    if args.get("reduction") == "none":
        return [_Part(sliced, layout.select(out, rows), None if grad_out is None else layout.select(grad_out, rows),
                      row_grads, where)]
    parts = [_Part(args, out, None, {}, reference=slices.loss_in_chunks)]
    if grad_out is not None and row_grads:
        scale = slices.loss_denominator(args) if args.get("reduction") == "mean" else 1.0
        parts.append(_Part({**sliced, "reduction": "sum"}, None, grad_out.to(torch.float64) / scale, row_grads, where))
    return parts


def check_call(call: SampledCall, device: Optional[torch.device] = None,
               settle: Optional[Callable[[], None]] = None) -> List[Comparison]:
    """Compare one sampled call with the float64 reference, forward and (if seen) backward, the
    reference and baseline computed on `device` (default: the CPU), on the slices of slices.py
    when the call is large. A call whose inputs hold NaN/Inf is not judged (NotJudged): the run
    broke before it; one whose upstream gradient does is judged forward only, and `call.note`
    says so. `settle()` (a GPU check: wait, without spinning, for the work queued so far) is
    called before each read of a result, so the host syncs that remain wait for small kernels."""
    device = torch.device("cpu") if device is None else device
    here = functools.partial(_move, device=device)
    kind, dtype = call.kind, call.out.dtype
    args = dict(call.args)                       # on the call's device: slices are taken there
    grad_out = call.grad_out if call.has_backward else None
    grads = dict(call.grads) if grad_out is not None else {}
    names = [name for name in kind.tensors if isinstance(args.get(name), torch.Tensor)]
    watched = [args[name] for name in names] + ([grad_out] if grad_out is not None else [])
    sums = slices.nonfinite_sums(watched)
    if settle is not None:
        settle()
    flags = slices.flagged(sums.tolist() if sums is not None else None)
    flags = [flag and slices.nonfinite_count(tensor)[0] > 0 for tensor, flag in zip(watched, flags)]
    bad = [name for name, flag in zip(names, flags) if flag]
    if bad:
        raise NotJudged(f"non-finite inputs ({', '.join(bad)}): the run was already broken before this call")
    if grad_out is not None and flags[-1]:
        call.note = "backward not judged: the upstream gradient reaching this call was already non-finite"
        grad_out, grads = None, {}
        call.grads.clear()
    parts, scan, scan_valid = _parts(call, args, call.out, grad_out, grads)
    references = []
    for part in parts:
        part.args = {name: here(value) for name, value in part.args.items()}
        part.args["_dtype"] = dtype
        part.out = None if part.out is None else here(part.out)
        part.grad_out = None if part.grad_out is None else here(part.grad_out)
        part.grads = {name: here(value) for name, value in part.grads.items()}
        grad_names = [name[len("grad_"):] for name in part.grads]
        if part.reference is not None:
            references.append((part.reference(part.args), {}))
            continue
        references.append(_run(kind, part.args, torch.float64, grad_names,
                               None if part.grad_out is None else part.grad_out.to(torch.float64)))
    # every small result of the check (the whole outputs' NaN/Inf sums, each comparison's norms
    # and worst element) goes to the host in one copy, after one wait for the GPU work
    scan_sums = slices.nonfinite_sums([t for _, t in scan], [scan_valid.get(name) for name, _ in scan])
    summaries = [_summarize(kind, part, ref_out, ref_grads) for part, (ref_out, ref_grads) in zip(parts, references)]
    flat = [value for _valid, _zero, items in summaries if items is not None for _name, stats, _shape in items
            for value in stats]
    tensors = [value for value in flat if isinstance(value, torch.Tensor)]
    small = [torch.stack(tensors)] if tensors else []
    if settle is not None:
        settle()
    if scan_sums is not None:      # the call's device: a CPU check of a GPU call copies them once they exist
        small.insert(0, scan_sums.to(device))
    read = iter(torch.cat(small).tolist() if small else [])
    scanned = slices.scan_nonfinite(scan, scan_valid, slices.flagged([next(read) for _ in scan]))
    values = [next(read) if isinstance(value, torch.Tensor) else value for value in flat]
    comparisons: List[Comparison] = []
    for part, (ref_out, ref_grads), (valid, zero, items) in zip(parts, references, summaries):
        quick = None
        if items is not None:
            mine, values = values[:SUMMARY * len(items)], values[SUMMARY * len(items):]
            quick = [_passed(name, mine[SUMMARY * i:SUMMARY * (i + 1)], shape, dtype, call.precision)
                     for i, (name, _stats, shape) in enumerate(items)]
        if quick is not None and all(c is not None for c in quick):
            comparisons += quick
        else:         # something is not a clear pass: the tolerance policy's own judge decides
            comparisons += _judge_part(kind, part, ref_out, ref_grads, dtype, call.precision, valid, zero)
    return scanned + comparisons


# _summary's values per comparison: ||out - ref||, ||ref||, the meaningful elements, the elements
# that must be 0 and are not, the largest |out - ref| and where it is (flat index)
SUMMARY = 6
# a comparison within this share of its bound is judged by tolerance.judge itself: the summary's
# norms may differ from relative_error's in the last bits (another summation order)
SUMMARY_MARGIN = 1e-6


def _summary(got, ref: torch.Tensor, valid, zero) -> Optional[List[Any]]:
    """tolerance.judge's measurements of one output: SUMMARY values, each a 0-d tensor on the
    reference's device (unread: a handful of ops, no host sync) or a number known here; None where
    judge's early answers apply (not a tensor, another shape, no elements)."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(ref.shape) or ref.numel() == 0:
        return None
    where = ref.device
    out64 = got.to(where, torch.float64)
    ref64 = ref.to(torch.float64)
    diff = out64 - ref64
    drop = None if valid is None else ~valid.to(where).expand_as(ref64)
    bad_zero, count = 0.0, float(ref64.numel())
    if zero is not None:
        zero_full = zero.to(where).expand_as(ref64)
        bad_zero = (zero_full & (out64 != 0)).sum()
        drop = zero_full if drop is None else drop | zero_full
    if drop is not None:
        diff, ref64, count = diff.masked_fill(drop, 0.0), ref64.masked_fill(drop, 0.0), drop.numel() - drop.sum()
    worst, index = torch.max(diff.abs().reshape(-1), 0)
    return [torch.linalg.vector_norm(diff), torch.linalg.vector_norm(ref64), count, bad_zero, worst, index]


def _summarize(kind: OpKind, part: _Part, ref_out, ref_grads):
    """(valid, zero, [(name, summary, shape)] in judge's order, or None where any output needs
    tolerance.judge itself)."""
    valid = kind.valid(part.args) if kind.valid else {}
    zero = kind.must_be_zero(part.args) if kind.must_be_zero else {}
    named = ([("out", part.out, ref_out)] if part.out is not None else []) + [
        (name, got, ref_grads.get(name)) for name, got in part.grads.items() if ref_grads.get(name) is not None]
    items = []
    for name, got, ref in named:
        stats = _summary(got, ref, valid.get(name), zero.get(name))
        if stats is None:
            return valid, zero, None
        items.append((name, stats, tuple(ref.shape)))
    return valid, zero, items


def _passed(name: str, values: List[float], shape, dtype, precision) -> Optional[Comparison]:
    """The passing Comparison tolerance.judge would give these _summary values without a baseline
    (the first of its two judgements), or None: not a clear pass, for judge itself to settle."""
    diff, norm, count, bad_zero, max_abs, index = values
    if bad_zero or not (math.isfinite(diff) and math.isfinite(norm)):
        return None
    err = diff / norm if norm != 0.0 else diff / max(count, 1.0) ** 0.5
    allowed = tolerance.allowed_error(None, dtype, precision)
    if not err <= allowed * (1 - SUMMARY_MARGIN):
        return None
    return Comparison(name, True, err=err, baseline_err=None, allowed=allowed, max_abs=max_abs,
                      worst_index=tolerance.unravel(int(index), shape), reason="")


def _judge_part(kind: OpKind, part: _Part, ref_out, ref_grads, dtype, precision, valid=None, zero=None
                ) -> List[Comparison]:
    valid = (kind.valid(part.args) if kind.valid else {}) if valid is None else valid
    zero = (kind.must_be_zero(part.args) if kind.must_be_zero else {}) if zero is None else zero

    def judged(base_out, base_grads, terms):
        comparisons = []
        if part.out is not None:
            comparisons.append(tolerance.judge("out", part.out, ref_out, base_out, dtype, valid.get("out"),
                                               zero.get("out"), precision, **terms.get("out", {})))
        for name, got in part.grads.items():
            ref = ref_grads.get(name)
            if ref is not None:
                comparisons.append(tolerance.judge(name, got, ref, base_grads.get(name), dtype,
                                                   valid.get(name), zero.get(name), precision,
                                                   **terms.get(name, {})))
        return comparisons
    # The bound is max(2 x the baseline's error, the output's floor): a call within the dtype's flat
    # floor passes whatever the baseline, so the same-dtype baseline (as costly as the reference)
    # and the floor's terms (a pass over the logits) are computed only when something is above it.
    # Same verdicts, about half the work of a passing check.
    comparisons = judged(None, {}, {})
    if not all(c.passed for c in comparisons):
        terms = kind.error_terms(part.args) if kind.error_terms else {}
        grad_names = [name[len("grad_"):] for name in part.grads]
        try:
            base_out, base_grads = _run(kind, part.args, dtype, grad_names, part.grad_out)
        except Exception:  # noqa: BLE001 - without a baseline the floor alone decides (as the battery)
            base_out, base_grads = None, {}
        comparisons = judged(base_out, base_grads or {}, terms)
    if part.where:
        for comparison in comparisons:
            if comparison.reason:
                comparison.reason = f"{comparison.reason} (checked on {part.where})"
    return comparisons


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
POLL_S = 2e-4            # how often a check waiting for its GPU work looks (asleep in between)


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


def float64_elements(kind: OpKind, args: Dict[str, Any], slice_above: Optional[int],
                       slice_rows_above: Optional[int], summed_grads: bool = False) -> int:
    """The size of the float64 reference's largest tensor: attention's score matrix (of one slice
    when the call is checked on slices); a row-wise op's checked rows (its whole input when a
    weight's gradient is judged too: that sums every row); else the largest input."""
    if kind.family == "attention":
        size = _score_elements(kind, args)
        if slice_above is not None and size > slice_above:
            size //= max(slices.count(kind, args), 1)
        return size
    whole = max((v.numel() for v in args.values() if isinstance(v, torch.Tensor)), default=0)
    layout = slices.rows_of(kind, args) if slice_rows_above is not None else None
    if layout is None or summed_grads:
        return whole
    checked = -(-layout.rows // slices.row_stride(layout, slice_rows_above)) * layout.width
    if kind.family == "loss" and args.get("reduction") != "none":
        checked = max(checked, slices.LOSS_CHUNK)      # the float64 loss, in chunks
    return min(whole, checked)


def check_bytes(call: SampledCall) -> int:
    """About the device memory a check holds at its peak: float64 copies of the inputs and, for
    attention, a handful of float64 score-sized tensors (scores, probabilities, their grads),
    of the slice where the call is checked on one."""
    if call.kind.family == "attention":
        tensors = [v for v in call.args.values() if isinstance(v, torch.Tensor)]
        inputs = sum(t.numel() for t in tensors) + call.out.numel() * 4
        scores = _score_elements(call.kind, call.args)
        if call.slice_above is not None and scores > call.slice_above:
            scores //= max(slices.count(call.kind, call.args), 1)
            inputs //= max(slices.count(call.kind, call.args), 1)
        return 8 * (2 * inputs + 6 * scores)
    summed = any(name != "grad_" + call.kind.tensors[0] for name in call.grads)
    return 8 * 6 * float64_elements(call.kind, call.args, call.slice_above, call.slice_rows_above, summed)


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
        self.busy_s = 0.0                          # host time of the checks (budget: max_overhead)
        self.gpu_wait_s = 0.0                      # time the checks waited, asleep, for their GPU work
        self.longest_s = 0.0                       # host time of the longest check so far
        self._running_since: Optional[float] = None   # perf_counter() when the check now running began
        self._waiting = 0.0                        # GPU wait of the check now running
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
        """Host seconds spent checking so far, the check now running included: wall time less
        the time a check waited, asleep, for its GPU work (`_settle`)."""
        return self.busy_s + self._running_s()

    def busy_beyond_longest(self) -> float:
        """busy_now() less the longest single check (the one running included): the budget's
        measure, so that one check's worth of time is always allowed (the first sample, and a
        second one early in a run, when the monitored time is still short)."""
        running = self._running_s()
        return self.busy_s + running - max(self.longest_s, running)

    def _running_s(self) -> float:
        since = self._running_since
        return 0.0 if since is None else max(0.0, time.perf_counter() - since - self._waiting)

    def _settle(self, stream) -> None:
        """Wait for the work queued on `stream` so far by polling an event (sleeping between
        polls: a blocking sync may spin a core) and count the time as GPU wait, not host work."""
        event = torch.cuda.Event()
        event.record(stream)
        started = time.perf_counter()
        while not event.query():
            time.sleep(POLL_S)
        waited = time.perf_counter() - started
        self._waiting += waited
        self.gpu_wait_s += waited

    def _check(self, call: SampledCall) -> List[Comparison]:
        call_device = call.out.device
        device = where_to_check(call_device, self.check_device)
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            if check_bytes(call) > GPU_MEMORY_SHARE * free:
                self.moved_to_cpu += 1
                device = torch.device("cpu")
        key = str(device)
        self.checked_on[key] = self.checked_on.get(key, 0) + 1
        if call_device.type != "cuda":
            return check_call(call, device)
        # a GPU call: its slices are taken (and a CPU check's copied to the host) on a side
        # stream that waits for the copies' event; the run's stream never waits for a check
        stream = self._streams.get(call_device.index)
        if stream is None:
            stream = self._streams[call_device.index] = torch.cuda.Stream(call_device)
        with torch.cuda.device(call_device), torch.cuda.stream(stream):
            if call.ready is not None:
                stream.wait_event(call.ready)
            try:
                return check_call(call, device, settle=functools.partial(self._settle, stream))
            finally:
                # the copies were made on the run's stream: they are released (and their memory
                # may go back to it) only once this stream is done reading them
                self._settle(stream)

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
                self._waiting = 0.0
                started = self._running_since = time.perf_counter()
                try:
                    comparisons, error = self._check(call), None
                except NotJudged as exc:
                    comparisons, error = None, f"not judged: {exc}"
                except Exception as exc:  # noqa: BLE001 - a check that cannot run is reported, not raised
                    frames = traceback.extract_tb(exc.__traceback__)
                    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
                    comparisons, error = None, f"{type(exc).__name__}: {str(exc)[:300]}{where}"
                took = max(0.0, time.perf_counter() - started - self._waiting)
                self.busy_s += took
                self.longest_s = max(self.longest_s, took)
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
