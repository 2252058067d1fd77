"""Small pieces the subcommands share: device/dtype arguments, console, progress bars."""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)


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
