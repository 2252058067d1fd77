"""Host time of tiny eager calls of gpuparity.rms_norm / layer_norm / attention on the CPU (the
backend work is negligible, so this is the ops-layer and dispatch cost). For A/B runs, one
process per side, alternating:  PYTHONPATH=<src of a side> python benchmarks/host_dispatch_ab.py LABEL"""
import time, torch, sys, json, os
os.environ["GPUPARITY_TRUST_UNPROBED"] = "1"
import gpuparity
x = torch.randn(4, 16); w = torch.randn(16)
q = torch.randn(1, 1, 4, 8)
def t(fn, n=20000):
    for _ in range(2000): fn()
    best = []
    for _ in range(5):
        s = time.perf_counter()
        for _ in range(n): fn()
        best.append((time.perf_counter() - s) / n * 1e6)
    return min(best)
out = {"label": sys.argv[1],
       "rms_norm us": t(lambda: gpuparity.rms_norm(x, (16,), w)),
       "layer_norm us": t(lambda: gpuparity.layer_norm(x, (16,), w)),
       "attention us": t(lambda: gpuparity.attention(q, q, q), 5000)}
print(json.dumps(out))
