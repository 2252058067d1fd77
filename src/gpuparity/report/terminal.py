"""Terminal rendering (rich) of platform reports, battery results and doctor reports."""
from __future__ import annotations

import os
import shlex
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..checks.results import SEVERITY, CheckResult, Status, clip, not_run_here, worst
from ..platform import is_unknown

STYLE = {"PASS": "green", "FAIL": "bold red", "ERROR": "red", "CRASH": "bold magenta", "TIMEOUT": "magenta",
         "SKIP": "dim", "NOT_RUN": "yellow"}
PROGRESS_EVERY_S = 10.0  # plain progress lines when not on a terminal; GPUPARITY_PROGRESS_S overrides


def _fmt(value: Any) -> str:
    if is_unknown(value):
        return f"unknown ({value['unknown']})"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def render_platform(console: Console, report: Dict[str, Any]) -> None:
    table = Table(title="Platform", show_header=False, title_justify="left")
    table.add_column("fact", style="bold")
    table.add_column("value")
    torch_info = report.get("torch") if isinstance(report.get("torch"), dict) else {}
    table.add_row("vendor", _fmt(report.get("vendor")))
    table.add_row("torch", f"{_fmt(torch_info.get('version'))} (CUDA {_fmt(torch_info.get('cuda'))}, "
                           f"HIP {_fmt(torch_info.get('hip'))})")
    driver = report.get("driver")
    if isinstance(driver, dict) and not is_unknown(driver):
        table.add_row("driver", ", ".join(f"{k} {_fmt(v)}" for k, v in driver.items()))
    devices = report.get("devices")
    if isinstance(devices, list):
        for d in devices:
            if is_unknown(d):
                table.add_row("device", _fmt(d))
                continue
            mem = d.get("total_memory_bytes") or 0
            table.add_row(f"device {d.get('index')}",
                          f"{d.get('name')} [{d.get('arch')}], {mem / 2**30:.1f} GiB, {d.get('multiprocessors')} SM/CU, "
                          f"{'APU' if d.get('is_apu') else 'discrete'}")
        if not devices:
            table.add_row("devices", "none (CPU only)")
    else:
        table.add_row("devices", _fmt(devices))
    triton = report.get("triton") or {}
    if isinstance(triton, dict):
        can = triton.get("can_compile")
        table.add_row("triton", f"{_fmt(triton.get('version'))}; "
                                f"{'compiles for ' + str(triton.get('target')) if can else triton.get('reason', '')}")
    libs = report.get("libraries")
    if isinstance(libs, dict) and libs:
        table.add_row("libraries", ", ".join(f"{k} {_fmt(v)}" for k, v in libs.items()))
    numerics = report.get("numerics")
    if isinstance(numerics, dict):
        table.add_row("numerics", ", ".join(f"{k}={_fmt(v)}" for k, v in numerics.items() if k != "sdp_enabled"))
    env = report.get("env")
    if isinstance(env, dict):
        table.add_row("environment", ", ".join(f"{k}={v}" for k, v in env.items()) or "none of the numerics variables set")
    params = report.get("kernel_params")
    if isinstance(params, dict) and (params.get("amdgpu") or params.get("iommu")):
        table.add_row("kernel params", ", ".join(f"{k}={v}" for k, v in {**params.get("amdgpu", {}),
                                                                          **params.get("iommu", {})}.items()))
    kfd = report.get("kfd")
    if isinstance(kfd, dict) and kfd.get("exists"):
        table.add_row("/dev/kfd", "read/write" if kfd.get("readable_writable") else "NO ACCESS (add user to render/video)")
    table.add_row("cpu", f"{_fmt(report.get('cpu_model'))} ({report.get('cpu_count')} cores)")
    console.print(table)


def summarize(results: Iterable[CheckResult]) -> List[Dict[str, Any]]:
    """One row per (op, backend): counts per status and the first reason of the worst status."""
    groups: Dict[tuple, List[CheckResult]] = {}
    for r in results:
        groups.setdefault((r.op, r.backend), []).append(r)
    rows = []
    for (op, backend), members in groups.items():
        counts = {s.value: sum(1 for m in members if m.status == s) for s in Status}
        status = worst(m.status for m in members if m.status != Status.SKIP) if any(
            m.status != Status.SKIP for m in members) else Status.SKIP
        example = next((m for m in members if m.status == status), members[0])
        reason = example.reason if status != Status.PASS else ""
        if status == Status.SKIP:
            reason = example.reason
        skip_reasons: Dict[str, int] = {}   # each distinct reason a check was skipped, with its count
        for m in members:
            if m.status == Status.SKIP:
                skip_reasons[m.reason] = skip_reasons.get(m.reason, 0) + 1
        rows.append({"op": op, "backend": backend, "status": status.value, "counts": counts,
                     "reason": reason, "example_case": f"{example.case}/{example.dtype}",
                     "skip_reasons": skip_reasons})
    return rows


