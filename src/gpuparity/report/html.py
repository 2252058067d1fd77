"""A doctor report as one self-contained HTML file (no scripts, no network), readable offline."""
from __future__ import annotations

import html
from typing import Any, Dict, List

from ..checks.results import CheckResult, clip, not_run_here
from .terminal import summarize, why_text

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;font-size:.9em}td,th{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}.PASS{color:#18794e;font-weight:600}.FAIL,.ERROR{color:#c62828;font-weight:600}
.CRASH,.TIMEOUT{color:#8e24aa;font-weight:600}.SKIP{color:#888}.ok{color:#18794e}.bad{color:#c62828}
code{font-size:.9em}.small{color:#666;font-size:.85em}
"""


def esc(value: Any) -> str:
    """Any value as HTML text (None as nothing); trace_report's pages use it too."""
    return html.escape("" if value is None else str(value))


def html_table(headers: List[str], rows: List[List[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page_head(title: str, heading: str, ok: bool, verdict: str) -> List[str]:
    """The first parts of a report page: its head with the CSS, and an h1 with the verdict in green
    (ok) or red. Parts, not one string: the doctor joins its parts with newlines, trace pages without."""
    return [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
            f"<style>{CSS}</style></head><body>",
            f"<h1>{esc(heading)}: <span class='{'ok' if ok else 'bad'}'>{verdict}</span></h1>"]


def render_doctor_html(report: Dict[str, Any]) -> str:
    platform = report["platform"]
    results = [CheckResult.from_dict(r) for r in report["battery"]["results"]]
    tally = report["battery"]["tally"]
    verdict = "all checks passed" if report["exit_code"] == 0 else "problems found"
    if report.get("partial"):
        verdict = (f"interrupted by {report['interrupted']}" if report.get("interrupted") else "stopped early") + \
            f": partial report of the {len(results)} checks that ran"
    parts = [*page_head(f"gpuparity doctor: {report['machine']}", "gpuparity doctor", report["exit_code"] == 0, verdict),
             f"<p>{esc(report['machine'])}<br><span class='small'>created {esc(report['created'])}, gpuparity "
             f"{esc(report['gpuparity_version'])}, level {esc(report['options']['level'])}, device "
             f"{esc(report['options']['device'])}, seed {esc(report['options']['seed'])}, "
             f"{report['duration_s']:.1f} s</span></p>",
             "<p>" + ", ".join(f"<span class='{k}'>{v} {k.lower()}</span>" for k, v in tally.items()) + "</p>"]
    parts.append("<h2>Recommended configuration</h2><ul>" + "".join(
        f"<li class='{'bad' if r['avoid'] or not r['use'] else 'ok'}'>{esc(r['text'])}</li>"
        for r in report.get("recommendations", [])) + "</ul>")
    known = [k for k in report.get("known_issues", []) if k.get("status") not in ("does not apply", "ruled out")]
    parts.append("<h2>Known issues that apply or may apply here</h2>")
    if report.get("known_issues_error"):
        parts.append(f"<p class='bad'>{esc(report['known_issues_error'])}</p>")
    parts.append(html_table(["id", "status", "why", "remedy", "sources"], [
        [esc(k.get("id")), esc(k.get("status")), esc("; ".join(k.get("why", []) or [])), esc(k.get("remedy")),
         esc(", ".join(k.get("sources", []) or []))] for k in known]) if known else "<p>None.</p>")
    parts.append("<h2>Checks against float64 (by op and backend)</h2>")
    parts.append(html_table(["op", "backend", "status", "pass", "fail", "crash/timeout", "skip", "why"], [
        [esc(r["op"]), esc(r["backend"]), f"<span class='{r['status']}'>{r['status']}</span>", str(r["counts"]["PASS"]),
         str(r["counts"]["FAIL"] + r["counts"]["ERROR"]), str(r["counts"]["CRASH"] + r["counts"]["TIMEOUT"]),
         str(r["counts"]["SKIP"]), esc(clip(why_text(r), 300))] for r in summarize(results)]))
    too_big = not_run_here(results)
    if too_big:   # each by name: the table counts them among the skips under one reason
        parts.append(f"<h2>Not run here: too large for this machine or the level's budget ({len(too_big)})</h2>")
        parts.append(html_table(["op", "case", "checks", "why"], [
            [esc(e["op"]), esc(e["case"]), str(e["checks"]), esc(e["reason"])] for e in too_big]))
    bad = [r for r in results if r.status.bad]
    parts.append(f"<h2>Failed checks ({len(bad)})</h2>")
    parts.append(html_table(["status", "check", "seed", "error / allowed", "reason", "stderr"], [
        [f"<span class='{r.status.value}'>{r.status.value}</span>", esc(r.key), esc(r.seed),
         esc(f"{r.worst_comparison.err:.3g} / {r.worst_comparison.allowed:.3g}" if r.worst_comparison and
            r.worst_comparison.err is not None else "-"),
         esc(clip(r.reason, 600)), f"<pre>{esc(r.stderr_tail[-800:])}</pre>" if r.stderr_tail else ""] for r in bad])
                 if bad else "<p>None.</p>")
    parts.append("<h2>Platform</h2>")
    flat = []
    for key, value in platform.items():
        flat.append([esc(key), f"<code>{esc(value)}</code>"])
    parts.append(html_table(["fact", "value"], flat))
    parts.append("</body></html>")
    return "\n".join(parts)
