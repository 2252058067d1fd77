"""Kernel profiles: torch.profiler over N training steps, the top kernels by device time (CPU
time on the CPU) with their share of the total and call counts, and every op with the device
time of the kernels it launched, so two machines can be put side by side by op name.

A step is counted at each `gpuparity.profile.step()` call; a script that never calls it has its
steps counted at each optimizer.step() instead. The first `warmup` steps (compilation,
autotuning, the caching allocator warming up) are not recorded.
"""
from __future__ import annotations

import datetime
import threading
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 1
KIND = "gpuparity.kernel_profile"

_ACTIVE: Optional["KernelProfiler"] = None
_ACTIVE_LOCK = threading.Lock()


def _attr(event, *names, default=0.0):
    for name in names:
        value = getattr(event, name, None)
        if value is not None:
            return value
    return default


class KernelProfiler:
    """torch.profiler over `steps` steps after `warmup` steps:

        with KernelProfiler(steps=10, warmup=2) as prof:
            for batch in data:
                train_step(batch)
                gpuparity.profile.step()
        report = prof.report(top=20)
    """

    def __init__(self, steps: int = 10, warmup: int = 1, device=None, *, count_optimizer_steps: bool = True):
        import torch
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps: expected an integer >= 1, got {steps!r}")
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup: expected an integer >= 0, got {warmup!r}")
        from .memory import _resolve_device
        self.device = _resolve_device(device)
        self.steps, self.warmup = steps, warmup
        self.count_optimizer_steps = count_optimizer_steps
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self.seen = 0                 # steps counted so far
        self.profiled = 0             # steps recorded
        self.step_source: Optional[str] = None
        self.running = False
        self.done = False
        self._hook = None
        self._averages = None

    # ----- steps
    def step(self, source: str = "step()") -> None:
        """One training step ended."""
        if source == "step()" and self._hook is not None:
            # Explicit steps win over the optimizer hook from the first one on.
            self._hook.remove()
            self._hook = None
            if self.step_source == "optimizer.step":
                self.step_source = "step()"
                return  # this step was already counted at its optimizer.step()
        if self.step_source is None:
            self.step_source = source
        elif source != self.step_source:
            return
        self.seen += 1
        if self.running:
            self.profiled += 1
            if self.profiled >= self.steps:
                self._stop()
        elif not self.done and self.seen == self.warmup:
            self._start()

    def _start(self) -> None:
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._profiler.start()
        self.running = True

    def _stop(self) -> None:
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._profiler.stop()
        self.running = False
        self.done = True

    def __enter__(self) -> "KernelProfiler":
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is not None:
                raise RuntimeError("a KernelProfiler is already active in this process")
            _ACTIVE = self
        if self.count_optimizer_steps:
            from torch.optim import optimizer as optimizer_mod
            self._hook = optimizer_mod.register_optimizer_step_post_hook(lambda *a: self.step("optimizer.step"))
        if self.warmup == 0:
            self._start()
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        try:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            if self.running:
                self._stop()  # fewer steps than asked for: keep what was recorded
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE = None

    # ----- results
    def report(self, top: int = 20, max_ops: int = 300) -> Dict[str, Any]:
        import torch
        from torch.autograd import DeviceType
        from .. import platform
        if not isinstance(top, int) or top < 1:
            raise ValueError(f"top: expected an integer >= 1, got {top!r}")
        report_platform = platform.current()
        base = {
            "schema_version": SCHEMA_VERSION, "kind": KIND,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "platform_fingerprint": platform.fingerprint_key(report_platform),
            "machine": platform.summary_line(report_platform),
            "device": str(self.device), "torch": torch.__version__,
            "steps_requested": self.steps, "warmup": self.warmup, "steps_seen": self.seen,
            "steps_profiled": self.profiled,
            "step_source": self.step_source or "none",
        }
        if not (self.done or self.running) and self.warmup > 0 and self.seen < self.warmup:
            return {**base, "error": f"only {self.seen} step(s) counted, fewer than the {self.warmup} warmup step(s): "
                                     "nothing was recorded. Call gpuparity.profile.step() after each training step "
                                     "(or use an optimizer), or pass warmup=0 to record the whole run",
                    "time_basis": None, "total_time_us": 0.0, "kernels": [], "ops": []}
        if self.warmup == 0 and self.seen == 0:
            base["steps_profiled"] = 1  # the whole run, as one step
        averages = self._profiler.key_averages()
        on_gpu = self.device.type == "cuda"
        kernels: List[Dict[str, Any]] = []
        ops: List[Dict[str, Any]] = []
        for event in averages:
            is_device = _attr(event, "device_type", default=None) == DeviceType.CUDA
            device_us = float(_attr(event, "self_device_time_total", "self_cuda_time_total"))
            cpu_us = float(_attr(event, "self_cpu_time_total"))
            entry = {"name": event.key, "calls": int(event.count), "device_time_us": device_us,
                     "self_cpu_time_us": cpu_us}
            if is_device:
                kernels.append(entry)
            elif cpu_us > 0 or device_us > 0:
                ops.append(entry)
        basis = "device" if on_gpu and kernels else "cpu"
        key = "device_time_us" if basis == "device" else "self_cpu_time_us"
        total = sum(k[key] for k in kernels) if basis == "device" else sum(o[key] for o in ops)
        steps = max(1, base["steps_profiled"])
        for entry in kernels + ops:
            entry["time_us"] = entry[key]
            entry["time_per_step_us"] = entry[key] / steps
            entry["share"] = entry[key] / total if total else 0.0
        kernels.sort(key=lambda e: e["device_time_us"], reverse=True)
        ops.sort(key=lambda e: e[key], reverse=True)
        top_list = kernels[:top] if basis == "device" else ops[:top]
        return {**base, "time_basis": basis, "total_time_us": total,
                "total_time_per_step_us": total / steps,
                "top": top_list, "kernels": kernels[:max_ops], "ops": ops[:max_ops]}


def active() -> Optional[KernelProfiler]:
    return _ACTIVE


def step() -> None:
    """Mark the end of a training step for the active KernelProfiler (`gpuparity profile
    kernels`); does nothing when none is active, so the call can stay in the script."""
    profiler = _ACTIVE
    if profiler is not None:
        profiler.step()
