"""The first backend="auto" calls in a fresh process with an empty probe cache: how long they
take, whether they print anything, and whether their answers are right.

Each repeat is a fresh Python subprocess with its own empty GPUPARITY_CACHE_DIR. In it, after
`import gpuparity` and the lookups of the two ops (not counted): the first
`gpuparity.attention` on q, k, v (2, 4, 128, 64) with a key padding mask (the second
item half padded), then the first `gpuparity.rms_norm` on (64, 512) with a weight, each timed with
time.perf_counter and checked against a float64 computation. Anything the child writes to
stderr (a logging warning, a torch._dynamo recompile message) is reported; logging is left
as the library leaves it (no handler configured: warnings reach stderr, INFO does not).

    python benchmarks/bench_first_call.py --repeats 5 [--src PATH/src] [--device cpu] [--json out.json]

--src points PYTHONPATH at another checkout's src (e.g. a `git worktree add /tmp/base <commit>`
of the code before a change), so old and new are measured by the same script. The load average
is printed before and after: on a shared machine other work slows every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import json, sys, time
import torch
import gpuparity
attention, rms_norm = gpuparity.attention, gpuparity.rms_norm   # the lazy imports, not counted
device = torch.device(sys.argv[1])
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 4, 128, 64, generator=gen).to(device) for _ in range(3))
mask = torch.zeros(2, 128, dtype=torch.bool)   # True = padding, as in nn.MultiheadAttention
mask[1, 64:] = True
mask = mask.to(device)
x, w = torch.randn(64, 512, generator=gen).to(device), torch.randn(512, generator=gen).to(device)

def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()

t0 = time.perf_counter()
out = attention(q, k, v, key_padding_mask=mask)
sync()
t1 = time.perf_counter()
y = rms_norm(x, (512,), w)
sync()
t2 = time.perf_counter()

ref_attn = torch.nn.functional.scaled_dot_product_attention(
    q.double(), k.double(), v.double(), attn_mask=~mask.view(2, 1, 1, 128))
ref_rms = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps)) * w.double()
err_attn = ((out.double() - ref_attn).abs().max() / ref_attn.abs().max()).item()
err_rms = ((y.double() - ref_rms).abs().max() / ref_rms.abs().max()).item()
t3 = time.perf_counter()
again = attention(q, k, v, key_padding_mask=mask)
sync()
t4 = time.perf_counter()
print(json.dumps({"attention_s": t1 - t0, "rms_norm_s": t2 - t1, "total_s": t2 - t0, "second_attention_s": t4 - t3,
                  "err_attention": err_attn, "err_rms_norm": err_rms, "torch": torch.__version__}))
'''


def one(python: str, src: str, device: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="gpuparity-first-call-") as cache:
        env = {**os.environ, "GPUPARITY_CACHE_DIR": cache, "PYTHONPATH": src}
        env.pop("GPUPARITY_TRUST_UNPROBED", None)
        started = time.perf_counter()
        proc = subprocess.run([python, "-c", CHILD, device], env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-2000:], "wall_s": wall}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["stderr_lines"] = [line for line in proc.stderr.splitlines() if line.strip()]
    row["wall_s"] = wall
    row["ok"] = row["err_attention"] < 1e-3 and row["err_rms_norm"] < 1e-4
    return row


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--src", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: expected at least 1, got {args.repeats}")
    load_before = os.getloadavg()
    rows = []
    for i in range(args.repeats):
        row = one(args.python, args.src, args.device, args.timeout)
        rows.append(row)
        if "error" in row:
            print(f"repeat {i + 1}: failed after {row['wall_s']:.1f} s:\n{row['error']}", file=sys.stderr)
            return 1
        print(f"repeat {i + 1}: attention {row['attention_s']:.2f} s + rms_norm {row['rms_norm_s']:.2f} s = "
              f"{row['total_s']:.2f} s (second attention call {row['second_attention_s'] * 1e3:.2f} ms); "
              f"rel err {row['err_attention']:.1e} / {row['err_rms_norm']:.1e}; "
              f"stderr lines {len(row['stderr_lines'])}; load {os.getloadavg()[0]:.2f}", flush=True)
    load_after = os.getloadavg()
    result = {"src": args.src, "device": args.device, "repeats": args.repeats, "load_before": load_before,
              "load_after": load_after, "total_s": summary([r["total_s"] for r in rows]),
              "attention_s": summary([r["attention_s"] for r in rows]),
              "rms_norm_s": summary([r["rms_norm_s"] for r in rows]),
              "all_right": all(r["ok"] for r in rows), "stderr_lines": sorted({l for r in rows for l in r["stderr_lines"]}),
              "rows": rows}
    t = result["total_s"]
    print(f"first attention + first rms_norm: median {t['median']:.2f} s (min {t['min']:.2f}, max {t['max']:.2f}) over "
          f"{args.repeats} fresh processes; answers right: {result['all_right']}; distinct stderr lines: "
          f"{len(result['stderr_lines'])}; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    for line in result["stderr_lines"][:10]:
        print(f"  stderr: {line[:200]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
