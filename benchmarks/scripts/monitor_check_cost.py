"""What one monitor check costs, per op: host ms and the aten ops it launches.

Builds bench_monitor.py's Llama (small by default, so it runs on a CPU in seconds), patched as
bench_monitor.py patches it (--variant gpuparity: the full patch; gpuparity-attn: attention
only), takes one forward and backward under `gpuparity.monitor(every=1)` with the checker held
back, so every sampled call of the step is kept (forward and backward copies, as the monitor
makes them), and then runs the checker's own check (`Checker._check`, side stream and all on a
GPU) on each kept call --repeat times, printing per op: the median host ms of a check (wall
time less the time it waited, asleep, for its GPU work: what max_overhead bounds), that GPU wait,
and the aten ops one check dispatches (counted by a TorchDispatchMode in a separate run, so
the count does not slow the timed runs). The slicing thresholds default to sizes that make the
small model's calls take the same paths (strided rows, one attention slice) as the 2048-token
run's do with the monitor's defaults.

    PYTHONPATH=src python benchmarks/scripts/monitor_check_cost.py                 # CPU, small
    PYTHONPATH=src python benchmarks/scripts/monitor_check_cost.py --device cuda --dtype bf16 \
        --layers 1 --hidden 2048 --heads 16 --kv-heads 4 --seq 2048 --batch 2 \
        --slice-rows-above 65536 --slice-attention-above 4194304      # the benchmark's sizes
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


# the model's size when not given (bench_monitor.py's options, which the other arguments may set)
SMALL = ["--layers", "1", "--hidden", "256", "--heads", "8", "--kv-heads", "2", "--vocab", "512", "--seq", "256",
         "--device", "cpu"]


def parse_args(argv=None):
    """(this script's options, bench_monitor.py's for the model: SMALL unless given)."""
    import bench_monitor
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="other arguments: bench_monitor.py's model options (--layers, --hidden, "
                                       "--heads, --kv-heads, --vocab, --seq, --batch, --pad, --device, --dtype)")
    p.add_argument("--variant", default="gpuparity", choices=("gpuparity", "gpuparity-attn"))
    p.add_argument("--slice-rows-above", type=int, default=2 ** 12)
    p.add_argument("--slice-attention-above", type=int, default=2 ** 14)
    p.add_argument("--repeat", type=int, default=5, help="timed checks per sampled call (median)")
    p.add_argument("--top", type=int, default=8, help="most frequent aten ops listed per op")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: host overhead, not a "
                   "contended core's float64 work, on a small CPU check)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args, rest = p.parse_known_args(argv)
    return args, bench_monitor.parse_args(SMALL + rest)


def sampled_calls(args, model_args):
    """One step's sampled calls, with their backward copies, as the checker would get them."""
    import bench_monitor
    import gpuparity
    from gpuparity.shadow import checker as checker_module
    model, step = bench_monitor.build(model_args, args.variant)
    step()                                  # first calls (backend choice) outside the monitor
    kept = []
    original = checker_module.Checker.submit

    def keep(self, call, wait=False):
        if call.ready is None:
            call.mark_ready()
        kept.append(call)
        return True
    checker_module.Checker.submit = keep
    try:
        mon = gpuparity.monitor(model, every=1, max_overhead=None, max_pending=1000,
                                slice_rows_above=args.slice_rows_above,
                                slice_attention_above=args.slice_attention_above)
        with mon:
            step()
    finally:
        checker_module.Checker.submit = original
    if model_args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return mon, kept


def main(argv=None):
    args, model_args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from gpuparity.shadow import capture, checker as checker_module
    mon, calls = sampled_calls(args, model_args)
    check = checker_module.Checker(lambda *a: None, check_device="auto")
    by_op = collections.OrderedDict()
    for call in calls:
        key = (call.kind.name, call.backend, call.has_backward)
        if key not in by_op:      # one call per (op, backend, with backward): the layers' calls are alike
            by_op[key] = call
    rows = []
    with capture.DEPTH:               # as in the checker's thread: its own F.* calls are not watched
        for (name, backend, backward), call in by_op.items():
            check._check(call)        # warm (first-call imports, allocator)
            host, wait, verdicts = [], [], None
            for _ in range(args.repeat):
                check._waiting = 0.0
                started = time.perf_counter()
                comparisons = check._check(call)
                host.append(1e3 * (time.perf_counter() - started - check._waiting))
                wait.append(1e3 * check._waiting)
                verdicts = [c.passed for c in comparisons]
            counter = _Count()
            with counter:
                check._check(call)
            rows.append({"op": name, "backend": backend, "backward": backward,
                         "shapes": call.described["shapes"], "host_ms": statistics.median(host),
                         "gpu_wait_ms": statistics.median(wait), "aten_ops": sum(counter.ops.values()),
                         "top_ops": dict(counter.ops.most_common(args.top)), "passed": all(verdicts),
                         "comparisons": len(verdicts)})
    report = mon.report()
    per_step = collections.Counter(call.kind.name for call in calls)
    print(f"device {model_args.device}, {model_args.dtype}, {args.variant}, {len(calls)} sampled calls in one step "
          f"({dict(per_step)}); skipped {report.skipped}")
    print(f"{'op':32s} {'backend':24s} {'bwd':4s} {'host ms':>8s} {'gpu wait':>9s} {'aten ops':>9s}  verdict")
    for row in rows:
        print(f"{row['op']:32s} {str(row['backend'])[:24]:24s} {'yes' if row['backward'] else 'no':4s} "
              f"{row['host_ms']:8.2f} {row['gpu_wait_ms']:9.2f} {row['aten_ops']:9d}  "
              f"{'pass' if row['passed'] else 'FAIL'} ({row['comparisons']} comparisons)")
        print(f"{'':32s} top: {row['top_ops']}")
    weighted = sum(row["host_ms"] * per_step[row["op"]] for row in rows if row["backward"]) / max(
        1, sum(per_step[row["op"]] for row in rows if row["backward"]))
    print(f"mean host ms per check (forward+backward checks, weighted by the step's calls per op): {weighted:.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": {**vars(model_args), **vars(args)}, "rows": rows, "weighted_host_ms": weighted}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
