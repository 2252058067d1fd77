"""Small pieces the subcommands share: device/dtype arguments, path arguments checked at
parse time, console, progress bars."""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import site
import sys
import sysconfig
import tempfile
import threading
import traceback
from typing import Any, Callable, Dict, Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 on a closed pipe; cli.main turns the error into exit 0 for every command
        self.quiet = True
        raise BrokenPipeError("stdout closed by the reader")


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return _Console(stderr=stderr, highlight=False, soft_wrap=False, width=None if stream.isatty() else 160)


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


# --------------------------------------------------------------------------- path arguments
# argparse calls these while it parses (type=...), so a bad path ends the command with exit 2 and
# a line naming the argument before any battery, probe or training runs. argparse adds the
# argument's name ("argument --json: ...") to the message.

def _nearest_existing(path: str) -> str:
    """The closest ancestor of `path` that exists (report writers create missing folders)."""
    current = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _check_writable(path: str, what: str) -> str:
    if not path:
        raise argparse.ArgumentTypeError(f"expected a {what} path, got an empty string")
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is a directory; expected a {what} to write")
    if os.path.exists(path):
        try:
            with open(path, "a", encoding="utf-8"):
                pass  # append mode: opening leaves the file as it is
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot write {path}: {exc.strerror}") from None
        return path
    folder = _nearest_existing(path)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {path}: {folder} is not a directory")
    # Root passes os.access checks on read-only mounts such as /proc: try a real file instead.
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".gpuparity-write-check-")
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {path}: cannot create files in {folder} "
                                         f"({exc.strerror})") from None
    os.close(handle)
    os.remove(probe)
    return path


def output_file(path: str) -> str:
    """type= of an output file (--html, --out, --plot): writable, not a directory."""
    return _check_writable(path, "file")


def output_json(path: str) -> str:
    """type= of --json: '-' (stdout) or a writable file."""
    return path if path == "-" else _check_writable(path, "file")


def output_dir(path: str) -> str:
    """type= of an output directory (trace record --out): a directory, or a path that can become one."""
    if not path:
        raise argparse.ArgumentTypeError("expected a directory path, got an empty string")
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise argparse.ArgumentTypeError(f"{path} is an existing file; expected a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"cannot write into {path}: permission denied")
        return path
    folder = _nearest_existing(path)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot create {path}: {folder} is not a writable directory")
    return path


def input_file(path: str) -> str:
    """type= of an input file (--platform, a.json): exists, is a file, can be read."""
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{path} does not exist")
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is a directory; expected a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
    return path


def input_trace(path: str) -> str:
    """type= of a trace: a directory holding trace.json (or the trace.json itself)."""
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{path} does not exist (record a trace with `gpuparity trace record`)")
    folder = (os.path.dirname(path) or ".") if os.path.isfile(path) else path
    meta = os.path.join(folder, "trace.json")
    if not os.path.isfile(meta):
        raise argparse.ArgumentTypeError(f"{path} is not a trace: no trace.json in {folder}")
    return path


def spec_argument(spec: str) -> str:
    """type= of SPEC (module:factory or path/to/file.py:factory): a .py file must exist."""
    source = spec.rsplit(":", 1)[0] if ":" in spec else spec
    if source.endswith(".py"):
        input_file(source)
    return spec


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N (ROCm GPUs are cuda:N too); default: the first GPU, else cpu")


def check_device_argument(args) -> None:
    """Every command's --device, checked the same way before its handler runs: a device that
    is not cpu/cuda/cuda:N, or a GPU torch cannot see, raises ValueError ("device: ..."), which
    cli.main turns into one line and exit 2 (not a traceback from deep inside torch). The name is
    checked without torch (device.device_name, the API's check too); torch is imported only to
    ask whether it sees a GPU that was named."""
    value = getattr(args, "device", None)
    if not isinstance(value, str):
        return
    from ..device import device_name
    name = device_name(value)
    if name.startswith("cuda"):
        from ..checks.plan import normalize_device, validate_device
        validate_device(normalize_device(name))


# --------------------------------------------------------------------------- interruptions
# SLURM ends a job at its time limit with SIGTERM (then SIGKILL after KillWait, 30 s by default);
# a user presses Ctrl-C (SIGINT). Either way the command writes every report it was asked for
# with what ran so far, marked interrupted, kills its worker processes, and exits 128 + the
# signal's number (130 for SIGINT, 143 for SIGTERM), the shell's convention.

INTERRUPTING = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived while a command ran."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum

    def __str__(self) -> str:
        return f"interrupted by {self.signal_name}"


def interruption(exc: BaseException) -> tuple:
    """(signal name, exit code) of an interruption; a bare KeyboardInterrupt is SIGINT's."""
    return getattr(exc, "signal_name", "SIGINT"), getattr(exc, "exit_code", 128 + signal.SIGINT)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While a command runs: SIGTERM and SIGINT kill the child processes at once and raise
    Interrupted in the main thread, where the command writes its partial reports; a second
    signal meanwhile is ignored (the reports are nearly written). Outside the main thread, or
    after the command, the signals act as before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from ..isolate import allow_children, stop_children
    raised = []

    def handler(signum, _frame) -> None:
        stop_children()
        if not raised:
            raised.append(signum)
            raise Interrupted(signum)
    previous = {sig: signal.signal(sig, handler) for sig in INTERRUPTING}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)
        allow_children()


