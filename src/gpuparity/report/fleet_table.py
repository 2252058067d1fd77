"""Terminal rendering (rich) of a fleet report: one row per host and GPU, then the collectives."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from rich.console import Console
from rich.table import Table

from ..checks.results import clip
from ..fleet import format_size, worst_status

STYLE = {"PASS": "green", "FAIL": "bold red", "ERROR": "red", "CRASH": "bold magenta", "TIMEOUT": "magenta",
         "SKIP": "dim"}


def _status(status: str) -> str:
    return f"[{STYLE.get(status, '')}]{status}[/]"


def _size(nbytes: Optional[int]) -> str:
    return format_size(int(nbytes)) if nbytes else "-"


def _rate(probe: Dict[str, Any], metric: str, unit: str) -> str:
    value = probe.get(metric) if isinstance(probe, dict) else None
    if not value:
        status = probe.get("status") if isinstance(probe, dict) else None
        return _status(status) if status and status != "PASS" else "-"
    text = f"{value:,.1f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    fraction = probe.get("fraction_of_median")
    if fraction is not None:
        text += f" ({fraction:.0%})"
        if probe.get("slow"):
            text = f"[bold yellow]{text} SLOW[/]"
    if probe.get("status") not in (None, "PASS"):
        text += f" {_status(probe['status'])}"
    return text


def _battery(battery: Dict[str, Any]) -> str:
    status = battery.get("status", "SKIP")
    counts = battery.get("counts")
    if counts:
        ran = sum(counts.values()) - counts.get("SKIP", 0)
        bad = sum(counts.get(s, 0) for s in ("FAIL", "ERROR", "CRASH", "TIMEOUT"))
        return f"{_status(status)} {ran - bad}/{ran}"
    return _status(status)


def render_fleet(console: Console, report: Dict[str, Any], *, all_sizes: bool = False) -> None:
    summary = report["summary"]
    suspects = set(summary.get("suspect_ranks", []))
    table = Table(title=f"Fleet: {report['world_size']} rank(s) on {len(summary['hosts'])} host(s), "
                        f"backend {report.get('backend')}", title_justify="left")
    for column in ("host", "GPU", "rank", "status", "battery", "matmul", "copy", "notes"):
        table.add_column(column, overflow="fold")
    rows = sorted(report["ranks"], key=lambda r: (str(r.get("host")), r.get("local_rank") or 0, r["rank"]))
    for row in rows:
        probes = row.get("probes") or {}
        notes: List[str] = []
        if row["rank"] in suspects:
            notes.append("[bold red]SUSPECT[/]")
        if row.get("stuck_step") and row["stuck_step"] not in (row.get("reason") or ""):
            notes.append(f"stuck in {row['stuck_step']}")
        if row.get("reason") and row.get("status") not in ("PASS", "SKIP"):
            notes.append(clip(row["reason"], 160))
        gpu = f"{row.get('local_rank', '-')}: {row.get('device_name') or row.get('device') or '?'}"
        table.add_row(str(row.get("host")), gpu, str(row["rank"]), _status(row["status"]),
                      _battery(row.get("battery") or {}), _rate(probes.get("matmul", {}), "tflops", "TFLOP/s"),
                      _rate(probes.get("copy", {}), "gbps", "GB/s"), " ".join(notes))
    console.print(table)

    collectives = report.get("collectives", [])
    if collectives:
        ctable = Table(title="Collectives (wrong = elements that differ from the exact answer, all ranks; "
                             "bandwidth at the largest size, mean over ranks)" if not all_sizes else
                       "Collectives, every size (mean over ranks)", title_justify="left")
        for column in ("collective", "dtype", "status", "sizes" if not all_sizes else "size", "wrong",
                       "time", "algbw", "busbw"):
            ctable.add_column(column, justify="right" if column in ("wrong", "time", "algbw", "busbw") else "left")
        if all_sizes:
            shown = collectives
        else:
            by_key: Dict[tuple, List[Dict[str, Any]]] = {}
            for entry in collectives:
                by_key.setdefault((entry["collective"], entry["dtype"]), []).append(entry)
            shown = []
            for (name, dtype), entries in by_key.items():
                timed = [e for e in entries if e.get("time_us")]
                largest = max(timed or entries, key=lambda e: e.get("bytes") or 0)
                shown.append({**largest, "status": worst_status([e["status"] for e in entries]),
                              "wrong": sum(e.get("wrong", 0) for e in entries),
                              "span": f"{_size(min(e['bytes'] for e in entries))} .. {_size(max(e['bytes'] for e in entries))}"})
        for entry in shown:
            ctable.add_row(entry["collective"], entry["dtype"], _status(entry["status"]),
                           entry.get("span") or _size(entry.get("bytes")),
                           f"[bold red]{entry['wrong']}[/]" if entry.get("wrong") else "0",
                           f"{entry['time_us']:.1f} us" if entry.get("time_us") else "-",
                           f"{entry['algbw_gbps']:.3g} GB/s" if entry.get("algbw_gbps") is not None else "-",
                           f"{entry['busbw_gbps']:.3g} GB/s" if entry.get("busbw_gbps") is not None else "-")
        console.print(ctable)

    skipped = sorted({row["collective_phase"] for row in report["ranks"]
                      if str(row.get("collective_phase", "")).startswith("skipped")})
    for phase in skipped:
        console.print(f"[yellow]Collectives {phase}[/]")
    if summary.get("fleet_wide_battery_failures"):
        console.print(f"[yellow]Battery failures on every rank (the software stack, not a node):[/] "
                      f"{', '.join(summary['fleet_wide_battery_failures'][:10])}")
    if summary["exit_code"] == 0:
        slow = summary.get("slow_ranks")
        extra = f"; slow (under {summary['outlier_fraction']:.0%} of the median): ranks {slow}" if slow else ""
        console.print(f"[bold green]HEALTHY[/]: every rank passed{extra}")
    else:
        console.print(f"[bold red]UNHEALTHY[/]: failing ranks {summary['failing_ranks']}; suspect ranks "
                      f"{summary['suspect_ranks']} on host(s) {', '.join(summary['suspect_hosts']) or '-'}")
