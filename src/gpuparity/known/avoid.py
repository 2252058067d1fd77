"""Which backends a known issue rules out when it is confirmed here: the base's `avoid` field
(op, backend, and optionally dtype and device type). A confirmed issue's remedy wins over a
passing battery verdict, in the doctor's recommendations and in `backend="auto"`."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, List, Optional

import torch

from .engine import CONFIRMED, evaluate, load_issues


@dataclasses.dataclass(frozen=True)
class Avoid:
    issue: str
    op: str
    backend: str
    dtype: Optional[str] = None          # "bfloat16"; None: every dtype
    device_type: Optional[str] = None    # "cpu" / "cuda"; None: every device
    remedy: str = ""

    def matches(self, op: str, backend: str, dtype: str, device_type: str) -> bool:
        return (self.op == op and self.backend == backend and self.dtype in (None, dtype.split("+")[0])
                and self.device_type in (None, device_type))

    @property
    def reason(self) -> str:
        return f"known issue {self.issue} confirmed here: {self.remedy}"


def _entries(issue: Dict[str, Any]) -> List[Avoid]:
    return [Avoid(issue["id"], a["op"], a["backend"], a.get("dtype"), a.get("device"), issue.get("remedy", ""))
            for a in issue.get("avoid", [])]


def from_results(results: Iterable[Dict[str, Any]], issues: Optional[List[Dict[str, Any]]] = None) -> List[Avoid]:
    """The avoid entries of the issues confirmed in `results` (KnownIssueResult dicts)."""
    confirmed = {r["id"] for r in results if r.get("status") == CONFIRMED}
    return [a for issue in (issues or load_issues()) if issue["id"] in confirmed for a in _entries(issue)]


def confirmed_here(op: str, dtype: torch.dtype, device: torch.device, backends: Iterable[str]) -> List[Avoid]:
    """Probe, now, the known issues that would rule out one of `backends` for this op, dtype and
    device, and return the avoid entries of those confirmed (the first-call probe's share of
    the known-issue base; the doctor evaluates the whole base)."""
    dname = str(dtype).replace("torch.", "")
    names = set(backends)
    wanted = [issue for issue in load_issues()
              if any(a.backend in names and a.matches(op, a.backend, dname, device.type) for a in _entries(issue))]
    if not wanted:
        return []
    results = evaluate(probes=True, device=str(device), ids=[issue["id"] for issue in wanted])
    return from_results([r.to_dict() for r in results], wanted)


def apply(verdicts: Dict[str, Dict[str, Any]], avoids: Iterable[Avoid], device_type: str) -> None:
    """Fail, in place, the verdicts ("op|backend|dtype|kind" -> verdict) that a confirmed issue rules out."""
    avoids = list(avoids)
    for key, verdict in verdicts.items():
        op, backend, dtype, _kind = key.split("|")
        for avoid in avoids:
            if avoid.matches(op, backend, dtype, device_type):
                verdict.update(passed=False, reason=avoid.reason)
                break
