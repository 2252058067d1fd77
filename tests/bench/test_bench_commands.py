"""The shared part of `gpuparity bench NAME`: a new bench is one `Bench` entry whose run returns
a BenchResult; the table, the files and the exit code come from run_and_show."""
from __future__ import annotations

import argparse
import json

from gpuparity.bench.common import BenchResult, BenchRow
from gpuparity.commands import bench as bench_command


def _fake_bench(status: str) -> bench_command.Bench:
    def add_arguments(parser):
        parser.add_argument("--json", dest="json_path")
        parser.add_argument("--md", dest="markdown_path")
        parser.add_argument("--plot", dest="plot_path")

    def run(args):
        if args.json_path == "bad":
            raise bench_command.BenchUsageError("--json: got 'bad'")
        rows = [BenchRow("model", "tiny", "eager", "fp32", "fwd", time_ms=1.0, gbps=2.0, status=status,
                         reason="" if status == "ok" else "it raised")]
        return BenchResult("model", rows, {"schema_version": 1, "command": "gpuparity bench model"}, ["eager"],
                           "a model")
    return bench_command.Bench("model", "a model, end to end", add_arguments, run)


def _parse(bench, argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def test_a_registered_bench_gets_the_table_files_and_exit_code(tmp_path, capsys):
    bench = _fake_bench("ok")
    out, md = tmp_path / "m.json", tmp_path / "m.md"
    assert bench_command.run_and_show(bench, _parse(bench, ["--json", str(out), "--md", str(md)])) == 0
    assert "a model" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"][0]["shape"] == "tiny"
    assert "| tiny | fwd | 2 (1.000) |" in md.read_text()


def test_a_backend_that_raised_exits_1_and_a_usage_error_exits_2(capsys):
    bench = _fake_bench("error")
    assert bench_command.run_and_show(bench, _parse(bench, [])) == 1
    assert bench_command.run_and_show(bench, _parse(bench, ["--json", "bad"])) == 2
    assert "gpuparity bench model: --json: got 'bad'" in capsys.readouterr().err


def test_every_bench_is_a_subcommand():
    parser = argparse.ArgumentParser()
    bench_command.register(parser.add_subparsers(dest="command"))
    for bench in bench_command.BENCHES:
        args = parser.parse_args(["bench", bench.name])
        assert args.bench == bench.name and args.json_path is None and args.plot_path is None
