"""Where the norm forward+backward time goes through autograd (GPU diagnostic): forward with and
without autograd, the backward launcher called directly and through autograd, one training
step, and the host time per step; --profile adds a torch.profiler table.

    PYTHONPATH=src python benchmarks/diag_norm_autograd.py [--profile]
"""
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing

from gpuparity.backends import triton_norms as tn


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1000


for op, rows, hidden in (("rms", 16384, 4096), ("rms", 131072, 128), ("ln", 16384, 4096)):
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(hidden, device="cuda", dtype=torch.bfloat16) if op == "ln" else None
    is_rms = op == "rms"
    fn = (lambda a, ww, bb: tn.triton_rms_norm(a, (hidden,), ww, 1e-6)) if is_rms else \
        (lambda a, ww, bb: tn.triton_layer_norm(a, (hidden,), ww, bb, 1e-5))
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    bg = b.detach().requires_grad_() if b is not None else None
    y, stats = tn.norm_forward(x, 1, w, b, 1e-5, is_rms)
    res = {}
    with torch.no_grad():
        res["fwd_nograd"] = bench(lambda: fn(x, w, b))
    res["fwd_grad"] = bench(lambda: fn(xg, wg, bg))
    res["bwd_direct"] = bench(lambda: tn.norm_backward(dy, x, 1, w, None if b is None else b.dtype, stats, is_rms))
    out = fn(xg, wg, bg)
    res["bwd_autograd_only"] = bench(lambda: torch.autograd.grad(out, [xg, wg], dy, retain_graph=True))

    def step():
        xg.grad = None
        wg.grad = None
        if bg is not None:
            bg.grad = None
        fn(xg, wg, bg).backward(dy)
    res["fwd+bwd"] = bench(step)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        step()
    cpu = (time.perf_counter() - t0) / 50 * 1e6
    torch.cuda.synchronize()
    res["cpu_us_per_step"] = cpu
    if is_rms:
        def tstep():
            xg.grad = None
            wg.grad = None
            F.rms_norm(xg, (hidden,), wg, 1e-6).backward(dy)
        res["torch_fwd+bwd"] = bench(tstep)
    print(op, rows, hidden, {k: round(v, 1) for k, v in res.items()}, flush=True)
    if "--profile" in sys.argv and rows == 131072:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=50))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=50))
t0 = time.perf_counter()
for _ in range(1000):
    torch.cuda.get_device_properties(torch.device("cuda"))
print("get_device_properties us", (time.perf_counter() - t0) * 1000)
