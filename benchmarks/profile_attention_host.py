"""Where the host time of one short attention forward+backward step goes (gpuparity triton):
cProfile of many steps, plus the raw cost of one direct kernel launch and of small torch ops
on this machine as yardsticks.

    PYTHONPATH=src python benchmarks/profile_attention_host.py [--shape bert]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

from diag_launch import host_and_wall  # benchmarks/ is this script's directory
from gpuparity.backends import triton_common
from gpuparity.bench.attention import SHAPES, make_case
from gpuparity.ops.attention import attention


def per_call_us(fn, n=2000):
    """Host time to issue one call, in microseconds."""
    return host_and_wall(fn, n)[0] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="bert")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    case = make_case(args.shape, SHAPES[args.shape], 0.25, torch.bfloat16, "cuda", 0)
    q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
    kpm = case.key_padding_mask

    def step():
        out = attention(q, k, v, key_padding_mask=kpm, backend="triton")
        torch.autograd.grad(out, (q, k, v), case.dout)

    small = torch.zeros(16, device="cuda")
    print(f"yardsticks on this host: torch.empty {per_call_us(lambda: torch.empty(64, device='cuda')):.1f} us, "
          f"x.add_(1) {per_call_us(lambda: small.add_(1)):.1f} us, "
          f"fwd+bwd step {per_call_us(step, 300):.1f} us", flush=True)
    # one direct launch of the cached forward kernel, no Python around it
    entries = [(key, value) for key, value in triton_common._LAUNCH_CACHE.items()]
    print(f"launch cache entries: {len(entries)}")
    from gpuparity.backends.triton_attention import attention_forward, prepare_masks
    masks = prepare_masks(q, k, None, kpm, None)
    print(f"attention_forward alone {per_call_us(lambda: attention_forward(q, k, v, masks, False, 0.125)):.1f} us",
          flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    stats.sort_stats("tottime").print_stats(35)
    print(buffer.getvalue()[:12000])
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(40)
    print(buffer.getvalue()[:12000])


if __name__ == "__main__":
    main()
