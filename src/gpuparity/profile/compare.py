"""Two kernel profiles side by side (e.g. the same script on CUDA and on ROCm), matched by op
name: kernel names differ between vendors (cutlass / Cijk_...), aten op names do not."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .kernels import KIND as KERNEL_KIND

SCHEMA_VERSION = 1


def _check(profile: Dict[str, Any], what: str) -> None:
    if not isinstance(profile, dict) or profile.get("kind") != KERNEL_KIND:
        kind = profile.get("kind") if isinstance(profile, dict) else type(profile).__name__
        raise ValueError(f"{what}: expected a kernel profile (`gpuparity profile kernels --json`), got kind {kind!r}")
    if profile.get("error"):
        raise ValueError(f"{what}: the profile recorded nothing ({profile['error']})")


def _per_step(entry: Optional[Dict[str, Any]], key: str, steps: int) -> Optional[float]:
    return entry[key] / steps if entry else None


def compare_profiles(a: Dict[str, Any], b: Dict[str, Any], *, top: Optional[int] = None) -> Dict[str, Any]:
    """Ops of both profiles by name: time per profiled step on each side, share of each side's
    total, and b / a. Device time where both sides have it, else self CPU time."""
    _check(a, "a")
    _check(b, "b")
    basis = "device" if a.get("time_basis") == b.get("time_basis") == "device" else "cpu"
    key = "device_time_us" if basis == "device" else "self_cpu_time_us"
    steps_a, steps_b = max(1, a.get("steps_profiled") or 1), max(1, b.get("steps_profiled") or 1)
    ops_a = {op["name"]: op for op in a.get("ops", [])}
    ops_b = {op["name"]: op for op in b.get("ops", [])}
    total_a = sum(op[key] for op in ops_a.values()) / steps_a
    total_b = sum(op[key] for op in ops_b.values()) / steps_b
    rows: List[Dict[str, Any]] = []
    for name in set(ops_a) | set(ops_b):
        time_a = _per_step(ops_a.get(name), key, steps_a)
        time_b = _per_step(ops_b.get(name), key, steps_b)
        if not time_a and not time_b:
            continue
        rows.append({
            "name": name,
            "a_time_per_step_us": time_a, "b_time_per_step_us": time_b,
            "a_calls_per_step": ops_a[name]["calls"] / steps_a if name in ops_a else None,
            "b_calls_per_step": ops_b[name]["calls"] / steps_b if name in ops_b else None,
            "a_share": time_a / total_a if time_a is not None and total_a else None,
            "b_share": time_b / total_b if time_b is not None and total_b else None,
            "ratio_b_over_a": time_b / time_a if time_a and time_b is not None else None,
            "only_in": "a" if name not in ops_b else ("b" if name not in ops_a else None),
        })
    rows.sort(key=lambda r: max(r["a_time_per_step_us"] or 0, r["b_time_per_step_us"] or 0), reverse=True)
    if top is not None:
        rows = rows[:top]
    return {
        "schema_version": SCHEMA_VERSION, "kind": "gpuparity.kernel_profile_comparison",
        "time_basis": basis,
        "a": {"machine": a.get("machine"), "device": a.get("device"), "steps": steps_a, "total_per_step_us": total_a},
        "b": {"machine": b.get("machine"), "device": b.get("device"), "steps": steps_b, "total_per_step_us": total_b},
        "ratio_total_b_over_a": total_b / total_a if total_a else None,
        "ops": rows,
    }
