"""The command line: parse, call the library, render. Each subcommand lives in
gpuparity/commands/<name>.py and exposes `register(subparsers)`, which adds its parser and
sets `handler(args) -> exit code`. Exit codes: 0 all passed, 1 a check failed or crashed,
2 bad usage or input."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from . import __version__

# The one list of subcommands, in the order `gpuparity --help` shows them.
COMMANDS = ("doctor", "env", "known_issues", "check", "bench", "trace", "model", "compile_check", "workload",
            "fleet", "template", "profile", "cache")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad arguments or input: exit code 2 with the message."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuparity",
        description="Same answers, fast, on CUDA, ROCm and CPU; and where and why they differ.")
    parser.add_argument("--version", action="version", version=f"gpuparity {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module_name = f"gpuparity.commands.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # argparse has printed the usage error (2) or the help (0); callers in-process get the
        # code like every other outcome
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except BrokenPipeError:
        # `gpuparity known-issues | head -1`: the reader stopped reading; that is not a failed
        # check. Point stdout at /dev/null so the interpreter's final flush cannot raise again.
        _silence_stdout()
        return EXIT_OK
    except (UsageError, ValueError, TypeError, FileNotFoundError) as exc:
        print(f"gpuparity {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gpuparity: interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (e.g. captured in tests): nothing will flush to the pipe


if __name__ == "__main__":
    sys.exit(main())
