"""Experiment: the attention forward in Gluon (Triton's explicit-layout dialect) for Hopper, with
FlashAttention-3's intra-warpgroup overlap: the scores of key block j are issued to the tensor
cores (asynchronous wgmma) together with block j-1's P @ V, and block j's softmax runs while
P @ V still computes. Triton's own pipeliner waits for every score wgmma before the next
instruction (its TTGIR for the same loop written by hand: `warp_group_dot_wait {pendings = 0}`
right after the dot), so the softmax (exp2 on the MUFU unit, row max / sum, rescale) and the
tensor cores take turns; here the wait is placed by hand.

Dense case only (no mask, not causal, MHA, contiguous (B, H, S, D) bf16, S a multiple of the
tiles, D 64 or 128). Not a shipped code path: timed beside the shipped forward on the same
inputs and checked against it.

    PYTHONPATH=src python benchmarks/attention_gluon_fwd.py [--shape 2,16,8192,128] [--tiles 128x64x8x2,...]
    python benchmarks/attention_gluon_fwd.py --compile-only      # sm_90 build on a machine without a GPU

Gluon's API moves between Triton releases: written for Triton 3.6 (the lent GPUs'), builds with
3.9 too (the names that changed are looked up once, below). Results:
benchmarks/records/h100/attention-gluon-fwd-2026-11-26.md.
"""
from __future__ import annotations

import argparse
import json
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

LOG2E = 1.4426950408889634
# a CTA-wide barrier: gl.thread_barrier in Triton 3.6 (the lent GPUs'), gl.barrier from 3.7 on
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# TMA copies: async_copy_global_to_shared / async_copy_shared_to_global in 3.6, async_load / async_store later
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _fwd_overlap(desc_q, desc_k, desc_v, desc_o, LSE, qk_scale, seq,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, OVERLAP: gl.constexpr):
    start_m = gl.program_id(0)
    bh = gl.program_id(1)
    row0 = bh * seq + start_m * BLOCK_M
    kv0 = bh * seq
    dtype: gl.constexpr = desc_q.dtype
    n_blocks = seq // BLOCK_N

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()
    _cta_barrier()

    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    _tma_load(desc_q, [row0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        ok = i < n_blocks
        mbarrier.expect(k_bars.index(i), desc_k.block_type.nbytes, pred=ok)
        _tma_load(desc_k, [kv0 + i * BLOCK_N, 0], k_bars.index(i), k_smem.index(i), pred=ok)
        mbarrier.expect(v_bars.index(i), desc_v.block_type.nbytes, pred=ok)
        _tma_load(desc_v, [kv0 + i * BLOCK_N, 0], v_bars.index(i), v_smem.index(i), pred=ok)

    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    # block 0: scores, then its softmax (nothing to overlap with yet)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    _cta_barrier()     # every warpgroup is done reading K slot 0: refill it
    ok = STAGES < n_blocks
    mbarrier.expect(k_bars.index(0), desc_k.block_type.nbytes, pred=ok)
    _tma_load(desc_k, [kv0 + STAGES * BLOCK_N, 0], k_bars.index(0), k_smem.index(0), pred=ok)
    s = s * qk_scale
    m_i = gl.max(s, axis=1)
    p = gl.exp2(s - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, axis=1)

    for j in range(1, n_blocks):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
        o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        if OVERLAP:
            # the scores were issued first: wait for them alone, P @ V keeps the tensor cores busy
            s = warpgroup_mma_wait(1, deps=[s_tok])
        else:
            s = warpgroup_mma_wait(0, deps=[s_tok])
        s = s * qk_scale
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = warpgroup_mma_wait(0, deps=[o_tok])
        _cta_barrier()     # K slot of block j and V slot of block j-1 are read: refill them
        ok_k = j + STAGES < n_blocks
        mbarrier.expect(k_bars.index(slot), desc_k.block_type.nbytes, pred=ok_k)
        _tma_load(desc_k, [kv0 + (j + STAGES) * BLOCK_N, 0], k_bars.index(slot),
                                        k_smem.index(slot), pred=ok_k)
        ok_v = j - 1 + STAGES < n_blocks
        mbarrier.expect(v_bars.index(prev), desc_v.block_type.nbytes, pred=ok_v)
        _tma_load(desc_v, [kv0 + (j - 1 + STAGES) * BLOCK_N, 0], v_bars.index(prev),
                                        v_smem.index(prev), pred=ok_v)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)

    last = n_blocks - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout, assert_trivial=True)
    o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[o_tok])

    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    rows = start_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)
    gl.store(LSE + bh * seq + rows, m_i + gl.log2(l_i))
    o_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], desc_o.layout)
    o_smem.store(out.to(dtype))
    fence_async_shared()
    _tma_store(desc_o, [row0, 0], o_smem)
    tma.store_wait(0)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))


def _layout(rows, dim):
    return gl.NVMMASharedLayout.get_default_for([rows, dim], gl.bfloat16)


