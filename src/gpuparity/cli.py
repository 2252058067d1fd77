"""The command line: parse, call the library, render. Each subcommand lives in
gpuparity/commands/<name>.py and exposes `register(subparsers)`, which adds its parser and
sets `handler(args) -> exit code`. Exit codes: 0 all passed, 1 a check failed or crashed,
2 bad usage or input, 130 / 143 interrupted by SIGINT / SIGTERM (128 + the signal)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional, Sequence

from . import __version__

# The one list of subcommands (module name -> command name, one-line help), in the order
# `gpuparity --help` shows them. The help is here so that `gpuparity --help`, `--version` and a
# bare `gpuparity` import no command module (several import torch: seconds on a loaded machine);
# tests/test_cli_startup.py checks that it matches what each module registers.
SUMMARY = {
    "doctor": ("doctor", "the main job: platform report, known issues, every op and backend vs float64"),
    "env": ("env", "what machine is this: vendor, build, devices, libraries, numerics flags"),
    "known_issues": ("known-issues", "match this machine against the base of known backend bugs"),
    "check": ("check", "one op's battery on its backends, or on your implementation (--impl)"),
    "bench": ("bench", "benchmark backends side by side (GPU)"),
    "trace": ("trace", "record, compare and replay per-module activations to find where two machines diverge"),
    "model": ("model", "run a model on the device and in float64 on the CPU; name the module that diverges"),
    "compile_check": ("compile-check", "check torch.compile backends for a model against a float64 run"),
    "workload": ("workload", "train reference workloads (aam, cnn) and check that two runs agree"),
    "fleet": ("fleet", "health check of every GPU of a job (run under torchrun or srun)"),
    "template": ("template", "write a SLURM job script or an Apptainer definition"),
    "profile": ("profile", "memory by phase, top kernels, and two machines' kernel profiles side by side"),
    "cache": ("cache", "show or clear the probe cache behind backend='auto'"),
    "explain": ("explain", "which backend and kernel each attention / norm / rotary call of a model ran"),
}
COMMANDS = tuple(SUMMARY)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad arguments or input: exit code 2 with the message."""


def build_parser(commands: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The full parser; `commands`: import and register only these command modules (names as in
    COMMANDS), the others being listed with their one-line help and nothing else."""
    parser = argparse.ArgumentParser(
        prog="gpuparity",
        description="Same answers, fast, on CUDA, ROCm and CPU; and where and why they differ.")
    parser.add_argument("--version", action="version", version=f"gpuparity {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if commands is not None and name not in commands:
            subparsers.add_parser(SUMMARY[name][0], help=SUMMARY[name][1])
            continue
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
    words = sys.argv[1:] if argv is None else argv
    # Only the command named is imported (none for --help, --version, nothing or a typo), and
    # command modules import torch only in their handlers: `gpuparity doctor --help` and a bad
    # usage answer at once (tests/test_cli_startup.py)
    named = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(commands=tuple(module for module, (name, _) in SUMMARY.items() if name == named))
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
        from .commands._common import check_device_argument, interruptible
        check_device_argument(args)  # one check for every command's --device, before any work
        with interruptible():  # SIGTERM/SIGINT: partial reports, no worker left, exit 128 + signal
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
    except KeyboardInterrupt as exc:
        # commands that write reports catch it themselves (and return the same code)
        print(f"gpuparity {args.command}: interrupted by {getattr(exc, 'signal_name', 'SIGINT')}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (e.g. captured in tests): nothing will flush to the pipe


if __name__ == "__main__":
    sys.exit(main())
