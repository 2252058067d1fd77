"""`gpuparity doctor`: platform, known issues, the battery on every backend, recommendations."""
from __future__ import annotations

import os
import sys
import tempfile
import time

from ._common import (add_device, add_explore, add_json, add_shrink, battery_progress, emit_json, human_console,
                      interruption, output_file, repro_dir, split_list)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="the main job: platform report, known issues, every op and backend vs float64",
        description="Checks every op on every backend of this machine against a float64 reference, forward and "
                    "backward, each check in a crash-isolated worker. Exit code 0: all passed; 1: a check failed, "
                    "crashed or hung, or a known issue was confirmed; 2: bad usage; 130 / 143: interrupted by SIGINT / "
                    "SIGTERM (the reports asked for are still written, marked partial).")
    level = parser.add_mutually_exclusive_group()
    level.add_argument("--quick", dest="level", action="store_const", const="quick", help="the hostile core only (seconds)")
    level.add_argument("--full", dest="level", action="store_const", const="full",
                       help="every case incl. long sequences and extreme inputs (says how long up front)")
    parser.set_defaults(level="default")
    add_device(parser)
    add_json(parser, "the whole report")
    parser.add_argument("--html", metavar="FILE", type=output_file, help="write a self-contained HTML report")
    parser.add_argument("--stream", metavar="FILE", type=output_file, help="append each result as a JSON line as it arrives "
                                                           "(kept even if the run is killed)")
    parser.add_argument("--ops", help="comma-separated ops (default: all)")
    parser.add_argument("--dtype", help="comma-separated dtypes, e.g. bf16,fp32 (default: what the device supports)")
    # --backend is the name `check` uses; --backends stays for existing scripts
    parser.add_argument("--backend", "--backends", dest="backends",
                        help="comma-separated backends (default: all registered)")
    parser.add_argument("--seed", type=int, default=0, help="base seed of the random inputs (reported per check)")
    parser.add_argument("--no-probes", action="store_true", help="evaluate known issues by rule only")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per check before it counts as a hang")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run; checks left when it is spent are NOT_RUN (exit 1), "
                             "and the reports are still written")
    add_explore(parser)
    add_shrink(parser)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    # torch comes in with these: `gpuparity doctor --help` and a bad usage import none of them
    from ..checks.results import Status, ran_count, read_stream
    from ..doctor import DoctorOptions, estimate, partial_report, run_doctor
    from ..report.terminal import PlainProgress, render_doctor, render_results
    con = human_console(args)
    stream = args.stream or os.path.join(tempfile.mkdtemp(prefix="gpuparity-"), "results.jsonl")
    options = DoctorOptions(level=args.level, device=args.device, ops=split_list(args.ops),
                            dtypes=split_list(args.dtype), backends=split_list(args.backends), seed=args.seed,
                            probes=not args.no_probes, stream_path=stream, timeout=args.timeout,
                            budget=args.budget, explore=args.explore, shrink=not args.no_shrink,
                            repro_dir=repro_dir(args))
    plan = estimate(options)
    minutes = plan["seconds"] / 60
    con.print(f"gpuparity doctor: {plan['checks']} checks ({plan['skipped']} cannot run here), "
              f"about {plan['seconds']:.0f} s" + (f" (~{minutes:.0f} min)" if minutes >= 2 else "")
              + f"; results stream to {stream}")
    started = time.monotonic()
    try:
        total = plan["checks"]   # progress counts the checks that run, as the line above does (not the skips)
        with battery_progress(con, total) as bar, PlainProgress(sys.stderr, "doctor", total,
                                                                enabled=not con.is_terminal, also=bar) as progress:
            report = run_doctor(options, progress=progress)
    except (ValueError, TypeError):
        raise
    except BaseException as exc:
        # No data is lost: whatever was measured is in the stream; every report asked for is
        # written from it, marked partial. SIGINT/SIGTERM exit 128 + the signal (130, 143).
        kept = list(read_stream(stream)) if os.path.exists(stream) else []
        signal_name, code = interruption(exc) if isinstance(exc, KeyboardInterrupt) else (None, 1)
        report = partial_report(options, kept, error=str(exc) if signal_name else f"{type(exc).__name__}: {exc}",
                                exit_code=code, interrupted=signal_name, duration_s=time.monotonic() - started)
        render_results(con, kept)
        # a planned check a backend declined when its turn came is a SKIP in the stream, beside the
        # plan's own skips: it did not run, but it is not missing either
        late = max(0, sum(1 for r in kept if r.status == Status.SKIP) - plan["skipped"])
        more = f", {late} more skipped when their turn came" if late else ""
        con.print(f"[bold red]doctor stopped: {report['error']}[/]; {ran_count(kept)} of {plan['checks']} checks "
                  f"ran{more}, their results kept in {stream} (exit {code})")
        _write_reports(con, args, report)
        if isinstance(exc, (SystemExit, GeneratorExit)):
            raise
        return code
    render_doctor(con, report)
    _write_reports(con, args, report)
    return report["exit_code"]


def _write_reports(con, args, report) -> None:
    if args.json:
        emit_json(con, args.json, report)
    if args.html:
        from ..report.files import write_text
        from ..report.html import render_doctor_html
        write_text(args.html, render_doctor_html(report))
        con.print(f"[dim]wrote {args.html}[/]")
