"""Where the host time of a small norm / RoPE step goes on a GPU machine: per-call host cost of
the pieces (allocation, device query, one direct launch, autograd.Function, autograd.grad)
next to the whole step, ours and torch's, then a cProfile of our step. The GPU work is made
negligible (1024 rows x 128, or a small RoPE), so every number is host time.

    PYTHONPATH=src python benchmarks/host_breakdown.py [--profile]
"""
from __future__ import annotations

import cProfile
import io
import itertools
import json
import pstats
import sys

import torch
import torch.nn.functional as F

from diag_launch import host_and_wall  # benchmarks/ is this script's directory
from gpuparity.backends import triton_common, triton_norms, triton_rotary


def us(fn, n=2000) -> float:
    return round(host_and_wall(fn, n)[0] * 1e3, 2)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def main() -> None:
    dev = "cuda"
    rows, hidden = 1024, 128
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    w = torch.randn(hidden, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    b = torch.randn(hidden, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    dy = torch.randn_like(x)
    xd = x.detach()
    res = {}
    res["torch.empty 64 f32"] = us(lambda: torch.empty(64, device=dev))
    res["torch.empty 1024x128 bf16"] = us(lambda: torch.empty((rows, hidden), device=dev, dtype=torch.bfloat16))
    res["cuda.current_device"] = us(torch.cuda.current_device)
    res["_C._cuda_getDevice"] = us(torch._C._cuda_getDevice)
    res["getCurrentRawStream"] = us(lambda: torch._C._cuda_getCurrentRawStream(0))
    res["_fast_launch_state"] = us(triton_common._fast_launch_state)
    res["x.add_ small"] = us(lambda: xd.add_(0))
    with torch.no_grad():
        res["norm_forward (plan)"] = us(lambda: triton_norms.norm_forward(xd, 1, w, None, 1e-6, True))
    y, stats = triton_norms.norm_forward(xd, 1, w.detach(), None, 1e-6, True)
    res["norm_backward (plan)"] = us(lambda: triton_norms.norm_backward(dy, xd, 1, w.detach(), None, stats, True))
    res["F.rms_norm fwd nograd"] = us(lambda: F.rms_norm(xd, (hidden,), w.detach()))
    res["identity Function apply"] = us(lambda: _Identity.apply(x))
    res["autograd.grad identity"] = us(lambda: torch.autograd.grad(_Identity.apply(x), (x,), dy))
    res["autograd.grad x*1"] = us(lambda: torch.autograd.grad(x.mul(1), (x,), dy))
    res["ours rms fwd (grad)"] = us(lambda: triton_norms.triton_rms_norm(x, (hidden,), w))
    out = triton_norms.triton_rms_norm(x, (hidden,), w)
    res["ours rms autograd.grad only"] = us(lambda: torch.autograd.grad(out, (x, w), dy, retain_graph=True))
    res["ours rms step"] = us(lambda: torch.autograd.grad(triton_norms.triton_rms_norm(x, (hidden,), w), (x, w), dy))
    res["F.rms step"] = us(lambda: torch.autograd.grad(F.rms_norm(x, (hidden,), w), (x, w), dy))
    res["ours ln step"] = us(lambda: torch.autograd.grad(triton_norms.triton_layer_norm(x, (hidden,), w, b), (x, w, b), dy))
    res["F.ln step"] = us(lambda: torch.autograd.grad(F.layer_norm(x, (hidden,), w, b), (x, w, b), dy))
    # RoPE, small: one tensor (2, 64, 4, 32)
    q = torch.randn(2, 64, 4, 32, device=dev, dtype=torch.bfloat16)
    angles = torch.rand(64, 16, device=dev)
    cos, sin = angles.cos(), angles.sin()
    with torch.no_grad():
        res["rotary fwd nograd"] = us(lambda: triton_rotary.triton_apply_rotary(q, cos, sin))
        # a decode loop: one new position per call (up to 8000), passed as an int offset
        q1 = q[:, :1].contiguous()
        long_angles = torch.rand(8192, 16, device=dev)
        long_cos, long_sin = long_angles.cos(), long_angles.sin()
        positions = itertools.cycle(range(8000))
        res["rotary decode fwd, new int offset"] = us(
            lambda: triton_rotary.triton_apply_rotary(q1, long_cos, long_sin, seqlen_offsets=next(positions)))
    qg = q.detach().requires_grad_()
    dq = torch.randn_like(q)
    res["rotary step"] = us(lambda: torch.autograd.grad(triton_rotary.triton_apply_rotary(qg, cos, sin), (qg,), dq))
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "host_us": res}), flush=True)
    for key, value in res.items():
        print(f"{key:32s} {value:8.2f} us", flush=True)
    if "--profile" in sys.argv:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            torch.autograd.grad(triton_norms.triton_layer_norm(x, (hidden,), w, b), (x, w, b), dy)
        torch.cuda.synchronize()
        profiler.disable()
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(30)
        print(buffer.getvalue()[:9000])


if __name__ == "__main__":
    main()
