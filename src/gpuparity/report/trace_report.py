"""Rendering of trace comparisons, trace replays, model checks, safe-compile choices and workload
comparisons: terminal (rich) and self-contained HTML."""
from __future__ import annotations

import math
import shlex
from typing import Any, Dict, List, Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..checks.results import clip
from .html import esc, html_table, page_head
from .plots import error_along_depth_svg

ROW_LIMIT = 40


def _num(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return "0" if value == 0 else f"{value:.3g}"


def _ratio(row: Dict[str, Any]) -> float:
    err, allowed = row.get("err"), row.get("allowed")
    if err is None:
        return -1.0
    if not math.isfinite(err):
        return math.inf
    return err / allowed if allowed else (0.0 if err == 0 else math.inf)


def rows_to_show(rows: Sequence[Dict[str, Any]], first: Optional[Dict[str, Any]], show_all: bool,
                 limit: int = ROW_LIMIT) -> List[Dict[str, Any]]:
    """All rows when few or asked; else the rows around the first divergence (or, when there is
    none, the rows closest to their limit), in order."""
    if show_all or len(rows) <= limit:
        return list(rows)
    if first is not None and first in rows:
        at = rows.index(first)
        picked = set(range(max(0, at - limit // 2), min(len(rows), at + limit // 2)))
    else:
        picked = set(sorted(range(len(rows)), key=lambda i: -_ratio(rows[i]))[:limit])
    return [rows[i] for i in sorted(picked)]


def _name(row: Dict[str, Any]) -> str:
    text = row["key"]
    if row.get("what") == "own code":
        text += " (own code)"
    return text


def _first_line(row: Optional[Dict[str, Any]], direction: str) -> str:
    if row is None:
        return f"[green]no module diverges ({direction})[/]"
    return (f"[bold red]{_name(row)}[/] ({row.get('type') or '-'}): relative error {_num(row.get('err'))} > allowed "
            f"{_num(row.get('allowed'))} (inherited {_num(row.get('inherited'))}); max abs error "
            f"{_num(row.get('max_abs'))} at {row.get('worst_index')} in {row.get('tensor')}")


# --------------------------------------------------------------------------- trace compare
def render_comparison(console: Console, data: Dict[str, Any], show_all: bool = False) -> None:
    """data: TraceComparison.to_dict()."""
    a, b = data["a"], data["b"]
    console.print(f"[bold]A[/] {a['path']}: {a['device']} {a['dtype']}; {a['machine']}")
    console.print(f"[bold]B[/] {b['path']}: {b['device']} {b['dtype']}; {b['machine']}")
    console.print(f"weights: {data['identity']['weights']}; inputs: {data['identity']['inputs']}")
    _comparison_tables(console, data, show_all)
    for note in data.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"first divergent module, forward:  {_first_line(data['first_forward'], 'forward')}")
    if data["backward"]:
        console.print(f"first divergent module, backward: {_first_line(data['first_backward'], 'backward')}")
    if data["passed"]:
        console.print("[bold green]the traces agree[/] under the tolerance policy (docs/diverging-runs.md)")
    else:
        # each machine replays the other's trace: its own arithmetic on the other's recorded inputs
        console.print("[bold red]the traces diverge[/]: replay each trace on the other machine to see whose own "
                      f"computation is off: on B's machine `gpuparity trace replay {escape(shlex.quote(a['path']))}`, "
                      f"on A's `gpuparity trace replay {escape(shlex.quote(b['path']))}`")


def _comparison_tables(console: Console, data: Dict[str, Any], show_all: bool, title: str = "B against A") -> None:
    for direction in ("forward", "backward"):
        rows = data[direction]
        first = data[f"first_{direction}"]
        if not rows:
            continue
        table = Table(title=f"{direction}: {title}, per module call", title_justify="left")
        for column in ("#", "module", "type", "what", "rel. error", "inherited", "allowed", "max abs", ""):
            table.add_column(column, justify="right" if column in ("#", "rel. error", "inherited", "allowed",
                                                                  "max abs") else "left")
        # A container's inline code that agrees is noise in the terminal (it stays in --json/--html).
        candidates = rows if show_all else [r for r in rows if r.get("what") != "own code" or not r["passed"]]
        shown = rows_to_show(candidates, first, show_all)
        for row in shown:
            mark = "[green]ok[/]" if row["passed"] else "[bold red]DIVERGES[/]"
            if row.get("reason") == "not in B":
                mark = "[dim]not in B[/]"
            style = "bold" if first is not None and row["index"] == first["index"] else None
            table.add_row(str(row["index"]), _name(row), row.get("type") or "", row.get("what", ""),
                          _num(row.get("err")), _num(row.get("inherited")), _num(row.get("allowed")),
                          _num(row.get("max_abs")), mark, style=style)
        console.print(table)
        if len(shown) < len(rows):
            console.print(f"[dim]{len(rows) - len(shown)} of {len(rows)} rows not shown (--all shows every row)[/]")


# --------------------------------------------------------------------------- trace replay
_DEVIATES = {"recorded": "a float64 replay of this module agrees with this machine, not with the recorded run",
             "here": "a float64 replay of this module agrees with the recorded run, not with this machine",
             "both": "a float64 replay of this module agrees with neither"}


def _culprit_line(row: Optional[Dict[str, Any]], direction: str) -> str:
    if row is None:
        return f"[green]every module's own {direction} computation agrees[/]"
    if row["status"] == "error":
        return f"[bold red]{row['key']}[/] ({row['type']}): {row['reason']}"
    text = (f"[bold red]{row['key']}[/] ({row['type']}): own error {_num(row.get('err'))} > allowed "
            f"{_num(row.get('allowed'))}; max abs {_num(row.get('max_abs'))} at {row.get('worst_index')}")
    if row.get("deviates"):
        text += f"; {_DEVIATES[row['deviates']]}"
    if row.get("known_issue"):
        text += f"; known issue {row['known_issue']} (confirmed here: torch's own kernel, not the model's code)"
    return text


def render_replay(console: Console, data: Dict[str, Any], show_all: bool = False) -> None:
    """data: ReplayResult.to_dict()."""
    trace, here = data["trace"], data["here"]
    console.print(f"[bold]recorded[/] {trace['path']}: {trace['device']} {trace['dtype']}; {trace['machine']}")
    console.print(f"[bold]here[/]     {here['device']}; {here['machine']}; spec {here['spec']} "
                  f"{here.get('factory_args') or ''}")
    console.print(f"weights: {data['identity']}")
    for direction in ("forward", "backward"):
        rows = data[direction]
        culprit = data[f"culprit_{direction}"]
        if not rows:
            continue
        table = Table(title=f"{direction}: each module on the recorded inputs, here vs recorded",
                      title_justify="left")
        for column in ("#", "module", "type", "own error", "allowed", "recorded vs f64", "here vs f64", "status"):
            table.add_column(column, justify="right" if column in ("#", "own error", "allowed", "recorded vs f64",
                                                                  "here vs f64") else "left")
        shown = rows_to_show(rows, culprit, show_all)
        for row in shown:
            status = {"ok": "[green]ok[/]", "diverged": "[bold red]DIVERGES[/]", "error": "[bold red]ERROR[/]",
                      "skipped": "[dim]skipped[/]"}[row["status"]]
            if row["status"] in ("skipped", "error") and row.get("reason"):
                status += f" [dim]{clip(row['reason'], 80)}[/]"
            style = "bold" if culprit is not None and row["key"] == culprit["key"] else None
            table.add_row(str(row["index"]), row["key"], row["type"], _num(row.get("err")), _num(row.get("allowed")),
                          _num(row.get("recorded_err64")), _num(row.get("here_err64")), status, style=style)
        console.print(table)
        if len(shown) < len(rows):
            console.print(f"[dim]{len(rows) - len(shown)} of {len(rows)} rows not shown (--all shows every row)[/]")
    for note in data.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"module whose own computation is wrong, forward:  {_culprit_line(data['culprit_forward'], 'forward')}")
    if data["backward"]:
        console.print(f"module whose own computation is wrong, backward: "
                      f"{_culprit_line(data['culprit_backward'], 'backward')}")


# --------------------------------------------------------------------------- HTML
def comparison_html(data: Dict[str, Any]) -> str:
    a, b = data["a"], data["b"]
    verdict = "the traces agree" if data["passed"] else "the traces diverge"
    parts = [*page_head("gpuparity trace compare", "gpuparity trace compare", data["passed"], verdict),
             f"<p><b>A</b> {esc(a['path'])}: {esc(a['device'])} {esc(a['dtype'])}; {esc(a['machine'])}<br>"
             f"<b>B</b> {esc(b['path'])}: {esc(b['device'])} {esc(b['dtype'])}; {esc(b['machine'])}<br>"
             f"weights {esc(data['identity']['weights'])}; inputs {esc(data['identity']['inputs'])}</p>"]
    parts += _comparison_sections(data, "relative error of B against A")
    if data.get("notes"):
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in data["notes"]) + "</ul>")
    parts.append("<p class='small'>Rule: err &lt;= max(2 x inherited, floor of the coarser dtype); "
                 "see docs/diverging-runs.md.</p></body></html>")
    return "".join(parts)


