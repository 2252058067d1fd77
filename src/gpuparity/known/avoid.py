"""Which backends a known issue rules out when it is confirmed here: the base's `avoid` field
(op, backend, and optionally dtype, device type and `when`, a regime). A confirmed issue's
remedy wins over a passing battery verdict, in the doctor's recommendations and in
`backend="auto"`.

Without `when` the backend is ruled out for the op (its stored verdict fails). With `when` it
is ruled out only for the calls inside the regime, a shape rule over what a call's arguments
show (its Problem's features): the stored verdict keeps passing and carries the regime
("avoid_when"), and `veto(problem, outcome)`, which ops/select.py applies to every verdict
`backend="auto"` reads, fails it for a call inside the regime. A data condition (a row's
logsumexp) cannot be known before the call, so a regime names only what the arguments show.

Regime clauses (all must hold):
  attn_mask: true          the call hands SDPA a mask tensor (attn_mask, key_padding_mask or a window)
  causal_without_mask: false  not SDPA's causal path without a mask tensor (a mask, or no is_causal)
  requires_grad: true      gradients are required (grad mode on and q, k or v requires grad)
  k_len_mod: [128, 64]     the key length % 128 == 64 (any feature: "<feature>_mod": [m, r])
  <feature>: value         any other Problem feature equal to value
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from ..registry import VerdictKey
from .engine import CONFIRMED, evaluate, load_issues

REGIME_WORDS = {"attn_mask": ("with an attn_mask", "without an attn_mask"),
                "causal_without_mask": ("is_causal=True without a mask", "with a mask or without is_causal"),
                "requires_grad": ("gradients required", "no gradients"),
                "has_mask": ("with a mask", "without a mask"),
                "is_causal": ("is_causal=True", "is_causal=False"),
                "gqa": ("GQA", "no GQA")}
FEATURE_WORDS = {"k_len": "key length", "q_len": "query length", "head_dim": "head dim"}


def _feature(problem, name: str):
    if name == "attn_mask":   # what SDPA receives: a window and a key padding mask become a mask tensor
        return bool(problem.feature("has_mask")) or problem.feature("window") is not None
    if name == "causal_without_mask":   # SDPA's own causal path, no mask tensor
        return bool(problem.feature("is_causal")) and not _feature(problem, "attn_mask")
    return problem.feature(name)


def in_regime(when: Dict[str, Any], problem) -> bool:
    """Whether a call (its Problem) falls inside the regime `when`."""
    for key, value in when.items():
        if key.endswith("_mod"):
            found = problem.feature(key[:-4])
            if not isinstance(found, int) or found % value[0] != value[1]:
                return False
        elif isinstance(value, bool):
            if bool(_feature(problem, key)) != value:
                return False
        elif _feature(problem, key) != value:
            return False
    return True


def regime_text(when: Dict[str, Any]) -> str:
    """A regime in words: 'with an attn_mask, gradients required, key length % 128 == 64'."""
    parts = []
    for key, value in when.items():
        if key.endswith("_mod"):
            parts.append(f"{FEATURE_WORDS.get(key[:-4], key[:-4])} % {value[0]} == {value[1]}")
        elif key in REGIME_WORDS and isinstance(value, bool):
            parts.append(REGIME_WORDS[key][0 if value else 1])
        else:
            parts.append(f"with {FEATURE_WORDS.get(key, key)} {value}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Avoid:
    issue: str
    op: str
    backend: str
    dtype: Optional[str] = None          # "bfloat16"; None: every dtype
    device_type: Optional[str] = None    # "cpu" / "cuda"; None: every device
    remedy: str = ""
    when: Optional[Tuple[Tuple[str, Any], ...]] = None   # a regime (items of the `when` object); None: every call

    def matches(self, op: str, backend: str, dtype: str, device_type: str) -> bool:
        return (self.op == op and self.backend == backend and self.dtype in (None, dtype.split("+")[0])
                and self.device_type in (None, device_type))

    @property
    def regime(self) -> Optional[Dict[str, Any]]:
        return None if self.when is None else {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.when}

    @property
    def reason(self) -> str:
        where = f" for calls {regime_text(self.regime)}" if self.when is not None else ""
        return f"known issue {self.issue} confirmed here{where}: {self.remedy}"


def _entries(issue: Dict[str, Any]) -> List[Avoid]:
    def frozen(when):
        return None if when is None else tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in when.items())
    return [Avoid(issue["id"], a["op"], a["backend"], a.get("dtype"), a.get("device"), issue.get("remedy", ""),
                  frozen(a.get("when")))
            for a in issue.get("avoid", [])]


def from_results(results: Iterable[Dict[str, Any]], issues: Optional[List[Dict[str, Any]]] = None) -> List[Avoid]:
    """The avoid entries of the issues confirmed in `results` (KnownIssueResult dicts)."""
    confirmed = {r["id"] for r in results if r.get("status") == CONFIRMED}
    return [a for issue in (issues or load_issues()) if issue["id"] in confirmed for a in _entries(issue)]


def named_for(op: str, backend: str, dtype: str, device_type: str) -> List[Tuple[str, str]]:
    """(id, title) of the known issues whose avoid entries name this backend for every call of
    the op in this dtype on this device (no regime): a battery failure there is that issue's
    symptom, labelled so (the base as written; no probe runs)."""
    return [(issue["id"], issue.get("title", "")) for issue in load_issues()
            if any(a.when is None and a.matches(op, backend, dtype, device_type) for a in _entries(issue))]


def named_by_error(reason: str, device_type: str) -> List[Tuple[str, str]]:
    """(id, title) of the known issues whose `error_markers` (the words of the error they raise, such
    as "misaligned address") appear in an ERROR's reason, on a device of the kind their rule is about
    (a GPU entry never names a CPU error): the error is labelled with them, whoever's code raised it
    (a user's function that calls torch's SDPA meets torch's fault)."""
    text = reason or ""
    return [(issue["id"], issue.get("title", "")) for issue in load_issues()
            if any(marker in text for marker in issue.get("error_markers", ()))
            and (device_type != "cpu" or issue.get("rule", {}).get("vendor") in (None, "cpu"))]


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
    """In place, on the verdicts ("op|backend|dtype|kind" -> verdict) a confirmed issue rules
    out: fail them, or, for an avoid with a regime, record the regime under "avoid_when" (which
    `veto` reads per call) and leave the verdict passing for the calls outside it."""
    avoids = list(avoids)
    for key, verdict in verdicts.items():
        op, backend, dtype, _kind = VerdictKey.decode(key)
        for avoid in avoids:
            if not avoid.matches(op, backend, dtype, device_type):
                continue
            if avoid.when is None:
                verdict.update(passed=False, reason=avoid.reason)
                break
            regimes = verdict.setdefault("avoid_when", [])
            entry = {"issue": avoid.issue, "when": avoid.regime, "reason": avoid.reason}
            if entry not in regimes:
                regimes.append(entry)


def veto(problem, outcome: Dict[str, Any]) -> Dict[str, Any]:
    """The verdict `backend="auto"` uses for this call: `outcome` (a stored verdict), failed
    when the call falls inside a regime a confirmed known issue recorded on it ("avoid_when")."""
    regimes = outcome.get("avoid_when") if outcome.get("passed") else None
    if regimes:
        for entry in regimes:
            if in_regime(entry["when"], problem):
                return {**outcome, "passed": False, "reason": entry["reason"]}
    return outcome


def regime_notes(avoids: Iterable[Avoid], op: str, backends: Iterable[str], dtype: str,
                 device_type: str) -> List[Dict[str, Any]]:
    """For the doctor's recommendation of one op and dtype: the calls to keep off each backend
    that a confirmed issue rules out inside a regime, each with its sentence."""
    notes = []
    for name in backends:
        for avoid in avoids:
            if avoid.when is not None and avoid.matches(op, name, dtype, device_type):
                notes.append({"backend": name, "known_issue": avoid.issue, "when": avoid.regime,
                              "text": f"keep {name} off calls {regime_text(avoid.regime)} (known issue "
                                      f"{avoid.issue} confirmed here; backend='auto' does)"})
    return notes
