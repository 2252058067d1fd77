"""Where a compiled training step's GPU time goes: the Llama of patch_compiled.py (same build,
batch and step), each variant compiled and warmed up, then N steps under torch.profiler; per
variant the kernels grouped by name and by kind (matrix products, attention, inductor's fused
kernels, optimizer, copies, other) in microseconds per step, the step's wall time and how much of
it the GPU was busy (the union of kernel intervals).

    PYTHONPATH=src python3 benchmarks/profile_compiled_step.py --variants sdpa,attention-only --json out.json

Needs a CUDA GPU and transformers. Prints one line per variant (a script, not the library).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import patch_compiled  # noqa: E402  (the model, batch and step this profiles)

KINDS = (  # first match wins
    ("attention", ("_attn_", "flash", "fmha", "cudnn", "efficient_attention", "attention")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "sm90_", "sm80_")),
    ("inductor", ("triton_",)),
    ("copy", ("copy", "memcpy", "memset", "fill")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, words in KINDS:
        if any(word in lowered for word in words):
            return kind
    return "other"


def busy_us(intervals) -> float:
    """Length of the union of [start, end) intervals (microseconds)."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def idle_before(kernels, steps: int, top: int):
    """The GPU's idle time per step, each gap between one kernel's end and the next start (after
    the union of all earlier kernels) credited to the kernel that ended the wait: where the GPU
    waited for the host. kernels: (start, end, name)."""
    gaps, end = collections.Counter(), None
    for start, stop, name in sorted(kernels):
        if end is not None and start > end:
            gaps[name] += start - end
        end = stop if end is None else max(end, stop)
    return {"idle_ms_per_step": round(sum(gaps.values()) / steps / 1e3, 3),
            "idle_before_us_per_step": {name[:120]: round(us / steps, 1) for name, us in gaps.most_common(top)}}


def profile_variant(args, variant, inputs):
    from torch._dynamo.utils import counters
    counters.clear()
    model, _ = patch_compiled.build(args, variant)
    step = patch_compiled.make_step(model, None if args.eager else "default")
    for _ in range(args.warmup):
        step(inputs)
    torch.cuda.synchronize()
    # host time per step, no profiler: a step's host work that outlasts its GPU work idles the GPU
    started = time.perf_counter()
    for _ in range(args.steps):
        step(inputs)
    host = (time.perf_counter() - started) / args.steps
    torch.cuda.synchronize()
    unprofiled = (time.perf_counter() - started) / args.steps
    graphs = {"unique_graphs": int(counters["stats"]["unique_graphs"]),
              "graph_breaks": int(sum(counters["graph_break"].values()))}
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(args.steps):
            step(inputs)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - started) / args.steps
    per_name = collections.defaultdict(lambda: [0.0, 0])
    intervals, kernels = [], []
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if getattr(event, "is_user_annotation", False) or "#" in event.name:
            continue    # a range on the GPU's timeline (e.g. "Optimizer.step#AdamW.step"), not a kernel
        duration = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        per_name[event.name][0] += duration
        per_name[event.name][1] += 1
        start = event.time_range.start
        intervals.append((start, start + duration))
        kernels.append((start, start + duration, event.name))
    kinds = collections.Counter()
    for name, (total, _) in per_name.items():
        kinds[kind_of(name)] += total / args.steps
    top = sorted(per_name.items(), key=lambda item: -item[1][0])[:args.top]
    row = {"wall_ms_per_step": round(wall * 1e3, 3),
           "unprofiled_ms_per_step": round(unprofiled * 1e3, 3), "host_ms_per_step": round(host * 1e3, 3),
           **graphs, **idle_before(kernels, args.steps, 12),
           "gpu_busy_ms_per_step": round(busy_us(intervals) / args.steps / 1e3, 3),
           "kernel_ms_per_step": round(sum(t for t, _ in per_name.values()) / args.steps / 1e3, 3),
           "kinds_ms_per_step": {k: round(v / 1e3, 3) for k, v in kinds.most_common()},
           "top": [{"name": name[:160], "kind": kind_of(name), "us_per_step": round(total / args.steps, 1),
                    "calls_per_step": count / args.steps} for name, (total, count) in top]}
    del model, step
    torch.cuda.empty_cache()
    return row


def main(argv=None):
    parser = patch_compiled.model_arguments(argparse.ArgumentParser())
    parser.add_argument("--variants", default="sdpa,attention-only")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args), "variants": {}}
    inputs = patch_compiled.batch(args)
    for variant in args.variants.split(","):
        row = profile_variant(args, variant, inputs)
        result["variants"][variant] = row
        print(variant, json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
        torch._dynamo.reset()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
