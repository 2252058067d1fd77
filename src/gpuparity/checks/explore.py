"""--explore SECONDS: after the level's checks, keep drawing family members for as long as
asked, spending more draws in the families whose errors came closest to their bound
(err / allowed, a failure counting as far past it). Seeded: the same seed draws the same
members in the same order given the same errors. Each draw is an ordinary battery check (same
policy, same float64 referee, same crash isolation), named "<family>.<label>" or
"<family>.draw<N>" so that `check --case` reruns it."""
from __future__ import annotations

import logging
import random
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import families as fam
from .plan import plan
from .pool import Budget, run_tasks
from .results import NOT_RUN_HERE, CheckResult, Status
from ..contracts import OPS, get_spec

log = logging.getLogger(__name__)

ROUND = 6            # members drawn per round (one worker start per round)
FLOOR_WEIGHT = 0.05  # every family keeps some chance
PAST_BOUND = 4.0     # the closeness a failed check counts as


def closeness(result: CheckResult) -> Optional[float]:
    """err / allowed of the check's worst output (PAST_BOUND for a failure without numbers)."""
    if result.status.bad:
        worst = result.worst_comparison
        if worst is not None and worst.err is not None and worst.allowed:
            return max(worst.err / worst.allowed, 1.0)
        return PAST_BOUND
    ratios = [c.err / c.allowed for c in result.comparisons if c.err is not None and c.allowed]
    return max(ratios) if ratios else None


def explore(seconds: float, ops: Optional[Sequence[str]], device, dtypes=None, backends=None, impl=None,
            seed: int = 0, previous: Sequence[CheckResult] = (), on_result: Optional[Callable] = None,
            isolate: bool = True, timeout: Optional[float] = None, env=None, level: str = "default",
            impl_lacks: Optional[Sequence[str]] = None) -> List[CheckResult]:
    """Explore for `seconds` after `previous` (the level's results, which seed the weights);
    returns the new results. `level`: the run's (its dtypes and its budget for sized members);
    `impl_lacks`: plan's."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"explore: expected a positive number of seconds, got {seconds!r}")
    budget = Budget(seconds)
    ops = list(ops or OPS)
    rng = random.Random(seed * 7919 + 17)
    weight: Dict[Tuple[str, str], float] = {}
    seen: Dict[str, set] = {op: set() for op in ops}
    draws: Dict[Tuple[str, str], int] = {}
    said: set = set()   # (check, reason) of the SKIPs already reported: not reported twice
    families = {(op, f.name): f for op in ops for f in fam.all_families(get_spec(op), level)}

    def learn(result: CheckResult) -> None:
        if result.status == Status.SKIP and result.reason.startswith(NOT_RUN_HERE):
            # too large at the run's level: explore tries it again under --level full's budget
            said.add((result.key, result.reason))
            return
        seen.setdefault(result.op, set()).add(result.case)
        name = fam.family_of(result.case)
        ratio = closeness(result)
        if name is not None and ratio is not None and (result.op, name) in families:
            weight[(result.op, name)] = max(weight.get((result.op, name), 0.0), ratio)

    for result in previous:
        learn(result)
    found: List[CheckResult] = []
    while not budget.spent and families:
        picks: Dict[str, list] = {}
        for _ in range(ROUND):
            keys = list(families)
            key = rng.choices(keys, weights=[FLOOR_WEIGHT + weight.get(k, 0.0) for k in keys])[0]
            case = _next_member(rng, key, families[key], seen, draws)
            if case is None:
                families.pop(key)          # every member seen and nothing to draw: done with it
                if not families:
                    break
                continue
            seen[key[0]].add(case.name)
            picks.setdefault(key[0], []).append(case)
        if not picks:
            break
        tasks, decided = plan(list(picks), level, device, dtypes, backends, impl, seed, cases=picks, sized_level="full",
                              impl_lacks=impl_lacks)
        for result in decided:
            if (result.key, result.reason) in said:
                continue   # still not runnable, for the reason the level's report already gives
            learn(result)
            found.append(result)
            if on_result:
                on_result(result)

        def record(result: CheckResult) -> None:
            if result.status == Status.NOT_RUN and result.reason.startswith(budget.reason):
                return  # a draw the exploring time did not reach: not a check left out
            learn(result)
            found.append(result)
            if on_result:
                on_result(result)
        run_tasks(tasks, isolate=isolate, timeout=timeout, env=env, on_result=record, budget=budget)
    log.info("explore: %d checks in %.0f s; closest families: %s", len(found), seconds,
             ", ".join(f"{op}/{name} {ratio:.2g}" for (op, name), ratio in
                       sorted(weight.items(), key=lambda item: -item[1])[:5]))
    return found


def _next_member(rng: random.Random, key, family: fam.Family, seen, draws):
    """An enumerated member not run yet, else a fresh draw."""
    op = key[0]
    spec = get_spec(op)
    unseen = [(label, params) for label, params in family.members
              if f"{family.name}{fam.SEPARATOR}{label}" not in seen[op]]
    if unseen:
        label, params = rng.choice(unseen)
        return family.case(spec.make_case, label, params)
    if family.sized:
        return None
    draws[key] = draws.get(key, 0) + 1
    return fam.drawn(spec, family, draws[key])