def why_text(row: Dict[str, Any]) -> str:
    """The "why" of a summarize() row: the worst status's first reason with its case, and why
    checks were skipped in a row that also ran some (check --impl: an argument the function
    lacks), so the table says it and not only --json."""
    why = row["reason"]
    if row["status"] not in ("PASS", "SKIP", "NOT_RUN") and why:
        why = f"{row['example_case']}: {why}"
    if row["status"] != "SKIP" and row["skip_reasons"]:
        why = "; ".join(filter(None, [why, f"{row['counts']['SKIP']} skipped: " + "; ".join(row["skip_reasons"])]))
    return why


def render_results(console: Console, results: List[CheckResult], title: str = "Checks against float64") -> None:
    table = Table(title=title, title_justify="left")
    not_run = any(r.status == Status.NOT_RUN for r in results)  # its column only when a run was cut short
    for column in ("op", "backend", "status", "pass", "fail", "crash/timeout", "skip") + ("not run",) * not_run + ("why",):
        table.add_column(column, overflow="fold")
    for row in summarize(results):
        c = row["counts"]
        why = escape(clip(why_text(row), 220))
        table.add_row(row["op"], row["backend"], f"[{STYLE[row['status']]}]{row['status']}[/]", str(c["PASS"]),
                      str(c["FAIL"] + c["ERROR"]), str(c["CRASH"] + c["TIMEOUT"]), str(c["SKIP"]),
                      *[str(c["NOT_RUN"])] * not_run, why)
    console.print(table)
    cut = next((r.reason for r in results if r.status == Status.NOT_RUN), None)
    if cut:
        console.print(f"[{STYLE['NOT_RUN']}]{sum(r.status == Status.NOT_RUN for r in results)} checks {cut}[/]")
    # the table counts these among the skips under one reason; each such case is named here
    too_big = not_run_here(results)
    if too_big:
        console.print(f"Not run here: {len(too_big)} case{'s' * (len(too_big) != 1)} too large for this machine or "
                      f"the level's budget")
        for entry in too_big:
            console.print(f"  [{STYLE['SKIP']}]{entry['op']} {escape(entry['case'])}[/] ({entry['checks']} "
                          f"check{'s' * (entry['checks'] != 1)}): {escape(entry['reason'])}", soft_wrap=True)


def tally_text(counts: Dict[str, int]) -> str:
    """"3 pass, 0 fail, ... 2 skip" (and "N not run" when a run was cut short)."""
    text = (f"{counts['PASS']} pass, {counts['FAIL']} fail, {counts['ERROR']} error, {counts['CRASH']} crash, "
            f"{counts['TIMEOUT']} timeout, {counts['SKIP']} skip")
    return text + (f", {counts['NOT_RUN']} not run" if counts.get("NOT_RUN") else "")


class PlainProgress:
    """The battery's progress as plain lines ("doctor: 120/342 checks, 0 failed, 38 s") for a
    stream that is not a terminal (CI logs, pipes, tee), where a progress bar shows nothing:
    one every `every_s` seconds while the run lasts (a hanging check included) and one at the
    end. Use as a context manager; the instance is the progress(done, total, result) callback."""

    def __init__(self, stream: TextIO, label: str, total: Optional[int] = None, every_s: Optional[float] = None,
                 enabled: bool = True, also: Optional[Callable] = None):
        self.stream, self.label, self.total, self.enabled, self.also = stream, label, total, enabled, also
        self.every_s = every_s if every_s is not None else float(os.environ.get("GPUPARITY_PROGRESS_S",
                                                                                PROGRESS_EVERY_S))
        self.done = self.failed = self.not_run = 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __call__(self, done: int, total: int, result: CheckResult) -> None:
        self.done, self.total = done, total
        self.failed += result.status.bad
        self.not_run += result.status == Status.NOT_RUN
        if self.also:
            self.also(done, total, result)

    def line(self) -> str:
        text = (f"{self.label}: {self.done}/{self.total if self.total is not None else '?'} checks, "
                f"{self.failed} failed, {time.monotonic() - self.started:.0f} s")
        return text + (f", {self.not_run} not run" if self.not_run else "")

    def _write(self) -> None:
        try:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: progress is not worth failing for
            pass

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            self._write()

    def __enter__(self) -> "PlainProgress":
        self.started = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self.done:
                self._write()


