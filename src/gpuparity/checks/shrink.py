"""Shrink a failing check to the smallest case that still fails, then hand over a repro.

Greedy, in phases: sizes first (every size parameter tried at 1, 2, half, and one tile of
16/32/64/128 less, so a remainder such as Sk % 128 == 64 survives: 192 -> 64), then values
(hostile value regimes back to plain ones), then the mask (simpler forms, then none), then
layouts. A candidate is kept when it fails the same way (_failure_kind: the same status; for an
ERROR, the same exception type, and sticky or not; for a FAIL, one of the same outputs or
gradients). Each candidate runs as a battery task: in a crash-isolated worker (kept alive across
candidates, replaced after one that crashed, hung or hit a sticky device error: a candidate after
it runs in a fresh process, so it fails only if it fails itself) unless isolate=False. The last,
smallest failing case is run once more with a standalone repro written (checks/repro.py)."""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .plan import Task
from .pool import DEFAULT_TIMEOUT_S, WorkerPool, _run_one
from ..contracts import get_spec
from .results import CheckResult, Status, clip
from .worker import STICKY_NOTE

log = logging.getLogger(__name__)

# Size parameters of the specs (ints, and lists/tuples of ints), shrunk in this order.
SIZE_KEYS = ("B", "Sq", "Sk", "S", "S_max", "H", "Hkv", "D", "rotary_dim", "n", "c", "vocab", "hidden", "shape", "a",
             "b", "x", "w", "q_lens", "k_lens", "varlen", "lengths")
# (key, plain value): value regimes undone one at a time
VALUE_RESETS = (("value", "normal"), ("values", None), ("logit_scale", 1.0), ("scale", None), ("softcap", None),
                ("offset", 0.0), ("spread", 1.0))
MASK_RESETS = (("mask_fill", "random"), ("empty_rows", 0), ("window", None), ("causal", False), ("mask", "none"))
LAYOUT_RESETS = (("views", None),)   # then the spec's default layout (_layout_candidates)
MASK_SIMPLER = ("key_padding", "bool", "float")
SHAPE_SIMPLER = ("qk", "11_k", "b1qk")
# what does not change a case's shape: params the battery adds (results) or reads for inputs
IGNORED = ("time_ms", "dtype")


@dataclasses.dataclass
class Shrunk:
    """The smallest failing case found: its params and result, the steps that got there."""
    original: CheckResult
    result: CheckResult
    params: Dict[str, Any]
    steps: List[str]
    attempts: int
    minimal: bool                     # no smaller candidate fails (False: the time budget ran out)
    repro: Optional[str] = None       # the standalone script's path
    repro_error: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {"op": self.original.op, "backend": self.original.backend, "case": self.original.case,
                "dtype": self.original.dtype, "seed": self.original.seed, "params": self.params,
                "steps": self.steps, "attempts": self.attempts, "minimal": self.minimal,
                "status": self.result.status.value, "reason": self.result.reason, "repro": self.repro,
                "repro_error": self.repro_error}


