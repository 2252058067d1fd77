"""Host time of one forward+backward step: attention, gpuparity (backend "triton" or "auto")
against cuDNN SDPA, on a tiny shape (the GPU work is negligible: the step is all host time)
and on the short shapes of the benchmark suite; with --norms, RMSNorm / LayerNorm (gpuparity
"triton" against torch's F.*) at hidden 128. For A/B runs of two versions of the code, run it
once per version (PYTHONPATH) in alternation; each run prints one JSON line per case.

Attention's host times are taken in interleaved rounds (--rounds R: each round times 20 steps
of every backend in turn), so a shared host's drift, which moves one round by up to 2x, hits
every backend alike; each line gives the median round and its ratio to cuDNN's.

    PYTHONPATH=src python benchmarks/host_overhead.py --label new [--norms]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from diag_launch import host_and_wall, norm_step  # benchmarks/ is this script's directory
from gpuparity.bench.attention import SHAPES, make_case
from gpuparity.bench.common import host_time_ms
from gpuparity.ops.attention import attention


def make_step(case, backend):
    q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
    kpm = case.key_padding_mask
    if backend == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        mask = (~kpm)[:, None, None, :]

        def step():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            torch.autograd.grad(out, (q, k, v), case.dout)
    else:
        def step():
            out = attention(q, k, v, key_padding_mask=kpm, backend=backend)
            torch.autograd.grad(out, (q, k, v), case.dout)
    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--shapes", default="tiny,aam-nuc,aam-asv,bert,vit")
    parser.add_argument("--backends", default="triton,auto,cudnn")
    parser.add_argument("--steps", type=int, default=300, help="steps per norm case")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per attention shape")
    parser.add_argument("--norms", action="store_true", help="time RMSNorm / LayerNorm steps instead")
    args = parser.parse_args()
    if args.norms:
        for kind in ("rms", "ln"):
            for rows in (1024, 131072):
                for backend in ("triton", "F"):
                    issue, wall = host_and_wall(norm_step(kind, rows, 128, backend), args.steps)
                    print(json.dumps({"label": args.label, "shape": f"{kind} {rows}x128", "backend": backend,
                                      "issue_ms": round(issue, 4), "wall_ms": round(wall, 4)}), flush=True)
        return
    shapes = dict(SHAPES, tiny=(2, 2, 64, 32), vit=(64, 12, 197, 64))
    for name in args.shapes.split(","):
        case = make_case(name, shapes[name], 0.25, torch.bfloat16, "cuda", 0)
        steps = {}
        for backend in args.backends.split(","):
            try:
                steps[backend] = make_step(case, backend)
                for _ in range(5):
                    steps[backend]()
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run is a line that says why
                steps.pop(backend, None)
                print(json.dumps({"label": args.label, "shape": name, "backend": backend,
                                  "error": f"{type(exc).__name__}: {exc}"[:200]}), flush=True)
        rounds = {backend: [] for backend in steps}
        for _ in range(args.rounds):
            for backend, step in steps.items():
                rounds[backend].append(host_time_ms(step, calls=20, rounds=1))
        medians = {backend: statistics.median(times) for backend, times in rounds.items()}
        for backend, issue in medians.items():
            line = {"label": args.label, "shape": name, "backend": backend, "issue_ms": round(issue, 4),
                    "issue_min_ms": round(min(rounds[backend]), 4), "rounds": args.rounds}
            if "cudnn" in medians:
                line["issue_vs_cudnn"] = round(issue / medians["cudnn"], 3)
            print(json.dumps(line), flush=True)

if __name__ == "__main__":
    main()
