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

`--set silent` reduces the other alignment bug instead: bf16 SDPA that returns wrong numbers
without an error when one input starts off a 16-byte boundary (the battery row of B=1, H=4,
Hkv=2, Sq=40, S=64, D=80, a float mask with masked keys, enable_gqa; torch picks cuDNN there).
It varies one factor at a time around that call (which input, its offset, the mask, GQA, the head
dim, the lengths, the dtype, the backward) so the report says what the wrong numbers need.

    python benchmarks/sdpa_misaligned.py --set silent > out/silent.jsonl
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

BACKENDS = ("default", "efficient", "flash", "cudnn", "math")


def cases(which="raise"):
    return _dedupe(silent_cases() if which == "silent" else raise_cases())


def silent_cases():
    base = dict(dtype="bfloat16", B=1, H=4, Hkv=2, Sq=40, S=64, D=80, mask="float", gqa=True, grad=False)
    out = []
    for backend, tensor, offset in itertools.product(("default", "cudnn"), ("q", "k", "v"), (0, 1, 2, 4, 8)):
        out.append(dict(base, backend=backend, tensor=tensor, offset=offset))
    for backend in ("default", "cudnn", "efficient", "flash"):
        out.append(dict(base, backend=backend, tensor="v", offset=1, mask=None))
        out.append(dict(base, backend=backend, tensor="v", offset=1, mask=True))
    for tensor in ("q", "k", "v"):
        for change in (dict(gqa=False, Hkv=4), dict(D=64), dict(D=128), dict(Sq=128, S=128), dict(Sq=1),
                       dict(B=3), dict(dtype="float16"), dict(grad=True), dict(mask=None, grad=True),
                       dict(mask=None, gqa=False, Hkv=4, D=64)):
            out.append(dict(base, backend="cudnn", tensor=tensor, offset=1, **change))
    return out


def _dedupe(out):
    seen, unique = set(), []
    for case in out:
        key = json.dumps(case, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(case)
    return unique


def raise_cases():
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
    return out


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
    grad_out = torch.randn((B, H, Sq, D), generator=gen)
    if case["grad"]:
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    mask = keep = None
    if case["mask"] == "float":   # random masked keys, the first kept, as a 0 / -inf mask of the inputs' dtype
        keep = torch.randn((B, 1, Sq, S), generator=gen) > -0.8
        keep[..., 0] = True
        mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf")).to(dev)
    elif case["mask"]:
        lengths = torch.tensor([S, 1, S // 2][:B]).view(B, 1, 1, 1)
        keep = (torch.arange(S).view(1, 1, 1, S) < lengths).expand(B, 1, Sq, S)
        mask = keep.to(dev)
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
            out.backward(grad_out.to(dev, dtype))
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
    leaves = [values[n].to(dtype).double().requires_grad_(True) for n in ("q", "k", "v")]   # the same rounded inputs
    q64, k64, v64 = leaves
    if Hkv != H:
        k64, v64 = k64.repeat_interleave(H // Hkv, 1), v64.repeat_interleave(H // Hkv, 1)
    scores = q64 @ k64.transpose(-2, -1) / D ** 0.5
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    ref = torch.softmax(scores, -1) @ v64
    err = float((out.detach().cpu().double() - ref).norm() / ref.norm())
    result.update(status="ok" if err < 2e-2 else "wrong", rel_err=err)
    if case["grad"]:
        ref.backward(grad_out.double())
        for name, got, want in zip(("q", "k", "v"), (q, k, v), leaves):
            grad_err = float((got.grad.cpu().double() - want.grad).norm() / want.grad.norm())
            result[f"grad_{name}_rel_err"] = grad_err
            if grad_err >= 2e-2:
                result["status"] = "wrong"
    return result, False


def worker(which, indices):
    all_cases = cases(which)
    for index in indices:
        result, poisoned = run_case(all_cases[index])
        print(json.dumps({"index": index, **result}), flush=True)
        if poisoned:   # the CUDA context is no longer usable: the driver restarts us
            return 3
    return 0


def main(which):
    todo = list(range(len(cases(which))))
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    while todo:
        proc = subprocess.run([sys.executable, __file__, "--worker", which, ",".join(map(str, todo))], capture_output=True,
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
    if len(sys.argv) > 3 and sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2], [int(i) for i in sys.argv[3].split(",")]))
    if sys.argv[1:] not in ([], ["--set", "raise"], ["--set", "silent"]):
        sys.exit(f"usage: {sys.argv[0]} [--set raise|silent] (got {' '.join(sys.argv[1:])})")
    sys.exit(main(sys.argv[2] if len(sys.argv) > 2 else "raise"))
