"""gpuparity.swiglu on a GPU at a Llama MLP's size: the Triton kernels' device time per tile
configuration (CUDA events over back-to-back launches) beside `F.silu(g) * u`, then forward +
backward through autograd, where the host time of a Python autograd backward shows.

    PYTHONPATH=src python benchmarks/bench_swiglu.py                  # (4096, 5632) bf16
    PYTHONPATH=src python benchmarks/bench_swiglu.py --rows 8192 --cols 11008
"""
from __future__ import annotations

import argparse
import json
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4096, help="tokens")
    p.add_argument("--cols", type=int, default=5632, help="MLP width")
    return p.parse_args(argv)


def events_us(torch, fn, n=50):
    """Microseconds per call between CUDA events around n calls (host-bound calls show host time)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / n * 1e3, 1)


def host_us(torch, fn, n=20):
    """Microseconds per call for the host to return (not synchronised)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - started
    torch.cuda.synchronize()
    return round(elapsed / n * 1e6, 1)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F

    from gpuparity.backends import triton_swiglu as ts
    if not torch.cuda.is_available():
        raise SystemExit("bench_swiglu: needs a CUDA or ROCm GPU")
    torch.manual_seed(0)
    g = torch.randn(args.rows, args.cols, device="cuda", dtype=torch.bfloat16)
    u, do = torch.randn_like(g), torch.randn_like(g)
    rows = {"shape": [args.rows, args.cols], "dtype": "bfloat16", "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "torch_fwd_us": events_us(torch, lambda: F.silu(g) * u)}
    shipped = (ts.MAX_BLOCK, ts.NUM_WARPS)
    for block, warps in [(512, 4), (1024, 2), (1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 16)]:
        ts.MAX_BLOCK, ts.NUM_WARPS = block, warps
        rows[f"fwd_{block}_{warps}"] = events_us(torch, lambda: ts.swiglu_forward(g, u))
        rows[f"bwd_{block}_{warps}"] = events_us(torch, lambda: ts.swiglu_backward(do, g, u))
    ts.MAX_BLOCK, ts.NUM_WARPS = shipped
    gg, uu = g.clone().requires_grad_(), u.clone().requires_grad_()
    for name, fn in (("torch", lambda a, b: F.silu(a) * b), ("triton", ts.triton_swiglu)):
        step = lambda fn=fn: torch.autograd.grad(fn(gg, uu), (gg, uu), do)  # noqa: E731
        rows[f"{name}_fwdbwd_events_us"] = events_us(torch, step, 20)
        rows[f"{name}_fwdbwd_host_us"] = host_us(torch, step)
    rows["triton_fwd_only_host_us"] = host_us(torch, lambda: ts.swiglu_forward(g, u))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
