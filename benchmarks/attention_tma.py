"""Experiment: do Hopper's tensor-memory-accelerator loads (Triton tensor descriptors) speed up the
attention kernels at D=128? Dense case only (no mask, not causal, MHA, contiguous (B, H, S, D) bf16,
S a multiple of the tiles): a forward and a dk/dv kernel written with descriptors, timed beside the
shipped pointer-based kernels on the same inputs, and checked against them.

    PYTHONPATH=src python benchmarks/attention_tma.py [--shape 2,16,8192,128] [--json out.json]

Prints one line per kernel: ms (median of triton.testing.do_bench), TFLOP/s, registers / spills,
and the relative difference from the shipped kernel's result. Not a shipped code path: if the
descriptors win, the shipped kernels gain them behind the portable pointer path.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]:
    os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported: the kernels then run interpreted

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from gpuparity.backends.triton_attention import launch  # noqa: E402

LOG2E = 1.4426950408889634
os.environ.setdefault("GPUPARITY_ATTENTION_BACKWARD", "split")   # the shipped dq and dk/dv, timed one by one


@triton.jit
def _fwd_tma(desc_q, desc_k, desc_v, desc_o, LSE, qk_scale, seq,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, WS: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    row0 = bh * seq + start_m * BLOCK_M
    q = desc_q.load([row0, 0])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in tl.range(0, seq, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([bh * seq + start_n, 0])
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([bh * seq + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(LSE + bh * seq + rows, m_i + tl.math.log2(l_i))
    desc_o.store([row0, 0], (acc / l_i[:, None]).to(q.dtype))


@triton.jit
def _dkdv_tma(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, Delta, qk_scale, sm_scale, seq,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, WS: tl.constexpr):
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    key0 = bh * seq + start_n * BLOCK_N
    k = desc_k.load([key0, 0])
    v = desc_v.load([key0, 0])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in tl.range(0, seq, BLOCK_M, warp_specialize=WS):
        q = desc_q.load([bh * seq + start_m, 0])
        do = desc_do.load([bh * seq + start_m, 0])
        lse = tl.load(LSE + bh * seq + start_m + offs_m)
        delta = tl.load(Delta + bh * seq + start_m + offs_m)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    desc_dk.store([key0, 0], (dk * sm_scale).to(k.dtype))
    desc_dv.store([key0, 0], dv.to(v.dtype))


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


_SEEN = set()


def _resources(fn) -> list:
    """(warps, stages, registers, spills) of the variants of fn compiled since the last call."""
    found = []
    for cache in getattr(fn, "device_caches", {}).values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        for compiled in getattr(kernels, "values", lambda: [])():
            if id(compiled) not in _SEEN:
                _SEEN.add(id(compiled))
                found.append((compiled.metadata.num_warps, compiled.metadata.num_stages,
                              getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)))
    return found


def reporter(rows: list, flops_unit: float, width: int = 34, key: str = "tflops"):
    """report(name, ms, units, err, resources): a row appended to rows and printed; units: how many
    (S x S x D) matmuls of flops_unit FLOPs the timed work does."""
    def report(name, ms, units, err, resources):
        rows.append({"kernel": name, "ms": round(ms, 4), key: round(units * flops_unit / ms / 1e9, 1),
                     "rel_diff_vs_shipped": err, "resources": resources})
        print(f"{name:{width}s} {ms:8.3f} ms {units * flops_unit / ms / 1e9:7.1f} TFLOP/s  diff {err:.2e}  "
              f"(warps, stages, regs, spills) {resources}", flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="2,16,8192,128")
    parser.add_argument("--fwd", default="128x64x8x3,128x128x8x2,128x64x8x2",
                        help="forward tiles to try: block_m x block_n x warps x stages, 'ws' appended: warp-specialized loop")
    parser.add_argument("--dkdv", default="64x64x4x2,64x128x8x2,32x128x8x2,64x64x4x3",
                        help="dk/dv tiles to try: block_m (queries per step) x block_n (keys) x warps x stages")
    parser.add_argument("--json", default=None)
    parser.add_argument("--pad", type=float, default=None,
                        help="give the shipped kernels a key padding mask, the last fraction PAD of every "
                             "item's keys padded (0: a mask with every key kept); the descriptor variants "
                             "take no mask and are skipped")
    parser.add_argument("--device", default="cuda", help="cpu: check the kernels under TRITON_INTERPRET=1, no timing")
    args = parser.parse_args()
    device = args.device
    # the interpreter's bf16 dot is wrong (see kernels._mma): the CPU check runs in float32
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    bench = (lambda fn: triton.testing.do_bench(fn, return_mode="median")) if device != "cpu" else (lambda fn: float("nan"))
    batch, heads, seq, dim = map(int, args.shape.split(","))
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(batch, heads, seq, dim, device=device, generator=gen, dtype=dtype)
                     for _ in range(4))
    scale = dim ** -0.5
    flops_unit = 2.0 * batch * heads * seq * seq * dim   # one (S x S x D) matmul
    kpm = None
    if args.pad is not None:
        kpm = torch.zeros(batch, seq, dtype=torch.bool, device=device)
        kpm[:, seq - int(round(seq * args.pad)):] = True
        args.fwd = args.dkdv = ""
        print(f"key padding mask: last {int(round(seq * args.pad))} of {seq} keys padded", flush=True)
    masks = launch.prepare_masks(q, k, key_padding_mask=kpm)
    mask_tensors = launch._mask_tensors(q, masks)
    rows = []
    report = reporter(rows, flops_unit)

    # shipped kernels: forward, then the backward's two launches timed one by one
    out, lse = launch.attention_forward(q, k, v, masks, False, scale)
    report("shipped fwd", bench(lambda: launch.attention_forward(q, k, v, masks, False, scale)), 2, 0.0, [])
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty(batch, heads, seq, dtype=torch.float32, device=device)
    # the shipped dk/dv kernel with pointers (GPUPARITY_ATTENTION_TMA=0), then as shipped (auto:
    # tensor descriptors on sm_90 where tiles.tma_backward allows)
    for choice in ("0", "auto"):
        os.environ["GPUPARITY_ATTENTION_TMA"] = choice
        launch.triton_common.clear_plans()
        dq_launch, dkdv_launch = launch._backward_launches(q, k, v, out, dout, dq, dk, dv, masks, False, scale, 0.0, 0)
        dq_launch(q, k, v, out, dout, lse, delta, dq, *mask_tensors)
        dk_prev = None if choice == "0" else dk.clone()
        dkdv_launch(q, k, v, dout, lse, delta, dk, dv, *mask_tensors)
        if choice == "0":
            report("shipped dq", bench(
                lambda: dq_launch(q, k, v, out, dout, lse, delta, dq, *mask_tensors)), 3, 0.0, [])
        report(f"shipped dkdv (GPUPARITY_ATTENTION_TMA={choice}, {type(dkdv_launch).__name__})", bench(
            lambda: dkdv_launch(q, k, v, dout, lse, delta, dk, dv, *mask_tensors)), 4,
            0.0 if dk_prev is None else _rel(dk, dk_prev), [])
    os.environ.pop("GPUPARITY_ATTENTION_TMA")

    flat = [t.view(batch * heads * seq, dim) for t in (q, k, v, dout)]
    for spec in filter(None, args.fwd.split(",")):
        ws = spec.endswith("ws")   # Triton's automatic warp specialization of the loop
        bm, bn, warps, stages = map(int, spec.rstrip("ws").split("x"))
        o2 = torch.empty_like(q)
        lse2 = torch.empty_like(lse)
        dq_, dk_, dv_, do_ = (TensorDescriptor.from_tensor(t, [bm if i in (0, 3) else bn, dim])
                              for i, t in enumerate(flat))
        desc_o = TensorDescriptor.from_tensor(o2.view(-1, dim), [bm, dim])

        def run():
            _fwd_tma[(seq // bm, batch * heads)](dq_, dk_, dv_, desc_o, lse2, scale * LOG2E, seq,
                                                BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=dim, WS=ws, num_warps=warps,
                                                num_stages=stages)
        try:
            run()
            ms = bench(run)
            report(f"tma fwd {spec}", ms, 2, max(_rel(o2, out), _rel(lse2, lse)), _resources(_fwd_tma))
        except Exception as exc:  # noqa: BLE001 - a failed variant is a result
            print(f"tma fwd {spec}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            rows.append({"kernel": f"tma fwd {spec}", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    for spec in filter(None, args.dkdv.split(",")):
        ws = spec.endswith("ws")
        bm, bn, warps, stages = map(int, spec.rstrip("ws").split("x"))
        dk2, dv2 = torch.empty_like(k), torch.empty_like(v)
        descs = [TensorDescriptor.from_tensor(t, [bm if i in (0, 3) else bn, dim]) for i, t in enumerate(flat)]
        desc_dk = TensorDescriptor.from_tensor(dk2.view(-1, dim), [bn, dim])
        desc_dv = TensorDescriptor.from_tensor(dv2.view(-1, dim), [bn, dim])

        def run():
            _dkdv_tma[(seq // bn, batch * heads)](descs[0], descs[1], descs[2], descs[3], desc_dk, desc_dv, lse,
                                                 delta, scale * LOG2E, scale, seq, BLOCK_M=bm, BLOCK_N=bn,
                                                 HEAD_DIM=dim, WS=ws, num_warps=warps, num_stages=stages)
        try:
            run()
            ms = bench(run)
            report(f"tma dkdv {spec}", ms, 4, max(_rel(dk2, dk), _rel(dv2, dv)), _resources(_dkdv_tma))
        except Exception as exc:  # noqa: BLE001
            print(f"tma dkdv {spec}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            rows.append({"kernel": f"tma dkdv {spec}", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"shape": [batch, heads, seq, dim], "device": torch.cuda.get_device_name() if device != "cpu" else "cpu (interpreter)",
                       "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
