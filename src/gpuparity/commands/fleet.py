"""`gpuparity fleet`: the health check of every GPU of a job, under torchrun or srun."""
from __future__ import annotations

from ._common import console, output_json, split_list

EPILOG = """\
Launch one process per GPU:
  torchrun --nproc-per-node 4 -m gpuparity fleet --json fleet.json
  srun --ntasks-per-node 4 --gpus-per-node 4 python -m gpuparity fleet      (SLURM_PROCID etc.)
Exit code: 0 every rank passed; 1 a rank failed, hung (TIMEOUT) or is missing; 2 bad usage.
Every rank exits with rank 0's verdict. The JSON names the suspect ranks and hosts.
See docs/cluster.md for a SLURM prolog/epilog that drains a failing node."""


def register(subparsers) -> None:
    import argparse
    parser = subparsers.add_parser(
        "fleet", help="health check of every GPU of a job (run under torchrun or srun)",
        description="Every rank: the quick battery, a matmul and a memory bandwidth probe on its own GPU; then "
                    "all_reduce, all_gather, reduce_scatter, broadcast and all_to_all with exactly known answers "
                    "(count of wrong elements) and algbw/busbw. Every wait has a deadline: a hang is a TIMEOUT.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="FILE", type=output_json, help="rank 0 writes the fleet report here ('-' for stdout)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds each collective, the barrier and the result exchange may take (default 60)")
    parser.add_argument("--sizes", help="comma-separated sizes in bytes per operation, e.g. 8,4K,1M,256M "
                                        "(default: 8 B .. 256 MiB on a GPU, 8 B .. 1 MiB on the CPU)")
    parser.add_argument("--max-size", help="drop default sizes above this, e.g. 16M")
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16 (default both)")
    parser.add_argument("--collectives", help="comma-separated subset of all_reduce, all_gather, reduce_scatter, "
                                              "broadcast, all_to_all (default all)")
    parser.add_argument("--level", choices=("quick", "default", "full"), default="quick",
                        help="battery level on every rank (default quick)")
    parser.add_argument("--no-battery", action="store_true", help="skip the battery (collectives and probes only)")
    parser.add_argument("--battery-timeout", type=float, default=900.0,
                        help="seconds the battery may take on a rank before the rank counts as stuck")
    parser.add_argument("--no-probes", action="store_true", help="skip the matmul and bandwidth probes")
    parser.add_argument("--iters", type=int, help="timed iterations per size (default 20 GPU / 3 CPU)")
    parser.add_argument("--warmup", type=int, help="warmup iterations per size (default 5 GPU / 1 CPU)")
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="auto: nccl (RCCL on ROCm) on GPUs, gloo on the CPU")
    parser.add_argument("--outlier", type=float, default=0.9,
                        help="a rank below this fraction of the fleet median throughput is flagged SLOW (0.9)")
    parser.add_argument("--fail-slow", action="store_true", help="SLOW ranks make the exit code 1")
    parser.add_argument("--all-sizes", action="store_true", help="print every size of every collective")
    parser.set_defaults(handler=handle)


def _sizes(args):
    from ..fleet import DEFAULT_SIZES, parse_size
    sizes = [parse_size(s) for s in split_list(args.sizes)] if args.sizes else None
    if args.max_size:
        limit = parse_size(args.max_size)
        if sizes is None:
            import torch
            sizes = list(DEFAULT_SIZES["gpu" if torch.cuda.is_available() and args.backend != "gloo" else "cpu"])
        sizes = [s for s in sizes if s <= limit] or [min(sizes)]
    return sizes


def handle(args) -> int:
    from .. import fleet
    from ..report.files import write_json
    from ..report.fleet_table import render_fleet
    dtypes = [fleet.DTYPE_ALIASES.get(d.lower(), d) for d in split_list(args.dtypes) or []]
    config = fleet.FleetConfig(
        sizes=_sizes(args), dtypes=dtypes, collectives=split_list(args.collectives) or fleet.COLLECTIVES,
        timeout_s=args.timeout, battery=not args.no_battery, level=args.level,
        battery_timeout_s=args.battery_timeout, probes=not args.no_probes, warmup=args.warmup, iters=args.iters,
        backend=args.backend, outlier_fraction=args.outlier, fail_slow=args.fail_slow).validate()

    def on_report(report) -> None:
        import json
        import sys
        report["command"] = " ".join(["gpuparity"] + sys.argv[1:])
        if args.json == "-":
            print(json.dumps(report, indent=1, default=str))
            return
        render_fleet(console(), report, all_sizes=args.all_sizes)
        if args.json:
            write_json(args.json, report)
            console().print(f"wrote {args.json}")

    return fleet.run(config, on_report=on_report)
