"""Backend choice for the public ops: dispatch's resolution with the verdict source wired in
(the probe-verdict store, probing on a miss: `gpuparity.checks.probe.probe_verdict`). The one
place the ops layer meets verification; `backend="auto"` in every op goes through here."""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, Hashable

from .. import dispatch
from ..backends.registry import Backend, Problem
from ..checks import probe


def verdict(problem: Problem, backend: Backend) -> Dict[str, Any]:
    # Looked up at call time, so a test (or a user) that replaces probe.probe_verdict is seen.
    return probe.probe_verdict(problem, backend)


# resolve(problem, backend="auto") -> Backend. A partial, not a def: one Python frame fewer on
# every eager call of every op (host time is what short shapes are bound by).
resolve = functools.partial(dispatch.resolve, verdict=verdict)


def explain(problem: Problem) -> Dict[str, Any]:
    return dispatch.explain(problem, verdict=verdict)


def self_checked(self_check: Callable[[Problem, Backend], Dict[str, Any]],
                 key: Callable[[Problem], Hashable]) -> Callable[[Problem, Backend], Dict[str, Any]]:
    """A verdict source for an op the check battery has no spec for yet (attention_varlen,
    attention_decode): the battery's stored verdict once a spec exists, else `self_check`'s,
    run once per process and (key(problem), backend)."""
    memo: Dict[tuple, Dict[str, Any]] = {}
    lock = threading.Lock()

    def checked(problem: Problem, backend: Backend) -> Dict[str, Any]:
        from ..checks.specs import SPECS
        if problem.op in SPECS:
            return probe.probe_verdict(problem, backend)
        memo_key = (key(problem), backend.name)
        with lock:
            if memo_key not in memo:
                memo[memo_key] = self_check(problem, backend)
            return memo[memo_key]

    return checked
