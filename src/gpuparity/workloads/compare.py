"""Do two training runs agree? The bar (docs/diverging-runs.md):

- final metrics: every metric of the final evaluation agrees within 5% relative
  (|a - b| / max(|a|, |b|)), the user's own bar in user story 1;
- the loss curves track: the training loss, smoothed by a trailing mean over
  w = max(1, steps // 10) steps, differs by at most 10% relative at every step after the
  first max(3, steps // 10) (the first steps are dominated by initialisation and are skipped).

Both runs must be of the same workload, size, config, seed and number of steps; they may
differ in device, dtype and attention backend (that is the point).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional

FINAL_TOLERANCE = 0.05
TRACK_TOLERANCE = 0.10
SCHEMA_VERSION = 1


@dataclasses.dataclass
class MetricCheck:
    name: str
    a: Optional[float]
    b: Optional[float]
    rel_diff: Optional[float]
    passed: bool


@dataclasses.dataclass
class RunComparison:
    a: Dict[str, Any]
    b: Dict[str, Any]
    final: List[MetricCheck]
    tracking_passed: bool
    window: int
    warmup: int
    worst_step: Optional[int]
    worst_rel_diff: Optional[float]
    smoothed_a: List[float]
    smoothed_b: List[float]
    problems: List[str]

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> Dict[str, Any]:
        from ..platform import current
        return {"schema_version": SCHEMA_VERSION, "kind": "gpuparity-workload-comparison",
                "platform": current(), "passed": self.passed, "a": self.a, "b": self.b,
                "final": [dataclasses.asdict(m) for m in self.final],
                "tracking": {"passed": self.tracking_passed, "window": self.window, "warmup": self.warmup,
                             "worst_step": self.worst_step, "worst_rel_diff": self.worst_rel_diff,
                             "tolerance": TRACK_TOLERANCE},
                "final_tolerance": FINAL_TOLERANCE, "problems": self.problems}


def load_run(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        run = json.load(handle)
    if run.get("kind") != "gpuparity-workload-run":
        raise ValueError(f"{path}: not a `gpuparity workload run` result (kind={run.get('kind')!r})")
    return run


def relative_difference(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def smooth(values: List[float], window: int) -> List[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _summary(run: Dict[str, Any]) -> Dict[str, Any]:
    from ..platform import summary_line
    report = run.get("platform") if isinstance(run.get("platform"), dict) else {}
    return {"workload": run.get("workload"), "attn": run.get("attn"), "device": run.get("device"),
            "dtype": run.get("dtype"), "status": run.get("status"), "error": run.get("error", ""),
            "steps": run.get("steps"), "step_time_ms_median": run.get("step_time_ms_median"),
            "machine": summary_line(report) if report else "unknown"}


def compare_runs(a: Dict[str, Any], b: Dict[str, Any]) -> RunComparison:
    """Compare two run records (as written by `gpuparity workload run`). Raises ValueError for
    runs that are not comparable (different workload, config, seed or steps)."""
    for field in ("workload", "size", "seed", "steps"):
        if a.get(field) != b.get(field):
            raise ValueError(f"runs are not comparable: {field} is {a.get(field)!r} in the first and "
                             f"{b.get(field)!r} in the second")
    config_a = {k: v for k, v in a.get("config", {}).get("model", {}).items() if k != "attn"}
    config_b = {k: v for k, v in b.get("config", {}).get("model", {}).items() if k != "attn"}
    if config_a != config_b or a.get("config", {}).get("data") != b.get("config", {}).get("data"):
        raise ValueError("runs are not comparable: their model or data configs differ")
    problems: List[str] = []
    for side, run in (("first", a), ("second", b)):
        if run.get("status") != "ok":
            problems.append(f"the {side} run did not finish: {run.get('status')}: {run.get('error', '')}".rstrip(": "))

    final: List[MetricCheck] = []
    names = list(a.get("metric_names") or sorted(set(a.get("final", {})) | set(b.get("final", {}))))
    for name in names:
        va, vb = a.get("final", {}).get(name), b.get("final", {}).get(name)
        if va is None or vb is None:
            final.append(MetricCheck(name, va, vb, None, False))
            continue
        diff = relative_difference(va, vb)
        check = MetricCheck(name, va, vb, diff, diff <= FINAL_TOLERANCE)
        final.append(check)
        if not check.passed:
            problems.append(f"final {name}: {va:.4g} vs {vb:.4g} differ by {100 * diff:.1f}% "
                            f"(> {100 * FINAL_TOLERANCE:.0f}%)")

    loss_a = [row["loss"] for row in a.get("metrics", [])]
    loss_b = [row["loss"] for row in b.get("metrics", [])]
    steps = min(len(loss_a), len(loss_b))
    window = max(1, steps // 10)
    warmup = max(3, steps // 10)
    smoothed_a, smoothed_b = smooth(loss_a[:steps], window), smooth(loss_b[:steps], window)
    worst_step, worst = None, None
    for step in range(warmup, steps):
        diff = relative_difference(smoothed_a[step], smoothed_b[step])
        if worst is None or diff > worst:
            worst_step, worst = step, diff
    tracking = worst is None or worst <= TRACK_TOLERANCE
    if steps and not tracking:
        problems.append(f"loss curves do not track: at step {worst_step} the smoothed losses "
                        f"{smoothed_a[worst_step]:.4g} and {smoothed_b[worst_step]:.4g} differ by "
                        f"{100 * worst:.1f}% (> {100 * TRACK_TOLERANCE:.0f}%)")
    return RunComparison(_summary(a), _summary(b), final, tracking, window, warmup, worst_step, worst,
                         smoothed_a, smoothed_b, problems)
