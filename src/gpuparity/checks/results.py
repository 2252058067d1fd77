"""The results model: one CheckResult per (op, backend, case, dtype), streamed as JSON lines."""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional

from ..tolerance import Comparison  # noqa: F401 - re-exported: results carry comparisons


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"        # ran and computed the wrong answer
    ERROR = "ERROR"      # raised, returned the wrong type/shape, or could not be imported
    CRASH = "CRASH"      # the worker process died (segfault, abort, illegal memory access)
    TIMEOUT = "TIMEOUT"  # the worker did not answer in time (hang)
    SKIP = "SKIP"        # cannot run here; the reason says why
    # could run, but was not: the run's --budget was spent, or its implementation crashed or
    # hung CRASH_LIMIT times in a row (checks/pool.py); the reason says which
    NOT_RUN = "NOT_RUN"

    @property
    def bad(self) -> bool:
        return self in (Status.FAIL, Status.ERROR, Status.CRASH, Status.TIMEOUT)


# Worst first: the status of a group is the worst of its members.
SEVERITY = [Status.CRASH, Status.TIMEOUT, Status.ERROR, Status.FAIL, Status.NOT_RUN, Status.PASS, Status.SKIP]


def worst(statuses: Iterable[Status]) -> Status:
    statuses = list(statuses)
    for status in SEVERITY:
        if status in statuses:
            return status
    return Status.SKIP


@dataclasses.dataclass
class CheckResult:
    op: str
    backend: str
    case: str
    dtype: str
    device: str
    status: Status
    seed: Optional[int] = None
    reason: str = ""
    comparisons: List[Comparison] = dataclasses.field(default_factory=list)
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    duration_s: float = 0.0
    stderr_tail: str = ""
    # `seed` is derived per check from the run's base seed (execute.task_seed); `--seed` takes the
    # base, so a rerun of this one check needs base_seed and a level whose plan has the case.
    base_seed: Optional[int] = None
    level: Optional[str] = None

    @property
    def worst_comparison(self) -> Optional[Comparison]:
        failed = [c for c in self.comparisons if not c.passed]
        pool = failed or self.comparisons
        if not pool:
            return None
        return max(pool, key=lambda c: (c.err or 0.0) / (c.allowed or 1e-30) if c.err is not None else float("inf"))

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        worst_cmp = self.worst_comparison
        data["err"] = worst_cmp.err if worst_cmp else None
        data["baseline_err"] = worst_cmp.baseline_err if worst_cmp else None
        data["allowed"] = worst_cmp.allowed if worst_cmp else None
        data["worst_index"] = worst_cmp.worst_index if worst_cmp else None
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "CheckResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["status"] = Status(kwargs["status"])
        kwargs["comparisons"] = [Comparison(**c) for c in kwargs.get("comparisons", [])]
        return cls(**kwargs)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.backend}/{self.case}/{self.dtype}"


class ResultStream:
    """Appends results to a JSON-lines file as they arrive, flushed and fsynced, so a killed
    run loses nothing already measured."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self._handle = open(path, "a", encoding="utf-8") if path else None

    def write(self, result: CheckResult) -> None:
        if self._handle is None:
            return
        self._handle.write(json.dumps(result.to_dict()) + "\n")
        self._handle.flush()
        try:
            os.fsync(self._handle.fileno())
        except OSError:
            pass

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_stream(path: str) -> Iterator[CheckResult]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line:
                try:
                    yield CheckResult.from_dict(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a kill


# The reason of a SKIP whose case is too large for this machine or the level's budget (a sized
# family's member: long sequences, > 2^31 elements); explore tries such a member again under
# --level full's budget, and reports list each one by name.
NOT_RUN_HERE = "not run here: "


def not_run_here(results: Iterable[CheckResult]) -> List[Dict[str, Any]]:
    """The cases skipped as too large here, one entry per (op, case, reason) in the order first
    seen: {"op", "case", "reason" (without the prefix), "checks" (how many checks it skipped)}."""
    found: Dict[tuple, Dict[str, Any]] = {}
    for result in results:
        if result.status == Status.SKIP and result.reason.startswith(NOT_RUN_HERE):
            reason = result.reason[len(NOT_RUN_HERE):]
            entry = found.setdefault((result.op, result.case, reason),
                                     {"op": result.op, "case": result.case, "reason": reason, "checks": 0})
            entry["checks"] += 1
    return list(found.values())


_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
ELLIPSIS = "\u2026"


def clip(text: Any, limit: int) -> str:
    """`text` in at most `limit` characters: whole when it fits, else cut at the last space
    before the limit (never inside a word or a number: "expected -0.6123" becomes "expected
    \u2026", not "expected -0.6") and ended with an ellipsis. A first word longer than the limit is
    cut inside, but before any number it would split."""
    text = str(text)
    if limit < 2 or len(text) <= limit:
        return text[:max(limit, 0)] if limit < 2 else text
    end = limit - 1                       # room for the ellipsis
    space = text.rfind(" ", 0, end + 1)
    if space > 0:
        end = space
    else:
        for number in _NUMBER.finditer(text, 0, end + 1):
            if number.start() < end < number.end():
                end = number.start()
    return text[:end].rstrip(" ,;:=") + ELLIPSIS


def ran_count(results: Iterable[CheckResult]) -> int:
    """How many of the results are checks that ran (what progress and "N checks ran" count):
    not the skips (decided before the run, or a backend declining a case) nor the NOT_RUN."""
    return sum(1 for result in results if result.status not in (Status.SKIP, Status.NOT_RUN))


def tally(results: Iterable[CheckResult]) -> Dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for result in results:
        counts[result.status.value] += 1
    return counts
