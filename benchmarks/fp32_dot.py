"""fp32 attention on an NVIDIA GPU with TF32 off: CUDA-core FMA dots ("ieee") against split-TF32
tensor-core dots ("tf32x3", gpuparity's default there). Per head dim: the seconds the first
forward+backward spends compiling (fresh Triton cache), the forward+backward time, and the
relative L2 error of out, dq, dk, dv against float64, next to the error of a plain fp32
matmul-softmax-matmul (the battery's baseline; the battery passes a kernel at <= 2x it, floor 1e-5).
Run once per choice, each in its own process:

    GPUPARITY_FP32_DOT=ieee PYTHONPATH=src python benchmarks/fp32_dot.py
    GPUPARITY_FP32_DOT=tf32x3 PYTHONPATH=src python benchmarks/fp32_dot.py
"""
from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="fp32dot-"))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from gpuparity import reference  # noqa: E402
from gpuparity.backends import triton_attention as ta  # noqa: E402
from gpuparity.contracts.attention import composition  # noqa: E402
from gpuparity.tolerance import relative_error  # noqa: E402
from gpuparity.ops.attention import attention  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def inputs(batch, heads, seq, dim, gen):
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=gen, dtype=torch.float64) for _ in range(3))
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
    kpm = torch.arange(seq).view(1, seq) >= lengths.view(batch, 1)
    dout = torch.randn(batch, heads, seq, dim, generator=gen, dtype=torch.float64)
    return q, k, v, kpm, dout


def fwd_bwd(fn, q, k, v, kpm, dout):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, key_padding_mask=kpm)
    grads = torch.autograd.grad(out, leaves, dout)
    return [out.detach(), *grads]


def errors(dim, gen):
    q, k, v, kpm, dout = inputs(2, 3, 197, dim, gen)
    ref = fwd_bwd(reference.attention, q, k, v, kpm, dout)
    cuda = [t.to("cuda", torch.float32) for t in (q, k, v)] + [kpm.cuda(), dout.to("cuda", torch.float32)]
    ours = fwd_bwd(lambda *a, **kw: attention(*a, **kw, backend="triton"), *cuda)
    base = fwd_bwd(composition, *cuda)
    names = ("out", "dq", "dk", "dv")
    return {n: (relative_error(o.double().cpu(), r), relative_error(b.double().cpu(), r))
            for n, o, b, r in zip(names, ours, base, ref)}


def main():
    print(f"fp32 dot: {ta.strict_fp32_dot()} (GPUPARITY_FP32_DOT={os.environ.get('GPUPARITY_FP32_DOT', 'unset')}); "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    gen = torch.Generator().manual_seed(0)
    for dim in (32, 64, 128, 256):
        batch = 32 if dim <= 128 else 8
        q, k, v, kpm, dout = inputs(batch, 12, 512, dim, gen)
        args = [t.to("cuda", torch.float32) for t in (q, k, v)] + [kpm.cuda(), dout.to("cuda", torch.float32)]
        leaves = [t.requires_grad_() for t in args[:3]]

        def step():
            out = attention(*leaves, key_padding_mask=args[3], backend="triton")
            torch.autograd.grad(out, leaves, args[4])

        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        second = time.perf_counter() - start
        ms = triton.testing.do_bench(step, warmup=10, rep=100, return_mode="median")
        errs = errors(dim, gen)
        err_text = ", ".join(f"{n} {o:.2e} (baseline {b:.2e})" for n, (o, b) in errs.items())
        print(f"D={dim:3d} (B={batch}, H=12, S=512, pad~.25): compile {first - second:6.1f} s, "
              f"fwd+bwd {ms:7.3f} ms; error vs float64: {err_text}", flush=True)


if __name__ == "__main__":
    main()
