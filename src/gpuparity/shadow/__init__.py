"""Shadow checks of a real run: `gpuparity.monitor(model, every=N)` samples every N-th call of
each watched op the run makes (F.scaled_dot_product_attention, F.layer_norm, F.rms_norm,
F.softmax, F.cross_entropy, gpuparity's attention / norms / rotary, a model's own RMSNorm
modules), copies its inputs and output at the call and its upstream and input gradients in the
backward, and checks them against the float64 reference in a background thread under the
tolerance policy. The run's own tensors are never touched: the loss and gradients are bitwise
those of the run without the monitor.

    with gpuparity.monitor(model, every=100) as mon:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
            mon.step()                       # optional: steps count model forwards otherwise
    print(mon.report().summary())            # failures carry op, backend, shapes, step, repro

docs/monitor.md has the rest (the transformers callback, torch.compile, costs).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from . import capture, checker, ops, repro
from .checker import Checker, SampledCall

LOG = logging.getLogger("gpuparity")

MAX_WAITING = 16   # sampled calls held for their backward at most
MAX_OVERHEAD = 0.05   # the checks' host time, as a share of the monitored time, above which samples wait

__all__ = ["Monitor", "MonitorReport", "monitor"]


@dataclasses.dataclass
class MonitorReport:
    sampled: Dict[str, int]
    checked: Dict[str, int]
    calls: Dict[str, int]
    failures: List[Dict[str, Any]]
    errors: List[Dict[str, Any]]
    notes: List[Dict[str, Any]]
    skipped: Dict[str, int]
    dropped: int
    unseen: Optional[str] = None
    over_budget: int = 0       # samples not taken to keep the checks within max_overhead
    max_overhead: Optional[float] = None
    checked_on: Dict[str, int] = dataclasses.field(default_factory=dict)   # "cuda:0" / "cpu" -> checks
    moved_to_cpu: int = 0      # GPU checks run on the CPU because they did not fit the free GPU memory
    due: Dict[str, int] = dataclasses.field(default_factory=dict)   # calls due for a sample (every N-th)
    check_host_s: float = 0.0  # host time of the checks (what max_overhead bounds)
    check_gpu_wait_s: float = 0.0   # time the checks waited, asleep, for their GPU work

    @property
    def not_checked(self) -> int:
        """Due samples that were not checked (over budget, dropped, not checkable, errors)."""
        return max(0, sum(self.due.values()) - sum(self.checked.values()))

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> Dict[str, Any]:
        return {"schema_version": 1, **dataclasses.asdict(self), "passed": self.passed}

    def summary(self) -> str:
        due, checked = sum(self.due.values()), sum(self.checked.values())
        lines = [f"gpuparity monitor: {checked} of {due} due samples checked, {len(self.failures)} failed"
                 + (f"; not checked: {self.over_budget} over budget, {self.dropped} dropped (checker busy), "
                    f"{max(0, self.not_checked - self.over_budget - self.dropped)} not checkable or in error "
                    f"(below)" if self.not_checked else "")]
        if self.over_budget:
            lines.append(f"  {self.over_budget} samples not taken to keep the checks within max_overhead="
                         f"{self.max_overhead:.0%} of the monitored time (their host time)")
        if checked:
            lines.append(f"  checks: {self.check_host_s:.3g} s of host time, {self.check_gpu_wait_s:.3g} s "
                         f"waiting for their GPU work")
        if self.checked_on:
            lines.append("  float64 checks ran on " + ", ".join(f"{where} ({n})" for where, n in sorted(self.checked_on.items()))
                         + (f"; {self.moved_to_cpu} moved to the CPU (GPU memory)" if self.moved_to_cpu else ""))
        for name in sorted(self.calls):
            lines.append(f"  {name}: {self.calls[name]} calls, {self.due.get(name, 0)} due, "
                         f"{self.sampled.get(name, 0)} sampled, {self.checked.get(name, 0)} checked")
        for reason, count in sorted(self.skipped.items()):
            lines.append(f"  not checked ({count}): {reason}")
        for error in self.errors[:3]:
            lines.append(f"  check error: {error['op']} at step {error['step']}: {error['error']}")
        for failure in self.failures[:5]:
            lines.append(f"  FAIL {failure['op']} [{failure['backend']}] step {failure['step']} call {failure['call']}: "
                         f"{failure['dtype']} {failure['shapes']}: {failure['reason']}")
            if failure.get("repro"):
                lines.append(f"       repro: {failure['repro']['rerun']}")
        if self.unseen:
            lines.append(f"  not seen: {self.unseen}")
        return "\n".join(lines)


def _describe_backend(kind: ops.OpKind, bound: Dict[str, Any], backend: Optional[str]) -> str:
    if backend is not None:
        return backend
    if kind is ops.SDPA:
        return f"sdpa {ops.sdpa_choice(bound)}"
    first = bound.get(kind.tensors[0])
    return f"torch ({first.device.type})" if isinstance(first, torch.Tensor) else "torch"


def _precision(kind: ops.OpKind, dtype: torch.dtype, device: torch.device) -> Optional[str]:
    """fp32 attention on a GPU may run on TF32 units when torch's switches allow it (docs/design.md)."""
    if dtype == torch.float32 and device.type == "cuda" and kind.family == "attention":
        if torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32:
            return "tf32"
    return None


