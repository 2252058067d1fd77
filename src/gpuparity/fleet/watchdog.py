"""Bounded waits: the watchdog thread that notices a stuck step, a deadline on collective work
handles, and the hard exit a process with a collective in flight needs."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple


class _Timeout(Exception):
    pass


class Watchdog(threading.Thread):
    """Watches the step the main thread is in; when one overruns its budget by more than the
    grace, calls on_stuck(step, elapsed) from this thread (the main thread may be stuck in C)."""

    def __init__(self, on_stuck: Callable[[str, float], None], grace_s: float):
        super().__init__(name="gpuparity-fleet-watchdog", daemon=True)
        self._on_stuck = on_stuck
        self._grace = grace_s
        self._lock = threading.Lock()
        self._step: Optional[Tuple[str, float, float]] = None
        self._stop_event = threading.Event()

    class _Step:
        def __init__(self, dog: "Watchdog", name: str, budget: float):
            self.dog, self.name, self.budget = dog, name, budget

        def __enter__(self):
            with self.dog._lock:
                self.dog._step = (self.name, time.monotonic(), self.budget)
            return self

        def __exit__(self, *exc):
            with self.dog._lock:
                self.dog._step = None
            return False

    def step(self, name: str, budget_s: float) -> "_Step":
        return Watchdog._Step(self, name, budget_s)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(0.1):
            with self._lock:
                step = self._step
            if step is None:
                continue
            name, started, budget = step
            elapsed = time.monotonic() - started
            if elapsed > budget + self._grace:
                self._stop_event.set()
                self._on_stuck(name, elapsed)
                return


def wait_all(works: Sequence[Any], device, timeout_s: float) -> None:
    """Wait for collective work handles (and, on a GPU, for the device) with a deadline.

    The waiting happens in a helper thread, because not every backend's Work answers
    is_completed() (gloo's reduce_scatter does not) and work.wait() has no portable deadline.
    Raises _Timeout when the deadline passes; the helper thread is abandoned."""
    import torch
    done = threading.Event()
    box: Dict[str, BaseException] = {}

    def waiter() -> None:
        try:
            for work in works:
                if work is not None:
                    work.wait()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=waiter, name="gpuparity-fleet-wait", daemon=True).start()
    if not done.wait(timeout_s):
        raise _Timeout(f"no completion within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _hard_exit(code: int) -> None:
    """End the process now: with a collective still in flight (or a stuck thread) a normal
    interpreter shutdown can hang in the backend's destructors."""
    _flush()
    os._exit(code)
