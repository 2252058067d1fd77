"""`gpuparity --help`, `--version` and a bare `gpuparity` import no command module and no torch
(seconds on a loaded machine; they must answer at once), and the one-line help they show is what
each command registers."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gpuparity import cli


def _imported(args):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuparity", *args], capture_output=True,
                          text=True, timeout=120)
    names = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return proc, names


@pytest.mark.parametrize("args,code", [(["--version"], 0), (["--help"], 0), ([], 2)])
def test_help_and_version_import_no_torch(args, code):
    proc, names = _imported(args)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "gpuparity.cli" in names  # the importtime listing is there to be read
    heavy = [n for n in names if n.split(".")[0] == "torch" or n.startswith("gpuparity.commands")]
    assert not heavy, f"gpuparity {' '.join(args)} imported {heavy[:5]}"
    out = proc.stdout
    if args == ["--version"]:
        assert out.strip() == f"gpuparity {cli.__version__}"
    else:
        for name, help_line in cli.SUMMARY.values():
            assert name in out and help_line.split()[0] in out


def test_the_summary_matches_what_each_command_registers():
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    registered = [(action.dest, action.help) for action in subs._choices_actions]
    assert registered == list(cli.SUMMARY.values())
    light = next(a for a in cli.build_parser(commands=())._actions if isinstance(a, argparse._SubParsersAction))
    assert [(action.dest, action.help) for action in light._choices_actions] == registered
