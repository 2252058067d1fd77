"""Backend choice for the public ops: dispatch's resolution with the verdict source wired in
(the verdict store, verifying on a miss: `gpuparity.checks.selection.verdict_for`). The one
place the ops layer meets verification; `backend="auto"` in every op goes through here."""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import dispatch
from ..registry import Backend, Problem
from ..checks import selection
from ..known import avoid as known_avoid


def verdict(problem: Problem, backend: Backend) -> Dict[str, Any]:
    # Looked up at call time, so a test (or a user) that replaces selection.verdict_for is seen.
    # known_avoid.veto: a confirmed known issue whose regime holds this call fails the verdict
    # for this call only (e.g. cuDNN SDPA with gradients at Sk % 128 == 64: SDPA-CUDNN-MASK-LSE).
    return known_avoid.veto(problem, selection.verdict_for(problem, backend))


def rank(problem: Problem, candidates: List[Backend]) -> List[Tuple[Backend, str, Optional[Dict[str, Any]]]]:
    # the order auto tries candidates in (timed here, else the device family's prior): a first
    # call verifies only the first that passes, not every backend (checks/selection.py). The stored
    # verdicts it returns beside them (shown by explain) get the same per-call veto as verdict's.
    ranked = []
    for entry in selection.rank(problem, candidates):   # (backend, why[, stored verdict])
        stored = entry[2] if len(entry) > 2 else None
        ranked.append((entry[0], entry[1], None if stored is None else known_avoid.veto(problem, stored)))
    return ranked


# resolve(problem, backend="auto") -> Backend. A partial, not a def: one Python frame fewer on
# every eager call of every op (host time is what short shapes are bound by).
resolve = functools.partial(dispatch.resolve, verdict=verdict, rank=rank)


def explain(problem: Problem) -> Dict[str, Any]:
    return dispatch.explain(problem, verdict=verdict, rank=rank)


def prepare(problems: Sequence[Problem]) -> int:
    """Verify, in the background, the candidates the first auto calls of `problems` would choose
    (gpuparity.patch passes its model's calls), each resolved exactly as its first call would
    be (`resolve`); returns how many were queued (0 where checks run in-process: a CPU unless
    GPUPARITY_PROBE=subprocess). checks/selection.py prepare."""
    return selection.prepare(problems, resolve)


# On a GPU, the first auto call verifies its candidate in a worker process: start it now, so
# that its imports overlap the caller's setup (checks/selection.py prestart).
selection.prestart()
