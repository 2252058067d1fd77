"""Memory profiles by named phase (model creation, to(device), forward, backward, optimizer step,
or any name), and the largest batch that fits. On a GPU: torch's allocated and reserved bytes,
peak and current, against the device total; on an APU also what the host has left (the memory
is shared); on the CPU: the process's resident set (RSS)."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import resource
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

SCHEMA_VERSION = 1
KIND = "gpuparity.memory_profile"

_ACTIVE: Optional["MemoryProfiler"] = None
_ACTIVE_LOCK = threading.Lock()


def _resolve_device(device) -> "Any":
    import torch
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {str(device)!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device} was asked for, but torch sees no CUDA or ROCm GPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


# --------------------------------------------------------------------------- host memory
def _proc_status() -> Dict[str, int]:
    """VmRSS / VmHWM of this process in bytes (Linux), else {}."""
    values = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return values


def host_rss_bytes() -> Optional[int]:
    return _proc_status().get("VmRSS")


def host_peak_rss_bytes() -> int:
    status = _proc_status()
    if "VmHWM" in status:
        return status["VmHWM"]
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if peak > 1 << 32 else peak * 1024


def reset_host_peak() -> bool:
    """Reset the kernel's RSS high-water mark of this process (Linux >= 4.0), so that a phase's
    peak is its own; False when that is not possible (the peak is then since process start)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def host_memory() -> Dict[str, Optional[int]]:
    """MemTotal / MemAvailable of the host in bytes (Linux), else None."""
    found: Dict[str, Optional[int]] = {"total": None, "available": None}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    found["total"] = int(rest.split()[0]) * 1024
                elif key == "MemAvailable":
                    found["available"] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return found


# --------------------------------------------------------------------------- the profiler
@dataclasses.dataclass
class PhaseRecord:
    """One named phase, aggregated over every time it ran."""
    name: str
    depth: int
    calls: int = 0
    duration_s: float = 0.0
    peak_allocated_bytes: Optional[int] = None   # GPU: torch's caching allocator
    peak_reserved_bytes: Optional[int] = None
    allocated_bytes: Optional[int] = None        # at the end of the last call
    reserved_bytes: Optional[int] = None
    allocated_delta_bytes: Optional[int] = None  # end minus start, summed over calls
    peak_rss_bytes: Optional[int] = None          # CPU (and APU host side): process RSS
    rss_bytes: Optional[int] = None
    device_free_bytes: Optional[int] = None       # what the driver says is free (GPU)
    host_available_bytes: Optional[int] = None    # MemAvailable (what an APU's host side sees)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _max(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


