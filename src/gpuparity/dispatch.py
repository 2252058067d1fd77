"""Backend selection: a named backend (or its reasons in words), or under "auto" the fastest
backend whose correctness verdict passed here, the op's plain composition as the last resort.

Dispatch decides; it does not verify. The verdicts come from a callable the caller hands it
(`verdict(problem, backend) -> {"passed", "reason", "time_ms"}`): the ops pass the selector's
(`gpuparity.ops.select.verdict`: the stored verdict, verified on a miss through the checks'
narrow interface, with a confirmed known issue's veto). With a `rank` callable too
(`rank(problem, candidates) -> [(backend, why, stored verdict)]`, fastest first: the ops pass
`gpuparity.ops.select.rank`), "auto" asks for verdicts in that order and stops at the first that
passed, so a first call verifies one candidate rather than every backend. A verdict source may
instead raise `Pending(baseline)`: that candidate's verdict is not in yet, and the call is served
by `baseline` meanwhile (the selector's: what torch runs for the op without gpuparity); the
resolution is remembered until the next verdict is stored, which empties the memo. Dispatch
imports nothing above `backends`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .registry import (Backend, BackendUnavailable, Problem, on_change, register, registered,
                                unregister)

__all__ = ["Backend", "BackendUnavailable", "Pending", "Problem", "VerdictSource", "backends", "explain", "forget", "get",
           "register", "resolve", "unregister"]

# verdict(problem, backend) -> a verdict: {"passed", "reason", "time_ms", ...} (ops/select.verdict)
VerdictSource = Callable[[Problem, Backend], Dict[str, Any]]
# rank(problem, candidates) -> [(backend, why, stored verdict or None)], the order to try them in
Rank = Callable[[Problem, List[Backend]], List[Tuple[Backend, str, Optional[Dict[str, Any]]]]]
LOG = logging.getLogger("gpuparity")
SLOW_RESOLUTION_S = 1.0   # a resolution slower than this (it verified a backend) logs one INFO line


class Pending(Exception):
    """Raised by a verdict source for a candidate whose verdict is still being made (in the
    background): `resolve` serves the call with `baseline` instead of waiting."""

    def __init__(self, candidate: Backend, baseline: Backend) -> None:
        super().__init__(f"{candidate.op}: the verdict of {candidate.name} is pending; {baseline.name} serves meanwhile")
        self.candidate, self.baseline = candidate, baseline


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


def _load_builtin_backends(op: str) -> None:
    # Importing the modules of op's line in gpuparity.manifest registers its backends (backends.load:
    # only that op's modules, so a first attention call imports no norm kernels).
    from .backends import load
    load((op,))


def backends(op: str) -> List[Backend]:
    _load_builtin_backends(op)
    return list(registered(op).values())


def get(op: str, name: str) -> Backend:
    _load_builtin_backends(op)
    table = registered(op)
    if name not in table:
        raise ValueError(f"backend: expected one of {sorted(table) + ['auto']} for {op}, got {name!r}")
    return table[name]


def _key(problem: Problem, backend: str, verdict: Optional[VerdictSource], rank: Optional[Rank] = None) -> tuple:
    # the environment variables a resolution depends on, read one by one: this runs on every eager call
    get_env = os.environ.get
    key = (problem, backend, verdict, rank, get_env("GPUPARITY_TRUST_UNPROBED"), get_env("TRITON_INTERPRET"),
           get_env("GPUPARITY_FIRST_CALLS"))
    if problem.dtype == torch.float32:
        from .numerics import cudnn_tf32, matmul_tf32
        key += (matmul_tf32(), cudnn_tf32())
    return key


def resolve(problem: Problem, backend: str = "auto", *, verdict: Optional[VerdictSource] = None,
            rank: Optional[Rank] = None) -> Backend:
    """The backend that serves `problem`: the named one (or BackendUnavailable with its
    reasons), or for "auto" the verified choice, which needs `verdict` (and, to verify lazily
    in rank order, `rank`). A verdict source that raises `Pending` has the call served by its
    baseline until that verdict is stored. Remembered (_Memo)."""
    key = _key(problem, backend, verdict, rank)
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
        started = time.monotonic()
        try:
            chosen = (_explain_ranked(problem, verdict, rank, full=False) if rank is not None
                      else explain(problem, verdict=verdict))["chosen_backend"]
        except Pending as pending:
            # kept until the verdict is stored (the store calls forget(), which empties the memo)
            LOG.debug("gpuparity: %s", pending)
            chosen = pending.baseline
        took = time.monotonic() - started
        if took > SLOW_RESOLUTION_S:
            # the library never prints: one line through logging, shown only where the user asks
            LOG.info("gpuparity: backend='auto' chose %s for %s (%s, %s on %s) in %.1f s, verifying it against "
                     "float64 first (once per call kind; cached; `gpuparity doctor` fills the cache ahead of time)",
                     chosen.name, problem.op, str(problem.dtype).replace("torch.", ""), problem.kind,
                     problem.device, took)
    _MEMO.keep(key, chosen, epoch)
    return chosen


def explain(problem: Problem, *, verdict: Optional[VerdictSource], rank: Optional[Rank] = None) -> Dict[str, Any]:
    """Why each backend was or was not chosen for `problem` under "auto".

    Without `rank`, every candidate's verdict is asked and the fastest that passed wins. With
    it, verdicts are asked in rank order and the first that passed wins (or the composition,
    where the rank puts it first); the candidates after it are not verified for the choice:
    their declared reasons and any verdict already stored are shown, else "unchecked".

    Returns {"chosen": name, "chosen_backend": Backend, "candidates": [{name, status, reason, time_ms}]}.
    """
    if verdict is None:
        raise TypeError("verdict: backend='auto' needs a verdict callable (problem, backend) -> dict; "
                        "gpuparity.ops.select.verdict is the ops' one")
    if rank is not None:
        return _explain_ranked(problem, verdict, rank, full=True)
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


def _explain_ranked(problem: Problem, verdict: VerdictSource, rank: Rank, full: bool) -> Dict[str, Any]:
    """The ranked walk. `full` (explain): the rows after the choice get their declared reasons
    and stored verdicts too; resolve leaves them out (some declarations cost seconds: the
    compile backend tries torch.compile)."""
    rows = []
    candidates: List[Backend] = []
    for candidate in backends(problem.op):
        if not candidate.probed and not candidate.fallback:
            rows.append({"name": candidate.name, "status": "never-auto", "reason": "only used when named"})
        else:
            candidates.append(candidate)
    ranked = [(entry[0], entry[1], entry[2] if len(entry) > 2 else None) for entry in rank(problem, list(candidates))]
    named = {b.name for b, _, _ in ranked}
    # what the rank left out comes after what it named, the composition last of all
    ranked += [(b, "not ranked", None) for b in candidates if b.name not in named and not b.fallback]
    ranked += [(b, "last resort", None) for b in candidates if b.name not in named and b.fallback]
    chosen: Optional[Backend] = None
    for candidate, why, stored in ranked:
        if chosen is not None and not full:
            continue
        reasons = candidate.reasons(problem)
        if reasons:
            rows.append({"name": candidate.name, "status": "unsupported", "reason": "; ".join(reasons)})
        elif chosen is not None:
            after = f"ranked after {chosen.name} ({why})"
            if candidate.fallback:
                rows.append({"name": candidate.name, "status": "fallback", "reason": f"trusted composition, {after}"})
            elif stored is None:
                rows.append({"name": candidate.name, "status": "unchecked", "reason": f"{after}; not verified yet"})
            else:
                rows.append(_verdict_row(candidate, stored, after))
        elif candidate.fallback:
            chosen = candidate
            rows.append({"name": candidate.name, "status": "fallback", "reason": f"trusted composition ({why})"})
        else:
            row = _verdict_row(candidate, verdict(problem, candidate), why)
            rows.append(row)
            if row["status"] == "verified":
                chosen = candidate
    if chosen is None:
        raise BackendUnavailable(f"no backend can serve this {problem.op} call: " +
                                 "; ".join(f"{r['name']}: {r['reason']}" for r in rows))
    return {"chosen": chosen.name, "chosen_backend": chosen, "candidates": rows}


def _verdict_row(candidate: Backend, outcome: Dict[str, Any], why: str) -> Dict[str, Any]:
    if outcome.get("passed"):
        time_ms = outcome.get("time_ms")
        return {"name": candidate.name, "status": "verified", "reason": f"{outcome.get('reason', '')} ({why})",
                "time_ms": float(time_ms) if time_ms is not None else float("inf")}
    return {"name": candidate.name, "status": "failed-probe", "reason": outcome.get("reason", "")}
