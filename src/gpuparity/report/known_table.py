"""Rendering of the known-issue base: a rich table of results grouped by status for the
terminal, and the markdown table of the base for docs/known-issues.md."""
from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any, Dict, Iterable, List, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..known.engine import (CONFIRMED, DOES_NOT_APPLY, MAY_APPLY, RULED_OUT, STATUS_ORDER, KnownIssueResult,
                            sort_results)
from ..known.rules import describe_rule

STYLES = {CONFIRMED: "bold red", MAY_APPLY: "yellow", RULED_OUT: "green", DOES_NOT_APPLY: "dim"}


def _env_text(env: Dict[str, Optional[str]]) -> str:
    return " ".join(f"unset {name}" if value is None else f"{name}={value}" for name, value in env.items())


def counts_line(results: Iterable[KnownIssueResult]) -> str:
    results = list(results)
    parts = [f"{sum(1 for r in results if r.status == status)} {status}" for status in STATUS_ORDER]
    return f"{len(results)} known issues: " + ", ".join(parts)


def results_table(results: List[KnownIssueResult], *, show_all: bool = False) -> Table:
    """One table, grouped by status in STATUS_ORDER (confirmed first); "does not apply" rows only
    with show_all."""
    table = Table(show_lines=False, expand=False, title_justify="left")
    table.add_column("id", style="bold", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("why", ratio=3, overflow="fold")
    table.add_column("remedy", ratio=2, overflow="fold")
    previous = None
    for result in sort_results(results):
        if result.status == DOES_NOT_APPLY and not show_all:
            continue
        if previous is not None and result.status != previous:
            table.add_section()
        previous = result.status
        why = Text("\n".join(f"- {line}" for line in result.why) or "-")
        if result.probe_outcome and result.probe_outcome.get("stderr_tail") and result.status == CONFIRMED:
            tail = result.probe_outcome["stderr_tail"].strip().splitlines()[-3:]
            why.append("\n" + "\n".join(f"  | {line}" for line in tail), style="dim")
        remedy = Text(result.remedy if result.status != DOES_NOT_APPLY else "")
        if result.remedy_env and result.status != DOES_NOT_APPLY:
            remedy.append(f"\nenv: {_env_text(result.remedy_env)}", style="cyan")
        status = Text(result.status, style=STYLES.get(result.status, ""))
        if result.kind != "bug" and result.status in (CONFIRMED, MAY_APPLY):
            status.append(f"\n({result.kind})", style="dim")
        table.add_row(Text(result.id), status, why, remedy)
    return table


def render(results: List[KnownIssueResult], console: Optional[Console] = None, *, summary: str = "",
           show_all: bool = False, recommended: Optional[Dict[str, Optional[str]]] = None) -> None:
    """The terminal view of `gpuparity known-issues`."""
    console = console or Console()
    if summary:
        console.print(summary)
    console.print(counts_line(results))
    shown = [r for r in results if show_all or r.status != DOES_NOT_APPLY]
    if shown:
        console.print(results_table(results, show_all=show_all))
    hidden = [r.id for r in results if r.status == DOES_NOT_APPLY]
    if hidden and not show_all:
        console.print(Text(f"does not apply ({len(hidden)}): {', '.join(hidden)}  (--all shows why)", style="dim"))
    if recommended:
        console.print(Text("recommended environment: " + _env_text(recommended), style="cyan"))


def as_results(items: Iterable[Any]) -> List[KnownIssueResult]:
    """KnownIssueResults from results or their to_dict() form (as stored in a doctor report)."""
    fields = {field.name for field in dataclasses.fields(KnownIssueResult)}
    return [item if isinstance(item, KnownIssueResult)
            else KnownIssueResult(**{k: v for k, v in item.items() if k in fields}) for item in items]


def render_known_table(console: Console, known: Iterable[Any], only_relevant: bool = False) -> None:
    """The known-issue part of another report (gpuparity doctor): the counts and the entries that
    were confirmed or may apply (with only_relevant), or every entry that is not "does not apply"."""
    results = as_results(known)
    console.print(counts_line(results))
    shown = [r for r in results if r.status in (CONFIRMED, MAY_APPLY)] if only_relevant else results
    if shown:
        console.print(results_table(shown))


# --------------------------------------------------------------------------- docs
def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _sources_text(sources: List[str]) -> str:
    """Each source as a short markdown link: owner/repo#N for a GitHub issue or pull request."""
    parts = []
    for source in sources:
        match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)/(issues|pull)/(\d+)(.*)", source)
        if match:
            label = f"{match.group(1)}#{match.group(3)}" + (" (PR)" if match.group(2) == "pull" else "")
            parts.append(f"[{label}](https://github.com/{match.group(1)}/{match.group(2)}/{match.group(3)})"
                         + match.group(4))
        else:
            parts.append(source)
    return "; ".join(parts) or "-"


def markdown_table(issues: List[Dict[str, Any]]) -> str:
    """The base as a markdown table: id, title, rule in words, probe (or why there is none),
    remedy environment, sources and the date they were reviewed."""
    lines = ["| id | what | kind | rule (may apply when) | probe | remedy env | sources | reviewed |",
             "|---|---|---|---|---|---|---|---|"]
    for issue in issues:
        env = _env_text(issue.get("remedy_env") or {})
        if env and issue.get("remedy_env_scope") == CONFIRMED:
            env += " (when confirmed)"
        title = issue["title"] + (" (unconfirmed)" if issue.get("unconfirmed") else "")
        probe = f"`{issue['probe']}`" if issue["probe"] else f"no probe: {issue.get('no_probe', 'none written')}"
        lines.append("| " + " | ".join(_cell(part) for part in (
            issue["id"], title, issue.get("kind", "bug"), describe_rule(issue["rule"]), probe,
            f"`{env}`" if env else "-", _sources_text(issue["sources"]), issue.get("reviewed", "-"))) + " |")
    return "\n".join(lines) + "\n"


BEGIN = "<!-- BEGIN GENERATED: known-issue table (python -m gpuparity.report.known_table docs/known-issues.md) -->"
END = "<!-- END GENERATED: known-issue table -->"


def rewrite_doc(path: str) -> bool:
    """Replace the generated section of a markdown file with the current table; True if changed."""
    from ..known import load_issues
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{path}: no generated section ({BEGIN} ... {END})")
    new = pattern.sub(lambda _: f"{BEGIN}\n{markdown_table(load_issues())}{END}", text)
    if new != text:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(new)
    return new != text


if __name__ == "__main__":
    for doc in sys.argv[1:]:
        print(f"{doc}: {'rewritten' if rewrite_doc(doc) else 'up to date'}")