def _replace_arg(kind: ops.OpKind, args: tuple, kwargs: dict, name: str, value) -> tuple:
    names = [p for p, _ in kind.params]
    position = names.index(name) if name in names else None
    if position is not None and position < len(args):
        args = args[:position] + (value,) + args[position + 1:]
    else:
        kwargs = {**kwargs, name: value}
    return args, kwargs


class _Tap(torch.autograd.Function):
    """Identity on one input of a sampled call; its backward sees that call's own gradient for
    the input (not the sum over the tensor's other uses) and passes it on unchanged."""

    @staticmethod
    def forward(ctx, x, pending, name):
        ctx.pending, ctx.name = pending, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.pending.arrived("grad_" + ctx.name, grad)
        return grad, None, None


class _Pending:
    """A sampled call waiting for its backward: the upstream gradient and one gradient per
    tapped input; the last to arrive sends the call to the checker."""

    def __init__(self, owner: "Monitor", call: SampledCall, names: List[str]):
        self.owner, self.call = owner, call
        self.waiting = {"grad_out", *("grad_" + n for n in names)}
        self.lock = threading.Lock()

    def arrived(self, name: str, grad: torch.Tensor) -> None:
        copy = grad.detach().clone()
        with self.lock:
            if name == "grad_out":
                self.call.grad_out = copy
            else:
                self.call.grads[name] = copy
            self.waiting.discard(name)
            done = not self.waiting
        if done:
            self.owner._backward_seen(self)

    def grad_out_hook(self, grad):
        self.arrived("grad_out", grad)
        return None  # the gradient flows on unchanged


