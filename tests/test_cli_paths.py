"""Paths are checked while the arguments are parsed: a bad output or input path ends the command
with exit 2 and one line naming the argument, before any battery, probe or training runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuparity import cli
from gpuparity.commands import _common

UNWRITABLE = "/proc/gpuparity-x.json"  # /proc takes no new files, even for root


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Any handler that runs fails the test: the path check must come first."""
    def refuse(args):
        raise AssertionError(f"the {args.command} handler ran despite a bad path")
    real = cli.build_parser

    def build(commands=None):
        parser = real(commands)
        for action in parser._subparsers._group_actions:
            for sub in action.choices.values():
                _refuse_everywhere(sub, refuse)
        return parser
    monkeypatch.setattr(cli, "build_parser", build)


def _refuse_everywhere(parser, refuse):
    if parser.get_default("handler") is not None:
        parser.set_defaults(handler=refuse)
    for action in parser._actions:
        if getattr(action, "choices", None) and isinstance(action.choices, dict):
            for sub in action.choices.values():
                _refuse_everywhere(sub, refuse)


def _usage_error(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def env_json(tmp_path):
    path = tmp_path / "env.json"
    path.write_text('{"schema_version": 1}')
    return str(path)


def _cases(tmp):
    directory = str(tmp)
    missing = str(tmp / "missing.json")
    trace_dir = str(tmp / "not-a-trace")
    os.makedirs(trace_dir, exist_ok=True)
    return [
        (["env", "--json", directory], "--json", "is a directory"),
        (["env", "--json", UNWRITABLE], "--json", "cannot write"),
        (["check", "--op", "rms_norm", "--json", directory], "--json", "is a directory"),
        (["check", "--op", "rms_norm", "--json", UNWRITABLE], "--json", "cannot write"),
        (["doctor", "--json", UNWRITABLE], "--json", "cannot write"),
        (["doctor", "--html", directory], "--html", "is a directory"),
        (["doctor", "--stream", UNWRITABLE], "--stream", "cannot write"),
        (["known-issues", "--platform", missing], "--platform", "does not exist"),
        (["known-issues", "--platform", directory], "--platform", "is a directory"),
        (["known-issues", "--json", directory], "--json", "is a directory"),
        (["trace", "compare", str(tmp / "nope"), str(tmp / "nope")], "A", "does not exist"),
        (["trace", "replay", trace_dir], "A", "no trace.json"),
        (["trace", "record", str(tmp / "model.py") + ":factory", "--out", str(tmp / "t")], "SPEC", "does not exist"),
        (["trace", "record", "pkg:factory", "--out", env_json_path(tmp)], "--out", "existing file"),
        (["profile", "compare", missing, missing], "a.json", "does not exist"),
        (["profile", "kernels", "--json", directory, "--", "python", "x.py"], "--json", "is a directory"),
        (["template", "slurm", "--nodes", "1", "--gpus-per-node", "1", "--vendor", "amd", "--out", directory,
          "--", "python", "t.py"], "--out", "is a directory"),
        (["template", "apptainer", "--vendor", "amd", "--out", UNWRITABLE], "--out", "cannot write"),
        (["template", "slurm", "--nodes", "1", "--gpus-per-node", "1", "--vendor", "amd", "--platform", missing,
          "--", "python", "t.py"], "--platform", "does not exist"),
        (["workload", "compare", missing, missing], "a.json", "does not exist"),
        (["compile-check", "pkg:factory", "--json", UNWRITABLE], "--json", "cannot write"),
        (["model", "pkg:factory", "--html", directory], "--html", "is a directory"),
        (["model", str(tmp / "model.py") + ":factory"], "SPEC", "does not exist"),
    ]


def env_json_path(tmp):
    path = tmp / "a-file"
    path.write_text("x")
    return str(path)


def test_every_bad_path_is_one_line_naming_the_argument(tmp_path, capsys):
    for argv, argument, why in _cases(tmp_path):
        line = _usage_error(argv, capsys)
        assert f"argument {argument}" in line and why in line, (argv, line)


def test_unwritable_json_names_no_temp_file(capsys):
    line = _usage_error(["doctor", "--json", UNWRITABLE], capsys)
    assert line.startswith("gpuparity doctor: error: argument --json: cannot write /proc/gpuparity-x.json")
    assert "tmp" not in line and "gpuparity-write-check" not in line


def test_good_paths_pass_and_leave_nothing_behind(tmp_path):
    target = tmp_path / "new" / "report.json"
    assert _common.output_json(str(target)) == str(target)
    assert _common.output_json("-") == "-"
    assert os.listdir(tmp_path) == []  # the write probe is removed, no folder is made early
    existing = tmp_path / "old.json"
    existing.write_text("keep")
    _common.output_file(str(existing))
    assert existing.read_text() == "keep"


def test_check_happens_before_work_in_a_real_process(tmp_path):
    # No monkeypatching here: the installed entry point stops at parse time, well under a second
    # of work (the doctor's battery would take tens of seconds).
    proc = subprocess.run([sys.executable, "-m", "gpuparity", "doctor", "--json", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"gpuparity doctor: error: argument --json: {tmp_path} is a directory; expected a file to write")
    assert "checks (" not in proc.stdout