def _comparison_sections(data: Dict[str, Any], what: str) -> List[str]:
    parts = []
    for direction in ("forward", "backward"):
        first = data[f"first_{direction}"]
        parts.append(f"<h2>{direction}</h2><p>first divergent module: " +
                     (f"<b class='bad'>{esc(_name(first))}</b> ({esc(first.get('type'))}): {esc(first.get('reason'))}"
                      if first else "<span class='ok'>none</span>") + "</p>")
        parts.append(error_along_depth_svg(data[direction], f"{direction}: {what}"))
        parts.append(html_table(["#", "module", "type", "what", "rel. error", "inherited", "allowed", "max abs", "verdict"], [
            [str(r["index"]), esc(r["key"]), esc(r.get("type")), esc(r.get("what")), _num(r.get("err")),
             _num(r.get("inherited")), _num(r.get("allowed")), _num(r.get("max_abs")),
             "<span class='ok'>ok</span>" if r["passed"] else f"<span class='bad'>diverges</span> {esc(r.get('reason'))}"]
            for r in data[direction]]))
    return parts


def replay_html(data: Dict[str, Any]) -> str:
    trace, here = data["trace"], data["here"]
    verdict = "every module agrees" if data["passed"] else "a module's own computation differs"
    parts = [*page_head("gpuparity trace replay", "gpuparity trace replay", data["passed"], verdict),
             f"<p><b>recorded</b> {esc(trace['path'])}: {esc(trace['device'])} {esc(trace['dtype'])}; "
             f"{esc(trace['machine'])}<br><b>here</b> {esc(here['device'])}; {esc(here['machine'])}</p>"]
    for direction in ("forward", "backward"):
        culprit = data[f"culprit_{direction}"]
        rows = data[direction]
        if not rows:
            continue
        parts.append(f"<h2>{direction}</h2><p>module whose own computation is wrong: " +
                     (f"<b class='bad'>{esc(culprit['key'])}</b> ({esc(culprit['type'])}): {esc(culprit['reason'])}"
                      + (f"; {esc(_DEVIATES[culprit['deviates']])}" if culprit.get("deviates") else "")
                      if culprit else "<span class='ok'>none</span>") + "</p>")
        plot_rows = [dict(r, passed=r["status"] != "diverged") for r in rows]
        parts.append(error_along_depth_svg(plot_rows, f"{direction}: own error of each module, here vs recorded"))
        parts.append(html_table(["#", "module", "type", "own error", "allowed", "recorded vs f64", "here vs f64", "status"], [
            [str(r["index"]), esc(r["key"]), esc(r["type"]), _num(r.get("err")), _num(r.get("allowed")),
             _num(r.get("recorded_err64")), _num(r.get("here_err64")),
             f"<span class='{'ok' if r['status'] == 'ok' else 'bad'}'>{esc(r['status'])}</span> {esc(r.get('reason'))}"]
            for r in rows]))
    if data.get("notes"):
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in data["notes"]) + "</ul>")
    parts.append("</body></html>")
    return "".join(parts)


