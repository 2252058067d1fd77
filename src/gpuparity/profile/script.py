"""Run a user's Python script in this process (as `python SCRIPT ...` or `python -m MODULE ...`
would), so that a profiler set up around it sees everything it does."""
from __future__ import annotations

import dataclasses
import os
import re
import runpy
import sys
import traceback
from typing import List, Optional, Sequence

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclasses.dataclass
class ScriptOutcome:
    exit_code: int                 # what the script's own process would have exited with
    error: Optional[str] = None    # the uncaught exception, with its traceback


def parse_command(command: Sequence[str]) -> List[str]:
    """['python', 'train.py', ...] or ['train.py', ...] -> ['train.py', ...];
    ['python', '-m', 'pkg', ...] -> ['-m', 'pkg', ...]."""
    command = list(command)
    if command[:1] == ["--"]:
        command = command[1:]
    if command and _PYTHON.match(os.path.basename(command[0])):
        command = command[1:]
    if not command:
        raise ValueError("command: expected a Python script to run after --, e.g. -- python train.py")
    if command[0] == "-m":
        if len(command) < 2:
            raise ValueError("command: -m needs a module name, e.g. -- python -m pkg.train")
        return command
    if command[0].startswith("-"):
        raise ValueError(f"command: profiles run `python SCRIPT ...` or `python -m MODULE ...` in this process; "
                         f"python's own option {command[0]!r} is not supported")
    if not os.path.exists(command[0]):
        raise FileNotFoundError(f"command: script {command[0]!r} does not exist")
    return command


def run_python(command: Sequence[str]) -> ScriptOutcome:
    """Run the script with sys.argv and sys.path set as python would; SystemExit and uncaught
    exceptions become the outcome instead of ending this process."""
    args = parse_command(command)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            runpy.run_path(args[0], run_name="__main__")
        return ScriptOutcome(0)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return ScriptOutcome(0)
        if isinstance(code, int):
            return ScriptOutcome(code)
        return ScriptOutcome(1, error=str(code))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the script failed; the profile so far is still worth having
        return ScriptOutcome(1, error="".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:])
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
