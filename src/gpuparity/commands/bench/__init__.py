"""`gpuparity bench attention|norm|rope ...`: backends side by side. Each bench is one `Bench` in
BENCHES: its arguments and a run(args) -> BenchResult that calls gpuparity.bench; the table,
--json, --markdown/--md, --plot and the exit code are shared (report/bench_table.py, report/plots.py).
Nothing here imports torch until a bench runs (bench/names.py has the names the parsers list)."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable

from .._common import interruption
from . import attention, norm, rope
from ._args import BenchUsageError


@dataclasses.dataclass(frozen=True)
class Bench:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]   # must add --json/--plot (json_path, plot_path)
    run: Callable[[argparse.Namespace], "BenchResult"]          # and may add markdown_path


# The one list of benches, in the order `gpuparity bench --help` shows them.
BENCHES = (
    Bench("attention", "masked attention: every backend, fwd and fwd+bwd, TFLOP/s, peak memory",
          attention.add_arguments, attention.run),
    Bench("norm", "RMSNorm / LayerNorm: GB/s against the copy bandwidth", norm.add_arguments, norm.run),
    Bench("rope", "rotary embeddings: GB/s, three layouts", rope.add_arguments, rope.run),
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmark backends side by side (GPU)",
                                   description="Benchmarks every available backend of an op side by side. On a CPU "
                                               "the benches run CPU-sized default shapes; each says how many "
                                               "measurements it will take and roughly how long before it starts, "
                                               "and Ctrl-C shows and writes the rows that finished (exit 130).")
    benches = parser.add_subparsers(dest="bench", metavar="BENCH")
    for bench in BENCHES:
        sub = benches.add_parser(bench.name, help=bench.help)
        bench.add_arguments(sub)
        sub.set_defaults(handler=lambda args, bench=bench: run_and_show(bench, args))
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def run_and_show(bench: Bench, args: argparse.Namespace) -> int:
    """Run the bench, print its table, write the files asked for; 1 if a backend raised.
    Interrupted (SIGINT, SIGTERM): the rows that finished are shown and written, marked partial,
    and the exit code is 128 + the signal (130, 143)."""
    try:
        result = bench.run(args)
    except BenchUsageError as exc:
        print(f"gpuparity bench {bench.name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        result = getattr(exc, "partial_result", None)
        if result is None:    # stopped before any measuring began: cli.main says so
            raise
        signal_name, code = interruption(exc)
        _show(result, args)
        print(f"gpuparity bench {bench.name}: interrupted by {signal_name}: {len(result.rows)} rows finished "
              f"(exit {code})", file=sys.stderr)
        return code
    _show(result, args)
    return 1 if result.failed else 0


def _show(result, args: argparse.Namespace) -> None:
    from ...report import bench_table, plots   # import torch: not for `bench --help`
    bench_table.render_terminal(result)
    if args.json_path:
        bench_table.write_result_json(args.json_path, result)
    if getattr(args, "markdown_path", None):
        bench_table.write_markdown(args.markdown_path, result)
    if args.plot_path:
        try:
            plots.bench_png(result, args.plot_path)
        except plots.PlotUnavailable:
            print("gpuparity bench: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
