"""Tell a known torch fault from the implementation's own error.

A function checked with --impl that calls torch's F.scaled_dot_product_attention meets torch's
faults: on a GPU, torch 2.11's efficient kernel raises "CUDA error: misaligned address" on an fp32
view off 16-byte alignment (SDPA-EFFICIENT-MISALIGNED), so a correct function ERRORs on the
battery's offset views. The ERROR names the issue (battery._label_known), but naming is a guess
from the words: a function's own kernel can fault the same way. So each such ERROR runs once
more, on the same inputs, with the SDPA kernels the named issues' `sidestep_sdpa` lists set aside
(known/sidestep.py): torch then serves the same call with another of its kernels.

- It passes: the function's arithmetic is right and the fault was torch's kernel. The check is a
  PASS whose reason starts with SET_ASIDE and says what the call raised as it was made, and which
  known issue that is: the user learns that the function, as written, meets torch's fault on such
  inputs here, without a false alarm against the function.
- It does not pass: the ERROR stays, and its reason adds what the rerun gave: the error was not
  (only) torch's.

Reruns run after the battery, in a fresh worker (a CUDA fault leaves the process that met it
unusable), within what is left of the run's budget; one not run leaves the ERROR as it was."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..known.avoid import named_by_error
from ..known.sidestep import sdpa_set_aside
from .plan import Task
from .pool import Budget, run_tasks
from .results import CheckResult, Status, clip

SET_ASIDE = "passed with torch's SDPA kernel(s) "
FIRST_ID = 1_000_000   # rerun task ids: apart from the battery's own


def set_aside_for(result: CheckResult, device_type: str) -> Tuple[List[str], List[str]]:
    """(known issue ids, SDPA kernels to set aside) for a rerun of `result`; ([], []): it is not
    such an ERROR. It is one when an --impl's ERROR message names known issues (`error_markers`)
    that list `sidestep_sdpa`."""
    if result.status != Status.ERROR or not result.backend.startswith("impl:"):
        return [], []
    issues = [issue for issue, _ in named_by_error(result.reason, device_type)]
    kernels = sdpa_set_aside(issues)
    return (issues, kernels) if kernels else ([], [])


def attribute(held: List[Tuple[CheckResult, Tuple[List[str], List[str]]]], impl: str, *, isolate: bool = True,
              timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None,
              budget: Optional[Budget] = None) -> None:
    """Rerun each (ERROR, set_aside_for's answer) of `held` and settle it in place (module doc)."""
    if not held:
        return
    tasks = [Task(FIRST_ID + n, r.op, r.backend, r.case, dict(r.params), r.dtype, r.device, r.seed or 0, impl=impl,
                  base_seed=r.base_seed, level=r.level, set_aside=list(kernels))
             for n, (r, (_, kernels)) in enumerate(held)]
    reruns = run_tasks(tasks, isolate=isolate, timeout=timeout, env=env, workers=1, budget=budget, crash_limit=None)
    for (result, (issues, kernels)), rerun in zip(held, reruns):
        settle(result, issues, kernels, rerun)


def settle(result: CheckResult, issues: List[str], kernels: List[str], rerun: CheckResult) -> None:
    """`result` (an ERROR that names the known `issues`) after its rerun with the SDPA `kernels` set aside."""
    aside = ", ".join(kernels)
    if rerun.status == Status.PASS:
        result.status = Status.PASS
        result.comparisons = rerun.comparisons
        result.reason = (f"{SET_ASIDE}{aside} set aside: the function's results are right; as called, it met "
                         f"torch's fault on these inputs here, known issue {' or '.join(issues)} (`gpuparity "
                         f"known-issues` gives the remedy): {result.reason}")
    elif rerun.status == Status.NOT_RUN:
        result.reason += f" [not told apart from torch's fault: the rerun without {aside} was not run: {rerun.reason}]"
    else:
        result.reason += (f" [with torch's SDPA kernel(s) {aside} set aside the same inputs gave "
                          f"{rerun.status.value}: {clip(rerun.reason, 300)}; so not (only) torch's fault]")
