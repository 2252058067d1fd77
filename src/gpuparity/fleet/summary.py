"""The fleet report rank 0 builds from every rank's result: per-rank status, throughput against
the fleet median, per-collective aggregates, suspects and the exit code."""
from __future__ import annotations

import datetime
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .config import _GOOD, KIND, SCHEMA_VERSION, FleetConfig, busbw_factor, worst_status


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(results: Dict[int, Dict[str, Any]], world_size: int, config: FleetConfig, *,
              hellos: Optional[Dict[int, Dict[str, Any]]] = None, missing_reason: str = "no result",
              launcher: str = "", sizes: Sequence[int] = (), iters: Tuple[int, int] = (0, 0)) -> Dict[str, Any]:
    """The fleet report from every rank's result (missing ranks become TIMEOUT): per-rank status,
    throughput against the fleet median, per-collective aggregates, suspects and the exit code."""
    hellos = hellos or {}
    ranks: List[Dict[str, Any]] = []
    for r in range(world_size):
        if r in results:
            ranks.append(dict(results[r]))
        else:
            hello = hellos.get(r, {})
            ranks.append({"rank": r, "host": hello.get("host", "unknown"), "local_rank": hello.get("local_rank"),
                          "device": hello.get("device"), "device_name": hello.get("device_name"),
                          "status": "TIMEOUT", "reason": missing_reason, "missing": True,
                          "battery": {"status": "SKIP", "reason": "no result"}, "probes": {}, "collectives": []})

    # Throughput against the fleet median.
    medians: Dict[str, Optional[float]] = {}
    for probe, metric in (("matmul", "tflops"), ("copy", "gbps")):
        values = [row["probes"][probe][metric] for row in ranks
                  if isinstance(row.get("probes", {}).get(probe), dict) and row["probes"][probe].get(metric)]
        medians[f"{probe}_{metric}"] = _median(values)
        for row in ranks:
            value = row.get("probes", {}).get(probe, {}).get(metric) if isinstance(row.get("probes"), dict) else None
            median = medians[f"{probe}_{metric}"]
            if value and median:
                row["probes"][probe]["fraction_of_median"] = value / median
                row["probes"][probe]["slow"] = value < config.outlier_fraction * median

    slow = [row["rank"] for row in ranks
            if any(isinstance(p, dict) and p.get("slow") for p in row.get("probes", {}).values())]

    # Battery failures every rank shares are the software stack, not a node.
    failing_sets = [set(row["battery"].get("failing", [])) for row in ranks
                    if row.get("battery", {}).get("status") not in (None, "SKIP") and "failing" in row["battery"]]
    fleet_wide = sorted(set.intersection(*failing_sets)) if len(failing_sets) >= 2 else []

    # Per collective, dtype and size: the aggregate over ranks.
    groups: Dict[Tuple[str, str, int], List[Dict[str, Any]]] = {}
    for row in ranks:
        for entry in row.get("collectives", []):
            groups.setdefault((entry["collective"], entry["dtype"], entry["requested_bytes"]), []).append(entry)
    collectives = []
    for (name, dtype, requested), entries in groups.items():
        times = [e["time_us"] for e in entries if e.get("time_us")]
        op_bytes = next((e["bytes"] for e in entries if e.get("bytes")), None)
        time_us = statistics.mean(times) if times else None
        algbw = op_bytes / (time_us / 1e6) / 1e9 if time_us and op_bytes else None
        collectives.append({
            "collective": name, "dtype": dtype, "bytes": op_bytes or requested, "requested_bytes": requested,
            "status": worst_status([e["status"] for e in entries]),
            "wrong": sum(e.get("wrong", 0) or 0 for e in entries),
            "ranks_wrong": [row["rank"] for row in ranks for e in row.get("collectives", [])
                            if e is not None and e["collective"] == name and e["dtype"] == dtype
                            and e["requested_bytes"] == requested and e.get("wrong")],
            "time_us": time_us, "algbw_gbps": algbw,
            "busbw_gbps": algbw * busbw_factor(name, world_size) if algbw is not None else None,
            "ranks_reported": len(entries),
        })

    # Who to blame: ranks that hung or vanished, ranks whose own checks failed (unless every rank
    # fails the same way), ranks that sent wrong data. With none of those, every failing rank.
    bad = [row for row in ranks if row["status"] not in _GOOD]
    suspects = set()
    for row in ranks:
        if row.get("missing") or row.get("stuck_step"):
            suspects.add(row["rank"])
        if any(e.get("sent_wrong") for e in row.get("collectives", [])):
            suspects.add(row["rank"])
        probes = row.get("probes", {})
        if any(isinstance(p, dict) and p.get("status") not in _GOOD for p in probes.values()):
            suspects.add(row["rank"])
        battery = row.get("battery", {})
        if battery.get("status") not in (None, "PASS", "SKIP"):
            own = set(battery.get("failing", [])) - set(fleet_wide)
            if own or not battery.get("failing"):
                suspects.add(row["rank"])
    if slow and config.fail_slow:
        suspects.update(slow)
    if bad and not suspects:
        suspects = {row["rank"] for row in bad}
    suspects_sorted = sorted(suspects)
    hosts = sorted({ranks[r].get("host", "unknown") for r in suspects_sorted})
    exit_code = 1 if bad or (slow and config.fail_slow) else 0

    first = next((row for row in ranks if row.get("platform")), {})
    platform_report = first.get("platform") or {}
    try:
        from ..platform import fingerprint_key, summary_line
        fingerprint, machine = fingerprint_key(platform_report), summary_line(platform_report)
    except Exception:  # noqa: BLE001
        fingerprint, machine = None, None
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "date": _now(),
        "world_size": world_size,
        "launcher": launcher,
        "backend": first.get("backend"),
        "platform_fingerprint": fingerprint,
        "machine": machine,
        "config": {**config.to_dict(), "sizes_used": list(sizes), "warmup_iters": iters[0], "timed_iters": iters[1]},
        "summary": {
            "status": "HEALTHY" if exit_code == 0 else "UNHEALTHY",
            "exit_code": exit_code,
            "hosts": sorted({row.get("host", "unknown") for row in ranks}),
            "failing_ranks": [row["rank"] for row in bad],
            "suspect_ranks": suspects_sorted,
            "suspect_hosts": hosts,
            "slow_ranks": slow,
            "fleet_wide_battery_failures": fleet_wide,
            "medians": medians,
            "outlier_fraction": config.outlier_fraction,
        },
        "collectives": collectives,
        "ranks": ranks,
    }
