"""Tell a known torch fault from the implementation's own error.

A function checked with --impl that calls torch's F.scaled_dot_product_attention meets torch's
faults: on a GPU, torch 2.11's efficient kernel raises "CUDA error: misaligned address" on an fp32
view off 16-byte alignment (SDPA-EFFICIENT-MISALIGNED), so a correct function ERRORs on the
battery's offset views. The ERROR names the issue (battery._label_known), but naming is a guess
from the words: a function's own kernel can fault the same way. So each ERROR that names issues
whose `sidestep_sdpa` lists kernels runs once more, on the same inputs, with every fused SDPA
kernel set aside (known/sidestep.py): torch then serves the same call with its math kernel.

- It passes: the function's arithmetic is right and the fault was torch's kernel. The check is a
  PASS whose reason starts with SET_ASIDE and says what the call raised as it was made, and which
  known issue that is: the user learns that the function, as written, meets torch's fault on such
  inputs here, without a false alarm against the function.
- It does not pass: the ERROR stays, and its reason adds what the rerun gave: the error was not
  (only) torch's.

A FAIL of an --impl of an attention op on a GPU is told apart the same way, with torch's fused
SDPA kernels (flash, efficient, cuDNN) set aside, so that its math kernel serves the call. The
FAIL stays a FAIL (the function's results are wrong on this machine, as called), but where the
rerun passes its reason starts with FUSED_WRONG: the wrong numbers come from torch's fused
kernel on these inputs, not from the function's own arithmetic, a candidate torch bug. The first
MAX_KERNEL_HUNTS such FAILs then run once per fused kernel with only that one allowed (the others
set aside): the kernel(s) that fail alone are named ("torch's CUDNN_ATTENTION kernel gives them").
At most MAX_FAIL_RERUNS FAILs of a run are rerun.

Reruns run after the battery, in a fresh worker (a CUDA fault leaves the process that met it
unusable), within what is left of the run's budget; one not run leaves the ERROR as it was."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..known.avoid import named_by_error
from ..known.engine import SDPA_KERNELS
from ..known.sidestep import sdpa_set_aside, wrong_numbers_of
from .plan import Task
from .pool import Budget, run_tasks
from .results import CheckResult, Status, clip

SET_ASIDE = "passed with torch's SDPA kernel(s) "
FUSED_WRONG = "wrong as called, right on torch's math SDPA kernel: "
FIRST_ID = 1_000_000   # rerun task ids: apart from the battery's own
ATTENTION_OPS = ("attention", "attention_varlen", "attention_decode")   # ops whose torch form is SDPA
MAX_FAIL_RERUNS = 16
MAX_KERNEL_HUNTS = 8   # FAILs whose fused kernel is named: one rerun per fused kernel each


def set_aside_for(result: CheckResult, device_type: str) -> Tuple[List[str], List[str]]:
    """(known issue ids, SDPA kernels to set aside) for a rerun of `result`; ([], []): none. An
    --impl's ERROR whose message names known issues (`error_markers`) that list `sidestep_sdpa`:
    those issues; an --impl's FAIL of an attention op on a GPU: no issue. Either sets aside every
    fused kernel (SDPA_KERNELS), so that torch's math kernel serves the rerun."""
    if not result.backend.startswith("impl:"):
        return [], []
    if result.status == Status.FAIL and device_type == "cuda" and result.op in ATTENTION_OPS:
        return [], list(SDPA_KERNELS)
    if result.status != Status.ERROR:
        return [], []
    issues = [issue for issue, _ in named_by_error(result.reason, device_type)]
    # every fused kernel, not only those the entries name: with cuDNN and efficient set aside,
    # torch 2.11 served a bf16 call on a k view off alignment with its flash kernel, which raised
    # the same "misaligned address" on an H100 (cover.47); its math kernel is plain ops
    return (issues, list(SDPA_KERNELS)) if sdpa_set_aside(issues) else ([], [])