# --------------------------------------------------------------------------- gpuparity model
_OWN_STATUS = {"ok": "[green]ok[/]", "diverged": "[bold red]DIVERGES[/]", "error": "[bold red]ERROR[/]",
               "unconfirmed": "[red]flagged, not re-run[/]", "skipped": "[dim]skipped[/]"}


def _model_header(data: Dict[str, Any]) -> str:
    scope = f"only {', '.join(data['include'])}, each on its recorded inputs" if data["include"] else "the whole model"
    mode = " in eval mode" if data.get("run_mode") == "eval" else ""
    return (f"{data['spec']} {data.get('factory_args') or ''}: {data['device']} {data['dtype']}{mode} against "
            f"{data['reference']} (same weights and inputs), {scope}; {data['machine']}")


def _padding_line(padding: Optional[Dict[str, Any]]) -> Optional[str]:
    """One line for the padding-invariance check (trace/padding.py), or None when it did not run."""
    if padding is None:
        return None
    if not padding["checked"]:
        return f"padding invariance: not checked: {padding['why']}"
    culprit = padding["culprit_forward"] or padding["culprit_backward"]
    if culprit is None:
        return (f"padding invariance ({padding['why']}): the outputs and gradients at the real tokens do not move: "
                "no module uses what sits at the padded positions")
    what = "own output" if culprit["direction"] == "forward" else "own backward"
    return (f"padding invariance ({padding['why']}): {culprit['key']} ({culprit['type']}): its {what} at the real "
            f"tokens moved by {_num(culprit['change'])} (allowed {_num(culprit['allowed'])}, {culprit['tensor']}) "
            "when only the padded positions changed: it reads padding its mask should hide")


