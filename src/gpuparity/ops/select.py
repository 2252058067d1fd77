"""The selector: how `backend="auto"` in every op chooses. It chooses; checks/ verifies.

For a call (its `Problem`) the selector ranks the op's candidates (`rank`: by the timings stored
here for the call's kind, else by the device family's priors, priors.py) and hands dispatch, for
each candidate dispatch asks about, the verdict auto reads for this call (`verdict`): the stored
one, or one made now on a miss, with a large call's timing and a confirmed known issue's
per-call veto (known/avoid.py `veto`) applied in one place, `_as_read`. Dispatch walks the ranked
candidates and takes the first that passed.

Verification is reached through one narrow interface, `Verification`: a backend's stored verdict
(no check), its verdict (checked now on a miss), work ahead of the first calls, the start of the
checking worker. The checks side implements it (checks/selection.py `VERIFICATION`), and it is
loaded here, by the target string `VERIFICATION`, at the first call that needs a verdict, at
`prepare` or at `gpuparity.prepare()`: the one place the ops meet checks/, never at an import,
so `import gpuparity` and the import of an op load no check machinery and start no process.
`use(other)` puts another in its place (a test's planted verifier).

First calls do not wait for a verdict (`GPUPARITY_FIRST_CALLS`, default "baseline"): where the
verification can run in the background (checks in a worker: a GPU, GPUPARITY_PROBE=subprocess),
a call whose candidate's verdict is not in yet is served by the op's `baseline` (what torch runs
for it without gpuparity: SDPA as torch dispatches it for attention, the op's trusted plain
composition otherwise) while the candidate is verified, and the calls after its verdict is
stored take the candidate if it passed (or walk on to the next, as a waiting call would have).
No backend of gpuparity's own serves a call before its verdict; the verdicts and the backends
chosen once they are in are those a waiting first call gets. "wait": every first call waits for
its verdict, as before (benchmarks, tests of the kernels themselves). A call no baseline can
serve (ALiBi, which only the Triton kernels implement) waits. Under torch.compile the choice is
made at trace time and waits: see `resolve_waiting`."""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from .. import dispatch, priors, targets
from ..contracts import get_spec
from ..known import avoid as known_avoid
from ..registry import Backend, Problem

__all__ = ["FIRST_CALLS", "VERIFICATION", "Verification", "baseline", "explain", "prepare", "rank", "resolve",
           "resolve_waiting", "use", "verdict"]

Verdict = Dict[str, Any]   # {"passed", "reason", "time_ms", ...}: one backend's, for an op, dtype and kind here


class Verification(Protocol):
    """All the selector asks of verification."""

    def stored(self, problem: Problem, backend: Backend) -> Optional[Verdict]:
        """The verdict stored here for `backend` at calls like `problem`, None if none (no check)."""

    def verdict(self, problem: Problem, backend: Backend) -> Verdict:
        """The stored verdict, `backend` checked now on a miss (or the check already under way
        waited for); the known issues that name it confirmed or ruled out with it."""

    def verdict_soon(self, problem: Problem, backend: Backend) -> Optional[Verdict]:
        """The stored verdict, or None once `backend`'s check was started in the background (the
        caller serves the call elsewhere meanwhile); where checks cannot run in the background,
        the verdict checked now (as `verdict`). Optional: a verification without it is waited for."""

    def prepare(self, problems: Sequence[Problem], resolve: Callable[[Problem], Backend]) -> int:
        """Queue, in the background, the checks the first auto calls of `problems` would make,
        each chosen by `resolve` as its first call would be; how many were queued."""

    def start(self) -> None:
        """Start the checking worker now where checks run in one (a GPU, GPUPARITY_PROBE=subprocess)."""


# The checks side's implementation: loaded at the first need, so that no import loads it.
VERIFICATION = "gpuparity.checks.selection:VERIFICATION"
_in_use: Optional[Verification] = None


def use(verification: Optional[Verification]) -> None:
    """Verify through `verification` from now on (None: the checks side's again)."""
    global _in_use
    _in_use = verification
    dispatch.forget()


def _verification() -> Verification:
    global _in_use
    if _in_use is None:
        _in_use = targets.load(VERIFICATION)
    return _in_use


def _time_of(found: Verdict, large: bool) -> Optional[float]:
    if large and found.get("time_ms_large") is not None:
        return float(found["time_ms_large"])
    return None if found.get("time_ms") is None else float(found["time_ms"])


def _as_read(problem: Problem, found: Verdict, large: bool) -> Verdict:
    """A verdict as auto reads it for this call: a large call's time is the large timing case's
    (contracts/base.py large_timing_params), and a confirmed known issue whose regime holds the
    call fails it for this call only (known/avoid.veto: e.g. cuDNN SDPA with gradients at
    Sk % 128 == 64, SDPA-CUDNN-MASK-LSE). Every verdict dispatch sees passes here, once."""
    time_ms = _time_of(found, large) if found.get("passed") else None
    if time_ms is not None and time_ms != found.get("time_ms"):
        found = {**found, "time_ms": time_ms}
    return known_avoid.veto(problem, found)


def verdict(problem: Problem, backend: Backend) -> Verdict:
    """The verdict auto reads for `backend` at this call (checked now if none is stored)."""
    return _as_read(problem, _verification().verdict(problem, backend), get_spec(problem.op).is_large(problem))


FIRST_CALLS = "GPUPARITY_FIRST_CALLS"   # "baseline" (default): first calls do not wait for a verdict; "wait"
FIRST_CALL_MODES = ("baseline", "wait")