# --------------------------------------------------------------------------- errors in the user's code
# A factory or forward that raises is the user's error, reported as one line with its type and
# the innermost line of the user's code that it passed through; an error raised inside gpuparity
# keeps its traceback (it is ours to fix).

def _folder(path: str) -> str:
    return os.path.join(os.path.realpath(path), "")


_GPUPARITY = _folder(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _library_roots() -> tuple:
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"],
             *getattr(site, "getsitepackages", lambda: [])()}
    return (_GPUPARITY, *(_folder(r) for r in roots if r))


def _is_library(filename: str, roots: tuple) -> bool:
    return filename.startswith("<") or os.path.realpath(filename).startswith(roots)


def user_code_location(exc: BaseException) -> Optional[str]:
    """'file:line, in function' of the innermost frame of `exc`'s traceback in the user's code
    (not gpuparity, the standard library or installed packages), or None when there is none or
    the error was raised inside gpuparity itself."""
    roots = _library_roots()
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename and not _is_library(exc.filename, roots):
        return f"{exc.filename}:{exc.lineno}"
    if not frames or os.path.realpath(frames[-1].filename).startswith(_GPUPARITY):
        return None
    for frame in reversed(frames):
        if not _is_library(frame.filename, roots):
            return f"{frame.filename}:{frame.lineno}, in {frame.name}"
    # A model made only of torch modules (nn.Sequential of nn.Linear) has no line of the user's
    # code: an error raised inside a module that gpuparity called is still the model's (wrong
    # input shapes, dtypes); one raised by a torch function gpuparity called itself is not.
    ours = max(i for i, f in enumerate(frames) if os.path.realpath(f.filename).startswith(_GPUPARITY)) \
        if any(os.path.realpath(f.filename).startswith(_GPUPARITY) for f in frames) else -1
    if any(f.name in ("_call_impl", "_wrapped_call_impl") and f.filename.endswith(os.path.join("nn", "modules", "module.py"))
           for f in frames[ours + 1:]):
        return f"{frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name}, a torch module of the model"
    return None


def reports_user_errors(handler: Callable) -> Callable:
    """Wrap a handler that runs the user's code (a SPEC factory, a model's forward): an error
    raised there ends the command with one line naming its type, message and location, exit 2."""
    @functools.wraps(handler)
    def run(args) -> int:
        try:
            return handler(args)
        except Exception as exc:  # noqa: BLE001 - re-raised unless the user's code raised it
            where = user_code_location(exc)
            if where is None:
                raise
            message = str(exc).strip() or "(no message)"
            print(f"gpuparity {args.command}: error: your code raised {type(exc).__name__}: {message} "
                  f"(at {where})", file=sys.stderr)
            return 2
    return run


def add_shrink(parser) -> None:
    parser.add_argument("--no-shrink", action="store_true",
                        help="do not shrink failures to a minimal case with a standalone repro script")
    parser.add_argument("--repro-dir", metavar="DIR",
                        help="where repro scripts go (default: beside the --json file, else a new temp folder)")


def repro_dir(args) -> str:
    """--repro-dir, else beside the --json file, else a new temp folder (made only when used)."""
    if args.repro_dir:
        return args.repro_dir
    if args.json and args.json != "-":
        return os.path.join(os.path.dirname(os.path.abspath(args.json)), "gpuparity-repros")
    return os.path.join(tempfile.gettempdir(), f"gpuparity-repros-{os.getpid()}")


def add_explore(parser) -> None:
    parser.add_argument("--explore", metavar="SECONDS", type=_positive_seconds, default=None,
                        help="after the level's checks, spend SECONDS more drawing regime-family cases (seeded), "
                             "more where errors came closest to the bound")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_json(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    parser.add_argument("--json", metavar="FILE", default=None, type=output_json,
                        help=f"write {what} as JSON to FILE ('-' for stdout)")


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
