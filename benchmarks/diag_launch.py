"""Host time per call with Triton's own launch path against gpuparity's cached direct launch
(triton_common.launch), for the calls where host time dominates: short-sequence attention
forward+backward and norm/RoPE forward+backward. Prints one line per case.

    PYTHONPATH=src python benchmarks/diag_launch.py
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from gpuparity.backends import triton_common
from gpuparity.bench.attention import SHAPES, make_case
from gpuparity.ops.attention import attention
from gpuparity.ops.norms import layer_norm, rms_norm
from gpuparity.ops.rotary import apply_rotary


def set_fast(enabled: bool) -> None:
    triton_common._FAST_LAUNCH.clear()
    if not enabled:
        triton_common._FAST_LAUNCH["knobs"] = None


def report_state(label: str) -> None:
    print(f"  [{label}] direct launches: {'on' if triton_common._fast_launch_state() else 'off'} "
          f"({triton_common._FAST_LAUNCH.get('why_off', '')}), cached kernels {len(triton_common._LAUNCH_CACHE)}",
          flush=True)


def compare(label: str, make_step, rounds: int = 3) -> None:
    """Median over alternating rounds of Triton's launch path and the direct one (the host is noisy)."""
    times = {False: [], True: []}
    for _ in range(rounds):
        for fast in (False, True):
            set_fast(fast)
            times[fast].append(host_and_wall(make_step()))
    for fast in (False, True):
        walls = sorted(wall for _, wall in times[fast])
        issues = sorted(issue for issue, _ in times[fast])
        print(f"{label} triton direct_launch={fast}: host issue {issues[len(issues) // 2]:.3f} ms, "
              f"wall {walls[len(walls) // 2]:.3f} ms (median of {rounds})", flush=True)
    report_state(label)


def host_and_wall(step, n=100):
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    issue = (time.perf_counter() - start) / n * 1e3
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / n * 1e3
    return issue, wall


def attention_step(case, backend):
    q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
    kpm = case.key_padding_mask
    mask = (~kpm)[:, None, None, :]

    def step():
        if backend == "triton":
            out = attention(q, k, v, key_padding_mask=kpm, backend="triton")
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.autograd.grad(out, (q, k, v), case.dout)
    return step


def norm_step(kind, rows, hidden, backend):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    b = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    dy = torch.randn_like(x)

    def step():
        if kind == "rms":
            y = rms_norm(x, (hidden,), w, backend=backend) if backend != "F" else F.rms_norm(x, (hidden,), w)
            torch.autograd.grad(y, (x, w), dy)
        else:
            y = layer_norm(x, (hidden,), w, b, backend=backend) if backend != "F" else F.layer_norm(x, (hidden,), w, b)
            torch.autograd.grad(y, (x, w, b), dy)
    return step


def rope_step(shape, backend):
    B, H, T, D = shape
    x = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
    angles = torch.rand(T, D // 2, device="cuda")
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    dy = torch.randn_like(x)

    def step():
        y = apply_rotary(x, cos, sin, backend=backend)
        torch.autograd.grad(y, (x,), dy)
    return step


def main() -> None:
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    for name in ("aam-nuc", "aam-asv", "bert"):
        case = make_case(name, SHAPES[name], 0.25, torch.bfloat16, "cuda", 0)
        issue, wall = host_and_wall(attention_step(case, "cudnn"))
        print(f"attention {name} pad .25 fwd+bwd cudnn: host issue {issue:.3f} ms, wall {wall:.3f} ms", flush=True)
        compare(f"attention {name} pad .25 fwd+bwd", lambda: attention_step(case, "triton"))
    for kind, rows, hidden in (("rms", 131072, 128), ("ln", 131072, 128), ("rms", 16384, 4096), ("ln", 65536, 1024)):
        issue, wall = host_and_wall(norm_step(kind, rows, hidden, "F"))
        print(f"{kind} {rows}x{hidden} fwd+bwd torch F: host issue {issue:.3f} ms, wall {wall:.3f} ms", flush=True)
        compare(f"{kind} {rows}x{hidden} fwd+bwd", lambda: norm_step(kind, rows, hidden, "triton"))
    for shape in ((64, 4, 1024, 32), (8, 32, 4096, 128)):
        compare(f"rope {shape} fwd+bwd", lambda: rope_step(shape, "triton"))
    set_fast(True)


if __name__ == "__main__":
    main()