def render_model_check(console: Console, data: Dict[str, Any], show_all: bool = False) -> None:
    """data: ModelCheck.to_dict()."""
    console.print(f"[bold]model[/] {_model_header(data)}")
    comparison = data.get("comparison")
    if comparison:
        _comparison_tables(console, comparison, show_all, title=f"{data['device']} {data['dtype']} against float64")
    for direction in ("forward", "backward"):
        rows, culprit = data[direction], data[f"culprit_{direction}"]
        if not rows:
            continue
        what = "each module on its recorded inputs" if data["include"] else "flagged modules on the reference's inputs"
        table = Table(title=f"{direction}: {what}, device against float64", title_justify="left")
        for column in ("#", "module", "type", "own error", "inherited", "allowed", "status"):
            table.add_column(column, justify="left" if column in ("module", "type", "status") else "right")
        for row in rows_to_show(rows, culprit, show_all):
            status = _OWN_STATUS[row["status"]]
            if row["status"] in ("skipped", "error", "unconfirmed") and row.get("reason"):
                status += f" [dim]{clip(row['reason'], 80)}[/]"
            style = "bold" if culprit is not None and row["key"] == culprit["key"] else None
            table.add_row(str(row["index"]), row["key"], row["type"], _num(row.get("err")), _num(row.get("inherited")),
                          _num(row.get("allowed")), status, style=style)
        console.print(table)
    padding = data.get("padding")
    for note in data.get("notes", []) + (comparison or {}).get("notes", []) + (padding or {}).get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"module whose own computation diverges, forward:  {_culprit_line(data['culprit_forward'], 'forward')}")
    console.print(f"module whose own computation diverges, backward: {_culprit_line(data['culprit_backward'], 'backward')}")
    if _padding_line(padding):
        console.print(escape(_padding_line(padding)), style=None if padding.get("passed", True) else "red")
    if data["passed"]:
        console.print("[bold green]the model agrees with float64[/] under the tolerance policy (docs/diverging-runs.md)"
                      + (" and its real tokens ignore the padding" if padding and padding["checked"] else ""))
        return
    culprit = data["culprit_forward"] or data["culprit_backward"]
    if culprit is not None:
        console.print(f"[bold red]{culprit['key']} diverges[/]: fed the same inputs, its result on {data['device']} "
                      f"differs from float64 beyond the tolerance policy")
        if culprit.get("known_issue"):
            console.print(escape(culprit["known_issue_text"]))
    if padding and not padding["passed"]:
        moved = padding["culprit_forward"] or padding["culprit_backward"]
        console.print(f"[bold red]{moved['key']} ignores the padding mask[/]: its result at the real tokens depends on "
                      "the padded positions")