def rerun_command(result: CheckResult, timeout: Optional[float] = None) -> Optional[str]:
    """The `gpuparity check` command that reruns exactly this check with the same inputs (and the
    run's --timeout, when it had one), or None for a record without the run's base seed and
    level (written before they were recorded)."""
    if result.base_seed is None or result.level is None:
        return None
    if result.backend.startswith("impl:"):
        target = ["--impl", result.backend[len("impl:"):]]
    else:
        target = ["--backend", result.backend]
    argv = ["gpuparity", "check", "--op", result.op, *target, "--dtype", result.dtype, "--case", result.case,
            "--seed", str(result.base_seed), "--level", result.level, "--device", result.device]
    if timeout is not None:
        argv += ["--timeout", f"{timeout:g}"]
    return " ".join(shlex.quote(arg) for arg in argv)


def render_failures(console: Console, results: List[CheckResult], limit: int = 15,
                    timeout: Optional[float] = None, shrunk: Optional[List[Dict[str, Any]]] = None) -> None:
    """Failed checks, each with its rerun line and, where it was shrunk (`shrunk`: Shrunk.to_dict()
    of checks/shrink.py), the minimal failing case and its standalone repro script."""
    bad = [r for r in results if r.status.bad]
    if not bad:
        return
    bad.sort(key=lambda r: SEVERITY.index(r.status))
    console.print(f"[bold]Failed checks[/] ({len(bad)}; first {min(limit, len(bad))}; "
                  f"each with the command that reruns it):")
    for r in bad[:limit]:
        console.print(f"  [{STYLE[r.status.value]}]{r.status.value}[/] {r.key} seed={r.seed}: {clip(r.reason, 400)}")
        command = rerun_command(r, timeout)
        if command:
            # never wrapped, so it can be copied whole
            console.print(f"      [dim]rerun:[/] {escape(command)}", soft_wrap=True)
        for item in shrunk or []:
            if (item["op"], item["backend"], item["case"], item["dtype"]) == (r.op, r.backend, r.case, r.dtype):
                render_shrunk(console, item)
        if r.stderr_tail:
            for line in r.stderr_tail.splitlines()[-4:]:
                console.print(f"      [dim]{line[:200]}[/]")


def render_shrunk(console: Console, item: Dict[str, Any]) -> None:
    steps = "; ".join(item["steps"]) or "already minimal"
    note = "" if item["minimal"] else " (search stopped by its time limit)"
    console.print(f"      [dim]shrunk in {item['attempts']} runs{note}:[/] {escape(steps)}", soft_wrap=True)
    if item.get("repro"):
        console.print(f"      [dim]repro:[/] python {escape(item['repro'])}", soft_wrap=True)
    elif item.get("repro_error"):
        console.print(f"      [dim]repro:[/] {escape(item['repro_error'])}")


def render_known_issues(console: Console, known: List[Dict[str, Any]], error: Optional[str] = None) -> None:
    if error:
        console.print(f"[yellow]Known issues: {error}[/]")
    try:
        from .known_table import render_known_table
    except ImportError:
        render_known_table = None
    relevant = [k for k in known if k.get("status") not in ("does not apply", "ruled out")]
    if render_known_table is not None:
        render_known_table(console, known, only_relevant=True)
        return
    for k in relevant:
        console.print(f"  {k.get('status')}: {k.get('id')} - {k.get('title')}; remedy: {k.get('remedy')}")


def render_recommendations(console: Console, recs: List[Dict[str, Any]]) -> None:
    if not recs:
        return
    console.print("[bold]Recommended configuration[/]")
    for rec in recs:
        style = "red" if rec["avoid"] or not rec["use"] else "green"
        console.print(f"  [{style}]{rec['text']}[/]")


def render_doctor(console: Console, report: Dict[str, Any]) -> None:
    render_platform(console, report["platform"])
    render_known_issues(console, report.get("known_issues", []), report.get("known_issues_error"))
    results = [CheckResult.from_dict(r) for r in report["battery"]["results"]]
    render_results(console, results)
    render_failures(console, results, timeout=report["options"].get("timeout"), shrunk=report.get("shrunk"))
    render_recommendations(console, report.get("recommendations", []))
    t = report["battery"]["tally"]
    verdict = "[bold green]all checks passed[/]" if report["exit_code"] == 0 else "[bold red]problems found[/]"
    console.print(f"{verdict}: {tally_text(t)} in {report['duration_s']:.1f} s on "
                  f"{report['options']['device']} (level {report['options']['level']}, seed {report['options']['seed']})")
    if report.get("phases_s"):
        kept = [f"{n} {what}" for n, what in ((report.get("timings_reused"), "timings"),
                                               (report.get("probes_reused"), "probe outcomes")) if n]
        console.print("[dim]time: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in report["phases_s"].items())
                      + (f" ({' and '.join(kept)} kept from an earlier doctor here)" if kept else "") + "[/]")
    if report.get("probe_cache"):
        console.print(f"[dim]probe cache for backend='auto': {report['probe_cache']}[/]")
