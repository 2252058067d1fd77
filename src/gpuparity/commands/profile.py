"""`gpuparity profile memory|kernels|compare`: memory by phase and top kernels of a training
script run in this process, and two kernel profiles side by side."""
from __future__ import annotations

import argparse
import json
import sys

from ._common import console, input_file, output_json

SCRIPT_HELP = ("the script to profile, after --: -- python train.py ARGS or -- python -m pkg.train ARGS "
               "(it runs in this process)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile", help="memory by phase, top kernels, and two machines' kernel profiles side by side",
        description="Run a training script under a profiler in this process. In the script, "
                    "gpuparity.profile.phase('name') names memory phases and gpuparity.profile.step() marks the end "
                    "of a training step; both do nothing when no profiler runs.")
    sub = parser.add_subparsers(dest="profile_kind", metavar="KIND")

    memory = sub.add_parser(
        "memory", help="peak and current memory per phase of a script",
        description="Phases: 'script' (all of it), automatic forward / backward / optimizer step / to(device), and "
                    "any gpuparity.profile.phase('name') in the script. GPU: torch's allocated and reserved bytes; "
                    "APU: also the host's available memory; CPU: the process RSS.")
    memory.add_argument("--json", metavar="FILE", type=output_json, help="write the profile as JSON ('-' for stdout)")
    memory.add_argument("--device", help="the device to watch (default: the current GPU, else cpu)")
    memory.add_argument("--no-auto", action="store_true",
                        help="no automatic phases (global module/optimizer hooks, Tensor.backward wrapper)")
    memory.add_argument("script", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ...", help=SCRIPT_HELP)
    memory.set_defaults(handler=handle_memory)

    kernels = sub.add_parser(
        "kernels", help="top kernels by device time over N steps of a script",
        description="torch.profiler over --steps steps after --warmup steps. A step ends at each "
                    "gpuparity.profile.step() call, or, if the script never calls it, at each optimizer.step().")
    kernels.add_argument("--steps", type=int, default=10, help="steps to record (default 10)")
    kernels.add_argument("--warmup", type=int, default=1,
                         help="steps to skip first (default 1; 0 records from the start)")
    kernels.add_argument("--top", type=int, default=20, help="kernels to show (default 20)")
    kernels.add_argument("--json", metavar="FILE", type=output_json, help="write the profile as JSON ('-' for stdout)")
    kernels.add_argument("--device", help="the device to profile (default: the current GPU, else cpu)")
    kernels.add_argument("script", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ...", help=SCRIPT_HELP)
    kernels.set_defaults(handler=handle_kernels)

    compare = sub.add_parser("compare", help="two kernel profiles side by side, ops matched by name",
                             description="e.g. the same script on CUDA (a.json) and ROCm (b.json).")
    compare.add_argument("a", metavar="a.json", type=input_file)
    compare.add_argument("b", metavar="b.json", type=input_file)
    compare.add_argument("--top", type=int, default=25, help="ops to show (default 25)")
    compare.add_argument("--json", metavar="FILE", type=output_json, help="write the comparison as JSON ('-' for stdout)")
    compare.set_defaults(handler=handle_compare)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def _write(path, data) -> None:
    if not path:
        return
    if path == "-":
        print(json.dumps(data, indent=1, default=str))
        return
    from ..report.files import write_json
    write_json(path, data)
    console(stderr=True).print(f"wrote {path}")


def _script_failed(outcome) -> int:
    if outcome.error:
        sys.stderr.write(f"gpuparity profile: the script failed:\n{outcome.error}\n")
    if outcome.exit_code:
        console(stderr=True).print(f"[red]the script exited with {outcome.exit_code}[/]; the profile covers "
                                   "what ran before that")
        return 1
    return 0


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def render_memory(con, report) -> None:
    from rich.table import Table
    from ..profile.memory import phase_rows
    on_gpu = report["device"]["device"].startswith("cuda")
    apu = report["device"].get("is_apu")
    table = Table(title=f"Memory by phase on {report['device']['device']} ({report['device'].get('name')}); "
                        f"{report['measures']}", title_justify="left")
    columns = ["phase", "calls", "time s"]
    columns += ["peak allocated MiB", "peak reserved MiB", "allocated MiB", "delta MiB"] if on_gpu else \
        ["peak RSS MiB", "RSS MiB", "delta MiB"]
    if apu:
        columns += ["peak host RSS MiB", "host available MiB"]
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in phase_rows(report):
        table.add_row(*row)
    con.print(table)
    total = report["device"].get("total_bytes")
    util = report.get("utilisation")
    con.print(f"device total {_mib(total)} MiB" + (f"; peak {'reserved' if on_gpu else 'RSS'} "
                                                   f"{util:.1%} of it" if util is not None else "")
              + ("; APU: device and host share this memory" if apu else ""))
    if not report.get("host_peak_per_phase") and not on_gpu:
        con.print("[dim]the RSS peak could not be reset between phases: each peak is since the process started[/]")


def handle_memory(args) -> int:
    from ..profile import MemoryProfiler
    from ..profile.script import parse_command, run_python
    parse_command(args.script)  # bad usage before anything runs
    with MemoryProfiler(args.device, auto_phases=not args.no_auto) as prof:
        with prof.phase("script"):
            outcome = run_python(args.script)
    report = prof.report()
    report["command"] = " ".join(args.script)
    report["script_exit_code"] = outcome.exit_code
    if args.json != "-":
        render_memory(console(), report)
    _write(args.json, report)
    return _script_failed(outcome)


def render_kernels(con, report) -> None:
    from rich.table import Table
    if report.get("error"):
        con.print(f"[red]{report['error']}[/]")
        return
    what = "kernels by device time" if report["time_basis"] == "device" else "ops by self CPU time"
    table = Table(title=f"Top {what}: {report['steps_profiled']} step(s) after {report['warmup']} warmup "
                        f"(steps counted at {report['step_source']}), {report['device']}", title_justify="left")
    for column, justify in (("name", "left"), ("calls/step", "right"), ("time/step", "right"), ("share", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    steps = max(1, report["steps_profiled"])
    for entry in report["top"]:
        table.add_row(entry["name"][:120], f"{entry['calls'] / steps:.3g}", f"{entry['time_per_step_us'] / 1e3:.3f} ms",
                      f"{entry['share']:.1%}")
    con.print(table)
    con.print(f"total {report['total_time_per_step_us'] / 1e3:.3f} ms per step ({report['time_basis']} time)")


def handle_kernels(args) -> int:
    from ..profile import KernelProfiler
    from ..profile.script import parse_command, run_python
    parse_command(args.script)
    if args.top < 1:
        raise ValueError(f"top: expected an integer >= 1, got {args.top}")
    with KernelProfiler(steps=args.steps, warmup=args.warmup, device=args.device) as prof:
        outcome = run_python(args.script)
    report = prof.report(top=args.top)
    report["command"] = " ".join(args.script)
    report["script_exit_code"] = outcome.exit_code
    if args.json != "-":
        render_kernels(console(), report)
    _write(args.json, report)
    failed = _script_failed(outcome)
    return 1 if report.get("error") else failed


def handle_compare(args) -> int:
    from rich.table import Table
    from ..profile import compare_profiles
    from ..report.files import read_json
    result = compare_profiles(read_json(args.a, "a"), read_json(args.b, "b"), top=args.top)
    if args.json != "-":
        con = console()
        basis = "device" if result["time_basis"] == "device" else "self CPU"
        table = Table(title=f"Ops by {basis} time per step: a = {result['a']['machine']} | b = {result['b']['machine']}",
                      title_justify="left")
        for column in ("op", "a ms/step", "a share", "b ms/step", "b share", "b / a"):
            table.add_column(column, justify="left" if column == "op" else "right", overflow="fold")

        def ms(value):
            return "-" if value is None else f"{value / 1e3:.3f}"

        def pct(value):
            return "-" if value is None else f"{value:.1%}"
        for row in result["ops"]:
            ratio = row["ratio_b_over_a"]
            ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
            if ratio is not None and (ratio > 1.5 or ratio < 1 / 1.5):
                ratio_text = f"[bold yellow]{ratio_text}[/]"
            table.add_row(row["name"][:90], ms(row["a_time_per_step_us"]), pct(row["a_share"]),
                          ms(row["b_time_per_step_us"]), pct(row["b_share"]), ratio_text)
        con.print(table)
        total = result["ratio_total_b_over_a"]
        con.print(f"total per step: a {ms(result['a']['total_per_step_us'])} ms, b {ms(result['b']['total_per_step_us'])} ms"
                  + (f" (b / a = {total:.2f}x)" if total else ""))
    _write(args.json, result)
    return 0