def attribute(held: List[Tuple[CheckResult, Tuple[List[str], List[str]]]], impl: str, *, isolate: bool = True,
              timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None,
              budget: Optional[Budget] = None) -> None:
    """Rerun each (ERROR or FAIL, set_aside_for's answer) of `held` and settle it in place (module
    doc); FAILs past the first MAX_FAIL_RERUNS stay as they are."""
    fails = [n for n, (r, _) in enumerate(held) if r.status == Status.FAIL]
    past_cap = set(fails[MAX_FAIL_RERUNS:])
    held = [item for n, item in enumerate(held) if n not in past_cap]
    if not held:
        return
    def rerun_all(calls: List[Tuple[CheckResult, List[str]]], first_id: int) -> List[CheckResult]:
        """Each (result, kernels) as a check of the same inputs with the SDPA `kernels` set aside."""
        tasks = [Task(first_id + n, r.op, r.backend, r.case, dict(r.params), r.dtype, r.device, r.seed or 0,
                      impl=impl, base_seed=r.base_seed, level=r.level, set_aside=list(kernels))
                 for n, (r, kernels) in enumerate(calls)]
        return run_tasks(tasks, isolate=isolate, timeout=timeout, env=env, workers=1, budget=budget,
                         crash_limit=None) if tasks else []

    reruns = rerun_all([(r, kernels) for r, (_, kernels) in held], FIRST_ID)
    fused_wrong = [n for n, ((r, _), rerun) in enumerate(zip(held, reruns))
                   if r.status == Status.FAIL and rerun.status == Status.PASS][:MAX_KERNEL_HUNTS]
    alone = rerun_all([(held[n][0], [other for other in SDPA_KERNELS if other != kernel])
                       for n in fused_wrong for kernel in SDPA_KERNELS], FIRST_ID + len(held))
    guilty: Dict[int, List[str]] = {}
    for i, n in enumerate(fused_wrong):
        outcomes = alone[len(SDPA_KERNELS) * i:len(SDPA_KERNELS) * (i + 1)]
        if all(o.status != Status.NOT_RUN for o in outcomes):   # else: not told (a run not made)
            guilty[n] = [kernel for kernel, o in zip(SDPA_KERNELS, outcomes) if o.status == Status.FAIL]
    for n, ((result, (issues, kernels)), rerun) in enumerate(zip(held, reruns)):
        settle(result, issues, kernels, rerun, guilty.get(n))


def settle(result: CheckResult, issues: List[str], kernels: List[str], rerun: CheckResult,
           guilty: Optional[List[str]] = None) -> None:
    """`result` (an ERROR that names the known `issues`, or a FAIL) after its rerun with the SDPA
    `kernels` set aside; `guilty`: for a FAIL that rerun passed, the fused kernels that fail it
    alone (None: not run)."""
    aside = ", ".join(kernels)
    if result.status == Status.FAIL:
        if rerun.status == Status.PASS:
            result.reason = (f"{FUSED_WRONG}with torch's fused SDPA kernel(s) {aside} set aside the same inputs "
                             f"pass, so the wrong numbers come from torch's fused kernel on these inputs here, not "
                             f"from the function's own arithmetic{_which(guilty)} (a candidate torch bug: "
                             f"`gpuparity known-issues` lists the known ones): {result.reason}")
        elif rerun.status == Status.FAIL:
            result.reason += " [the same with torch's fused SDPA kernels set aside: not torch's kernel]"
        return
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


def _which(guilty: Optional[List[str]]) -> str:
    """The clause naming the fused kernel(s) that fail a check alone (a kernel alone that raises,
    or that torch has none of for the call, so that math serves it, does not give wrong numbers)."""
    if guilty is None:
        return ""
    if not guilty:
        return "; no fused kernel alone (the others set aside) fails it"
    others = [kernel for kernel in SDPA_KERNELS if kernel not in guilty]
    rest = f"; {' and '.join(others)} alone pass, raise or have no kernel for the call" if others else ""
    kernels, fails = ("kernels give", "each fails") if len(guilty) > 1 else ("kernel gives", "it fails")
    known = wrong_numbers_of(guilty)
    listed = (f"; the known issues of wrong numbers from {'these kernels' if len(guilty) > 1 else 'that kernel'}: "
              f"{', '.join(known)} (`gpuparity known-issues` says which apply here)") if known else ""
    return (f"; torch's {' and '.join(guilty)} {kernels} them (alone, the others set aside, {fails} the check{rest})"
            f"{listed}")
