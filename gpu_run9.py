import subprocess, sys, json
CHILD = r'''
import sys, json, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
cfg = json.loads(sys.argv[1])
torch.manual_seed(0)
B, H, Sq, Sk, D = cfg["shape"]
dt = getattr(torch, cfg["dtype"])
def mk(S, off):
    n = B * H * S * D
    return torch.randn(n + off, device="cuda", dtype=dt)[off:].view(B, H, S, D)
q = mk(Sq, cfg["off"][0]); k = mk(Sk, cfg["off"][1]); v = mk(Sk, cfg["off"][2])
for t in (q, k, v): t.requires_grad_(cfg.get("grad", False))
mask = None
if cfg.get("mask") == "bool":
    mask = torch.rand(Sq, Sk, device="cuda") > 0.3
be = {"eff": [SDPBackend.EFFICIENT_ATTENTION], "default": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]}[cfg["be"]]
with sdpa_kernel(be):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if cfg.get("grad"):
        out.sum().backward()
torch.cuda.synchronize()
ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
print("OK", (out.double() - ref).abs().max().item(), q.data_ptr() % 16, k.data_ptr() % 16)
'''
cfgs = []
for dtype in ("float32", "float16"):
    for off in ([1,0,0], [0,1,0], [0,0,1], [0,1,1], [2,2,2], [4,4,4], [0,0,0]):
        for mask in (None, "bool"):
            for grad in (False, True):
                cfgs.append(dict(shape=[1,1,1,1,16], dtype=dtype, off=off, mask=mask, be="eff", grad=grad))
cfgs.append(dict(shape=[3,1,129,64,40], dtype="float32", off=[0,1,1], mask="bool", be="default", grad=True))
cfgs.append(dict(shape=[3,1,129,64,40], dtype="float32", off=[0,1,1], mask="bool", be="default", grad=False))
cfgs.append(dict(shape=[1,1,1,1,1], dtype="float32", off=[0,1,1], mask=None, be="default", grad=False))
cfgs.append(dict(shape=[1,1,1,1,1], dtype="float32", off=[0,0,0], mask=None, be="default", grad=False))
for c in cfgs:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(c)], capture_output=True, text=True, timeout=60)
    last = (p.stdout.strip().splitlines() or [""])[-1] if p.returncode == 0 else [l for l in p.stderr.splitlines() if "Error" in l][-1:] 
    print(json.dumps(c), "rc", p.returncode, last, flush=True)
