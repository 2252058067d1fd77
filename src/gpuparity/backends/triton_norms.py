"""Fused RMSNorm and LayerNorm in Triton, forward and backward (dx, dweight, dbias): the kernels,
their launchers, the autograd.Function, and the backends registered as "triton".

Statistics are always fp32. Rows are read through their strides (up to two leading strides, so
a sliced (B, S, H) view needs no copy), offsets are 64-bit, small hidden sizes pack many rows
into one program, and hidden sizes past FUSED_MAX_N loop over the row in chunks. dweight and
dbias are summed per program into an fp32 partial buffer and then reduced in a fixed order, so
the backward is deterministic.
"""
# long file: not yet split like backends/triton_attention/ (issue #16); its kernels need no closure.
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch

from ..numerics import default_rms_eps
from ..registry import Backend, register
from . import triton_common
from .triton_common import (AotSpec, PlanCache, PreparedLaunch, allocation_template, availability, cdiv,
                            launch, next_pow2, problem_reasons)
from .. import caches

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton: the backends say so through availability()
    triton = None
    tl = None

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# ----------------------------------------------------------------------------- tile configs
# Per hardware family: threads per warp (wavefront), the most warps a program may have, the
# largest row kept whole in registers, and the chunk used when a row is longer than that.
FAMILIES = {
    "nvidia": {"warp": 32, "max_warps": 32, "fused_max_n": 16384, "loop_block": 4096,
               "targets": ("cuda:80", "cuda:90")},
    # CDNA (MI200/MI300): wave64, 64 KiB of LDS; 16 wavefronts = 1024 threads per workgroup.
    "cdna": {"warp": 64, "max_warps": 16, "fused_max_n": 16384, "loop_block": 4096,
             "targets": ("hip:gfx942", "hip:gfx90a")},
    # RDNA3 (gfx1100): wave32.
    "rdna": {"warp": 32, "max_warps": 32, "fused_max_n": 16384, "loop_block": 4096,
             "targets": ("hip:gfx1100",)},
}
# Tiles. Forward (a sweep on an H100, benchmarks/tune_norms_rope.py; numbers in
# docs/kernels-norms-rope.md): 4096-element tiles (rows x block_n), 16 elements per thread.
# Backward (benchmarks/tune_norm_bwd.py on an H200 and an H100, read with
# git show be48db0:benchmarks/records/h200/history/session4-2026-11-21.md and
# git show be48db0:benchmarks/records/h100/history/session4-2026-11-21.md; the H100 A/B:
# benchmarks/records/h100/norm-bwd-prefetch-ab-2026-11-21.md): one persistent program per SM
# walking 8192-element tiles, each program loading its next tile while it reduces and stores the
# current one (PREFETCH: 12-19% more bandwidth on the H200 than the best config without it, 6-22%
# on the H100); 32 elements per thread below 4096 columns (8 warps), 16 from there (8 warps lost
# 1-4% there, 16 warps lost 1-4% below). Other vendors get the same element counts over their
# own warp width.
FWD_TILE_ELEMS = 4096
FWD_ELEMS_PER_THREAD = 16
BWD_TILE_ELEMS = 8192
# Rows up to this many columns finish the dweight/dbias reduction inside the fused backward
# (its last program sums programs x columns fp32 partials: 132 x 128 per gradient at 128
# columns on an H100), one launch fewer where the host time decides a step; wider rows keep the
# separate, column-parallel partial-sum launch. NVIDIA only: the ordering it relies on (a CTA
# barrier, then one thread's acq_rel atomic at GPU scope, as CUTLASS's semaphore) is sound in
# the PTX memory model and was tested on H100s; on AMD it would rest on the compiler ordering
# other waves' stores before wave 0's release, unverified without the hardware.
FINISH_MAX_N = 256
FINISH_FAMILIES = ("nvidia",)
# Persistent backward: programs per SM / CU when a config does not say (tests, overrides).
BWD_PROGRAMS_PER_SM = 2


@dataclasses.dataclass(frozen=True)
class NormConfig:
    block_n: int        # columns per tile (a power of two)
    rows: int           # rows per tile
    num_warps: int
    looped: bool        # the row is longer than one tile: loop over chunks
    programs_per_sm: int = 0   # backward: persistent programs per SM (0: BWD_PROGRAMS_PER_SM)
    num_stages: Optional[int] = None  # backward: pipelining depth of its row loops (None: Triton's default)
    prefetch: bool = False     # fused backward: load the next tile while working on this one
    finish: bool = False       # fused backward: its last program sums dweight/dbias (no 2nd launch)