def env_mode(name: str, modes: Sequence[str]) -> str:
    """The environment variable `name`, one of `modes` (unset: the first); ValueError otherwise."""
    mode = os.environ.get(name, modes[0])
    if mode not in modes:
        raise ValueError(f"{name}: expected one of {tuple(modes)}, got {mode!r}")
    return mode


def _first_calls() -> str:
    return env_mode(FIRST_CALLS, FIRST_CALL_MODES)


def baseline(problem: Problem) -> Optional[Backend]:
    """What serves a call while the verdict of the backend auto would choose is pending: what torch
    runs for the op without gpuparity, where it can serve the call. For attention torch's SDPA as
    torch dispatches it (backends/sdpa.py BASELINE: an unpatched transformers model's attention;
    not for a softcap or a float mask that needs a gradient), else the op's trusted plain
    composition (the fallback auto ends at: the eager RMSNorm formula, silu(gate) * up, the
    rotation, ...). None when neither serves it (ALiBi): that call waits for its verdict."""
    found = [b for b in dispatch.backends(problem.op) if b.fallback]
    if problem.op == "attention":
        from ..backends.sdpa import BASELINE
        found.insert(0, BASELINE)
    return next((b for b in found if not b.reasons(problem)), None)


def verdict_or_pending(problem: Problem, backend: Backend) -> Verdict:
    """`verdict`, but where the verification can run in the background and a baseline serves
    this call, `dispatch.Pending(backend, baseline)` while the verdict is not stored yet (its check
    started then): dispatch serves the call with the baseline, and the next call asks again."""
    source = _verification()
    soon = getattr(source, "verdict_soon", None)
    if soon is None or _first_calls() == "wait":
        return verdict(problem, backend)
    found = soon(problem, backend)
    if found is None:
        serving = baseline(problem)
        if serving is None:
            return verdict(problem, backend)   # waits for the check just started
        raise dispatch.Pending(backend, serving)
    return _as_read(problem, found, get_spec(problem.op).is_large(problem))


def rank(problem: Problem, candidates: List[Backend]) -> List[Tuple[Backend, str, Optional[Verdict]]]:
    """`candidates` in the order a first call tries them, each with why and its stored verdict as
    auto reads it (None: none yet): those timed here (doctor, background refinement) fastest first,
    then the rest in this device family's prior order (priors.py), the composition where the prior
    puts it, else last. Backends whose stored verdict failed are left in (their verdict says no
    without a check). A first call verifies only the first that passes, not every backend."""
    source = _verification()
    large = get_spec(problem.op).is_large(problem)
    prior = priors.order(problem.op, problem.device, large)
    timed, untimed, found = [], [], {}
    for position, backend in enumerate(candidates):
        stored = source.stored(problem, backend) if not backend.fallback else None
        time_ms = _time_of(stored, large) if stored and stored.get("passed") else None
        found[backend.name] = None if stored is None else _as_read(problem, stored, large)
        if time_ms is not None:
            timed.append((time_ms, position, backend))
        else:
            where = prior.index(backend.name) if backend.name in prior else (
                len(prior) + (len(candidates) if backend.fallback else position))
            untimed.append((where, position, backend))
    family = priors.family(problem.device)
    return ([(b, f"{t:.3g} ms measured here", found[b.name]) for t, _, b in sorted(timed, key=lambda x: x[:2])] +
            [(b, f"{family} prior", found[b.name]) for _, _, b in sorted(untimed, key=lambda x: x[:2])])


# resolve(problem, backend="auto") -> Backend. A partial, not a def: one Python frame fewer on
# every eager call of every op (host time is what short shapes are bound by).
resolve = functools.partial(dispatch.resolve, verdict=verdict_or_pending, rank=rank)
# The resolution that waits for the verdict: `prepare`'s (it verifies ahead of the first calls,
# in a thread of its own) and the one torch.compile bakes into a graph while it traces
# (ops/library.py traced_backend). A baseline baked in instead, with a guard on a global that
# the verdict bumps, was tried (2026-12-06, CPU): dynamo reads a guarded global's value when it
# builds the guards, after the backend compiled the graph, so a verdict that landed during that
# compilation (the usual case: seconds of checks against tens of seconds of inductor) was taken
# as already in, and the graph kept the baseline for good; where it did recompile, that cost a
# second compilation of the whole graph.
resolve_waiting = functools.partial(dispatch.resolve, verdict=verdict, rank=rank)


def explain(problem: Problem) -> Dict[str, Any]:
    return dispatch.explain(problem, verdict=verdict, rank=rank)


def prepare(problems: Sequence[Problem] = ()) -> int:
    """Get verification ready ahead of the first auto calls: start the checking worker now where
    checks run in one (a GPU, or GPUPARITY_PROBE=subprocess), so that its start (torch, Triton,
    the backends: seconds) overlaps the caller's setup, and queue the checks the first auto calls
    of `problems` would make, each resolved as its first call would be, waiting for each verdict (`resolve_waiting`);
    `gpuparity.patch` passes its model's calls. Returns how many were queued (0 without
    `problems`, and where checks run in-process: a CPU unless GPUPARITY_PROBE=subprocess).
    Public as `gpuparity.prepare()`; without it the worker starts at the first call that needs
    a verdict."""
    source = _verification()
    source.start()
    return source.prepare(list(problems), resolve_waiting) if problems else 0