class Monitor:
    """See the module docstring. Use through `gpuparity.monitor(...)`."""

    def __init__(self, model: Optional[torch.nn.Module] = None, every: int = 100, *, ops_filter=None,
                 repro_dir: Optional[str] = None, max_pending: int = 4, max_reference_elements: int = 2 ** 28,
                 drain_timeout: Optional[float] = 600.0, on_failure: Optional[Callable[[Dict[str, Any]], None]] = None,
                 check_threads: Optional[int] = None, slice_attention_above: Optional[int] = 2 ** 22,
                 check_device: str = "auto", max_overhead: Optional[float] = MAX_OVERHEAD,
                 slice_rows_above: Optional[int] = 2 ** 16):
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module or None, got {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every: expected a positive int (check every N-th call of each op), got {every!r}")
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending: expected a positive int, got {max_pending!r}")
        if max_overhead is not None and (isinstance(max_overhead, bool) or not isinstance(max_overhead, (int, float))
                                         or not 0 < max_overhead <= 1):
            raise ValueError(f"max_overhead: expected a fraction in (0, 1] of the monitored time the checks may "
                             f"take, or None for no limit, got {max_overhead!r}")
        self.model, self.every, self.repro_dir = model, every, repro_dir
        self.max_overhead = max_overhead
        self._active_s = 0.0                  # monitored time of earlier with-blocks
        self._entered: Optional[float] = None
        self._over_budget = 0
        self.ops_filter = None if ops_filter is None else set(ops_filter)
        self.max_reference_elements = max_reference_elements
        self.slice_attention_above = slice_attention_above
        for name, value in (("slice_attention_above", slice_attention_above), ("slice_rows_above", slice_rows_above)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: expected a positive int (elements) or None (always whole), got {value!r}")
        self.slice_rows_above = slice_rows_above
        self.drain_timeout, self.on_failure = drain_timeout, on_failure
        self._checker = Checker(self._checked, max_pending, check_threads, check_device)
        self._lock = threading.Lock()
        self._calls: Dict[str, int] = collections.Counter()
        self._due: Dict[str, int] = collections.Counter()
        self._sampled: Dict[str, int] = collections.Counter()
        self._checked_counts: Dict[str, int] = collections.Counter()
        self._skipped: Dict[str, int] = collections.Counter()
        self._pending: List[_Pending] = []
        self.failures: List[Dict[str, Any]] = []
        self.errors: List[Dict[str, Any]] = []
        self.notes: List[Dict[str, Any]] = []   # calls judged forward only, with why
        self._step: Optional[int] = None
        self._forwards = 0
        self._handles: List[Any] = []
        self._modules: List[Any] = []
        self._unseen: Optional[str] = None
        self._active = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Monitor":
        if self._active:
            raise RuntimeError("gpuparity monitor: this monitor is already active (use a new one to nest)")
        self._active = True
        self._entered = time.perf_counter()
        self._unseen = capture.compiled_note(self.model)
        if self._unseen:
            LOG.warning("gpuparity monitor: %s", self._unseen)
        if self.model is not None:
            self._handles.append(self.model.register_forward_pre_hook(self._count_forward))
            self._modules = capture.watch_rms_norm_modules(self.model)
        capture.install(self)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop watching, check what is still pending (forward-only where no backward came) and
        wait for the checker (up to drain_timeout seconds)."""
        if not self._active:
            return
        capture.uninstall(self)
        if self._entered is not None:
            self._active_s += time.perf_counter() - self._entered
            self._entered = None
        for handle in self._handles:
            handle.remove()
        capture.unwatch_modules(self._modules)
        self._handles, self._modules = [], []
        with self._lock:
            pending, self._pending = self._pending, []
        for item in pending:          # no backward seen: the forward alone is checked
            item.call.grads.clear()
            item.call.grad_out = None
            self._checker.submit(item.call, wait=True)
        if not self._checker.drain(self.drain_timeout):
            LOG.warning("gpuparity monitor: checks still running after %ss; their results are not in the report",
                        self.drain_timeout)
        self._checker.stop()
        self._active = False

    def step(self, step: Optional[int] = None) -> None:
        """Mark a training step (the next, or the given number) for the reports."""
        self._step = (self._step + 1 if self._step is not None else 0) if step is None else int(step)

    @property
    def current_step(self) -> int:
        if self._step is not None:
            return self._step
        return max(self._forwards - 1, 0)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the checks submitted so far have run (the run itself never waits)."""
        return self._checker.drain(timeout)

    def _count_forward(self, module, args):
        if not torch.compiler.is_compiling():
            self._forwards += 1

    # ------------------------------------------------------------------ the calls
    def on_call(self, kind: ops.OpKind, original, args: tuple, kwargs: dict, backend: Optional[str]):
        if self.ops_filter is not None and kind.family not in self.ops_filter and kind.name not in self.ops_filter:
            return original(*args, **kwargs)
        index = self._calls[kind.name]
        self._calls[kind.name] = index + 1
        if index % self.every:
            return original(*args, **kwargs)
        self._due[kind.name] += 1
        if not self._checker.room():
            self._checker.dropped += 1
            return original(*args, **kwargs)
        if self._over_budget_now():
            self._over_budget += 1
            return original(*args, **kwargs)
        return self._sample(kind, original, args, kwargs, backend, index)

    def _over_budget_now(self) -> bool:
        """Whether the checks so far (the one running included) took more host time than
        max_overhead of the time this monitor has been active: a safety net for checks that cost
        more than their slices should (a CPU check of a large call, a host much slower than the
        run's GPU). A GPU check's float64 work is bounded by its slice sizes instead (slices.py):
        the time it waits for the GPU is not host time. The longest check is not counted, so one
        check's worth is always allowed (the first sample, a second early in a short run)."""
        if self.max_overhead is None:
            return False
        active = self._active_s + (time.perf_counter() - self._entered if self._entered is not None else 0.0)
        return self._checker.busy_beyond_longest() > self.max_overhead * active

    def _skip(self, reason: str, original, args, kwargs):
        self._skipped[reason] += 1
        return original(*args, **kwargs)

    def _sample(self, kind, original, args, kwargs, backend, index):
        bound = kind.bind(args, kwargs)
        if hasattr(original, "bind_extra"):
            bound.update(original.bind_extra(args[0]))
        reason = kind.uncheckable(bound) if kind.uncheckable else None
        if reason:
            return self._skip(f"{kind.name}: {reason}", original, args, kwargs)
        summed = any(isinstance(bound.get(name), torch.Tensor) and bound[name].requires_grad
                     for name in kind.tensors[1:])
        size = checker.float64_elements(kind, bound, self.slice_attention_above, self.slice_rows_above, summed)
        if size > self.max_reference_elements:
            return self._skip(f"{kind.name}: larger than max_reference_elements ({size} > "
                              f"{self.max_reference_elements})", original, args, kwargs)
        label = _describe_backend(kind, bound, backend)
        copies = {name: value.detach().clone() if isinstance(value, torch.Tensor) else value
                  for name, value in bound.items()}
        tapped = [name for name in kind.tensors if isinstance(bound.get(name), torch.Tensor)
                  and bound[name].requires_grad and torch.is_grad_enabled()
                  and name in _positional_or_kw(kind, args, kwargs)] if _single_node(kind, backend) else []
        described = ops.describe_args(bound, kind)
        first = bound[kind.tensors[0]]
        call = SampledCall(kind, label, index, self.current_step, copies, out=None, described=described,
                           slice_above=self.slice_attention_above, slice_rows_above=self.slice_rows_above,
                           pick=self._sampled[kind.name])
        pending = _Pending(self, call, tapped) if tapped else None
        for name in tapped:
            args, kwargs = _replace_arg(kind, args, kwargs, name, _Tap.apply(bound[name], pending, name))
        out = original(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            self._skipped[f"{kind.name}: returned {type(out).__name__}, not a tensor"] += 1
            return out
        call.out = out.detach().clone()
        call.precision = _precision(kind, out.dtype, first.device)
        self._sampled[kind.name] += 1
        if pending is not None and out.requires_grad:
            out.register_hook(pending.grad_out_hook)
            with self._lock:
                self._pending.append(pending)
                # a backward that has not come a step later, or beyond MAX_WAITING calls, will not
                # (eval with grad mode on, grads asked for other tensors): check those forward only,
                # so the copies they hold do not pile up
                stale = [p for p in self._pending if p.call.step < call.step - 1]
                stale += [p for p in self._pending[:-MAX_WAITING] if p not in stale]
                self._pending = [p for p in self._pending if p not in stale]
            for item in stale:    # their backward never came (eval, or grads not asked for)
                item.call.grads.clear()
                item.call.grad_out = None
                self._submit(item.call)
        else:
            self._submit(call)
        return out

    def _backward_seen(self, pending: _Pending) -> None:
        with self._lock:
            if pending not in self._pending:
                return
            self._pending.remove(pending)
        self._submit(pending.call)

    def _submit(self, call: SampledCall) -> None:
        self._checker.submit(call)

    # ------------------------------------------------------------------ results (checker thread)
    def _checked(self, call: SampledCall, comparisons, error: Optional[str]) -> None:
        entry = {"op": call.kind.name, "backend": call.backend, "step": call.step, "call": call.index,
                 "dtype": call.described["dtype"], "device": call.described["device"],
                 "shapes": call.described["shapes"], "options": call.described["options"],
                 "backward": call.has_backward}
        if error is not None and error.startswith("not judged: "):
            self._skipped[f"{call.kind.name}: {error[len('not judged: '):]}"] += 1
            return
        if call.note:
            self._skipped[f"{call.kind.name}: {call.note}"] += 1
            self.notes.append({**entry, "note": call.note})
        if error is not None:
            self.errors.append({**entry, "error": error})
            LOG.warning("gpuparity monitor: could not check %s at step %s: %s", call.kind.name, call.step, error)
            return
        self._checked_counts[call.kind.name] += 1
        failed = [c for c in comparisons if not c.passed]
        if not failed:
            return
        entry.update(reason="; ".join(c.reason for c in failed), comparisons=[c.to_dict() for c in comparisons])
        if not self.failures:
            try:
                entry["repro"] = repro.write(call, comparisons, self.repro_dir)
            except Exception as exc:  # noqa: BLE001 - the failure is reported even without its repro
                entry["repro_error"] = f"{type(exc).__name__}: {exc}"
            LOG.warning("gpuparity monitor: %s [%s] failed at step %s (call %s, %s %s): %s%s", entry["op"],
                        entry["backend"], entry["step"], entry["call"], entry["dtype"], entry["shapes"],
                        entry["reason"], f"; repro: {entry['repro']['rerun']}" if "repro" in entry else "")
        self.failures.append(entry)
        if self.on_failure is not None:
            self.on_failure(entry)

    def report(self) -> MonitorReport:
        return MonitorReport(sampled=dict(self._sampled), checked=dict(self._checked_counts), calls=dict(self._calls),
                             failures=list(self.failures), errors=list(self.errors), notes=list(self.notes), skipped=dict(self._skipped),
                             dropped=self._checker.dropped, unseen=self._unseen,
                             over_budget=self._over_budget, max_overhead=self.max_overhead,
                             checked_on=dict(self._checker.checked_on), moved_to_cpu=self._checker.moved_to_cpu,
                             due=dict(self._due), check_host_s=self._checker.busy_s,
                             check_gpu_wait_s=self._checker.gpu_wait_s)


def _single_node(kind: ops.OpKind, backend: Optional[str]) -> bool:
    """Whether the call's backward is one autograd node, so a tap between an input and the call
    leaves the order in which that input's gradients are summed as it was. Inside a composition
    of many nodes (a model's RMSNorm module, gpuparity's "composition" fallback) an input used
    twice would have its gradients grouped differently, changing the run's bits: such calls
    are checked forward only."""
    return kind is not ops.RMS_NORM_MODULE and backend != "composition"


def _positional_or_kw(kind, args, kwargs):
    """The parameter names this call passed (a tensor input left at its default is not tapped)."""
    names = [p for p, _ in kind.params][:len(args)]
    return set(names) | set(kwargs)


def monitor(model: Optional[torch.nn.Module] = None, every: int = 100, **options) -> Monitor:
    """Shadow-check a run: a context manager that samples every `every`-th call of each watched
    op and checks it, forward and backward, against float64 in a background thread.

    model: the model whose RMSNorm modules are watched at their boundaries and whose forwards
    count the steps (None: the functional ops only). options: ops_filter (families or op names
    to watch, e.g. {"attention"}), repro_dir (where the first failure's repro goes; a temporary
    folder by default), max_pending (checks queued before samples are dropped, default 4),
    max_reference_elements (larger calls are counted as not checked), drain_timeout (seconds
    to wait for the checks at exit), on_failure(entry) (called from the checker thread),
    check_threads (CPU threads of the checker in a GPU run; default a quarter of the cores),
    slice_attention_above (attention calls whose B x H x Sq x Sk exceeds it are checked against
    float64 on one batch item and KV head group, rotating with the sample, and scanned whole for
    NaN/Inf; None: always whole), slice_rows_above (norm, softmax, rotary and cross-entropy
    calls larger than this many elements are checked on rows strided across the whole input, about this many
    elements, the offset rotating with the sample so that every row is checked in turn; weight
    gradients and a reduced loss whole; every output scanned whole for NaN/Inf; default 2^16;
    None: always whole),
    check_device (where a GPU call's float64 check runs: "auto" its own GPU on a side stream
    when that GPU's float64 is full rate, else the CPU; "device"; "cpu"), max_overhead (a safety
    net: the share of the monitored time the checks' host time may reach, default 0.05; a
    sample due while it is above is not taken and counted in the report's over_budget; None:
    every due sample is taken, as far as max_pending allows). The report counts the due samples
    and the checked ones per op (`due`, `checked`)."""
    return Monitor(model, every, **options)