def compile_only(tiles, dim) -> int:
    """Build for sm_90 without a GPU: lowering errors, shared memory, registers (from the PTX)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    failures = 0
    for bm, bn, warps, stages, overlap in tiles:
        sig = {"desc_q": f"tensordesc<bf16[{bm},{dim}],{_layout(bm, dim)!r}>",
               "desc_k": f"tensordesc<bf16[{bn},{dim}],{_layout(bn, dim)!r}>",
               "desc_v": f"tensordesc<bf16[{bn},{dim}],{_layout(bn, dim)!r}>",
               "desc_o": f"tensordesc<bf16[{bm},{dim}],{_layout(bm, dim)!r}>",
               "LSE": "*fp32", "qk_scale": "fp32", "seq": "i32"}
        consts = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=dim, STAGES=stages, NUM_WARPS=warps, OVERLAP=overlap)
        sig.update({name: "constexpr" for name in consts})
        try:
            kernel = triton.compile(GluonASTSource(_fwd_overlap, sig, consts), target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": warps})
            ptx = kernel.asm["ptx"]
            print(f"{bm}x{bn}x{warps}x{stages} overlap={overlap}: ok, shared {kernel.metadata.shared} B, "
                  f"wgmma {ptx.count('wgmma.mma_async')}, waits {ptx.count('wgmma.wait_group')}, "
                  f"local {ptx.count('st.local')}", flush=True)
        except Exception as exc:  # noqa: BLE001 - every variant is reported
            failures += 1
            print(f"{bm}x{bn}x{warps}x{stages} overlap={overlap}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
    return 1 if failures else 0


def run_gpu(args, tiles) -> int:
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from gpuparity.backends.triton_attention import launch
    batch, heads, seq, dim = map(int, args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", generator=gen, dtype=torch.bfloat16)
               for _ in range(3))
    scale = dim ** -0.5
    flops = 4.0 * batch * heads * seq * seq * dim
    masks = launch.prepare_masks(q, k)
    ref_out, ref_lse = launch.attention_forward(q, k, v, masks, False, scale)
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # noqa: E731
    rows = []
    flat = [t.view(batch * heads * seq, dim) for t in (q, k, v)]
    variants = {}
    for bm, bn, warps, stages, overlap in tiles:
        out = torch.empty_like(q)
        lse = torch.empty(batch, heads, seq, device="cuda", dtype=torch.float32)
        dq_ = TensorDescriptor.from_tensor(flat[0], [bm, dim], _layout(bm, dim))
        dk_ = TensorDescriptor.from_tensor(flat[1], [bn, dim], _layout(bn, dim))
        dv_ = TensorDescriptor.from_tensor(flat[2], [bn, dim], _layout(bn, dim))
        do_ = TensorDescriptor.from_tensor(out.view(-1, dim), [bm, dim], _layout(bm, dim))
        name = f"gluon {bm}x{bn}x{warps}x{stages}" + (" overlap" if overlap else " no-overlap")

        def run(bm=bm, bn=bn, warps=warps, stages=stages, overlap=overlap, dq_=dq_, dk_=dk_, dv_=dv_, do_=do_, lse=lse):
            _fwd_overlap[(seq // bm, batch * heads)](dq_, dk_, dv_, do_, lse, scale * LOG2E, seq, BLOCK_M=bm,
                                                    BLOCK_N=bn, HEAD_DIM=dim, STAGES=stages, NUM_WARPS=warps,
                                                    OVERLAP=overlap, num_warps=warps)
        try:
            run()
            torch.cuda.synchronize()
            err = max(((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item(),
                      ((lse - ref_lse).abs().max()).item())
            variants[name] = (run, err)
            print(f"{name}: built, rel diff from the shipped forward {err:.2e}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
            rows.append({"kernel": name, "error": f"{type(exc).__name__}: {str(exc)[:1500]}"})
    shipped = lambda: launch.attention_forward(q, k, v, masks, False, scale)  # noqa: E731
    times = {}
    for rnd in range(args.rounds):    # alternated: a lent host's drift falls on every variant alike
        for name, fn in [("shipped fwd", shipped)] + [(n, f) for n, (f, _) in variants.items()]:
            times.setdefault(name, []).append(bench(fn))
    for name, values in times.items():
        ms = sorted(values)[len(values) // 2]
        err = variants[name][1] if name in variants else 0.0
        print(f"MEDIAN {name}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s, diff {err:.1e}, rounds {[round(t, 3) for t in values]}")
        rows.append({"kernel": name, "ms": ms, "rounds_ms": values, "tflops": flops / ms / 1e9, "rel_diff": err})
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"shape": [batch, heads, seq, dim], "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, handle, indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2,16,8192,128")
    parser.add_argument("--tiles", default="128x64x8x2,128x64x8x3,128x128x8x2,64x64x4x2",
                        help="block_m x block_n x warps x stages; each is built with and without the overlap")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    tiles = []
    for text in args.tiles.split(","):
        bm, bn, warps, stages = (int(f) for f in text.split("x"))
        tiles += [(bm, bn, warps, stages, True), (bm, bn, warps, stages, False)]
    if args.compile_only:
        return compile_only(tiles, int(args.shape.split(",")[3]))
    return run_gpu(args, tiles)


if __name__ == "__main__":
    sys.exit(main())
