"""`gpuparity workload run|compare`: train a reference workload and check that two runs agree."""
from __future__ import annotations

import json
import sys

from ..report.files import read_json, write_json
from ._common import console, input_file, output_file, output_json


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "workload", help="train reference workloads (aam, cnn) and check that two runs agree",
        description="Train a reference workload with seeded data and weights (identical on every machine) and "
                    "compare two runs: final metrics within 5% and loss curves that track.")
    sub = parser.add_subparsers(dest="workload_command", metavar="ACTION")

    run = sub.add_parser("run", help="train a workload and write its run record")
    run.add_argument("workload", choices=("aam", "cnn"),
                     help="aam: user story 1's masked sequence transformer; cnn: user story 2's conv net (isolated)")
    run.add_argument("--attn", default=None, help="aam: the gpuparity.attention backend (default: auto)")
    run.add_argument("--steps", type=int, default=None, help="training steps (default: 300 full / 30 small for aam)")
    run.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the first GPU, else cpu)")
    run.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (autocast; fp32 weights)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--size", choices=("small", "full"), default=None,
                     help="full: user story 1's shape (default on a GPU); small: CPU-sized (default on the CPU)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a data or model setting, e.g. --set sets=8 (repeatable)")
    isolation = run.add_mutually_exclusive_group()
    isolation.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                           help="train in a separate process, so a crash becomes a result (default for cnn)")
    isolation.add_argument("--no-isolate", dest="isolate", action="store_false")
    run.add_argument("--timeout", type=float, default=1800.0, help="seconds before an isolated run counts as hung")
    run.add_argument("--out", required=True, metavar="run.json", type=output_file, help="where to write the run record")
    run.set_defaults(handler=handle_run)

    compare = sub.add_parser("compare", help="do two runs agree? (final metrics within 5%%, loss curves track)")
    compare.add_argument("a", metavar="a.json", type=input_file)
    compare.add_argument("b", metavar="b.json", type=input_file)
    compare.add_argument("--plot", metavar="FILE.png", type=output_file, help="plot both loss curves and final metrics (needs matplotlib)")
    compare.add_argument("--json", metavar="FILE", type=output_json, help="write the comparison as JSON ('-' for stdout)")
    compare.set_defaults(handler=handle_compare)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def handle_run(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from ..trace.spec import default_device, parse_factory_args
    from ..workloads import run
    device = args.device or default_device()
    overrides = parse_factory_args(args.set) if args.set else None
    con = console()
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=con, transient=True,
                        disable=not con.is_terminal)
    with progress:
        task = progress.add_task(f"{args.workload} on {device}", total=args.steps, last="")

        def update(done, total, metrics):
            progress.update(task, completed=done, total=total, last=f"loss {metrics['loss']:.4f}")
        record = run(args.workload, attn=args.attn, steps=args.steps, device=device, dtype=args.dtype,
                     seed=args.seed, size=args.size, overrides=overrides, isolate=args.isolate,
                     timeout=args.timeout, progress=update)
    write_json(args.out, record)
    final = ", ".join(f"{k} {v:.4g}" for k, v in record["final"].items())
    step = record.get("step_time_ms_median")
    if record["status"] == "ok":
        con.print(f"{args.workload} ({record['size']}{attn_text(record.get('attn'))}) on {device} {record['dtype']}: "
                  f"{record['steps']} steps, {step:.1f} ms/step; final {final}")
    else:
        con.print(f"[bold red]{args.workload} on {device}: {record['status']}[/]: {record['error']}")
        if record.get("stderr_tail"):
            con.print(f"[dim]{record['stderr_tail']}[/]")
    con.print(f"[dim]wrote {args.out}[/]")
    return 0 if record["status"] == "ok" else 1


def attn_text(attn) -> str:
    """", attn=BACKEND" for the run line; auto says that dispatch chose per call; nothing for a
    workload without attention (cnn)."""
    if attn is None:
        return ""
    return f", attn={'auto (resolved per call)' if attn == 'auto' else attn}"


def handle_compare(args) -> int:
    from ..report import plots
    from ..report.trace_report import render_workload_comparison
    from ..workloads import compare_runs
    if args.plot:
        try:
            plots.require_matplotlib()
        except plots.PlotUnavailable as exc:
            print(f"gpuparity workload compare: error: {exc}", file=sys.stderr)
            return 2
    a, b = read_json(args.a, "a.json"), read_json(args.b, "b.json")
    for path, run in ((args.a, a), (args.b, b)):
        if run.get("kind") != "gpuparity-workload-run":
            raise ValueError(f"{path}: not a `gpuparity workload run` record (kind={run.get('kind')!r})")
    result = compare_runs(a, b)
    data = result.to_dict()
    con = console()
    if args.json == "-":
        print(json.dumps(data, indent=1, default=str))
    else:
        render_workload_comparison(con, data)
        if args.json:
            write_json(args.json, data)
            con.print(f"[dim]wrote {args.json}[/]")
    if args.plot:
        plots.loss_curves_png(a, b, dict(data, smoothed_a=result.smoothed_a, smoothed_b=result.smoothed_b,
                                         warmup=result.warmup), args.plot)
        if args.json != "-":
            con.print(f"[dim]wrote {args.plot}[/]")
    return 0 if result.passed else 1