class MemoryProfiler:
    """Peak and current memory per named phase.

        with MemoryProfiler() as prof:
            with prof.phase("model creation"):
                model = Net()
            with prof.phase("to(device)"):
                model.to("cuda")
            ...
        print(prof.table()); report = prof.report()

    Phases nest: an outer phase's peak includes its inner phases. A name that runs again (a
    training loop's "forward") adds to the same record. `auto_phases=True` records forward
    (the outermost module call), backward (Tensor.backward), optimizer step and to(device) by
    itself through global hooks while the profiler is active. Inside the with block,
    `gpuparity.profile.phase(name)` reaches this profiler from anywhere.
    """

    def __init__(self, device=None, *, auto_phases: bool = False):
        self.device = _resolve_device(device)
        self.auto_phases = auto_phases
        self.records: Dict[str, PhaseRecord] = {}
        self._stack: List[Dict[str, Any]] = []
        self._lock = threading.RLock()
        self._hooks: List[Any] = []
        self._patched: List[Any] = []
        self._started: Optional[float] = None
        self._finished: Optional[float] = None
        self._peak_reset_ok = True
        self.overall: Dict[str, Optional[int]] = {}
        self.device_info = self._device_info()

    # ----- device facts
    def _device_info(self) -> Dict[str, Any]:
        import torch
        host = host_memory()
        info: Dict[str, Any] = {"device": str(self.device), "host_total_bytes": host["total"]}
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            info.update(name=props.name, total_bytes=int(props.total_memory), is_apu=self._is_apu(props))
        else:
            from ..platform import _cpu_model
            info.update(name=f"CPU ({_cpu_model()})", total_bytes=host["total"], is_apu=False)
        return info

    def _is_apu(self, props) -> bool:
        try:
            from ..platform import _arch_of, _is_apu, _vendor
            vendor = _vendor()
            return bool(_is_apu(props, vendor, _arch_of(props, vendor)))
        except Exception:  # noqa: BLE001 - a guess is not worth failing a profile for
            return bool(getattr(props, "is_integrated", False))

    # ----- measurement
    def _sync(self) -> None:
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _peaks(self) -> Dict[str, Optional[int]]:
        import torch
        if self.device.type == "cuda":
            return {"allocated": int(torch.cuda.max_memory_allocated(self.device)),
                    "reserved": int(torch.cuda.max_memory_reserved(self.device)),
                    "rss": host_peak_rss_bytes() if self.device_info.get("is_apu") else None}
        return {"allocated": None, "reserved": None, "rss": host_peak_rss_bytes()}

    def _reset_peaks(self) -> None:
        import torch
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.device.type == "cpu" or self.device_info.get("is_apu"):
            self._peak_reset_ok = reset_host_peak() and self._peak_reset_ok

    def _current(self) -> Dict[str, Optional[int]]:
        import torch
        now: Dict[str, Optional[int]] = {"allocated": None, "reserved": None, "device_free": None,
                                         "rss": host_rss_bytes(), "host_available": host_memory()["available"]}
        if self.device.type == "cuda":
            now["allocated"] = int(torch.cuda.memory_allocated(self.device))
            now["reserved"] = int(torch.cuda.memory_reserved(self.device))
            try:
                now["device_free"] = int(torch.cuda.mem_get_info(self.device)[0])
            except Exception:  # noqa: BLE001 - some builds cannot answer
                pass
        return now

    def _fold(self, frame: Dict[str, Any], peaks: Dict[str, Optional[int]]) -> None:
        for key, value in peaks.items():
            frame["peak"][key] = _max(frame["peak"].get(key), value)

    # ----- phases
    def enter(self, name: str) -> None:
        """Start a phase (the context manager `phase` is the usual way)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: expected a non-empty phase name, got {name!r}")
        with self._lock:
            self._sync()
            peaks = self._peaks()
            for frame in self._stack:  # the outer phases keep what they saw so far
                self._fold(frame, peaks)
            self._reset_peaks()
            self._stack.append({"name": name, "start": time.perf_counter(), "begin": self._current(),
                                "peak": {}})

    def exit(self, name: Optional[str] = None) -> PhaseRecord:
        with self._lock:
            if not self._stack:
                raise RuntimeError("MemoryProfiler.exit: no phase is open")
            if name is not None and self._stack[-1]["name"] != name:
                raise RuntimeError(f"MemoryProfiler.exit: phase {name!r} is not the innermost open phase "
                                   f"({self._stack[-1]['name']!r} is)")
            self._sync()
            frame = self._stack.pop()
            peaks = self._peaks()
            self._fold(frame, peaks)
            for outer in self._stack:
                self._fold(outer, frame["peak"])
            self._reset_peaks()
            end = self._current()
            record = self.records.get(frame["name"])
            if record is None:
                record = self.records[frame["name"]] = PhaseRecord(frame["name"], depth=len(self._stack))
            record.calls += 1
            record.duration_s += time.perf_counter() - frame["start"]
            record.peak_allocated_bytes = _max(record.peak_allocated_bytes, frame["peak"].get("allocated"))
            record.peak_reserved_bytes = _max(record.peak_reserved_bytes, frame["peak"].get("reserved"))
            record.peak_rss_bytes = _max(record.peak_rss_bytes, frame["peak"].get("rss"))
            record.allocated_bytes, record.reserved_bytes = end["allocated"], end["reserved"]
            record.rss_bytes, record.device_free_bytes = end["rss"], end["device_free"]
            record.host_available_bytes = end["host_available"]
            if end["allocated"] is not None and frame["begin"]["allocated"] is not None:
                record.allocated_delta_bytes = (record.allocated_delta_bytes or 0) + \
                    end["allocated"] - frame["begin"]["allocated"]
            elif end["rss"] is not None and frame["begin"]["rss"] is not None:
                record.allocated_delta_bytes = (record.allocated_delta_bytes or 0) + end["rss"] - frame["begin"]["rss"]
            for key in ("allocated", "reserved", "rss"):
                self.overall[key] = _max(self.overall.get(key), frame["peak"].get(key))
            return record

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.exit(name)

    # ----- lifecycle
    def __enter__(self) -> "MemoryProfiler":
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is not None:
                raise RuntimeError("a MemoryProfiler is already active in this process")
            _ACTIVE = self
        self._started = time.perf_counter()
        self._sync()
        self._reset_peaks()
        if self.auto_phases:
            self._install_auto_phases()
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        try:
            self._remove_auto_phases()
            while self._stack:  # a phase left open by an exception
                self.exit()
            self._sync()
            peaks = self._peaks()
            for key, value in peaks.items():
                self.overall[key] = _max(self.overall.get(key), value)
            self.final = self._current()
            self._finished = time.perf_counter()
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE = None

    # ----- automatic phases
    def _install_auto_phases(self) -> None:
        import torch
        from torch.nn.modules import module as module_mod
        from torch.optim import optimizer as optimizer_mod
        depth = {"forward": 0}

        def forward_pre(_module, _args):
            depth["forward"] += 1
            if depth["forward"] == 1:
                self.enter("forward")

        def forward_post(_module, _args, _out):
            depth["forward"] -= 1
            if depth["forward"] == 0 and self._stack and self._stack[-1]["name"] == "forward":
                self.exit("forward")

        self._hooks += [module_mod.register_module_forward_pre_hook(forward_pre),
                        module_mod.register_module_forward_hook(forward_post, always_call=True),
                        optimizer_mod.register_optimizer_step_pre_hook(lambda *a: self.enter("optimizer step")),
                        optimizer_mod.register_optimizer_step_post_hook(lambda *a: self.exit("optimizer step"))]
        self._patch(torch.Tensor, "backward", "backward")
        self._patch(torch.nn.Module, "to", "to(device)")

    def _patch(self, owner, attr: str, phase_name: str) -> None:
        original = getattr(owner, attr)
        profiler = self

        def wrapper(*args, **kwargs):
            if profiler._stack and profiler._stack[-1]["name"] == phase_name:
                return original(*args, **kwargs)  # nested (Module.to calls itself on children)
            with profiler.phase(phase_name):
                return original(*args, **kwargs)

        wrapper.__wrapped__ = original
        setattr(owner, attr, wrapper)
        self._patched.append((owner, attr, original))

    def _remove_auto_phases(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched = []

    # ----- output
    def report(self) -> Dict[str, Any]:
        """The profile as a JSON-ready dict (schema_version, platform fingerprint, phases)."""
        from .. import platform
        total = self.device_info.get("total_bytes")
        peak = self.overall.get("reserved") if self.device.type == "cuda" else self.overall.get("rss")
        report_platform = platform.current()
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": KIND,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "platform_fingerprint": platform.fingerprint_key(report_platform),
            "machine": platform.summary_line(report_platform),
            "device": self.device_info,
            "measures": ("torch caching allocator (allocated / reserved)" if self.device.type == "cuda"
                         else "process resident set (RSS)"),
            "host_peak_per_phase": self._peak_reset_ok,
            "duration_s": (self._finished or time.perf_counter()) - (self._started or time.perf_counter()),
            "peak_allocated_bytes": self.overall.get("allocated"),
            "peak_reserved_bytes": self.overall.get("reserved"),
            "peak_rss_bytes": self.overall.get("rss"),
            "utilisation": (peak / total) if peak and total else None,
            "phases": [record.to_dict() for record in self.records.values()],
        }

    def table(self) -> str:
        """A plain-text table of the phases (for print(); `gpuparity profile memory` renders
        the same data with rich)."""
        return format_table(self.report())


def _mib(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def phase_rows(report: Dict[str, Any]) -> List[List[str]]:
    """One row of text per phase (indented by depth): calls, seconds, then MiB columns: device
    memory on a GPU, RSS on the CPU, plus host RSS and available memory on an APU."""
    on_gpu = report["device"]["device"].startswith("cuda")
    apu = report["device"].get("is_apu")
    rows = []
    for phase in report["phases"]:
        row = ["  " * phase["depth"] + phase["name"], str(phase["calls"]), f"{phase['duration_s']:.3f}"]
        if on_gpu:
            row += [_mib(phase["peak_allocated_bytes"]), _mib(phase["peak_reserved_bytes"]),
                    _mib(phase["allocated_bytes"]), _mib(phase["allocated_delta_bytes"])]
        else:
            row += [_mib(phase["peak_rss_bytes"]), _mib(phase["rss_bytes"]), _mib(phase["allocated_delta_bytes"])]
        if apu:
            row += [_mib(phase["peak_rss_bytes"]), _mib(phase["host_available_bytes"])]
        rows.append(row)
    return rows


def format_table(report: Dict[str, Any]) -> str:
    on_gpu = report["device"]["device"].startswith("cuda")
    apu = report["device"].get("is_apu")
    columns = ["phase", "calls", "time s"]
    columns += ["peak alloc MiB", "peak reserved MiB", "alloc MiB", "delta MiB"] if on_gpu else \
        ["peak RSS MiB", "RSS MiB", "delta MiB"]
    if apu:
        columns += ["peak host RSS MiB", "host avail MiB"]
    rows = phase_rows(report)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(columns, widths)))]
    for row in rows:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))))
    device = report["device"]
    util = report.get("utilisation")
    lines.append(f"device {device['device']} ({device.get('name')}): total {_mib(device.get('total_bytes'))} MiB"
                 + (f", peak {'reserved' if on_gpu else 'RSS'} {util:.1%} of it" if util is not None else "")
                 + (" (APU: the host shares this memory)" if apu else ""))
    return "\n".join(lines)


def active() -> Optional[MemoryProfiler]:
    """The MemoryProfiler active in this process, if any."""
    return _ACTIVE


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """A named phase of the active MemoryProfiler; does nothing when none is active, so a
    training script can keep these lines in production."""
    profiler = _ACTIVE
    if profiler is None:
        yield
        return
    with profiler.phase(name):
        yield


# --------------------------------------------------------------------------- batch size
def _is_oom(exc: BaseException) -> bool:
    import torch
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # Older ROCm / CUDA builds raise a plain RuntimeError.
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _release(device) -> None:
    import torch
    gc.collect()
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def find_batch_size(step_fn: Callable[[int], Any], *, start: int = 1, max_batch: int = 65536, device=None,
                    on_try: Optional[Callable[[int, bool], None]] = None) -> int:
    """The largest batch size for which `step_fn(batch_size)` runs without running out of
    memory: doubling from `start` until it fails or reaches `max_batch`, then bisection.

    step_fn should run one full training step (forward, backward, optimizer step) at that
    batch size and keep no references to its tensors. Out-of-memory (torch.OutOfMemoryError,
    or a RuntimeError saying "out of memory") counts as "does not fit"; the cache is emptied
    before the next try; any other error propagates. `on_try(batch, fits)` sees every try.
    Raises RuntimeError when even `start` does not fit.
    """
    if not callable(step_fn):
        raise TypeError(f"step_fn: expected a callable taking a batch size, got {type(step_fn).__name__}")
    if not isinstance(start, int) or start < 1:
        raise ValueError(f"start: expected an integer >= 1, got {start!r}")
    if not isinstance(max_batch, int) or max_batch < start:
        raise ValueError(f"max_batch: expected an integer >= start ({start}), got {max_batch!r}")
    device = _resolve_device(device)

    def fits(batch: int) -> bool:
        failed = False
        try:
            step_fn(batch)
        except Exception as exc:  # noqa: BLE001 - only OOM is an answer; the rest propagates
            if not _is_oom(exc):
                raise
            failed = True
        # Outside the except block, so the traceback (and the tensors its frames hold) is gone.
        _release(device)
        if on_try:
            on_try(batch, not failed)
        return not failed

    if not fits(start):
        raise RuntimeError(f"find_batch_size: batch size start={start} already runs out of memory on {device}")
    good, bad = start, None
    while good < max_batch:
        candidate = min(good * 2, max_batch)
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
            break
    if bad is None:
        return good
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good
