"""`gpuparity cache show|clear`: the probe verdicts behind backend="auto"."""
from __future__ import annotations

import glob
import os
import sys

from rich.table import Table

from ..cachedir import cache_dir
from ._common import console

# An unsupported backend (no check could run: wrong vendor, no GPU, a kind it does not serve)
# is not a failed probe; only a probe that ran checks and saw them fail is.
VERDICT_STYLE = {"passed": "[green]passed[/]", "failed": "[red]failed[/]", "unsupported": "[dim]unsupported[/]"}


def register(subparsers) -> None:
    parser = subparsers.add_parser("cache", help="show or clear the probe cache behind backend='auto'")
    parser.add_argument("action", choices=("show", "clear"))
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from ..checks import verdicts  # imports torch: not for `cache --help`
    from ..checks.battery import verdict_status
    from ..checks.results import clip
    con = console()
    files = sorted(glob.glob(os.path.join(cache_dir(), "probes-*.json")))
    if args.action == "clear":
        failed = []
        for path in files:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass  # another process cleared it meanwhile
            except OSError as exc:
                failed.append(f"{path} ({exc.strerror})")
        verdicts.clear_cache()
        con.print(f"removed {len(files) - len(failed)} probe cache file(s) from {cache_dir()}")
        if failed:
            print(f"gpuparity cache: error: cannot remove {', '.join(failed)}; remove it by hand or set "
                  f"GPUPARITY_CACHE_DIR to a directory you can write", file=sys.stderr)
            return 2
        return 0
    if not files:
        con.print(f"no probe cache in {cache_dir()} yet: `gpuparity doctor` fills it, "
                  f"or the first backend='auto' call probes")
        return 0
    damaged = []
    for path in files:
        try:
            stored = verdicts.read_file(path)
        except (verdicts.CacheCorrupt, OSError) as exc:
            damaged.append(str(exc) if isinstance(exc, verdicts.CacheCorrupt)
                           else f"cannot read the probe cache {path} ({exc.strerror})")
            continue
        table = Table(title=path, title_justify="left")
        for column in ("op", "backend", "dtype", "kind", "verdict", "time (ms)", "why"):
            table.add_column(column, overflow="fold")
        for key, verdict in sorted(stored.items()):
            op, backend, dtype, kind = verdicts.VerdictKey.decode(key)
            time_ms = verdict.get("time_ms")
            status = verdict_status(verdict)
            reason = clip(verdict.get("reason", ""), 160)
            table.add_row(op, backend, dtype, kind, VERDICT_STYLE[status],
                          f"{time_ms:.3g}" if isinstance(time_ms, (int, float)) else "-",
                          f"unsupported: {reason}" if status == "unsupported" else reason)
        con.print(table)
    for message in damaged:
        print(f"gpuparity cache: error: {message}", file=sys.stderr)
    return 2 if damaged else 0