def model_check_html(data: Dict[str, Any]) -> str:
    verdict = ("agrees with float64" if data["passed"] else "a module's own computation diverges"
               if data["culprit_forward"] or data["culprit_backward"] else "a module ignores the padding mask")
    parts = [*page_head("gpuparity model", "gpuparity model", data["passed"], verdict),
             f"<p>{esc(_model_header(data))}</p>"]
    for direction in ("forward", "backward"):
        culprit = data[f"culprit_{direction}"]
        parts.append(f"<h2>{direction}: own computation</h2><p>module whose own computation diverges: " +
                     (f"<b class='bad'>{esc(culprit['key'])}</b> ({esc(culprit['type'])}): {esc(culprit['reason'])}"
                      + (f" {esc(culprit['known_issue_text'])}" if culprit.get("known_issue") else "")
                      if culprit else "<span class='ok'>none</span>") + "</p>")
        parts.append(html_table(["#", "module", "type", "own error", "inherited", "allowed", "status"], [
            [str(r["index"]), esc(r["key"]), esc(r["type"]), _num(r.get("err")), _num(r.get("inherited")),
             _num(r.get("allowed")),
             f"<span class='{'ok' if r['status'] == 'ok' else 'bad'}'>{esc(r['status'])}</span> {esc(r.get('reason'))}"]
            for r in data[direction]]))
    if _padding_line(data.get("padding")):
        ok = data["padding"].get("passed", True)
        parts.append(f"<h2>Padding invariance</h2><p class='{'ok' if ok else 'bad'}'>{esc(_padding_line(data['padding']))}</p>")
    if data.get("comparison"):
        parts += _comparison_sections(data["comparison"], "relative error against float64")
    notes = data.get("notes", []) + (data.get("comparison") or {}).get("notes", []) + \
        (data.get("padding") or {}).get("notes", [])
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    parts.append("</body></html>")
    return "".join(parts)


# --------------------------------------------------------------------------- compile-check
def render_compile_choice(console: Console, data: Dict[str, Any]) -> None:
    """data: CompileChoice.to_dict()."""
    table = Table(title=f"torch.compile backends, judged against {data['referee']}", title_justify="left")
    for column in ("backend", "result", "rel. RMSE", "eager's", "allowed", "seconds", "reason"):
        table.add_column(column, justify="right" if column in ("rel. RMSE", "eager's", "allowed", "seconds") else "left")
    for attempt in data["attempts"]:
        result = {"ok": "[green]ok[/]", "wrong": "[bold red]WRONG ANSWER[/]", "error": "[red]error[/]"}[attempt["status"]]
        table.add_row(attempt["backend"], result, _num(attempt.get("err")), _num(attempt.get("eager_err")),
                      _num(attempt.get("allowed")), f"{attempt.get('seconds', 0):.1f}", clip(attempt.get("reason", ""), 200))
    console.print(table)
    for note in data.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    if data["known_issues"]:
        console.print(f"known issues that may match: {', '.join(data['known_issues'])} (gpuparity known-issues)")
    color = "red" if data["wrong_answer"] else ("yellow" if data["fell_back"] else "green")
    console.print(f"[bold {color}]use backend={data['backend']!r}[/]"
                  + (" (a backend gave a wrong answer)" if data["wrong_answer"] else ""))


# --------------------------------------------------------------------------- workload compare
def render_workload_comparison(console: Console, data: Dict[str, Any]) -> None:
    """data: RunComparison.to_dict()."""
    for side in ("a", "b"):
        run = data[side]
        step = run.get("step_time_ms_median")
        console.print(f"[bold]{side}[/] {run['workload']} attn={run.get('attn')} {run['device']} {run['dtype']}: "
                      f"{run['status']}{', ' + format(step, '.1f') + ' ms/step' if step else ''}; {run['machine']}")
    table = Table(title="final evaluation metrics", title_justify="left")
    for column in ("metric", "a", "b", "difference", ""):
        table.add_column(column, justify="left" if column in ("metric", "") else "right")
    for metric in data["final"]:
        diff = metric.get("rel_diff")
        table.add_row(metric["name"], _num(metric.get("a")), _num(metric.get("b")),
                      "-" if diff is None else f"{100 * diff:.2f}%",
                      "[green]ok[/]" if metric["passed"] else f"[bold red]> {100 * data['final_tolerance']:.0f}%[/]")
    console.print(table)
    tracking = data["tracking"]
    if tracking["worst_rel_diff"] is not None:
        console.print(f"loss curves (mean over {tracking['window']} steps, from step {tracking['warmup']}): largest "
                      f"difference {100 * tracking['worst_rel_diff']:.2f}% at step {tracking['worst_step']} "
                      + ("[green]track[/]" if tracking["passed"] else
                         f"[bold red]do not track (> {100 * tracking['tolerance']:.0f}%)[/]"))
    for problem in data["problems"]:
        console.print(f"[red]problem:[/] {problem}")
    console.print("[bold green]the runs agree[/]" if data["passed"] else "[bold red]the runs diverge[/]: record a "
                  "trace on each machine and compare them (gpuparity trace record / compare / replay)")
