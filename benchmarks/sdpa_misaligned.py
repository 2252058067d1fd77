"""Reduce "CUDA error: misaligned address" from F.scaled_dot_product_attention (the doctor's
ERROR on attention_decode/sdpa/layouts.q_offset, bf16, H200): which SDPA backend raises it, for
which input at which storage offset. Imports torch only.

Each case runs SDPA pinned to one backend (or unpinned, torch's own choice, named by
torch._fused_sdp_choice) on q, k, v of the decode case (B=3, H=4, Hkv=2, Sq=1, S=40, D=32, a bool
mask, enable_gqa) with one of them at a storage offset of N elements, and compares the output
with float64 on the CPU. A misaligned-address error poisons the CUDA context, so the cases run
in a worker process that is restarted after each such error (CUDA_LAUNCH_BLOCKING=1, so the
error is raised by the call that caused it). One JSON line per case on stdout.

    python benchmarks/sdpa_misaligned.py > out/misaligned.jsonl
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

BACKENDS = ("default", "efficient", "flash", "cudnn", "math")


def cases():
    out = []
    base = dict(dtype="bfloat16", B=3, H=4, Hkv=2, Sq=1, S=40, D=32, mask=True, gqa=True, grad=False)
    # the doctor's call first, on every backend; then what the alignment depends on
    for backend in BACKENDS:
        out.append(dict(base, backend=backend, tensor="q", offset=3))
    for backend, tensor, offset in itertools.product(BACKENDS[:4], ("q", "k", "v"), (1, 2, 4, 8)):
        out.append(dict(base, backend=backend, tensor=tensor, offset=offset))
    for backend in ("default", "efficient", "cudnn"):
        out.append(dict(base, backend=backend, tensor="q", offset=3, mask=False))
        out.append(dict(base, backend=backend, tensor="q", offset=3, gqa=False, Hkv=4))
        out.append(dict(base, backend=backend, tensor="q", offset=3, Sq=16, S=128, D=64))
        out.append(dict(base, backend=backend, tensor="q", offset=3, dtype="float16"))
        out.append(dict(base, backend=backend, tensor="q", offset=3, dtype="float32"))
        out.append(dict(base, backend=backend, tensor="q", offset=3, grad=True, Sq=16, S=128, D=64))
    seen, unique = set(), []
    for case in out:
        key = json.dumps(case, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(case)
    return unique


def run_case(case):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = getattr(torch, case["dtype"])
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, Sq, S, D = (case[k] for k in ("B", "H", "Hkv", "Sq", "S", "D"))
    shapes = {"q": (B, H, Sq, D), "k": (B, Hkv, S, D), "v": (B, Hkv, S, D)}
    values = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    dev = torch.device(os.environ.get("SDPA_MISALIGNED_DEVICE", "cuda"))
    tensors = {}
    for name, value in values.items():
        offset = case["offset"] if name == case["tensor"] else 0
        flat = torch.zeros(value.numel() + offset, dtype=dtype, device=dev)
        flat[offset:] = value.reshape(-1).to(dev, dtype)
        tensors[name] = flat[offset:].view(value.shape)
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    if case["grad"]:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    mask = None
    if case["mask"]:
        lengths = torch.tensor([S, 1, S // 2][:B]).view(B, 1, 1, 1)
        mask = (torch.arange(S).view(1, 1, 1, S) < lengths).expand(B, 1, Sq, S).to(dev)
    kwargs = dict(attn_mask=mask)
    if case["gqa"]:
        kwargs["enable_gqa"] = True
    result = dict(case, q_ptr_mod16=tensors["q"].data_ptr() % 16, k_ptr_mod16=tensors["k"].data_ptr() % 16,
                  v_ptr_mod16=tensors["v"].data_ptr() % 16)
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=None, enable_gqa=case["gqa"])
        result["torch_choice"] = SDPBackend(choice).name
    except Exception as exc:  # noqa: BLE001
        result["torch_choice"] = f"? {type(exc).__name__}"
    members = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    try:
        if case["backend"] == "default":
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            with sdpa_kernel([members[case["backend"]]]):
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        if case["grad"]:
            out.backward(torch.ones_like(out))
        if dev.type == "cuda":
            torch.cuda.synchronize()
    except RuntimeError as exc:
        text = str(exc).strip().splitlines()[0][:200]
        if "No available kernel" in str(exc) or "No viable backend" in str(exc):
            result["status"] = "no kernel"
        else:
            result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {text}"
        return result, "misaligned" in str(exc) or "CUDA error" in str(exc)
    # float64 on the CPU
    q64, k64, v64 = (values[n].double() for n in ("q", "k", "v"))
    q64, k64, v64 = (t.to(dtype).double() for t in (q64, k64, v64))   # the same rounded inputs
    if Hkv != H:
        k64, v64 = k64.repeat_interleave(H // Hkv, 1), v64.repeat_interleave(H // Hkv, 1)
    scores = q64 @ k64.transpose(-2, -1) / D ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask.cpu(), float("-inf"))
    ref = torch.softmax(scores, -1) @ v64
    err = float((out.detach().cpu().double() - ref).norm() / ref.norm())
    result.update(status="ok" if err < 2e-2 else "wrong", rel_err=err)
    return result, False


def worker(indices):
    all_cases = cases()
    for index in indices:
        result, poisoned = run_case(all_cases[index])
        print(json.dumps({"index": index, **result}), flush=True)
        if poisoned:   # the CUDA context is no longer usable: the driver restarts us
            return 3
    return 0


def main():
    todo = list(range(len(cases())))
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    while todo:
        proc = subprocess.run([sys.executable, __file__, "--worker", ",".join(map(str, todo))], capture_output=True,
                              text=True, env=env, timeout=300)
        done = set()
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                print(line, flush=True)
                done.add(json.loads(line)["index"])
        if not done:   # the worker died before its first case: report it and stop
            print(json.dumps({"index": todo[0], "status": "worker died", "stderr": proc.stderr[-500:]}), flush=True)
            done.add(todo[0])
        todo = [i for i in todo if i not in done]
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        sys.exit(worker([int(i) for i in sys.argv[2].split(",")]))
    sys.exit(main())
