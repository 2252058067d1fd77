"""Experiment: a one-kernel attention backward that accumulates dq with fp32 atomics (as
FlashAttention-2/3 do) instead of recomputing the scores in a second dq kernel, timed beside the
shipped two-kernel backward (dq, then dk/dv) on the same inputs and checked against it.

The shipped backward does 7 (S x S x D) matmuls: dq recomputes q k^T and dout v^T that dk/dv also
computes. One kernel with atomics does 5, but adds (S / BLOCK_N) x S x D fp32 reductions per head
(L2 traffic) and gives up bit-for-bit determinism (the additions' order varies from run to run):
is the saving worth it on Hopper? Dense case only: no mask, not causal, MHA, contiguous (B, H, S, D)
bf16, S a multiple of the tiles.

    PYTHONPATH=src python benchmarks/attention_atomic_dq.py [--shape 2,16,8192,128] [--json out.json]
    PYTHONPATH=src python benchmarks/attention_atomic_dq.py --device cpu --shape 1,2,128,32   # interpreter check

Variants: BLOCK_M x BLOCK_N x warps x stages, then flags: "d" reduces dq through a tensor
descriptor (TMA reduce-add), else pointer atomics; "s" staggers each key block's first query block
(program n starts at query block n) so that concurrent programs add into different rows.
Not a shipped code path.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from attention_tma import _rel, _resources, reporter  # noqa: E402  (benchmarks/ is on sys.path: the script's directory)
from gpuparity.backends.triton_attention import launch  # noqa: E402

LOG2E = 1.4426950408889634
os.environ.setdefault("GPUPARITY_ATTENTION_BACKWARD", "split")


@triton.jit
def _bwd_atomic(desc_q, desc_k, desc_v, desc_do, desc_dq, DQ, DK, DV, LSE, Delta, qk_scale, sm_scale, seq,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                DESC_REDUCE: tl.constexpr, STAGGER: tl.constexpr, UPCAST: tl.constexpr):
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    key0 = bh * seq + start_n * BLOCK_N
    k = desc_k.load([key0, 0])
    v = desc_v.load([key0, 0])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    num_m = seq // BLOCK_M
    for i in range(0, num_m):
        if STAGGER:
            start_m = ((i + start_n) % num_m) * BLOCK_M
        else:
            start_m = i * BLOCK_M
        row0 = bh * seq + start_m
        q = desc_q.load([row0, 0])
        do = desc_do.load([row0, 0])
        lse = tl.load(LSE + row0 + offs_m)
        delta = tl.load(Delta + row0 + offs_m)
        if UPCAST:   # the interpreter's bf16 dot is wrong; fp32 inputs there
            qk_t = tl.dot(k, tl.trans(q), input_precision="ieee")
        else:
            qk_t = tl.dot(k, tl.trans(q))
        p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        dq_part = tl.dot(tl.trans(ds_t), k)
        if DESC_REDUCE:
            desc_dq.atomic_add([row0, 0], dq_part)
        else:
            tl.atomic_add(DQ + (row0 + offs_m)[:, None] * HEAD_DIM + offs_d[None, :], dq_part, sem="relaxed")
    rows = key0 + offs_n
    tl.store(DK + rows[:, None] * HEAD_DIM + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + rows[:, None] * HEAD_DIM + offs_d[None, :], dv.to(DV.dtype.element_ty))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2,16,8192,128")
    parser.add_argument("--variants", default="64x128x8x2:s,64x128x8x2:ds,64x128x8x2:,64x64x4x2:s,128x128x8x2:s,"
                                              "64x128x8x3:s",
                        help="BLOCK_M x BLOCK_N x warps x stages : flags (d: descriptor reduce, s: stagger)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cpu: check under TRITON_INTERPRET=1, no timing")
    args = parser.parse_args()
    if not re.fullmatch(r"\d+,\d+,\d+,\d+", args.shape):
        parser.error(f"--shape: expected B,H,S,D (four integers), got {args.shape!r}")
    for spec in filter(None, args.variants.split(",")):
        if not re.fullmatch(r"\d+x\d+x\d+x\d+:[ds]*", spec):
            parser.error(f"--variants: expected BLOCK_MxBLOCK_NxWARPSxSTAGES:flags (flags from d, s), got {spec!r}")
    device = args.device
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    bench = ((lambda fn: triton.testing.do_bench(fn, return_mode="median")) if device != "cpu"
             else (lambda fn: float("nan")))
    if device != "cpu":
        # descriptors in global scratch memory need an allocator (Triton asks for it)
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    batch, heads, seq, dim = map(int, args.shape.split(","))
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(batch, heads, seq, dim, device=device, generator=gen, dtype=dtype)
                     for _ in range(4))
    scale = dim ** -0.5
    unit = 2.0 * batch * heads * seq * seq * dim
    masks = launch.prepare_masks(q, k)
    mask_tensors = launch._mask_tensors(q, masks)
    rows = []
    report = reporter(rows, unit, width=40, key="tflops_dense_equiv")

    out, lse = launch.attention_forward(q, k, v, masks, False, scale)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty(batch, heads, seq, dtype=torch.float32, device=device)
    dq_launch, dkdv_launch = launch._backward_launches(q, k, v, out, dout, dq, dk, dv, masks, False, scale, 0.0, 0)

    def shipped():
        dq_launch(q, k, v, out, dout, lse, delta, dq, *mask_tensors)
        dkdv_launch(q, k, v, dout, lse, delta, dk, dv, *mask_tensors)
    shipped()
    report("shipped dq + dk/dv (two kernels)", bench(shipped), 7, 0.0, [])

    flat = [t.view(batch * heads * seq, dim) for t in (q, k, v, dout)]
    dq_acc = torch.zeros(batch * heads * seq, dim, dtype=torch.float32, device=device)
    dk2, dv2 = torch.empty_like(k), torch.empty_like(v)
    lse_flat = lse.view(-1)

    def preprocess():   # delta = rowsum(out * dout); dq accumulator zeroed
        torch.sum(out.float() * dout.float(), dim=-1, out=delta)
        dq_acc.zero_()
    preprocess()
    report("torch preprocess (delta, zero dq acc)", bench(preprocess), 0, 0.0, [])
    for spec in filter(None, args.variants.split(",")):
        tiles, _, flags = spec.partition(":")
        bm, bn, warps, stages = map(int, tiles.split("x"))
        descs = [TensorDescriptor.from_tensor(t, [bm if i in (0, 3) else bn, dim]) for i, t in enumerate(flat)]
        desc_dq = TensorDescriptor.from_tensor(dq_acc, [bm, dim])

        def run():
            _bwd_atomic[(seq // bn, batch * heads)](
                descs[0], descs[1], descs[2], descs[3], desc_dq, dq_acc, dk2, dv2, lse_flat, delta,
                scale * LOG2E, scale, seq, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=dim, DESC_REDUCE="d" in flags,
                STAGGER="s" in flags, UPCAST=device == "cpu", num_warps=warps, num_stages=stages)

        def whole():
            preprocess()
            run()
            return (dq_acc * scale).to(dtype)
        try:
            preprocess()
            run()
            dq2 = (dq_acc * scale).to(dtype).view_as(q)
            err = max(_rel(dq2, dq), _rel(dk2, dk), _rel(dv2, dv))
            ms = bench(run)
            report(f"atomic {spec} (kernel)", ms, 5, err, _resources(_bwd_atomic))
            report(f"atomic {spec} (with pre/post)", bench(whole), 7, err, [])
        except Exception as exc:  # noqa: BLE001 - a failed variant is a result
            print(f"atomic {spec}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            rows.append({"kernel": f"atomic {spec}", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": [batch, heads, seq, dim], "device": torch.cuda.get_device_name() if device != "cpu"
                       else "cpu", "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
