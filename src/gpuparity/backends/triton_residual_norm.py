"""The fused residual add + RMSNorm / LayerNorm (op "residual_norm") in Triton: one forward
kernel that reads x and the residual, writes new_residual (in its dtype), the normalized output
and the per-row statistics; one backward kernel that writes d(new_residual) into the gradients
of x and of the residual (each in its own dtype) with grad_new_residual added, and sums dweight
/ dbias per program; the fixed-order partial-sum launch of backends/triton_norms.py finishes
those (deterministic). Registered as the "triton" backend of op "residual_norm".

The norm is taken of new_residual as stored (rounded to its dtype), so the backward can
recompute it from the tensor it saved; statistics are fp32, LayerNorm's mean kept relative to
the row's first element (exact for huge-mean rows, as in triton_norms). A row is held whole in
registers (up to MAX_N columns); rows are read through up to two leading strides (a sliced or
transposed x needs no copy); offsets are 64-bit. Portable: no NVIDIA-only instruction, warp
counts a power of two within every family's limit (triton_norms.FAMILIES: wave64 CDNA too).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..numerics import default_rms_eps
from ..registry import Backend, register
from . import triton_common
from .triton_common import AotSpec, availability, cdiv, launch, next_pow2, problem_reasons
from . import triton_norms
from .triton_norms import FAMILIES, SUM_BLOCK_N, SUM_BLOCK_P, _partials, _program_count, _warps, row_layout

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton: the backend says so through availability()
    triton = None
    tl = None

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_N = 16384          # the widest row one program holds in registers
TILE_ELEMS = 4096      # elements per program tile (rows x block_n), forward and backward
ELEMS_PER_THREAD = 16
BWD_PROGRAMS_PER_SM = 2   # persistent backward programs per SM / CU


def tile(n: int, fam: Optional[str] = None) -> Tuple[int, int, int]:
    """(block_n, rows per tile, num_warps) for rows of n columns on a tile family."""
    spec = FAMILIES[fam or triton_common.tile_family()]
    block = next_pow2(max(n, 1))
    rows = max(1, TILE_ELEMS // block)
    return block, rows, _warps(rows * block, ELEMS_PER_THREAD, spec)


# ----------------------------------------------------------------------------- kernels
if triton is not None:
    # the norms' jit helper, defined there only where triton imports
    from .triton_norms import _row_offsets

    @triton.jit
    def _residual_norm_fwd_kernel(
        X, RES, W, B, Y, NEW_RES, STATS,
        n_rows, x_inner, x_outer_stride, x_inner_stride, r_inner, r_outer_stride, r_inner_stride, N, eps, ROWSCALE,
        IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
        TWO_LEVEL_X: tl.constexpr, TWO_LEVEL_R: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
        HAS_ROWSCALE: tl.constexpr = False, ZERO_CENTERED: tl.constexpr = False,
    ):
        """ROWS rows per program: s = x (* rowscale[row], in fp32) + residual rounded to
        NEW_RES's dtype and stored; the norm of that s, times weight (+ 1 when ZERO_CENTERED)
        (+ bias), stored in Y's dtype. STATS: rstd per row, then (LayerNorm) the mean of
        s - s[row, 0] per row."""
        eps = tl.cast(eps, tl.float32)  # fp64 when torch.compile's code passes it
        pid = tl.program_id(0).to(tl.int64)
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < n_rows
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        x_start = _row_offsets(rows, x_inner, x_outer_stride, x_inner_stride, TWO_LEVEL_X)
        s = tl.load(X + x_start[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_ROWSCALE:
            s *= tl.load(ROWSCALE + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        if HAS_RESIDUAL:
            r_start = _row_offsets(rows, r_inner, r_outer_stride, r_inner_stride, TWO_LEVEL_R)
            s += tl.load(RES + r_start[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        s = s.to(NEW_RES.dtype.element_ty)   # rounded to nearest even
        out_offsets = rows[:, None] * N + cols[None, :]
        tl.store(NEW_RES + out_offsets, s, mask=mask)
        s = s.to(tl.float32)
        if IS_RMS:
            rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
            xhat = s * rstd[:, None]
        else:
            shift = tl.sum(tl.where(cols[None, :] == 0, s, 0.0), axis=1)   # the row's first element
            shifted = tl.where(mask, s - shift[:, None], 0.0)
            mean = tl.sum(shifted, axis=1) / N
            centered = tl.where(mask, shifted - mean[:, None], 0.0)
            rstd = tl.rsqrt(tl.sum(centered * centered, axis=1) / N + eps)
            xhat = centered * rstd[:, None]
            tl.store(STATS + n_rows + rows, mean, mask=row_ok)
        tl.store(STATS + rows, rstd, mask=row_ok)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            w += 1.0
        y = xhat * w[None, :]
        if HAS_BIAS:
            y += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + out_offsets, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _bwd_tile_loads(S, DY, DRES_IN, rows, end_row, cols, col_ok, N, dy_inner, dy_outer_stride, dy_inner_stride,
                        g_inner, g_outer_stride, g_inner_stride, HAS_DRES_IN: tl.constexpr,
                        TWO_LEVEL_DY: tl.constexpr, TWO_LEVEL_G: tl.constexpr):
        """One row tile's s, dy and grad_new_residual, as stored (rows from end_row on read nothing)."""
        mask = (rows < end_row)[:, None] & col_ok[None, :]
        s = tl.load(S + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
        dy_start = _row_offsets(rows, dy_inner, dy_outer_stride, dy_inner_stride, TWO_LEVEL_DY)
        dy = tl.load(DY + dy_start[:, None] + cols[None, :], mask=mask, other=0.0)
        gres = dy   # a placeholder without grad_new_residual, never read
        if HAS_DRES_IN:
            g_start = _row_offsets(rows, g_inner, g_outer_stride, g_inner_stride, TWO_LEVEL_G)
            gres = tl.load(DRES_IN + g_start[:, None] + cols[None, :], mask=mask, other=0.0)
        return s, dy, gres

    @triton.jit
    def _residual_norm_bwd_kernel(
        S, DY, DRES_IN, W, STATS, DX, DRES, PARTIAL, ROWSCALE,
        n_rows, dy_inner, dy_outer_stride, dy_inner_stride, g_inner, g_outer_stride, g_inner_stride,
        N, tiles_per_program, db_offset,
        IS_RMS: tl.constexpr, HAS_DRES_IN: tl.constexpr, STORE_DRES: tl.constexpr, HAS_BIAS: tl.constexpr,
        TWO_LEVEL_DY: tl.constexpr, TWO_LEVEL_G: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
        HAS_ROWSCALE: tl.constexpr = False, ZERO_CENTERED: tl.constexpr = False,
    ):
        """A persistent program walks `tiles_per_program` row tiles: ds = d norm(s) / ds . dy
        (+ grad_new_residual), written as dx (DX's dtype; times rowscale[row] with HAS_ROWSCALE)
        and, STORE_DRES, as the residual's gradient (DRES's dtype); dweight / dbias summed in
        registers into one partial row each.
        (Loading the next tile before working on this one, as triton_norms' backward does, gave
        no gain measurable above the noise on an H100: not done.)"""
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            w += 1.0
        dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        first_tile = pid.to(tl.int64) * tiles_per_program
        end_row = tl.minimum((first_tile + tiles_per_program) * ROWS, n_rows)
        for step in range(0, tiles_per_program):
            rows = (first_tile + step) * ROWS + tl.arange(0, ROWS)
            row_ok = rows < end_row
            mask = row_ok[:, None] & col_ok[None, :]
            s, dy, gres = _bwd_tile_loads(S, DY, DRES_IN, rows, end_row, cols, col_ok, N, dy_inner, dy_outer_stride,
                                          dy_inner_stride, g_inner, g_outer_stride, g_inner_stride, HAS_DRES_IN,
                                          TWO_LEVEL_DY, TWO_LEVEL_G)
            s = s.to(tl.float32)
            dy = dy.to(tl.float32)
            rstd = tl.load(STATS + rows, mask=row_ok, other=0.0)
            g = dy * w[None, :]
            if IS_RMS:
                xhat = s * rstd[:, None]
                c1 = tl.sum(xhat * g, axis=1) / N
                ds = (g - xhat * c1[:, None]) * rstd[:, None]
            else:
                mean = tl.load(STATS + n_rows + rows, mask=row_ok, other=0.0)
                shift = tl.sum(tl.where(cols[None, :] == 0, s, 0.0), axis=1)   # the row's first element
                xhat = tl.where(mask, ((s - shift[:, None]) - mean[:, None]) * rstd[:, None], 0.0)
                c1 = tl.sum(xhat * g, axis=1) / N
                c2 = tl.sum(g, axis=1) / N
                ds = (g - c2[:, None] - xhat * c1[:, None]) * rstd[:, None]
            if HAS_DRES_IN:
                ds += gres.to(tl.float32)
            offsets = rows[:, None] * N + cols[None, :]
            if STORE_DRES:
                tl.store(DRES + offsets, ds.to(DRES.dtype.element_ty), mask=mask)
            if HAS_ROWSCALE:
                ds *= tl.load(ROWSCALE + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(DX + offsets, ds.to(DX.dtype.element_ty), mask=mask)
            dw_acc += dy * xhat
            if HAS_BIAS:
                db_acc += dy
        tl.store(PARTIAL + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_ok)
        if HAS_BIAS:
            tl.store(PARTIAL + db_offset + pid * N + cols, tl.sum(db_acc, axis=0), mask=col_ok)


# ----------------------------------------------------------------------------- launchers
def _two_layouts(a: torch.Tensor, b: Optional[torch.Tensor], n: int):
    """Row layouts of a and b (None: a's stands in); b copied when both need two levels split
    differently (the kernels take one row count, each tensor its own strides)."""
    la = row_layout(a, 1, n)
    if b is None:
        return la, la
    lb = row_layout(b, 1, n)
    return la, lb


def residual_norm_forward(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                          bias: Optional[torch.Tensor], eps: float, is_rms: bool, residual_dtype: torch.dtype,
                          rowscale: Optional[torch.Tensor] = None, zero_centered_weight: bool = False,
                          out_dtype: Optional[torch.dtype] = None):
    """(out in out_dtype (None: x's dtype), new_residual in residual_dtype, both contiguous of
    x's shape, stats: fp32 [rstd per row | (LayerNorm) shifted mean per row]). rowscale: one
    factor per row of x (x's shape without its last dimension), applied to x before the add."""
    n = x.shape[-1]
    n_rows = x.numel() // n if n else 0
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    new_residual = torch.empty(x.shape, dtype=residual_dtype, device=x.device)
    stats = torch.empty(n_rows if is_rms else 2 * n_rows, dtype=torch.float32, device=x.device)
    if n_rows == 0 or n == 0:
        return out, new_residual, stats
    lx, lr = _two_layouts(x, residual, n)
    block, rows, warps = tile(n)
    weight = weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    scale = None if rowscale is None else rowscale.reshape(-1).contiguous()
    launch(_residual_norm_fwd_kernel, (cdiv(n_rows, rows),), (
        lx.tensor, lr.tensor, weight, weight if bias is None else bias, out, new_residual, stats,
        n_rows, lx.n_inner, lx.stride_outer, lx.stride_inner, lr.n_inner, lr.stride_outer, lr.stride_inner,
        n, float(eps), stats if scale is None else scale),
        IS_RMS=is_rms, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None,
        TWO_LEVEL_X=lx.two_level, TWO_LEVEL_R=lr.two_level, BLOCK_N=block, ROWS=rows,
        HAS_ROWSCALE=scale is not None, ZERO_CENTERED=bool(zero_centered_weight), num_warps=warps)
    return out, new_residual, stats


def residual_norm_backward(grad_out: Optional[torch.Tensor], grad_new_residual: Optional[torch.Tensor],
                           new_residual: torch.Tensor, weight: torch.Tensor, stats: torch.Tensor, is_rms: bool,
                           x_dtype: torch.dtype, residual_dtype: Optional[torch.dtype], has_bias: bool,
                           alias: bool = False, rowscale: Optional[torch.Tensor] = None,
                           zero_centered_weight: bool = False):
    """(dx in x_dtype, dresidual in residual_dtype or None when there was no residual, dweight
    in weight's dtype, dbias in weight's dtype or None). A missing grad_out counts as zeros.
    alias: where residual_dtype is x_dtype (and no rowscale), dresidual is dx itself (one write
    fewer; autograd takes one tensor as two inputs' gradients, as for a + b; a custom op's
    outputs may not). rowscale: the forward's; dx is scaled by it (rowscale gets no gradient)."""
    n = new_residual.shape[-1]
    n_rows = new_residual.numel() // n if n else 0
    shape, device = new_residual.shape, new_residual.device
    if grad_out is None:
        grad_out = torch.zeros(shape, dtype=x_dtype, device=device)
    dx = torch.empty(shape, dtype=x_dtype, device=device)
    shared = alias and residual_dtype == x_dtype and rowscale is None
    dres = None if residual_dtype is None or shared else torch.empty(shape, dtype=residual_dtype, device=device)
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=device)
    db = torch.empty(weight.shape, dtype=weight.dtype, device=device) if has_bias else None
    if n_rows == 0 or n == 0:
        for grad in (dw, db):
            if grad is not None:
                grad.zero_()
        return dx, (dx if shared else dres), dw, db
    ldy, lg = _two_layouts(grad_out, grad_new_residual, n)
    block, rows, warps = tile(n)
    n_tiles = cdiv(n_rows, rows)
    programs = min(n_tiles, _program_count(device, BWD_PROGRAMS_PER_SM))
    tiles_per_program = cdiv(n_tiles, programs)
    programs = cdiv(n_tiles, tiles_per_program)
    partial, db_offset = _partials(programs, n, True, has_bias, device)
    scale = None if rowscale is None else rowscale.reshape(-1).contiguous()
    launch(_residual_norm_bwd_kernel, (programs,), (
        new_residual, ldy.tensor, lg.tensor, weight.contiguous(), stats, dx, dx if dres is None else dres, partial,
        stats if scale is None else scale,
        n_rows, ldy.n_inner, ldy.stride_outer, ldy.stride_inner, lg.n_inner, lg.stride_outer, lg.stride_inner,
        n, tiles_per_program, db_offset),
        IS_RMS=is_rms, HAS_DRES_IN=grad_new_residual is not None, STORE_DRES=dres is not None, HAS_BIAS=has_bias,
        TWO_LEVEL_DY=ldy.two_level, TWO_LEVEL_G=lg.two_level, BLOCK_N=block, ROWS=rows,
        HAS_ROWSCALE=scale is not None, ZERO_CENTERED=bool(zero_centered_weight), num_warps=warps)
    # triton_norms defines its kernels only where triton imports (as this module does)
    launch(triton_norms._partial_sum_kernel, (cdiv(n, SUM_BLOCK_N),),
           (partial, dw, partial if db is None else db, programs, n, db_offset),
           HAS_WEIGHT=True, HAS_BIAS=has_bias, BLOCK_P=SUM_BLOCK_P, BLOCK_N=SUM_BLOCK_N, num_warps=4)
    return dx, (dx if shared else dres), dw, db


# ----------------------------------------------------------------------------- autograd
def _resolve(x, residual, eps, norm, residual_in_fp32):
    """(eps, is_rms, new_residual's dtype) as the contract defines them (contracts/residual_norm.py:
    eps=None is rms_norm's / layer_norm's default; float32 under residual_in_fp32, else the
    residual's dtype, else x's)."""
    if eps is None:
        eps = default_rms_eps(x.dtype) if norm == "rms" else 1e-5
    dtype = torch.float32 if residual_in_fp32 else (x.dtype if residual is None else residual.dtype)
    return float(eps), norm == "rms", dtype


class _ResidualNormApply(torch.autograd.Function):
    """(out, new_residual) with the Triton forward and backward; saves new_residual (the
    stored sum), weight, rowscale and the row statistics, not x or the residual."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, rowscale, spec):
        eps, is_rms, residual_dtype, zero_centered, out_dtype = spec
        out, new_residual, stats = residual_norm_forward(x, residual, weight, bias, eps, is_rms, residual_dtype,
                                                         rowscale, zero_centered, out_dtype)
        ctx.save_for_backward(new_residual, weight, stats, rowscale)
        ctx.meta = (is_rms, x.dtype, None if residual is None else residual.dtype, bias is not None,
                    None if bias is None else bias.dtype, zero_centered)
        ctx.set_materialize_grads(False)
        return out, new_residual

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_new_residual):
        new_residual, weight, stats, rowscale = ctx.saved_tensors
        is_rms, x_dtype, residual_dtype, has_bias, bias_dtype, zero_centered = ctx.meta
        dx, dres, dw, db = residual_norm_backward(grad_out, grad_new_residual, new_residual, weight, stats, is_rms,
                                                  x_dtype, residual_dtype, has_bias, alias=True, rowscale=rowscale,
                                                  zero_centered_weight=zero_centered)
        if db is not None and db.dtype != bias_dtype:
            db = db.to(bias_dtype)
        needs = ctx.needs_input_grad
        return (dx if needs[0] else None, dres if needs[1] else None, dw if needs[2] else None,
                db if needs[3] else None, None, None)


def triton_residual_norm(x, residual, weight, bias=None, eps=None, norm="rms", residual_in_fp32=False,
                         rowscale=None, zero_centered_weight=False, out_dtype=None):
    spec = _resolve(x, residual, eps, norm, residual_in_fp32) + (bool(zero_centered_weight), out_dtype)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (x, residual, weight, bias)):
        return residual_norm_forward(x, residual, weight, bias, *spec[:3], rowscale, *spec[3:])[:2]   # no node
    return _ResidualNormApply.apply(x, residual, weight, bias, None if rowscale is None else rowscale.detach(), spec)


# The forward/backward split the torch.library op calls (ops/residual_norm.py).
def _forward_saving(x, residual, weight, bias, eps, norm, residual_in_fp32, rowscale=None, zero_centered_weight=False,
                    out_dtype=None):
    out, new_residual, stats = residual_norm_forward(x, residual, weight, bias,
                                                     *_resolve(x, residual, eps, norm, residual_in_fp32),
                                                     rowscale, zero_centered_weight, out_dtype)
    return (out, new_residual), (stats,)


def _backward_from(grads, saved, new_residual, weight, bias, norm, x_dtype, residual_dtype, rowscale=None,
                   zero_centered_weight=False):
    """(dx, dresidual, dweight, dbias) from (grad_out, grad_new_residual) and the forward's stats."""
    grad_out, grad_new_residual = grads
    dx, dres, dw, db = residual_norm_backward(grad_out, grad_new_residual, new_residual, weight, saved[0],
                                              norm == "rms", x_dtype, residual_dtype, bias is not None,
                                              rowscale=rowscale, zero_centered_weight=zero_centered_weight)
    return dx, dres, dw, (None if db is None else db.to(bias.dtype))


def _supports(problem) -> List[str]:
    reasons = problem_reasons(problem)
    hidden = problem.feature("hidden", 0)
    if hidden > MAX_N:
        reasons.append(f"hidden size {hidden} > {MAX_N}: the fused kernel holds a whole row in one program's "
                       "registers")
    return reasons


register(Backend(
    name="triton", op="residual_norm", fn=triton_residual_norm,
    description="gpuparity's fused Triton residual add + RMSNorm/LayerNorm (fp32 statistics, forward and backward)",
    dtypes=KERNEL_DTYPES, availability=availability, supports=_supports, jit=True,
    forward_saving=_forward_saving, backward_from=_backward_from))


# ----------------------------------------------------------------------------- AOT
# Representative bf16 configurations: packed short rows (hidden 128, many rows per program) and
# the widest row (MAX_N: most warps and registers); RMSNorm with a bf16 residual, LayerNorm with
# bias and a float32 residual stream (its other dtype pair), both with grad_new_residual in the
# backward. Hidden sizes in between share these tiles' warp counts and per-thread work.
AOT_CASES = (("rms", 128), ("rms", MAX_N), ("layer", MAX_N))


def aot_specs() -> List[AotSpec]:
    if triton is None:
        return []
    specs: List[AotSpec] = []
    for fam, fam_spec in FAMILIES.items():
        for name, n in AOT_CASES:
            is_rms = name == "rms"
            block, rows, warps = tile(n, fam)
            res = "*bf16" if is_rms else "*fp32"
            tag = f"residual_norm.{fam}:{name}-n{n}"
            fwd_const = dict(IS_RMS=is_rms, HAS_RESIDUAL=True, HAS_BIAS=not is_rms, TWO_LEVEL_X=True,
                             TWO_LEVEL_R=True, BLOCK_N=block, ROWS=rows, HAS_ROWSCALE=False, ZERO_CENTERED=False)
            fwd_sig = {"X": "*bf16", "RES": res, "W": "*bf16", "B": "*bf16", "Y": "*bf16", "NEW_RES": res,
                       "STATS": "*fp32", "n_rows": "i64", "x_inner": "i64", "x_outer_stride": "i64",
                       "x_inner_stride": "i64", "r_inner": "i64", "r_outer_stride": "i64", "r_inner_stride": "i64",
                       "N": "i32", "eps": "fp32", "ROWSCALE": "*fp32", **{k: "constexpr" for k in fwd_const}}
            bwd_const = dict(IS_RMS=is_rms, HAS_DRES_IN=True, STORE_DRES=True, HAS_BIAS=not is_rms,
                             TWO_LEVEL_DY=True, TWO_LEVEL_G=True, BLOCK_N=block, ROWS=rows, HAS_ROWSCALE=False,
                             ZERO_CENTERED=False)
            bwd_sig = {"S": res, "DY": "*bf16", "DRES_IN": res, "W": "*bf16", "STATS": "*fp32", "DX": "*bf16",
                       "DRES": res, "PARTIAL": "*fp32", "ROWSCALE": "*fp32", "n_rows": "i64", "dy_inner": "i64",
                       "dy_outer_stride": "i64",
                       "dy_inner_stride": "i64", "g_inner": "i64", "g_outer_stride": "i64", "g_inner_stride": "i64",
                       "N": "i32", "tiles_per_program": "i32", "db_offset": "i32",
                       **{k: "constexpr" for k in bwd_const}}
            specs.append(AotSpec(tag + "-fwd", _residual_norm_fwd_kernel, fwd_sig, fwd_const, num_warps=warps,
                                 targets=fam_spec["targets"]))
            specs.append(AotSpec(tag + "-bwd", _residual_norm_bwd_kernel, bwd_sig, bwd_const, num_warps=warps,
                                 targets=fam_spec["targets"]))
    return specs
