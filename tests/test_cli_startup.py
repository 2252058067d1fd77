"""`gpuparity --help`, `--version` and a bare `gpuparity` import no command module and no torch
(seconds on a loaded machine; they must answer at once), and the one-line help they show is what
each command registers. Every subcommand's --help and a bad usage import no torch either."""
from __future__ import annotations

import argparse
import json
import os
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


# Every subcommand's --help (nested ones too) and bad usages, run one after the other in one fresh
# process: after each, torch must still be unimported (the first command that imports it is
# named). The command modules are all imported by the walk itself, so this also holds each of
# them to importing no torch at import time.
_WALK = r"""
import argparse, json, os, sys, time
from gpuparity import cli

def walk(parser, words):
    yield words
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, words + [name])

out = os.environ["GPUPARITY_TEST_OUT"]
calls = [words + ["--help"] for words in walk(cli.build_parser(), []) if words]
calls += [["doctor", "--device", "tpu"], ["check"], ["check", "--op", "nope"], ["bench", "attention", "--dtype", "x"],
          ["workload", "run", "aam", "--device", "cuda:x", "--out", os.path.join(out, "r.json")],
          ["doctor", "--quick", "--full"], ["template", "apptainer"]]
report = []
for words in calls:
    started = time.perf_counter()
    try:
        code = cli.main(words)
    except SystemExit as exc:
        code = exc.code
    report.append({"words": words, "code": code, "s": time.perf_counter() - started, "torch": "torch" in sys.modules})
    if "torch" in sys.modules:
        break
print(json.dumps(report))
"""


def test_every_subcommand_help_and_bad_usage_import_no_torch(tmp_path):
    env = {**os.environ, "GPUPARITY_TEST_OUT": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _WALK], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    offenders = [" ".join(r["words"]) for r in report if r["torch"]]
    assert not offenders, f"`gpuparity {offenders[0]}` imported torch"
    helps = [r for r in report if r["words"][-1] == "--help"]
    assert len(helps) > 20 and all(r["code"] == 0 for r in helps)
    assert {" ".join(r["words"]) for r in helps} >= {"doctor --help", "check --help", "bench attention --help",
                                                     "trace record --help", "template apptainer --help"}
    usage = [r for r in report if r["words"][-1] != "--help"]
    assert len(usage) == 7 and all(r["code"] == 2 for r in usage), usage
    # generous: on an idle machine each takes milliseconds (torch alone takes seconds to import)
    slow = [(" ".join(r["words"]), round(r["s"], 2)) for r in report if r["s"] > 2.0]
    assert not slow, slow
