import sys, time, torch, transformers, gpuparity
sys.path.insert(0, "benchmarks")
import argparse, patch_compiled as pc
args = argparse.Namespace(layers=2, hidden=512, mlp=1024, batch=2, seq=256, backend=sys.argv[1], mode="compiled")
model, summary = pc.build(args, "patch-all")
inputs = pc.batch(args)
def step(**inp):
    out = model(**inp)
    return out.loss
t = time.time()
e = torch._dynamo.explain(step)(**inputs)
print("backend", sys.argv[1], "graphs", e.graph_count, "breaks", e.graph_break_count, round(time.time() - t, 1), "s")
for b in e.break_reasons[:12]:
    print("--", b.reason[:400])
    for f in b.user_stack[-4:]:
        print("     ", str(f)[:200])
