"""`gpuparity check --op OP [--impl module:fn]`: one op's whole battery, on its backends or on
a user's implementation."""
from __future__ import annotations

import sys
import time

from .. import platform
from ..contracts import OPS
from ._common import (add_device, add_explore, add_json, add_shrink, battery_progress, emit_json, human_console,
                      interruption, repro_dir, split_list)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "check", help="one op's battery on its backends, or on your implementation (--impl)",
        description="Runs every case of one op against float64, forward and backward, crash-isolated. "
                    "--impl module:function (or path/to/file.py:function) checks your own implementation, "
                    "which must have the op's public signature (see --signature). A failed check is "
                    "listed with the command that reruns exactly it (--case, --seed, --level).")
    parser.add_argument("--op", required=True, choices=OPS)
    parser.add_argument("--impl", help="your implementation: package.module:function or file.py:function")
    parser.add_argument("--backend", help="comma-separated backends to check (default: all registered)")
    parser.add_argument("--dtype", help="comma-separated dtypes (default: what the device supports)")
    parser.add_argument("--case", help="comma-separated case names to run (default: every case of the level)")
    parser.add_argument("--level", choices=("quick", "default", "full"), default="default")
    parser.add_argument("--seed", type=int, default=0,
                        help="base seed of the random inputs (each check derives its own from it, the op, "
                             "case and dtype)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per check before it counts as a hang")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run; checks left when it is spent are NOT_RUN (exit 1)")
    parser.add_argument("--signature", action="store_true", help="print the signature --impl must have and exit")
    add_explore(parser)
    add_shrink(parser)
    add_device(parser)
    add_json(parser)
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    # torch comes in with these: `gpuparity check --help` and a bad usage import none of them
    from ..api import check as run_check
    from ..checks.results import ran_count, tally
    from ..contracts import get_spec
    from ..report.terminal import PlainProgress, render_failures, render_results, tally_text
    con = human_console(args)
    spec = get_spec(args.op)
    if args.signature:
        con.print(f"{args.op}: {spec.signature}")
        return 0
    kept = []        # every result as it arrives: what an interrupted run reports
    started = time.monotonic()
    interrupted = None
    with battery_progress(con) as bar, PlainProgress(sys.stderr, "check", enabled=not con.is_terminal,
                                                     also=bar) as progress:
        def keep(done, total, result):
            kept.append(result)
            progress(done, total, result)
        try:
            run = run_check(args.op, impl=args.impl, backends=split_list(args.backend),
                            dtypes=split_list(args.dtype), level=args.level, device=args.device, seed=args.seed,
                            progress=keep, timeout=args.timeout, cases=split_list(args.case), budget=args.budget,
                            explore=args.explore, shrink=not args.no_shrink, repro_dir=repro_dir(args))
            results, device, duration, code = run.results, run.device, run.duration_s, 0 if run.ok else 1
            shrunk = [s.to_dict() for s in run.shrunk]
        except KeyboardInterrupt as exc:   # SIGINT, or SIGTERM (cli.interruptible): report what ran
            interrupted, code = interruption(exc)
            results, duration = list(kept), time.monotonic() - started
            device = results[0].device if results else str(args.device or "the default device")
            shrunk = []
    render_results(con, results, title=f"{args.op}: checks against float64")
    render_failures(con, results, timeout=args.timeout, shrunk=shrunk)
    counts = tally(results)
    con.print(f"{tally_text(counts)} in {duration:.1f} s on {device}")
    if interrupted:
        con.print(f"[bold red]interrupted by {interrupted}[/]: {ran_count(results)} checks ran, their results "
                  f"kept; the checks left did not run (exit {code})")
    if args.json:
        data = {"schema_version": 1, "kind": "check", "op": args.op, "impl": args.impl,
                "platform": platform.collect(), "level": args.level, "device": device, "seed": args.seed,
                "budget": args.budget, "partial": interrupted is not None, "interrupted": interrupted,
                "exit_code": code, "tally": counts, "results": [r.to_dict() for r in results],
                "explore": args.explore, "shrunk": shrunk}
        emit_json(con, args.json, data)
    return code
