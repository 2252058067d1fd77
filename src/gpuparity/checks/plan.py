"""The battery's plan: which checks run (op x case x dtype x backend at a level), which are
decided up front as SKIP with a reason, and how long the run should take."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch

from .. import dispatch
from ..device import device_name
from . import families, relations
from .execute import dtype_from_name, dtype_name, task_seed
from .results import NOT_RUN_HERE, CheckResult, Status
from ..contracts import LEVELS, OPS, Case, get_spec

# Rough cost of one check, for the up-front estimate of --full.
# The up-front estimate: on a 16-core H100 machine the default level's 663 checks took 40 s in
# all on a fresh machine (Triton compiling every kernel), 25 s with its cache warm; on a 2-core
# CPU its 342 checks took 11-36 s (36 s with another job on the cores).
SECONDS_PER_CHECK = {"cpu": 0.1, "cuda": 0.05}
WORKER_START_S = {"cpu": 2.0, "cuda": 6.0}


@dataclasses.dataclass
class Task:
    id: int
    op: str
    backend: str
    case: str
    params: Dict[str, Any]
    dtype: str
    device: str
    seed: int
    impl: Optional[str] = None
    mode: str = "check"
    base_seed: Optional[int] = None  # the run's --seed, from which `seed` is derived
    level: Optional[str] = None
    repro: Optional[Dict[str, Any]] = None  # write a standalone repro of this check (execute.run_case)
    # torch SDPA kernels set aside while the implementation runs (known/sidestep.py; checks/attribute.py)
    set_aside: Optional[List[str]] = None

    def result(self, status: Status, reason: str = "", **extra) -> CheckResult:
        return CheckResult(op=self.op, backend=self.backend, case=self.case, dtype=self.dtype, device=self.device,
                           status=status, seed=self.seed, reason=reason, params=self.params,
                           base_seed=self.base_seed, level=self.level, **extra)


def normalize_device(device) -> torch.device:
    """None: the CPU; else the one check every device argument gets (device.device_name)."""
    return torch.device(device_name(device) if device is not None else "cpu")


def validate_device(device: torch.device) -> None:
    device_name(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device} was asked for, but torch sees no CUDA or ROCm GPU "
                             f"(torch {torch.__version__}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device} was asked for, but only {torch.cuda.device_count()} GPU(s) are visible")


def plan(ops: Optional[Sequence[str]] = None, level: str = "default", device="cpu",
         dtypes: Optional[Sequence[str]] = None, backends: Optional[Sequence[str]] = None,
         impl: Optional[str] = None, seed: int = 0, case_filter: Optional[Callable] = None,
         cases: Optional[Dict[str, Sequence[Case]]] = None, sized_level: Optional[str] = None,
         impl_lacks: Optional[Sequence[str]] = None):
    """(tasks to run, results already decided: SKIP with a reason). The cases of an op: its
    listed cases of `level` and its families' members the level selects (checks/families.py),
    or exactly `cases[op]` where given (named cases, explore's draws). `sized_level`: the level
    whose budget decides which long cases run (default: `level`; explore uses full's).
    `impl_lacks`: the optional keywords (spec.optional_keywords) `impl` does not take, where
    known (api.check asks its preflight): a case that needs one is a SKIP here, before any
    input is built (else the check finds out when it calls the implementation)."""
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {list(LEVELS)}, got {level!r}")
    device = normalize_device(device)
    ops = list(ops or OPS)
    if backends and not impl:
        check_backend_names(ops, backends)
    tasks: List[Task] = []
    decided: List[CheckResult] = []
    next_id = 0
    for op in ops:
        spec = get_spec(op)
        op_dtypes = spec.dtypes(device, level)
        if dtypes:
            wanted = [dtype_name(d) if isinstance(d, torch.dtype) else d for d in dtypes]
            op_dtypes = [dtype_from_name(d) for d in wanted]
        if impl:
            candidates = [(f"impl:{impl}", None)]
        else:
            available = dispatch.backends(op)
            if backends:
                available = [b for b in available if b.name in backends]
            candidates = [(b.name, b) for b in available]
        in_dtypes, ruled_out = {}, {}   # case name -> the dtypes it runs in, where not each of op_dtypes
        if cases is not None and op in cases:
            op_cases = list(cases[op])
        else:
            op_cases = [case for case in spec.cases() if case.at(level)]
            deep = len(ops) == 1 and _implementations(spec, candidates, op_dtypes, device) == 1
            members, too_big_members = families.select(
                spec, level, seed, deep,
                lambda case: _sized_reason(spec, case, level, device,
                                           _serving(spec, case, candidates, op_dtypes, device, level)))
            op_cases += members + [case for case, _ in too_big_members]
            # the equivalence relations (checks/relations.py) on a seeded few of those cases
            related = relations.battery_cases(spec, level, seed, [c for c in op_cases if c.name not in
                                                                  {case.name for case, _ in too_big_members}], deep)
            op_cases += related
            # a member that select() ruled out keeps its reason (a family of a higher level
            # would fit this level's budget, but this level does not run it)
            ruled_out = {case.name: why for case, why in too_big_members}
            # a relation check runs in one dtype (seeded); at the doctor's default level so
            # does each family member
            for case in related + (members if not deep and level == "default" else []):
                runnable = [d for d in op_dtypes if _runs_in(case, d, op_dtypes, level)]
                if runnable:
                    in_dtypes[case.name] = [runnable[task_seed(seed, op, case.name, "") % len(runnable)]]
            # check --impl at the default level: a covering array declared with dtype_pairs runs
            # each row in about one dtype, every value of every dimension in every dtype; a
            # family with dtypes_in_turn each member in one, the dtypes in turn
            if deep and level == "default":
                in_dtypes.update(_array_dtypes(spec, members, op_dtypes, level))
        for case in op_cases:
            if case_filter and not case_filter(op, case):
                continue
            too_big = ruled_out.get(case.name) or _sized_reason(
                spec, case, sized_level or level, device, _serving(spec, case, candidates, op_dtypes, device, level))
            for dtype in op_dtypes:
                if not _runs_in(case, dtype, op_dtypes, level) or dtype not in in_dtypes.get(case.name, [dtype]):
                    continue
                seed_here = task_seed(seed, op, case.name, dtype_name(dtype))
                for name, backend in candidates:
                    if backend is not None and name == spec.baseline_backend and case.params.get("relation"):
                        continue   # the baseline's two sides are the relation's bar: nothing to check
                    task = Task(next_id, op, name, case.name, case.params, dtype_name(dtype), str(device),
                                seed_here, impl=impl, base_seed=seed, level=level)
                    next_id += 1
                    if backend is not None and LEVELS.index(backend.battery_level) > LEVELS.index(level):
                        decided.append(task.result(Status.SKIP, f"{name}: compiles per shape, so the battery "
                                                                f"checks it at --{backend.battery_level} (probed on first use)"))
                        continue
                    if too_big:
                        decided.append(task.result(Status.SKIP, f"{NOT_RUN_HERE}{too_big}"))
                        continue
                    missing = _missing_keywords(spec, case.params, impl_lacks) if backend is None else []
                    if missing:   # the reason the call would give (the contract's call)
                        decided.append(task.result(Status.SKIP, f"{impl.rpartition(':')[2]}: takes no "
                                                                f"{' or '.join(missing)} argument, "
                                                                f"which this case needs"))
                        continue
                    if backend is not None:
                        reasons = backend.reasons(spec.problem(case.params, dtype, device))
                        if not reasons and case.params.get("relation"):   # its second call too
                            reasons = [f"the relation's second call: {why}" for why in backend.reasons(
                                spec.problem(relations.second_params(op, case.params), dtype, device))]
                        if reasons:
                            decided.append(task.result(Status.SKIP, "; ".join(reasons)))
                            continue
                    tasks.append(task)
    return tasks, decided


def _array_dtypes(spec, members: Sequence[Case], op_dtypes, level: str) -> Dict[str, List[torch.dtype]]:
    """The dtypes of each row of the op's arrays declared with dtype_pairs (families.cover_dtypes),
    and of each member of a family with dtypes_in_turn."""
    out: Dict[str, List[torch.dtype]] = {}
    for fam in spec.families():
        if fam.dtypes_in_turn:
            labels = [label for label, _ in fam.members]
            for case in members:
                if families.family_of(case.name) == fam.name:
                    runnable = [d for d in op_dtypes if _runs_in(case, d, op_dtypes, level)]
                    if runnable:
                        out[case.name] = [runnable[labels.index(case.name.partition(".")[2]) % len(runnable)]]
    for name in families.covering_declarations(spec):
        rows = [case for case in members if families.family_of(case.name) == name]
        if not rows:
            continue
        # the dtypes some row runs in (a row of 16-bit at --full only, half_at_full, runs in
        # the others: its pick where it can, else its first)
        runnable = [d for d in op_dtypes if any(_runs_in(case, d, op_dtypes, level) for case in rows)]
        picks = families.cover_dtypes(spec, name, runnable)
        if picks is not None:
            for case in rows:
                own = [d for d in runnable if _runs_in(case, d, op_dtypes, level)]
                out[case.name] = [d for d in picks[case.name.partition(".")[2]] if d in own] or own[:1]
    return out


def _missing_keywords(spec, params: Dict[str, Any], lacks: Optional[Sequence[str]]) -> List[str]:
    """The keywords a case's calls pass (a relation's second call too) that the implementation lacks."""
    if not lacks:
        return []
    needed = list(spec.keywords_needed(params))
    if params.get("relation"):
        needed += [k for k in spec.keywords_needed(relations.second_params(spec.op, params)) if k not in needed]
    return [name for name in needed if name in lacks]


def _sized_reason(spec, case: Case, level: str, device: torch.device, checks: int) -> Optional[str]:
    """Why a case of a sized family (long sequences, > 2^31 elements) does not run here."""
    work = spec.work(case.params)
    if work is None or families.family_of(case.name) is None:
        return None
    return families.not_runnable(work, level, device, checks, reference_bytes=spec.reference_bytes(case.params))


def _implementations(spec, candidates, op_dtypes, device) -> int:
    """How many of the candidates can serve the op's first case here (the others SKIP)."""
    first = spec.cases()[0]
    return sum(1 for _, backend in candidates
               if backend is None or not backend.reasons(spec.problem(first.params, op_dtypes[0], device)))


def _runs_in(case: Case, dtype: torch.dtype, op_dtypes, level: str) -> bool:
    if case.params.get("half_at_full") and dtype != torch.float32 and level != "full":
        return False
    # fp16 runs the kernels bf16 runs, in a second dtype: at the default level it gets the
    # quick (hostile) cases, bf16 every case; --full runs fp16 on all.
    return not (level == "default" and dtype == torch.float16 and torch.bfloat16 in op_dtypes
                and case.level != "quick")


def _serving(spec, case: Case, candidates, op_dtypes, device, level: str) -> int:
    """How many checks would run `case` (implementations that serve it x dtypes)."""
    count = 0
    for dtype in [d for d in op_dtypes if _runs_in(case, dtype=d, op_dtypes=op_dtypes, level=level)]:
        for _, backend in candidates:
            if backend is None:
                count += 1
            elif (LEVELS.index(backend.battery_level) <= LEVELS.index(level)
                  and not backend.reasons(spec.problem(case.params, dtype, device))):
                count += 1
    return count


def check_backend_names(ops: Sequence[str], backends: Sequence[str]) -> None:
    """A backend name that none of `ops` has is a typo, not a filter that matches nothing."""
    have = sorted({b.name for op in ops for b in dispatch.backends(op)})
    unknown = [b for b in backends if b not in have]
    if unknown:
        raise ValueError(f"backends: got {', '.join(unknown)}, which no selected op ({', '.join(ops)}) has; "
                         f"expected names from {', '.join(have)}")


def estimate_seconds(n_tasks: int, device) -> float:
    kind = normalize_device(device).type
    return WORKER_START_S[kind] + n_tasks * SECONDS_PER_CHECK[kind]


def is_jit(task: Task) -> bool:
    """Whether the task's backend compiles on first use (Triton)."""
    if task.impl:
        return False
    try:
        return dispatch.get(task.op, task.backend).jit
    except ValueError:
        return False


def timing_tasks(keys: Iterable[tuple], device: str, mode: str = "time", first_id: int = 0,
                 only: Optional[Callable[[Task], bool]] = None) -> List[Task]:
    """One task per (op, backend, dtype) worth timing on the op's timing case: mode "time"
    measures it; mode "warm" only runs it once (compiling what the timing will need).
    Timings only rank candidates, so fallback compositions (never ranked) are left out, and
    so is an (op, dtype) with a single candidate left (nothing to rank). `only` filters the
    tasks after that."""
    candidates: Dict[tuple, List[str]] = {}
    for op, backend, dtype in sorted(set(keys)):
        if get_spec(op).timing_params() is not None and not dispatch.get(op, backend).fallback:
            candidates.setdefault((op, dtype), []).append(backend)
    tasks = []
    for (op, dtype), backends in candidates.items():
        if len(backends) < 2:
            continue
        for backend in backends:
            for case, params in timing_cases(op, device):
                task = Task(first_id + len(tasks), op, backend, case, params, dtype, device, 0, mode=mode)
                if only is None or only(task):
                    tasks.append(task)
    return tasks


# The training-size timing case: timed by device time (execute.time_case(device_time=True)),
# where the small case is timed step by step, host included.
LARGE_TIMING_CASE = "timing-large"


def timing_cases(op: str, device: str) -> List[tuple]:
    """(case name, params) of the op's timing runs on `device`: "timing", plus "timing-large"
    on a GPU where the spec has one (contracts/base.py large_timing_params)."""
    spec = get_spec(op)
    cases = [("timing", spec.timing_params())]
    large = spec.large_timing_params()
    if large is not None and not str(device).startswith("cpu"):
        cases.append((LARGE_TIMING_CASE, large))
    return cases


def timing_field(case: str) -> str:
    """The verdict field a timing case's milliseconds go to: "time_ms" (each step synchronised:
    host and device) or, for the training-size case, "time_ms_large" (device time per step)."""
    return "time_ms_large" if case == LARGE_TIMING_CASE else "time_ms"
