"""`gpuparity cache show|clear`: the probe verdicts behind backend="auto"."""
from __future__ import annotations

import glob
import json
import os

from rich.table import Table

from ..cachedir import cache_dir
from ..checks import verdicts
from ..checks.battery import verdict_status
from ._common import console

# An unsupported backend (no check could run: wrong vendor, no GPU, a kind it does not serve)
# is not a failed probe; only a probe that ran checks and saw them fail is.
VERDICT_STYLE = {"passed": "[green]passed[/]", "failed": "[red]failed[/]", "unsupported": "[dim]unsupported[/]"}


def register(subparsers) -> None:
    parser = subparsers.add_parser("cache", help="show or clear the probe cache behind backend='auto'")
    parser.add_argument("action", choices=("show", "clear"))
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    con = console()
    files = sorted(glob.glob(os.path.join(cache_dir(), "probes-*.json")))
    if args.action == "clear":
        for path in files:
            os.remove(path)
        verdicts.clear_cache()
        con.print(f"removed {len(files)} probe cache file(s) from {cache_dir()}")
        return 0
    if not files:
        con.print(f"no probe cache in {cache_dir()} yet: `gpuparity doctor` fills it, "
                  f"or the first backend='auto' call probes")
        return 0
    for path in files:
        with open(path, encoding="utf-8") as handle_:
            data = json.load(handle_)
        table = Table(title=path, title_justify="left")
        for column in ("op", "backend", "dtype", "kind", "verdict", "time (ms)", "why"):
            table.add_column(column, overflow="fold")
        for key, verdict in sorted(data.get("verdicts", {}).items()):
            op, backend, dtype, kind = key.split("|")
            time_ms = verdict.get("time_ms")
            status = verdict_status(verdict)
            reason = verdict.get("reason", "")[:160]
            table.add_row(op, backend, dtype, kind, VERDICT_STYLE[status],
                          f"{time_ms:.3g}" if isinstance(time_ms, (int, float)) else "-",
                          f"unsupported: {reason}" if status == "unsupported" else reason)
        con.print(table)
    return 0
