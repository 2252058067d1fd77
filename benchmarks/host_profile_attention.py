"""Host Python time of gpuparity's own code per eager attention step (forward + backward, key
padding mask, backend="triton"), from cProfile, with the Triton kernels' own bodies left out (on
the CPU they run in Triton's interpreter). Compares two trees' host paths without a GPU:

    PYTHONPATH=src python benchmarks/host_profile_attention.py 64          # batch 64, (B, 4, 16, 32)
    PYTHONPATH=.ab_prev/src python benchmarks/host_profile_attention.py 64

A script, not the library: it prints.
"""
import cProfile, pstats, sys, os, time, io
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch, gpuparity
B, H, S, D = int(sys.argv[1]), 4, 16, 32
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))
kpm = torch.ones(B, S, dtype=torch.bool); kpm[::2, S // 2:] = False
def step():
    out = gpuparity.attention(q, k, v, key_padding_mask=kpm, backend="triton")
    out.sum().backward()
for _ in range(2): step()
pr = cProfile.Profile(); pr.enable()
for _ in range(5): step()
pr.disable()
st = pstats.Stats(pr)
tot = 0.0; rows = []
for (fn, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
    if "/gpuparity/" in fn and not fn.endswith("kernels.py"):
        tot += tt; rows.append((tt, nc, fn.split("/gpuparity/")[1], line, name))
rows.sort(reverse=True)
print(f"gpuparity self time per step: {1e3*tot/5:.3f} ms")
for r in rows[:12]: print(f"{1e3*r[0]/5:8.3f} ms {r[1]//5:6d} calls {r[2]}:{r[3]} {r[4]}")