def _warps(elems: int, per_thread: int, spec) -> int:
    warps = max(1, min(spec["max_warps"], elems // (spec["warp"] * per_thread)))
    return 1 << (warps.bit_length() - 1)  # a power of two


@caches.lru_cache("backends.triton_norms.norm_config", maxsize=1024)
def norm_config(n: int, backward: bool = False, fam: Optional[str] = None) -> NormConfig:
    spec = FAMILIES[fam or triton_common.tile_family()]
    if n > spec["fused_max_n"]:
        block = spec["loop_block"]
        return NormConfig(block, 1, _warps(block, 8, spec), True, 2)
    block = next_pow2(n)
    if not backward:
        rows = max(1, FWD_TILE_ELEMS // block)
        return NormConfig(block, rows, _warps(rows * block, FWD_ELEMS_PER_THREAD, spec), False)
    rows = max(1, BWD_TILE_ELEMS // block)
    per_thread = 32 if block < 4096 else 16
    return NormConfig(block, rows, _warps(rows * block, per_thread, spec), False, programs_per_sm=1, prefetch=True,
                      finish=block <= FINISH_MAX_N and (fam or triton_common.tile_family()) in FINISH_FAMILIES)


_SM_COUNT: Dict[int, int] = caches.register("backends.triton_norms.sm_count", {})


def _program_count(device: torch.device, per_sm: int = 0) -> int:
    """How many programs a persistent backward launches: a few per SM / CU."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _SM_COUNT:
            _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
        return (per_sm or BWD_PROGRAMS_PER_SM) * _SM_COUNT[index]
    return 4  # the interpreter: few programs, each looping, keeps it fast


# ----------------------------------------------------------------------------- kernels
if triton is not None:

    @triton.jit
    def _row_offsets(rows, n_inner, stride_outer, stride_inner, TWO_LEVEL: tl.constexpr):
        # rows are int64; a row's start is outer * stride_outer + inner * stride_inner.
        if TWO_LEVEL:
            return (rows // n_inner) * stride_outer + (rows % n_inner) * stride_inner
        return rows * stride_inner

    @triton.jit
    def _add_pair(a0, b0, a1, b1):
        return a0 + a1, b0 + b1

    @triton.jit
    def _norm_fwd_fused_kernel(
        X, Y, W, B, RSTD,
        n_rows, n_inner, stride_x_outer, stride_x_inner, N, eps,
        IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
        TWO_LEVEL: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    ):
        """ROWS whole rows per program, kept in registers: one read of x, one write of y.
        RSTD holds n_rows rstd values, then (LayerNorm) n_rows shifted means, then the
        backward's arrival counter, zeroed here."""
        eps = tl.cast(eps, tl.float32)  # fp64 when torch.compile's code passes it (see attention's kernels)
        MEAN = RSTD + n_rows
        pid = tl.program_id(0).to(tl.int64)
        if pid == 0:
            tl.store(RSTD + (n_rows if IS_RMS else 2 * n_rows), 0.0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < n_rows
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        x_start = _row_offsets(rows, n_inner, stride_x_outer, stride_x_inner, TWO_LEVEL)
        x = tl.load(X + x_start[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if IS_RMS:
            rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
            xhat = x * rstd[:, None]
        else:
            # Two passes over registers (mean, then squared deviations): exact for
            # near-constant rows, where E[x^2] - E[x]^2 would cancel to noise. The mean is
            # kept relative to the row's first element (stored as MEAN): x - x[0] is exact
            # for near-constant rows, where an fp32 mean of ~1000 would be off by half an
            # ulp (3e-5), a large error next to a spread of 1e-2.
            shift = tl.load(X + x_start, mask=row_ok, other=0.0).to(tl.float32)
            shifted = tl.where(mask, x - shift[:, None], 0.0)
            mean = tl.sum(shifted, axis=1) / N
            centered = tl.where(mask, shifted - mean[:, None], 0.0)
            rstd = tl.rsqrt(tl.sum(centered * centered, axis=1) / N + eps)
            xhat = centered * rstd[:, None]
            tl.store(MEAN + rows, mean, mask=row_ok)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        y = xhat
        if HAS_WEIGHT:
            y = y * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _norm_fwd_looped_kernel(
        X, Y, W, B, RSTD,
        n_rows, n_inner, stride_x_outer, stride_x_inner, N, eps,
        IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
        TWO_LEVEL: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """One long row per program, in chunks: a statistics pass, then a normalising pass.
        Statistics laid out as in the fused kernel."""
        eps = tl.cast(eps, tl.float32)  # fp64 when torch.compile's code passes it (see attention's kernels)
        MEAN = RSTD + n_rows
        row = tl.program_id(0).to(tl.int64)
        if row == 0:
            tl.store(RSTD + (n_rows if IS_RMS else 2 * n_rows), 0.0)
        x_start = _row_offsets(row, n_inner, stride_x_outer, stride_x_inner, TWO_LEVEL)
        cols = tl.arange(0, BLOCK_N)
        if IS_RMS:
            sum_sq = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                offs = start + cols
                x = tl.load(X + x_start + offs, mask=offs < N, other=0.0).to(tl.float32)
                sum_sq += x * x
            rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / N + eps)
            mean = 0.0
            shift = 0.0
        else:
            # Chan et al.'s merge of per-chunk (count, mean, M2), each chunk exact in registers:
            # stable for near-constant rows and large means.
            # Statistics of x - x[0] (see the fused kernel); MEAN stores the shifted mean.
            shift = tl.load(X + x_start).to(tl.float32)
            count = 0.0
            mean = 0.0
            m2 = 0.0
            for start in range(0, N, BLOCK_N):
                offs = start + cols
                ok = offs < N
                x = tl.where(ok, tl.load(X + x_start + offs, mask=ok, other=0.0).to(tl.float32) - shift, 0.0)
                chunk_count = tl.minimum(N - start, BLOCK_N).to(tl.float32)
                chunk_mean = tl.sum(x, axis=0) / chunk_count
                dev = tl.where(ok, x - chunk_mean, 0.0)
                chunk_m2 = tl.sum(dev * dev, axis=0)
                total = count + chunk_count
                delta = chunk_mean - mean
                mean = mean + delta * (chunk_count / total)
                m2 = m2 + chunk_m2 + delta * delta * (count * chunk_count / total)
                count = total
            rstd = tl.rsqrt(m2 / N + eps)
            tl.store(MEAN + row, mean)
        tl.store(RSTD + row, rstd)
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            ok = offs < N
            x = tl.load(X + x_start + offs, mask=ok, other=0.0).to(tl.float32)
            y = ((x - shift) - mean) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y = y + tl.load(B + offs, mask=ok, other=0.0).to(tl.float32)
            tl.store(Y + row * N + offs, y.to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def _norm_bwd_fused_kernel(
        X, DY, W, RSTD, DX, PARTIAL, DW, DB,
        n_rows, n_inner, stride_x_outer, stride_x_inner, stride_dy_outer, stride_dy_inner,
        N, tiles_per_program, db_offset,
        IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
        TWO_LEVEL_X: tl.constexpr, TWO_LEVEL_DY: tl.constexpr,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, PREFETCH: tl.constexpr, FINISH: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):
        """A persistent program walks `tiles_per_program` consecutive row tiles, writing dx and
        summing dweight/dbias in registers; its sums go to one row of the partial buffers
        (dweight's, then dbias's at db_offset). PREFETCH: load the next tile's x and dy before
        working on this one, so a program always has a tile's loads in flight while it
        reduces and stores (one tile of registers more). FINISH: the last program to finish
        also sums the partial rows into DW / DB (no second launch; see the end)."""
        MEAN = RSTD + n_rows
        DW_PARTIAL = PARTIAL
        DB_PARTIAL = PARTIAL + db_offset
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < N
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        first_tile = pid.to(tl.int64) * tiles_per_program
        if PREFETCH:
            # rows of this program's tiles: a prefetch past them (or past n_rows) loads nothing
            end_row = tl.minimum((first_tile + tiles_per_program) * ROWS, n_rows)
            rows_next = first_tile * ROWS + tl.arange(0, ROWS)
            mask_next = (rows_next < end_row)[:, None] & col_ok[None, :]
            x_next = tl.load(X + _row_offsets(rows_next, n_inner, stride_x_outer, stride_x_inner, TWO_LEVEL_X)[:, None]
                             + cols[None, :], mask=mask_next, other=0.0)
            dy_next = tl.load(DY + _row_offsets(rows_next, n_inner, stride_dy_outer, stride_dy_inner, TWO_LEVEL_DY)[:, None]
                              + cols[None, :], mask=mask_next, other=0.0)
        for step in range(0, tiles_per_program):
            tile = first_tile + step
            rows = tile * ROWS + tl.arange(0, ROWS)
            row_ok = rows < n_rows
            mask = row_ok[:, None] & col_ok[None, :]
            x_start = _row_offsets(rows, n_inner, stride_x_outer, stride_x_inner, TWO_LEVEL_X)
            if PREFETCH:
                x = x_next.to(tl.float32)
                dy = dy_next.to(tl.float32)
                rows_next = rows + ROWS
                mask_next = (rows_next < end_row)[:, None] & col_ok[None, :]
                x_next = tl.load(X + _row_offsets(rows_next, n_inner, stride_x_outer, stride_x_inner,
                                                  TWO_LEVEL_X)[:, None] + cols[None, :], mask=mask_next, other=0.0)
                dy_next = tl.load(DY + _row_offsets(rows_next, n_inner, stride_dy_outer, stride_dy_inner,
                                                    TWO_LEVEL_DY)[:, None] + cols[None, :], mask=mask_next, other=0.0)
            else:
                dy_start = _row_offsets(rows, n_inner, stride_dy_outer, stride_dy_inner, TWO_LEVEL_DY)
                x = tl.load(X + x_start[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + dy_start[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            if IS_RMS:
                xhat = x * rstd[:, None]
            else:
                mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
                shift = tl.load(X + x_start, mask=row_ok, other=0.0).to(tl.float32)
                xhat = tl.where(mask, ((x - shift[:, None]) - mean[:, None]) * rstd[:, None], 0.0)
            if HAS_WEIGHT:
                g = dy * w[None, :]
            else:
                g = dy
            # d/dx of xhat * rstd-scaling: dx = rstd * (g - mean(g) - xhat * mean(g * xhat));
            # RMSNorm has no centering, so no mean(g) term. LayerNorm's two row sums go through
            # one reduction (one exchange between warps instead of two).
            if IS_RMS:
                c1 = tl.sum(xhat * g, axis=1) / N
                dx = (g - xhat * c1[:, None]) * rstd[:, None]
            else:
                sum_gx, sum_g = tl.reduce((xhat * g, g), 1, _add_pair)
                c1 = sum_gx / N
                c2 = sum_g / N
                dx = (g - c2[:, None] - xhat * c1[:, None]) * rstd[:, None]
            tl.store(DX + rows[:, None] * N + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            if HAS_WEIGHT:
                dw_acc += dy * xhat
            if HAS_BIAS:
                db_acc += dy
        if HAS_WEIGHT:
            tl.store(DW_PARTIAL + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_ok)
        if HAS_BIAS:
            tl.store(DB_PARTIAL + pid * N + cols, tl.sum(db_acc, axis=0), mask=col_ok)
        if FINISH:
            # For short rows, where a training step's time is host time, one launch fewer:
            # programs count their arrivals on a counter in the statistics buffer (the slot
            # after them, zeroed by the forward) and the last to arrive sums every partial row
            # in program order (deterministic) and zeroes the counter again, so another
            # backward through the same forward (retain_graph, CUDA graph replays) starts at
            # zero. The barrier orders all of this program's partial stores before the
            # atomic; its release half publishes them at GPU scope and its acquire half orders
            # the last program's loads after every other program's stores.
            counter = (RSTD + (n_rows if IS_RMS else 2 * n_rows)).to(tl.pointer_type(tl.int32))
            tl.debug_barrier()
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == tl.num_programs(0) - 1:
                _sum_partials(PARTIAL, DW, DB, tl.num_programs(0), N, db_offset, cols, HAS_WEIGHT, HAS_BIAS,
                              BLOCK_P, BLOCK_N)
                tl.store(counter, 0)

    @triton.jit
    def _norm_bwd_row_stats_kernel(
        X, DY, W, RSTD, C1, C2,
        n_rows, n_inner, stride_x_outer, stride_x_inner, stride_dy_outer, stride_dy_inner, N,
        IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
        TWO_LEVEL_X: tl.constexpr, TWO_LEVEL_DY: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """Long rows, backward step 1: mean(g * xhat) and mean(g) of each row."""
        MEAN = RSTD + n_rows
        row = tl.program_id(0).to(tl.int64)
        x_start = _row_offsets(row, n_inner, stride_x_outer, stride_x_inner, TWO_LEVEL_X)
        dy_start = _row_offsets(row, n_inner, stride_dy_outer, stride_dy_inner, TWO_LEVEL_DY)
        rstd = tl.load(RSTD + row)
        if IS_RMS:
            mean = 0.0
            shift = 0.0
        else:
            mean = tl.load(MEAN + row)
            shift = tl.load(X + x_start).to(tl.float32)
        cols = tl.arange(0, BLOCK_N)
        acc_gx = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + cols
            ok = offs < N
            x = tl.load(X + x_start + offs, mask=ok, other=0.0).to(tl.float32)
            g = tl.load(DY + dy_start + offs, mask=ok, other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
            xhat = tl.where(ok, ((x - shift) - mean) * rstd, 0.0)
            acc_gx += g * xhat
            acc_g += g
        tl.store(C1 + row, tl.sum(acc_gx, axis=0) / N)
        if not IS_RMS:
            tl.store(C2 + row, tl.sum(acc_g, axis=0) / N)

    @triton.jit
    def _norm_bwd_columns_kernel(
        X, DY, W, RSTD, C1, C2, DX, PARTIAL,
        n_rows, n_inner, stride_x_outer, stride_x_inner, stride_dy_outer, stride_dy_inner,
        N, rows_per_program, db_offset,
        IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
        TWO_LEVEL_X: tl.constexpr, TWO_LEVEL_DY: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """Long rows, backward step 2: a program owns one column chunk of a group of rows, so
        its dweight/dbias partial sums stay in registers."""
        MEAN = RSTD + n_rows
        DW_PARTIAL = PARTIAL
        DB_PARTIAL = PARTIAL + db_offset
        pid_col = tl.program_id(0)
        pid_group = tl.program_id(1)
        offs = pid_col * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = offs < N
        if HAS_WEIGHT:
            w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        first = pid_group.to(tl.int64) * rows_per_program
        last = tl.minimum(first + rows_per_program, n_rows)
        for row in range(first, last):
            x_start = _row_offsets(row, n_inner, stride_x_outer, stride_x_inner, TWO_LEVEL_X)
            dy_start = _row_offsets(row, n_inner, stride_dy_outer, stride_dy_inner, TWO_LEVEL_DY)
            x = tl.load(X + x_start + offs, mask=ok, other=0.0).to(tl.float32)
            dy = tl.load(DY + dy_start + offs, mask=ok, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row)
            c1 = tl.load(C1 + row)
            if IS_RMS:
                xhat = x * rstd
            else:
                mean = tl.load(MEAN + row)
                shift = tl.load(X + x_start).to(tl.float32)
                xhat = tl.where(ok, ((x - shift) - mean) * rstd, 0.0)
            if HAS_WEIGHT:
                g = dy * w
            else:
                g = dy
            if IS_RMS:
                dx = (g - xhat * c1) * rstd
            else:
                c2 = tl.load(C2 + row)
                dx = (g - c2 - xhat * c1) * rstd
            tl.store(DX + row * N + offs, dx.to(DX.dtype.element_ty), mask=ok)
            if HAS_WEIGHT:
                dw_acc += dy * xhat
            if HAS_BIAS:
                db_acc += dy
        if HAS_WEIGHT:
            tl.store(DW_PARTIAL + pid_group.to(tl.int64) * N + offs, dw_acc, mask=ok)
        if HAS_BIAS:
            tl.store(DB_PARTIAL + pid_group.to(tl.int64) * N + offs, db_acc, mask=ok)

    @triton.jit
    def _sum_partials(PARTIAL, DW, DB, n_partials, N, db_offset, cols,
                      HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
        """dweight / dbias for `cols`: the per-program partial rows summed in a fixed order (so
        the result is deterministic), written in their own dtypes. The loads bypass L1: the
        rows were written by other programs of the same launch when the fused backward
        finishes the reduction itself."""
        col_ok = cols < N
        parts = tl.arange(0, BLOCK_P)
        dw_acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_partials, BLOCK_P):
            rows = start + parts
            mask = (rows < n_partials)[:, None] & col_ok[None, :]
            offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
            if HAS_WEIGHT:
                dw_acc += tl.load(PARTIAL + offsets, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                db_acc += tl.load(PARTIAL + db_offset + offsets, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_WEIGHT:
            tl.store(DW + cols, tl.sum(dw_acc, axis=0).to(DW.dtype.element_ty), mask=col_ok)
        if HAS_BIAS:
            tl.store(DB + cols, tl.sum(db_acc, axis=0).to(DB.dtype.element_ty), mask=col_ok)

    @triton.jit
    def _partial_sum_kernel(
        PARTIAL, DW, DB, n_partials, N, db_offset,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        """The second reduction, as its own launch (wide rows): one column block per program."""
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        _sum_partials(PARTIAL, DW, DB, n_partials, N, db_offset, cols, HAS_WEIGHT, HAS_BIAS, BLOCK_P, BLOCK_N)


# ----------------------------------------------------------------------------- row layout
@dataclasses.dataclass
class RowLayout:
    """How to find row r of a tensor: r = outer * n_inner + inner, at outer * stride_outer +
    inner * stride_inner elements, the row's N elements contiguous."""
    tensor: torch.Tensor
    n_rows: int
    n_inner: int
    stride_outer: int
    stride_inner: int

    @property
    def two_level(self) -> bool:
        return self.n_inner != self.n_rows


def row_layout(t: torch.Tensor, norm_ndim: int, n: Optional[int] = None) -> RowLayout:
    """Read the rows of `t` (the last `norm_ndim` dims normalised) through at most two leading
    strides; copy only when that cannot describe it. `n`: the row length, if known."""
    if n and t.is_contiguous():  # the common case, kept cheap: this runs on every call
        rows = t.numel() // n
        return RowLayout(t, rows, rows, 0, n)
    shape, strides = list(t.shape), list(t.stride())
    norm_shape, norm_strides = shape[len(shape) - norm_ndim:], strides[len(strides) - norm_ndim:]
    n = 1
    for size in norm_shape:
        n *= size
    expected, contiguous_rows = 1, True
    for size, stride in zip(reversed(norm_shape), reversed(norm_strides)):
        if size != 1 and stride != expected:
            contiguous_rows = False
        expected *= size
    lead = [(size, stride) for size, stride in zip(shape[:len(shape) - norm_ndim],
                                                   strides[:len(strides) - norm_ndim]) if size != 1]
    # Merge leading dims, innermost first, while they are evenly spaced.
    groups: List[List[int]] = []  # [size, stride]
    for size, stride in reversed(lead):
        if groups and stride == groups[-1][0] * groups[-1][1]:
            groups[-1][0] *= size
        else:
            groups.append([size, stride])
    n_rows = 1
    for size, _ in lead:
        n_rows *= size
    if not contiguous_rows or len(groups) > 2:
        t = t.contiguous()
        return RowLayout(t, n_rows, n_rows, 0, n)
    if not groups:
        return RowLayout(t, n_rows, n_rows, 0, n)
    if len(groups) == 1:
        return RowLayout(t, n_rows, n_rows, 0, groups[0][1])
    inner, outer = groups
    return RowLayout(t, n_rows, inner[0], outer[1], inner[1])


# ----------------------------------------------------------------------------- launchers
def _hidden(x: torch.Tensor, norm_ndim: int) -> int:
    n = 1
    for size in x.shape[x.dim() - norm_ndim:]:
        n *= size
    return n


# Launches prepared per call signature (shape, strides, dtypes, flags), as for attention: a
# training loop repeats a few, and at small sizes (hidden 128) the per-call Python decides the
# step time. Only calls that read their tensors in place (no copy for the row layout) and use
# the shipped configs are kept.
_PLANS = PlanCache()


def norm_forward(x: torch.Tensor, norm_ndim: int, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 eps: float, is_rms: bool, config: Optional[NormConfig] = None):
    """y (x's shape and dtype, contiguous) and stats: fp32 [rstd per row | (LayerNorm) mean of
    x - x[row, 0] per row | the backward's arrival counter, zeroed], what the backward reads."""
    key = None
    if config is None:
        key = ("fwd", x.shape, x.stride(), x.dtype, x.device, norm_ndim, None if weight is None else weight.dtype,
               None if bias is None else bias.dtype, eps, is_rms)
        plan = _PLANS.get(key)
        if plan is not None:
            run, stats_template, contiguous = plan
            y = torch.empty_like(x) if contiguous else torch.empty(x.shape, dtype=x.dtype, device=x.device)
            stats = torch.empty_like(stats_template)
            run(x, y, stats if weight is None else weight, stats if bias is None else bias, stats)
            return y, stats
    n = _hidden(x, norm_ndim)
    layout = row_layout(x, norm_ndim, n)
    n_rows = layout.n_rows
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # One allocation for both statistics and the counter: every call costs host time at small sizes.
    stats = torch.empty((n_rows if is_rms else 2 * n_rows) + 1, dtype=torch.float32, device=x.device)
    if n_rows == 0 or n == 0:
        return y, stats
    cfg = config or norm_config(n, False)
    w = weight if weight is not None else stats  # a placeholder pointer, never read
    b = bias if bias is not None else stats
    common = dict(IS_RMS=is_rms, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                  TWO_LEVEL=layout.two_level, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    scalars = (n_rows, layout.n_inner, layout.stride_outer, layout.stride_inner, n, float(eps))
    if cfg.looped:
        run = PreparedLaunch(_norm_fwd_looped_kernel, (n_rows,), scalars, **common)
    else:
        run = PreparedLaunch(_norm_fwd_fused_kernel, (cdiv(n_rows, cfg.rows),), scalars, ROWS=cfg.rows, **common)
    run(layout.tensor, y, w, b, stats)
    if key is not None and layout.tensor is x:
        _PLANS.keep(key, (run, allocation_template(stats.numel(), torch.float32, x.device), x.is_contiguous()))
    return y, stats


def norm_backward(dy: torch.Tensor, x: torch.Tensor, norm_ndim: int, weight: Optional[torch.Tensor],
                  bias_dtype: Optional[torch.dtype], stats: torch.Tensor, is_rms: bool,
                  config: Optional[NormConfig] = None):
    """dx (x's shape and dtype), dweight (weight's shape and dtype, or None) and dbias (of
    `bias_dtype`, or None when there is no bias). `stats` come from norm_forward on x; they hold
    the arrival counter of the one-launch reduction, so backward calls on the same stats must be
    ordered on one stream (autograd runs a node's backward on its forward's stream)."""
    key = None
    if config is None:
        key = ("bwd", x.shape, x.stride(), dy.stride(), x.dtype, dy.dtype, x.device, norm_ndim,
               None if weight is None else weight.dtype, None if weight is None else weight.stride(),
               bias_dtype, is_rms)
        plan = _PLANS.get(key)
        if plan is not None:
            fused, summed, partial_template, db_template, contiguous = plan
            dx = torch.empty_like(x) if contiguous else torch.empty(x.shape, dtype=x.dtype, device=x.device)
            dw = None if weight is None else torch.empty_like(weight)
            db = None if db_template is None else torch.empty_like(db_template)
            partial = torch.empty_like(partial_template)
            placeholder = partial  # pointer arguments the kernels do not use
            dw_arg = placeholder if dw is None else dw
            db_arg = placeholder if db is None else db
            fused(x, dy, stats if weight is None else weight, stats, dx, partial, dw_arg, db_arg)
            if summed is not None:
                summed(partial, dw_arg, db_arg)
            return dx, dw, db
    n = _hidden(x, norm_ndim)
    x_layout = row_layout(x, norm_ndim, n)
    dy_layout = row_layout(dy, norm_ndim, n)
    n_rows = x_layout.n_rows
    if x_layout.two_level and dy_layout.two_level and x_layout.n_inner != dy_layout.n_inner:
        # Both need two levels but split the rows differently: one shared split is needed.
        dy_layout = row_layout(dy.contiguous(), norm_ndim, n)
    # A one-level layout ignores n_inner (row r sits at r * stride_inner).
    n_inner = x_layout.n_inner if x_layout.two_level else dy_layout.n_inner
    two_x, two_dy = x_layout.two_level, dy_layout.two_level
    has_weight, has_bias = weight is not None, bias_dtype is not None
    norm_shape = x.shape[x.dim() - norm_ndim:]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # dweight is cheap next to dx: it is computed whenever there is a weight (one kernel variant).
    dw = torch.empty(norm_shape, dtype=weight.dtype, device=x.device) if has_weight else None
    db = torch.empty(norm_shape, dtype=bias_dtype, device=x.device) if has_bias else None
    if n_rows == 0 or n == 0:
        for grad in (dw, db):
            if grad is not None:
                grad.zero_()
        return dx, dw, db
    cfg = config or norm_config(n, True)
    w = weight if has_weight else stats
    flags = dict(IS_RMS=is_rms, HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, TWO_LEVEL_X=two_x, TWO_LEVEL_DY=two_dy,
                 BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    finish = False
    if not cfg.looped:
        n_tiles = cdiv(n_rows, cfg.rows)
        programs = min(n_tiles, _program_count(x.device, cfg.programs_per_sm))
        tiles_per_program = cdiv(n_tiles, programs)
        programs = cdiv(n_tiles, tiles_per_program)
        partial, db_offset = _partials(programs, n, has_weight, has_bias, x.device)
        finish = cfg.finish and (has_weight or has_bias)
        fused = PreparedLaunch(_norm_bwd_fused_kernel, (programs,), (
            n_rows, n_inner, x_layout.stride_outer, x_layout.stride_inner,
            dy_layout.stride_outer, dy_layout.stride_inner, n, tiles_per_program, db_offset),
            ROWS=cfg.rows, PREFETCH=cfg.prefetch, FINISH=finish, BLOCK_P=SUM_BLOCK_P, **flags)
        fused(x_layout.tensor, dy_layout.tensor, w, stats, dx, partial,
              dw if has_weight else partial, db if has_bias else partial)
    else:
        row_stats = torch.empty(n_rows if is_rms else 2 * n_rows, dtype=torch.float32, device=x.device)
        c1, c2 = row_stats, row_stats[n_rows:] if not is_rms else row_stats
        stats_flags = {k: v for k, v in flags.items() if k != "HAS_BIAS"}
        launch(_norm_bwd_row_stats_kernel, (n_rows,), (
            x_layout.tensor, dy_layout.tensor, w, stats, c1, c2,
            n_rows, n_inner, x_layout.stride_outer, x_layout.stride_inner,
            dy_layout.stride_outer, dy_layout.stride_inner, n), **stats_flags)
        column_blocks = cdiv(n, cfg.block_n)
        groups = max(1, min(n_rows, cdiv(_program_count(x.device, cfg.programs_per_sm), column_blocks)))
        rows_per_program = cdiv(n_rows, groups)
        groups = cdiv(n_rows, rows_per_program)
        partial, db_offset = _partials(groups, n, has_weight, has_bias, x.device)
        programs = groups
        launch(_norm_bwd_columns_kernel, (column_blocks, groups), (
            x_layout.tensor, dy_layout.tensor, w, stats, c1, c2, dx, partial,
            n_rows, n_inner, x_layout.stride_outer, x_layout.stride_inner,
            dy_layout.stride_outer, dy_layout.stride_inner, n, rows_per_program, db_offset), **flags)
    summed = None
    if (has_weight or has_bias) and not finish:
        # The second reduction, over the per-program partial sums in a fixed order: deterministic.
        summed = PreparedLaunch(_partial_sum_kernel, (cdiv(n, SUM_BLOCK_N),), (programs, n, db_offset),
                                HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, BLOCK_P=SUM_BLOCK_P,
                                BLOCK_N=SUM_BLOCK_N, num_warps=4)
        summed(partial, dw if has_weight else partial, db if has_bias else partial)
    if (key is not None and not cfg.looped and x_layout.tensor is x and dy_layout.tensor is dy
            and (weight is None or weight.is_contiguous())):
        _PLANS.keep(key, (fused, summed, allocation_template(partial.numel(), torch.float32, x.device),
                          None if db is None else allocation_template(norm_shape, bias_dtype, x.device), x.is_contiguous()))
    return dx, dw, db


SUM_BLOCK_P, SUM_BLOCK_N = 16, 128


def _partials(programs: int, n: int, has_weight: bool, has_bias: bool, device) -> Tuple[torch.Tensor, int]:
    """One fp32 buffer for the dweight and dbias partial rows; dbias's start at the offset."""
    count = int(has_weight) + int(has_bias)
    partial = torch.empty(max(count, 1) * programs * n if count else 1, dtype=torch.float32, device=device)
    return partial, (programs * n if has_weight else 0)


# ----------------------------------------------------------------------------- autograd
def _normalized_ndim(normalized_shape) -> int:
    return 1 if isinstance(normalized_shape, int) else len(tuple(normalized_shape))


def _run(x, weight, bias, norm_ndim, eps, is_rms):
    # The kernels index weight and bias as contiguous; a strided view (a column of a matrix)
    # is copied once (autograd carries its gradient back through the copy).
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return norm_forward(x, norm_ndim, weight, bias, eps, is_rms)[0]  # no autograd node to build
    return _NormApply.apply(x, weight, bias, (norm_ndim, eps, is_rms))


class _NormApply(torch.autograd.Function):
    """y = norm(x) * weight + bias with Triton forward and backward. The non-tensor arguments
    come as one tuple: autograd's Python layer costs per argument, on every call."""

    @staticmethod
    def forward(ctx, x, weight, bias, spec):
        norm_ndim, eps, is_rms = spec
        y, stats = norm_forward(x, norm_ndim, weight, bias, eps, is_rms)
        ctx.save_for_backward(x, weight, stats)
        ctx.norm_ndim, ctx.is_rms = norm_ndim, is_rms
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, stats = ctx.saved_tensors
        dx, dw, db = norm_backward(dy, x, ctx.norm_ndim, weight, ctx.bias_dtype, stats, ctx.is_rms)
        needs = ctx.needs_input_grad
        return (dx if needs[0] else None), (dw if needs[1] else None), (db if needs[2] else None), None


# ----------------------------------------------------------------------------- backends
def triton_rms_norm(x, normalized_shape, weight=None, eps=None):
    # eps=None: what F.rms_norm's kernels use (the op-math dtype's eps), not finfo(x.dtype).
    eps = default_rms_eps(x.dtype) if eps is None else eps
    return _run(x, weight, None, _normalized_ndim(normalized_shape), eps, True)


def triton_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _run(x, weight, bias, _normalized_ndim(normalized_shape), eps, False)


# The forward/backward split the torch.library ops call (gpuparity.ops.library): a compiled graph
# saves the statistics and runs the fused backward, as the autograd.Function above does eagerly.
def _contiguous(param: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return param if param is None or param.is_contiguous() else param.contiguous()


def _rms_forward_saving(x, normalized_shape, weight, eps):
    eps = default_rms_eps(x.dtype) if eps is None else eps
    y, stats = norm_forward(x, _normalized_ndim(normalized_shape), _contiguous(weight), None, eps, True)
    return y, (stats,)


def _rms_backward_from(dy, saved, x, normalized_shape, weight, eps):
    weight = _contiguous(weight)
    dx, dw, _ = norm_backward(dy, x, _normalized_ndim(normalized_shape), weight, None, saved[0], True)
    return dx, dw


def _ln_forward_saving(x, normalized_shape, weight, bias, eps):
    y, stats = norm_forward(x, _normalized_ndim(normalized_shape), _contiguous(weight), _contiguous(bias), eps, False)
    return y, (stats,)


def _ln_backward_from(dy, saved, x, normalized_shape, weight, bias, eps):
    weight = _contiguous(weight)
    dx, dw, db = norm_backward(dy, x, _normalized_ndim(normalized_shape), weight,
                               None if bias is None else bias.dtype, saved[0], False)
    return dx, dw, db


for _op, _fn, _what, _saving, _from in (
        ("rms_norm", triton_rms_norm, "RMSNorm", _rms_forward_saving, _rms_backward_from),
        ("layer_norm", triton_layer_norm, "LayerNorm", _ln_forward_saving, _ln_backward_from)):
    register(Backend(
        name="triton", op=_op, fn=_fn,
        description=f"gpuparity's fused Triton {_what} (fp32 statistics, forward and backward)",
        dtypes=KERNEL_DTYPES, availability=availability, supports=problem_reasons, jit=True,
        forward_saving=_saving, backward_from=_from))


# ----------------------------------------------------------------------------- AOT
# Representative cases: a packed small row (many rows per program), the largest fused row (most
# warps and registers; RMSNorm and LayerNorm differ in code there) and one looped long row.
# Hidden sizes in between share these tiles' warp counts and per-thread work.
AOT_CASES = (("ln", 128), ("rms", 16384), ("ln", 16384), ("ln", 65536))


def aot_specs() -> List[AotSpec]:
    """Every shipped configuration family, bf16, with weight (and bias for LayerNorm)."""
    if triton is None:
        return []
    specs: List[AotSpec] = []
    for fam, spec in FAMILIES.items():
        for name, n in AOT_CASES:
            is_rms = name == "rms"
            flags = {"IS_RMS": is_rms, "HAS_WEIGHT": True, "HAS_BIAS": not is_rms}
            for backward in (False, True):
                cfg = norm_config(n, backward=backward, fam=fam)
                specs.extend(_aot_for(fam, name, n, cfg, backward, flags, spec["targets"]))
        sum_const = {"HAS_WEIGHT": True, "HAS_BIAS": True, "BLOCK_P": SUM_BLOCK_P, "BLOCK_N": SUM_BLOCK_N}
        sum_sig = {"PARTIAL": "*fp32", "DW": "*bf16", "DB": "*bf16", "n_partials": "i32", "N": "i32",
                   "db_offset": "i32", **{k: "constexpr" for k in sum_const}}
        specs.append(AotSpec(f"{fam}:partial-sum", _partial_sum_kernel, sum_sig, sum_const, num_warps=4,
                             targets=spec["targets"]))
    return specs


def _aot_for(fam, name, n, cfg, backward, flags, targets) -> List[AotSpec]:
    ptr, f32 = "*bf16", "*fp32"
    tag = f"{fam}:{name}-{'bwd' if backward else 'fwd'}-n{n}"
    if not backward:
        sig = {"X": ptr, "Y": ptr, "W": ptr, "B": ptr, "RSTD": f32, "n_rows": "i64",
               "n_inner": "i64", "stride_x_outer": "i64", "stride_x_inner": "i64", "N": "i32", "eps": "fp32"}
        const = dict(flags, TWO_LEVEL=True, BLOCK_N=cfg.block_n)
        if cfg.looped:
            kernel = _norm_fwd_looped_kernel
        else:
            kernel, const["ROWS"] = _norm_fwd_fused_kernel, cfg.rows
        sig.update({k: "constexpr" for k in const})
        return [AotSpec(tag, kernel, sig, const, num_warps=cfg.num_warps, targets=targets)]
    strides = {"stride_x_outer": "i64", "stride_x_inner": "i64", "stride_dy_outer": "i64", "stride_dy_inner": "i64"}
    if not cfg.looped:
        sig = {"X": ptr, "DY": ptr, "W": ptr, "RSTD": f32, "DX": ptr, "PARTIAL": f32, "DW": ptr, "DB": ptr,
               "n_rows": "i64", "n_inner": "i64", **strides, "N": "i32", "tiles_per_program": "i32",
               "db_offset": "i32"}
        const = dict(flags, TWO_LEVEL_X=True, TWO_LEVEL_DY=True, BLOCK_N=cfg.block_n, ROWS=cfg.rows,
                     PREFETCH=cfg.prefetch, FINISH=cfg.finish, BLOCK_P=SUM_BLOCK_P)
        sig.update({k: "constexpr" for k in const})
        return [AotSpec(tag, _norm_bwd_fused_kernel, sig, const, num_warps=cfg.num_warps, targets=targets)]
    stats_sig = {"X": ptr, "DY": ptr, "W": ptr, "RSTD": f32, "C1": f32, "C2": f32,
                 "n_rows": "i64", "n_inner": "i64", **strides, "N": "i32"}
    stats_const = {"IS_RMS": flags["IS_RMS"], "HAS_WEIGHT": True, "TWO_LEVEL_X": True, "TWO_LEVEL_DY": True,
                   "BLOCK_N": cfg.block_n}
    stats_sig.update({k: "constexpr" for k in stats_const})
    col_sig = {"X": ptr, "DY": ptr, "W": ptr, "RSTD": f32, "C1": f32, "C2": f32, "DX": ptr,
               "PARTIAL": f32, "n_rows": "i64", "n_inner": "i64", **strides,
               "N": "i32", "rows_per_program": "i32", "db_offset": "i32"}
    col_const = dict(flags, TWO_LEVEL_X=True, TWO_LEVEL_DY=True, BLOCK_N=cfg.block_n)
    col_sig.update({k: "constexpr" for k in col_const})
    return [AotSpec(tag + "-stats", _norm_bwd_row_stats_kernel, stats_sig, stats_const,
                    num_warps=cfg.num_warps, targets=targets),
            AotSpec(tag + "-columns", _norm_bwd_columns_kernel, col_sig, col_const,
                    num_warps=cfg.num_warps, targets=targets)]
