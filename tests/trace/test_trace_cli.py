"""gpuparity trace record / compare / replay from the command line: exit codes and files."""
from __future__ import annotations

import json
import os
import sys

import pytest

from gpuparity import cli

SPEC = os.path.join(os.path.dirname(__file__), "trace_models.py") + ":factory"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-traces")
    paths = {name: str(root / name) for name in ("good", "bad", "other")}
    assert cli.main(["trace", "record", SPEC, "--out", paths["good"], "--device", "cpu"]) == 0
    assert cli.main(["trace", "record", SPEC, "--out", paths["bad"], "--device", "cpu",
                     "--factory-arg", "bug=forward"]) == 0
    assert cli.main(["trace", "record", SPEC, "--out", paths["other"], "--device", "cpu",
                     "--factory-arg", "weights_seed=9"]) == 0
    return paths


def test_compare_exit_codes_and_reports(recorded, tmp_path, capsys):
    assert cli.main(["trace", "compare", recorded["good"], recorded["good"]]) == 0
    out_json, out_html, out_png = (str(tmp_path / f) for f in ("c.json", "c.html", "c.png"))
    code = cli.main(["trace", "compare", recorded["good"], recorded["bad"], "--json", out_json,
                     "--html", out_html, "--plot", out_png])
    assert code == 1
    text = capsys.readouterr().out
    assert "blocks.2.act" in text and "DIVERGES" in text
    data = json.load(open(out_json))
    assert data["schema_version"] == 1 and data["first_forward"]["key"] == "blocks.2.act"
    assert "<svg" in open(out_html).read()
    assert os.path.getsize(out_png) > 1000


def test_compare_refuses_different_models(recorded, capsys):
    assert cli.main(["trace", "compare", recorded["good"], recorded["other"]]) == 2
    assert "different weights" in capsys.readouterr().err


def test_replay_exit_codes(recorded, capsys):
    assert cli.main(["trace", "replay", recorded["good"], "--device", "cpu"]) == 0
    capsys.readouterr()
    assert cli.main(["trace", "replay", recorded["bad"], "--device", "cpu", "--factory-arg", "bug=none"]) == 1
    assert "blocks.2.act" in capsys.readouterr().out


def test_replay_writes_html_and_plot_and_refuses_an_unreadable_trace(recorded, tmp_path, capsys):
    out_html, out_png = str(tmp_path / "r.html"), str(tmp_path / "r.png")
    assert cli.main(["trace", "replay", recorded["bad"], "--device", "cpu", "--factory-arg", "bug=none",
                     "--html", out_html, "--plot", out_png]) == 1
    assert "a module's own computation differs" in open(out_html).read()
    assert os.path.getsize(out_png) > 1000 and f"wrote {out_png}" in capsys.readouterr().out
    assert cli.main(["trace", "replay", str(tmp_path), "--device", "cpu"]) == 2
    assert "gpuparity trace replay: error:" in capsys.readouterr().err


def test_bad_spec_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["trace", "record", "no_such_module_xyz:factory", "--out", str(tmp_path / "t")]) == 2
    assert "cannot import" in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_clear_usage_error(recorded, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["trace", "compare", recorded["good"], recorded["good"], "--plot", "x.png"]) == 2
    assert "needs matplotlib" in capsys.readouterr().err
