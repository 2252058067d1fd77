"""Backend selection: a named backend (or its reasons in words), or under "auto" the fastest
backend whose correctness verdict passed here, the op's plain composition as the last resort.

Dispatch decides; it does not verify. The verdicts come from a callable the caller hands it
(`verdict(problem, backend) -> {"passed", "reason", "time_ms"}`): the ops layer passes
`gpuparity.checks.probe.probe_verdict`, which reads the on-disk probe cache and probes on a
miss. Dispatch imports nothing above `backends`.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .backends.registry import (Backend, BackendUnavailable, Problem, on_change, register, registered,
                                unregister)

__all__ = ["Backend", "BackendUnavailable", "Problem", "Verdict", "backends", "explain", "forget", "get",
           "register", "resolve", "unregister"]

Verdict = Callable[[Problem, Backend], Dict[str, Any]]


class _Memo:
    """Resolutions already made, so a training loop does not re-derive every backend's reasons
    and verdicts on every call.

    The rule: a resolution follows from its key (the problem, the backend asked for, the
    verdict source, the environment variables above and, for fp32, torch's TF32 switches) and
    from two things outside it: the registry and the verdicts. Whatever changes those calls
    `forget()` (registration does; the verdict store does on every store and clear), which
    empties the memo; a resolution computed while a forget() happened is not kept. Bounded:
    problems carry sequence lengths, and a decode loop makes a new one per step."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._entries: Dict[tuple, Backend] = {}
        self._epoch = 0
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Optional[Backend]:
        return self._entries.get(key)

    def epoch(self) -> int:
        return self._epoch

    def keep(self, key: tuple, backend: Backend, epoch: int) -> None:
        with self._lock:
            if epoch != self._epoch:
                return
            if len(self._entries) >= self.LIMIT:
                self._entries.clear()
            self._entries[key] = backend

    def forget(self) -> None:
        with self._lock:
            self._epoch += 1
            self._entries.clear()


_MEMO = _Memo()
forget = _MEMO.forget
on_change(forget)


def _load_builtin_backends() -> None:
    # Importing the modules registers their backends; backends.MODULES is the one list of them.
    from .backends import load_all
    load_all()


def backends(op: str) -> List[Backend]:
    _load_builtin_backends()
    return list(registered(op).values())


def get(op: str, name: str) -> Backend:
    _load_builtin_backends()
    table = registered(op)
    if name not in table:
        raise ValueError(f"backend: expected one of {sorted(table) + ['auto']} for {op}, got {name!r}")
    return table[name]


def _key(problem: Problem, backend: str, verdict: Optional[Verdict]) -> tuple:
    # the environment variables a resolution depends on, read one by one: this runs on every eager call
    get_env = os.environ.get
    key = (problem, backend, verdict, get_env("GPUPARITY_TRUST_UNPROBED"), get_env("TRITON_INTERPRET"))
    if problem.dtype == torch.float32:
        from .numerics import cudnn_tf32, matmul_tf32
        key += (matmul_tf32(), cudnn_tf32())
    return key


def resolve(problem: Problem, backend: str = "auto", *, verdict: Optional[Verdict] = None) -> Backend:
    """The backend that serves `problem`: the named one (or BackendUnavailable with its
    reasons), or for "auto" the verified choice, which needs `verdict`. Remembered (_Memo)."""
    key = _key(problem, backend, verdict)
    chosen = _MEMO.get(key)
    if chosen is not None:
        return chosen
    epoch = _MEMO.epoch()
    if backend != "auto":
        chosen = get(problem.op, backend)
        reasons = chosen.reasons(problem)
        if reasons:
            raise BackendUnavailable(f"backend={backend!r} cannot serve this {problem.op} call: " + "; ".join(reasons))
    else:
        chosen = explain(problem, verdict=verdict)["chosen_backend"]
    _MEMO.keep(key, chosen, epoch)
    return chosen


def explain(problem: Problem, *, verdict: Optional[Verdict]) -> Dict[str, Any]:
    """Why each backend was or was not chosen for `problem` under "auto".

    Returns {"chosen": name, "chosen_backend": Backend, "candidates": [{name, status, reason, time_ms}]}.
    """
    if verdict is None:
        raise TypeError("verdict: backend='auto' needs a verdict callable (problem, backend) -> dict; "
                        "gpuparity.ops.select hands it the probe cache's")
    rows = []
    verified: List[Tuple[float, Backend]] = []
    fallback: Optional[Backend] = None
    for candidate in backends(problem.op):
        reasons = candidate.reasons(problem)
        if reasons:
            rows.append({"name": candidate.name, "status": "unsupported", "reason": "; ".join(reasons)})
            continue
        if candidate.fallback:
            fallback = fallback or candidate
            rows.append({"name": candidate.name, "status": "fallback", "reason": "trusted composition, last resort"})
            continue
        if not candidate.probed:
            rows.append({"name": candidate.name, "status": "never-auto", "reason": "only used when named"})
            continue
        outcome = verdict(problem, candidate)
        if outcome.get("passed"):
            time_ms = float(outcome.get("time_ms") or float("inf"))
            verified.append((time_ms, candidate))
            rows.append({"name": candidate.name, "status": "verified", "reason": outcome.get("reason", ""),
                         "time_ms": time_ms})
        else:
            rows.append({"name": candidate.name, "status": "failed-probe", "reason": outcome.get("reason", "")})
    if verified:
        verified.sort(key=lambda item: item[0])
        chosen = verified[0][1]
    elif fallback is not None:
        chosen = fallback
    else:
        raise BackendUnavailable(f"no backend can serve this {problem.op} call: " +
                                 "; ".join(f"{r['name']}: {r['reason']}" for r in rows))
    return {"chosen": chosen.name, "chosen_backend": chosen, "candidates": rows}
