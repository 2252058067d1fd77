"""Where a forward+backward step of short-sequence attention spends its time: GPU time per
kernel (torch.profiler) against the host time to issue the step (no sync), for gpuparity's
triton backend and cuDNN SDPA.

    PYTHONPATH=src python benchmarks/profile_attention_overhead.py [--shapes bert,aam-asv]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from gpuparity.bench.attention import SHAPES, make_case
from gpuparity.ops.attention import attention


def steps(case, backend):
    q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
    kpm = case.key_padding_mask
    mask = (~kpm)[:, None, None, :]

    def step():
        if backend == "triton":
            out = attention(q, k, v, key_padding_mask=kpm, backend="triton")
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.autograd.grad(out, (q, k, v), case.dout)
    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="aam-nuc,aam-asv,bert")
    parser.add_argument("--pad", type=float, default=0.25)
    args = parser.parse_args()
    for name in args.shapes.split(","):
        case = make_case(name, SHAPES[name], args.pad, torch.bfloat16, "cuda", 0)
        for backend in ("triton", "cudnn"):
            step = steps(case, backend)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            n = 50
            start = time.perf_counter()
            for _ in range(n):
                step()
            issue_ms = (time.perf_counter() - start) / n * 1e3
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - start) / n * 1e3
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step()
                torch.cuda.synchronize()
            kernels = {}
            for event in prof.key_averages():
                device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
                if device_us:
                    kernels[event.key[:60]] = device_us / 10 / 1e3
            gpu_ms = sum(kernels.values())
            top = ", ".join(f"{k}: {v:.3f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:4])
            print(f"{name} pad {args.pad} {backend}: host issue {issue_ms:.3f} ms/step, wall {wall_ms:.3f} ms/step, "
                  f"GPU {gpu_ms:.3f} ms/step [{top}]", flush=True)


if __name__ == "__main__":
    main()
