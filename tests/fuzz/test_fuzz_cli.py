"""Property-based tests of the command line: random argv from the real subcommands and options
plus junk values. Every run exits 0, 1 or 2 and no traceback reaches the user. Runs in-process
(gpuparity.cli.main); argv that would start long work (a battery, probes, training, a profile)
is only parsed, which is where bad values must be caught."""
from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuparity import cli

JUNK = ["-", "", "0", "-1", "1e999", "nan", "x", "é", "a,b,,", "/proc/gpuparity-x.json", ".", "missing.json",
        "fp8", "cuda:99", "torch", "bf16", "--", "no_module:factory", "x.py:f", "1-00:00:00", "0:0"]

# A command runs for real only when argv carries one of these (or the command is always quick).
QUICK_WHEN = {"check": "--signature", "known-issues": "--no-probes", "template": None, "cache": None, "env": None}
QUICK_SUB = {("trace", "compare"), ("trace", "replay"), ("profile", "compare"), ("workload", "compare")}


def _parsers():
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = {}
    for name, sub in subs.choices.items():
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            for inner, inner_parser in nested[0].choices.items():
                found[(name, inner)] = inner_parser
        else:
            found[(name,)] = sub
    return found


PARSERS = _parsers()


def _options(parser):
    options, choices = [], {}
    for action in parser._actions:
        for flag in action.option_strings:
            options.append(flag)
            if action.choices:
                choices[flag] = [str(c) for c in action.choices]
    return options, choices


@st.composite
def argv(draw):
    path = draw(st.sampled_from(sorted(PARSERS)))
    options, choices = _options(PARSERS[path])
    tokens = list(path)
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.integers(0, 3))
        if kind == 0 and options:
            flag = draw(st.sampled_from(options))
            tokens.append(flag)
            if flag in choices and draw(st.booleans()):
                tokens.append(draw(st.sampled_from(choices[flag])))
        elif kind == 1:
            tokens.append(draw(st.sampled_from(JUNK)))
        elif kind == 2:
            tokens.append(draw(st.text(alphabet="-abcxyz0123456789.:/,=", max_size=8)))
        else:
            tokens.extend(["--", "python", "x.py"])
    return tokens


def _quick(tokens) -> bool:
    if "-h" in tokens or "--help" in tokens:
        return True
    if tuple(tokens[:2]) in QUICK_SUB:
        return True
    if tokens[0] in QUICK_WHEN:
        guard = QUICK_WHEN[tokens[0]]
        return guard is None or guard in tokens
    return False


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # junk paths that are valid outputs land here
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path / "cache"))


@given(argv())
def test_every_argv_exits_0_1_or_2_without_a_traceback(capsys, tokens):
    try:
        if _quick(tokens):
            code = cli.main(tokens)
        else:
            cli.build_parser().parse_args(tokens)
            code = 0  # parsed: the work it would start is covered by the commands' own tests
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    captured = capsys.readouterr()
    assert code in (0, 1, 2), (tokens, code, captured.err[-2000:])
    assert "Traceback" not in captured.err + captured.out, (tokens, captured.err[-2000:])
