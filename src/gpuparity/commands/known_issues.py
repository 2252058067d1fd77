"""`gpuparity known-issues`: which known backend bugs may apply here, confirmed or ruled out by
crash-isolated probes; or, with --platform, which may apply on another machine (rules only)."""
from __future__ import annotations

import json

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .. import platform as platform_mod
from ..known import evaluate, load_platform, recommended_env, results_json
from ..report.files import write_json
from ..report.known_table import render
from ._common import add_device, add_json, console, input_file


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "known-issues", help="match this machine against the base of known backend bugs",
        description="Match the platform against the known-issue base. Each entry ends as: does not apply, "
                    "may apply (by version, arch or setup), confirmed (its probe failed here) or ruled out "
                    "(its probe passed here: not reproduced here). Probes run crash-isolated, for entries that may apply "
                    "and for those only a version range rules out: the probe decides, not the version rule. "
                    "Exit code 0 (informational), 2 on bad input.")
    parser.add_argument("--platform", metavar="ENV_JSON", type=input_file,
                        help="judge a saved `gpuparity env --json` from another machine (rules only, no probes)")
    add_json(parser, "the results")
    parser.add_argument("--no-probes", action="store_true", help="rules only: do not run probes")
    add_device(parser)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per probe (default 60; compile probes get 3x, collective probes 2x)")
    parser.add_argument("--all", action="store_true", dest="show_all", help="also list why the others do not apply")
    parser.set_defaults(handler=run)


def run(args) -> int:
    if args.timeout <= 0:
        raise ValueError(f"--timeout: expected seconds > 0, got {args.timeout:g}")
    if args.platform:
        report = load_platform(args.platform)
        probes = False
        summary = f"platform from {args.platform}: {platform_mod.summary_line(report)} (rules only, no probes)"
    else:
        report = platform_mod.current()
        probes = not args.no_probes
        summary = f"this machine: {platform_mod.summary_line(report)}"
    err = console(stderr=True)
    progress_display = Progress(TextColumn("probing known issues"), BarColumn(), TextColumn("{task.fields[label]}"),
                                TimeElapsedColumn(), console=err, transient=True,
                                disable=not probes or not err.is_terminal)
    with progress_display:
        task = progress_display.add_task("probes", total=None, label="")

        def progress(done: int, total: int, label: str) -> None:
            progress_display.update(task, completed=done, total=total, label=label)

        results = evaluate(report if args.platform else None, probes=probes, device=args.device,
                           timeout=args.timeout, progress=progress)
    document = results_json(results, report, probes_ran=probes)
    if args.json == "-":
        print(json.dumps(document, indent=1, default=str))
        return 0
    out = console()
    render(results, out, summary=summary, show_all=args.show_all, recommended=document["recommended_env"])
    if args.json:
        write_json(args.json, document)
        out.print(f"[dim]wrote {args.json}[/]")
    return 0
