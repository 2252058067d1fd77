"""Host cost of the pieces of an eager launch and of an attention step's allocations, in us per
call (median of 9 rounds of 2000 calls; the kernel does nothing, so it is host time): a cached
compiled kernel's launcher given 11 tensors or their addresses as ints, PreparedLaunch.call,
its key, and ways to allocate the three gradients / lse and delta.

    PYTHONPATH=src python benchmarks/launch_and_alloc_micro.py
"""
import time, statistics, json
import torch, triton, triton.language as tl
from gpuparity.backends import triton_common as tc

def us(fn, n=2000, rounds=9):
    r = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n): fn()
        r.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(r), 2)

@triton.jit
def k11(A, B, C, D, E, F, G, H, I, J, K, n, s1, s2, s3, s4, s5, s6, s7, s8, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < 0:
        tl.store(A + tl.arange(0, BLOCK), tl.load(B + tl.arange(0, BLOCK)))

ts = [torch.empty(1024, device="cuda") for _ in range(11)]
scal = (1024, 64, 64, 64, 64, 64, 64, 64, 64)
entry = tc.launch(k11, (1, 1, 1), (*ts, *scal), num_warps=4, num_stages=1, BLOCK=128)
compiled, tail = entry
dev = torch.cuda.current_device()
stream = torch._C._cuda_getCurrentRawStream
ptrs = [t.data_ptr() for t in ts]
out = {}
out["run tensors"] = us(lambda: compiled.run(1, 1, 1, stream(dev), compiled.function, compiled.packed_metadata, None, None, None, *ts, *scal, *tail))
out["run ints"] = us(lambda: compiled.run(1, 1, 1, stream(dev), compiled.function, compiled.packed_metadata, None, None, None, *ptrs, *scal, *tail))
out["run ints + data_ptr()"] = us(lambda: compiled.run(1, 1, 1, stream(dev), compiled.function, compiled.packed_metadata, None, None, None, *[t.data_ptr() for t in ts], *scal, *tail))
pl = tc.PreparedLaunch(k11, (1,), scal, num_warps=4, num_stages=1, BLOCK=128)
pl(*ts)
out["PreparedLaunch"] = us(lambda: pl(*ts))
out["_fast_launch_state"] = us(tc._fast_launch_state)
out["key"] = us(lambda: (dev, *[(t.dtype, not t.data_ptr() & 15) for t in ts]))
out["data_ptr x11"] = us(lambda: [t.data_ptr() for t in ts])
q = torch.empty(16, 4, 1024, 32, device="cuda", dtype=torch.bfloat16)
out["empty(3,...).unbind"] = us(lambda: torch.empty((3, *q.shape), dtype=q.dtype, device=q.device).unbind(0))
out["3x empty_like"] = us(lambda: (torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)))
def idx():
    b = torch.empty((3, *q.shape), dtype=q.dtype, device=q.device)
    return b[0], b[1], b[2]
out["empty + 3 index"] = us(idx)
out["empty(2,..).unbind fp32"] = us(lambda: torch.empty(2, 16, 4, 1024, dtype=torch.float32, device="cuda").unbind(0))
out["iter empty(2,..)"] = us(lambda: tuple(torch.empty(2, 16, 4, 1024, dtype=torch.float32, device="cuda")))
out["empty lse"] = us(lambda: torch.empty(16, 4, 1024, dtype=torch.float32, device="cuda"))
print(json.dumps(out, indent=1))
