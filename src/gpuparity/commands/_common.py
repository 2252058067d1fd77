"""Small pieces the subcommands share: device/dtype arguments, console, progress bars."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Dict, Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=None if stream.isatty() else 160)


def human_console(args) -> Console:
    """The console for tables, progress and notes: stderr when `--json -` owns stdout, so that
    stdout is exactly one JSON document."""
    return console(stderr=getattr(args, "json", None) == "-")


def emit_json(con: Console, target: str, data: Dict[str, Any]) -> None:
    """`--json FILE` writes the file (and says so); `--json -` prints the document on stdout."""
    if target == "-":
        sys.stdout.write(json.dumps(data, default=str) + "\n")
        sys.stdout.flush()
        return
    from ..report.files import write_json
    write_json(target, data)
    con.print(f"[dim]wrote {target}[/]")


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N (ROCm GPUs are cuda:N too); default: the first GPU, else cpu")


def add_json(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    parser.add_argument("--json", metavar="FILE", default=None, help=f"write {what} as JSON to FILE ('-' for stdout)")


def split_list(value: Optional[str]):
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items or None


@contextlib.contextmanager
def battery_progress(con: Console, total_hint: Optional[int] = None, label: str = "checks") -> Iterator:
    """A progress bar fed by the battery's progress(done, total, result) callback."""
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=con, transient=True,
                        disable=not con.is_terminal)
    with progress:
        task = progress.add_task(label, total=total_hint, last="")

        def update(done: int, total: int, result) -> None:
            progress.update(task, completed=done, total=total,
                            last=f"{result.op}/{result.backend}/{result.case}/{result.dtype}: {result.status.value}")
        yield update