def _smaller_ints(value: int) -> List[int]:
    options = {1, 2, value // 2} | {value - step for step in (128, 64, 32, 16, 8, 1)}
    return sorted(v for v in options if 1 <= v < value)


def _size_candidates(params: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    for key in SIZE_KEYS:
        value = params.get(key)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            for smaller in _smaller_ints(value):
                yield f"{key} {value} -> {smaller}", {**params, key: smaller}
        elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            kind = type(value)
            if key in ("q_lens", "k_lens", "varlen") and len(value) > 1:
                for drop in range(len(value)):
                    fewer = [v for i, v in enumerate(value) if i != drop]
                    changed = {**params, key: kind(fewer)}
                    for twin in ("q_lens", "k_lens"):  # the per-sequence lists go together
                        if twin != key and isinstance(params.get(twin), list) and len(params[twin]) == len(value):
                            changed[twin] = [v for i, v in enumerate(params[twin]) if i != drop]
                    yield f"{key}: drop item {drop}", changed
            for index, item in enumerate(value):
                for smaller in _smaller_ints(item):
                    changed = list(value)
                    changed[index] = smaller
                    yield f"{key}[{index}] {item} -> {smaller}", {**params, key: kind(changed)}


def _reset_candidates(params: Dict[str, Any], resets) -> Iterator[Tuple[str, Dict[str, Any]]]:
    for key, plain in resets:
        if key in params and params[key] != plain:
            yield f"{key} {params[key]!r} -> {plain!r}", {**params, key: plain}


def _mask_candidates(params: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    mask = params.get("mask")
    if isinstance(mask, str) and "+" in mask:
        for part in mask.split("+"):
            yield f"mask {mask} -> {part}", {**params, "mask": part}
    if params.get("mask_shape") not in (None, "qk"):
        for shape in SHAPE_SIMPLER:
            if shape != params["mask_shape"]:
                yield f"mask_shape {params['mask_shape']} -> {shape}", {**params, "mask_shape": shape}
    yield from _reset_candidates(params, MASK_RESETS)


def _layout_candidates(op: str):
    try:
        default = get_spec(op).make_case("default").params.get("layout")
    except NotImplementedError:
        default = None
    resets = LAYOUT_RESETS + ((("layout", default),) if default is not None else ())
    return lambda params: _reset_candidates(params, resets)


def _phases(op: str):
    return (("sizes", _size_candidates), ("values", lambda p: _reset_candidates(p, VALUE_RESETS)),
            ("mask", _mask_candidates), ("layout", _layout_candidates(op)))


def _failure_kind(result: CheckResult) -> tuple:
    """What a shrunk case must keep: the status; for an ERROR the exception's type (and whether
    the implementation or the check itself raised: src/gpuparity/checks/execute.py and
    src/gpuparity/checks/worker.py word the reason "raised <Type>: ...") and whether it was a
    sticky device error (worker.STICKY_NOTE); for a FAIL the outputs or gradients off (None: no comparison failed,
    a problem with the returned value: its shape, dtype, device, or no gradient)."""
    if result.status == Status.ERROR:
        raised = re.match(r"(.*?)raised ([\w.]+)", result.reason or "")
        return result.status, (raised.groups() if raised else result.reason, STICKY_NOTE in (result.reason or ""))
    if result.status == Status.FAIL:
        return result.status, frozenset(c.name for c in result.comparisons if not c.passed) or None
    return result.status, None


def _same_failure(original: CheckResult, result: CheckResult) -> bool:
    """A candidate is kept only when it fails the same way (_failure_kind); a FAIL's outputs need
    only overlap (grad_q and grad_k off, then grad_q alone, is the same bug shrinking)."""
    (status, kind), (now_status, now) = _failure_kind(original), _failure_kind(result)
    if status != now_status:
        return False
    if status == Status.FAIL and kind is not None and now is not None:
        return bool(kind & now)
    return kind == now


def shrink(result: CheckResult, *, impl: Optional[str] = None, isolate: bool = True,
           timeout: Optional[float] = None, seconds: float = 60.0, env: Optional[Dict[str, str]] = None,
           repro_dir: Optional[str] = None) -> Shrunk:
    """Shrink one failing check (FAIL, ERROR, CRASH or TIMEOUT) and, given `repro_dir`, write
    its standalone repro there. `seconds`: time for the search (the repro run comes after)."""
    if not result.status.bad:
        raise ValueError(f"result: expected a failing check, got {result.status.value} for {result.key}")
    started = time.monotonic()
    params = {k: v for k, v in result.params.items() if k not in IGNORED}
    limit = timeout or DEFAULT_TIMEOUT_S["cuda" if result.device.startswith("cuda") else "cpu"]
    pool = WorkerPool(env) if isolate else None
    attempts, steps = 0, []
    best = result
    tried = set()

    def attempt(candidate: Dict[str, Any], repro: Optional[Dict[str, Any]] = None) -> CheckResult:
        task = Task(attempts, result.op, result.backend, result.case, candidate, result.dtype, result.device,
                    result.seed or 0, impl=impl, base_seed=result.base_seed, level=result.level, repro=repro)
        return _run_one(task, pool, limit, None, None)

    minimal = True
    try:
        for phase, candidates in _phases(result.op):
            progress = True
            while progress:
                progress = False
                for step, candidate in candidates(params):
                    if time.monotonic() - started > seconds:
                        minimal = False
                        break
                    candidate = get_spec(result.op).normalize(candidate)
                    key = repr(sorted(candidate.items())) if candidate is not None else None
                    if candidate is None or key in tried:
                        continue
                    tried.add(key)
                    attempts += 1
                    outcome = attempt(candidate)
                    if _same_failure(result, outcome):
                        params, best = candidate, outcome
                        steps.append(f"{phase}: {step}")
                        progress = True
                        break
                if not minimal:
                    break
            if not minimal:
                break
        shrunk = Shrunk(result, best, params, steps, attempts, minimal)
        if repro_dir is not None:
            stem = os.path.join(repro_dir, _file_name(result))
            who = {"stem": stem, "backend": result.backend, "impl": impl, "case": result.case}
            final = attempt(params, repro=who)
            if os.path.exists(stem + ".py"):
                shrunk.repro = stem + ".py"
            else:
                shrunk.repro_error = (f"no repro written: the last run was {final.status.value}"
                                      + (f" ({clip(final.reason, 200)})" if final.reason else "")
                                      + ("; a crash or hang takes the process with it, rerun the check's "
                                         "rerun line instead" if final.status in (Status.CRASH, Status.TIMEOUT) else ""))
        log.info("shrunk %s in %d attempts: %s", result.key, attempts, "; ".join(steps) or "already minimal")
        return shrunk
    finally:
        if pool is not None:
            pool.close()


def _file_name(result: CheckResult) -> str:
    who = result.backend.rpartition(":")[2] if result.backend.startswith("impl:") else result.backend
    raw = f"repro_{result.op}_{who}_{result.dtype}_{result.case}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)[:120]


def shrink_failures(results: List[CheckResult], *, impl: Optional[str] = None, isolate: bool = True,
                    timeout: Optional[float] = None, seconds: float = 60.0, env: Optional[Dict[str, str]] = None,
                    repro_dir: Optional[str] = None, limit: int = 1) -> List[Shrunk]:
    """Shrink the first `limit` failures of each implementation (op and backend), smallest
    case first (the cheapest to shrink). FAIL and ERROR only: every candidate of a crash or a
    hang would cost a worker restart or the whole per-check timeout (their rerun line stands)."""
    by_impl: Dict[tuple, List[CheckResult]] = {}
    for result in results:
        if result.status in (Status.FAIL, Status.ERROR):
            by_impl.setdefault((result.op, result.backend), []).append(result)
    shrunk = []
    for failures in by_impl.values():
        failures.sort(key=lambda r: _size_of(r.params))
        for failure in failures[:limit]:
            try:
                shrunk.append(shrink(failure, impl=impl, isolate=isolate, timeout=timeout, seconds=seconds, env=env,
                                     repro_dir=repro_dir))
            except Exception as exc:  # noqa: BLE001 - the check's own result stands; say why there is no repro
                log.warning("could not shrink %s: %s: %s", failure.key, type(exc).__name__, exc)
    return shrunk


def _size_of(params: Dict[str, Any]) -> int:
    total = 1
    for key in SIZE_KEYS:
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total *= max(1, value)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
            total *= max(1, sum(value))
    return total
