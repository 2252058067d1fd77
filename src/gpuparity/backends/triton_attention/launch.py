"""Launching the attention kernels: masks as the kernels read them, prepared launches per call
signature, attention_forward/attention_backward (plain functions) and the autograd Function."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...numerics import matmul_tf32
from .. import triton_common
from ..triton_common import TRACED, PlanCache, PreparedLaunch, cdiv, lazy_kernel
from .tiles import (ORDER_FOLD, SCAN_BLOCK, causal_order, fused_backward, padded_head_dim, split_kpm_dq, tile_config,
                    tma_backward)
from ... import caches

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# Mask kinds as the kernels see them (a constexpr).
MASK_NONE, MASK_BOOL, MASK_ADDITIVE = 0, 1, 2


def _load_kernels() -> Dict[str, Any]:
    # kernels.py imports triton at its top: imported on first launch (or AOT spec), never at
    # package import, so the package (and the backend's availability) works without triton
    from .backward_kernels import BACKWARD_KERNELS
    from .kernels import KERNELS
    return {**KERNELS, **BACKWARD_KERNELS}


# The kernels by name ("fwd", "dq", "dkdv"). Not called `kernels`: that is the submodule's name,
# which Python binds on the package once the submodule is imported.
kernel_table = lazy_kernel(_load_kernels)


@dataclasses.dataclass
class MaskArgs:
    """Masks as the kernels read them: a tensor and four strides (0 for broadcast dims)."""
    kind: int = MASK_NONE
    mask: Optional[torch.Tensor] = None
    mask_strides: Tuple[int, int, int, int] = (0, 0, 0, 0)
    kpm: Optional[torch.Tensor] = None
    kpm_strides: Tuple[int, int] = (0, 0)
    bounds: Optional[torch.Tensor] = None        # int32 (B, 3) from key_lengths: first, one past the last kept key, 0
    # ALiBi slopes fp32 (B or 1, H), contiguous, and their batch stride (0: one row for every item)
    alibi: Optional[torch.Tensor] = None
    alibi_stride: int = 0


def _broadcast_strides(t: torch.Tensor) -> Tuple[int, int, int, int]:
    shape = (1,) * (4 - t.dim()) + tuple(t.shape)
    strides = (0,) * (4 - t.dim()) + tuple(t.stride())
    return tuple(0 if size == 1 else stride for size, stride in zip(shape, strides))  # type: ignore[return-value]


def _bytes(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask as uint8: the same bytes, no copy (a view); while traced for inductor a
    conversion, which inductor fuses into the mask's producer (its lowering of a bool -> uint8
    view fails: "torch.bool is not supported by torch.iinfo", torch 2.11)."""
    return mask.to(torch.uint8) if TRACED.on else mask.view(torch.uint8)


def prepare_masks(q: torch.Tensor, k: torch.Tensor, attn_mask=None, key_padding_mask=None,
                  key_lengths=None, alibi_slopes=None) -> MaskArgs:
    batch, k_len = q.shape[0], k.shape[2]
    args = MaskArgs()
    if alibi_slopes is not None:
        args.alibi, args.alibi_stride = alibi_table(alibi_slopes, q.shape[1])
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            args.kind = MASK_BOOL
            args.mask = _bytes(attn_mask)  # Triton reads u8
        else:
            args.kind = MASK_ADDITIVE
            args.mask = attn_mask.detach()
        args.mask_strides = _broadcast_strides(args.mask)
    if key_lengths is not None and key_padding_mask is not None:  # rare: fold lengths into the mask
        beyond = torch.arange(k_len, device=q.device).view(1, k_len) >= key_lengths.to(q.device).view(-1, 1)
        key_padding_mask, key_lengths = key_padding_mask | beyond, None
    if key_padding_mask is not None:
        kpm = key_padding_mask
        if kpm.dtype == torch.bool:
            kpm = _bytes(kpm)
        args.kpm = kpm
        args.kpm_strides = (0 if kpm.shape[0] == 1 else kpm.stride(0), kpm.stride(1))
        # the kernels find each item's kept-key range by scanning its row of the mask themselves
    elif key_lengths is not None:
        lengths = key_lengths.to(device=q.device, dtype=torch.int32).clamp(0, k_len)
        # keys 0..length-1 kept: no holes; with ALiBi the third column moves each item's diagonal
        # to its own length (kernels.alibi_shift_of), else it stays 0 (never read)
        third = lengths - k_len if alibi_slopes is not None else torch.zeros_like(lengths)
        args.bounds = torch.stack([torch.zeros_like(lengths), lengths, third], dim=1).contiguous()
    return args


def check_alibi_slopes(alibi_slopes, batch: int, heads: int, device) -> None:
    """alibi_slopes must be fp32 (H,) or (B, H) (or (1, H)) on q's device: raises naming the argument."""
    from ...validation import describe
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes: expected a float32 tensor of shape ({heads},) or ({batch}, {heads}), got "
                        f"{describe(alibi_slopes)}")
    if tuple(alibi_slopes.shape) not in ((heads,), (1, heads), (batch, heads)):
        raise ValueError(f"alibi_slopes: expected shape ({heads},) (per head) or ({batch}, {heads}) (per batch item "
                         f"and head), got {describe(alibi_slopes)}")
    if alibi_slopes.device != torch.device(device):
        raise ValueError(f"alibi_slopes: expected a tensor on {device} (the device of q), got {describe(alibi_slopes)}")


def alibi_table(alibi_slopes: torch.Tensor, heads: int) -> Tuple[torch.Tensor, int]:
    """(fp32 (B or 1, H) contiguous, batch stride): the slopes as the kernels read them, stride 0
    when every batch item shares one row. No copy for the usual contiguous slopes."""
    table = alibi_slopes.detach().reshape(-1, heads)
    table = table if table.is_contiguous() else table.contiguous()
    return table, (0 if table.shape[0] == 1 else heads)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 follows torch's TF32 switch (on NVIDIA; AMD's Triton has no portable tf32 dot).
    With TF32 off, NVIDIA GPUs get fp32-accurate dots from the tensor cores ("tf32x3": each
    operand split into a TF32 high and low part, three products) instead of CUDA-core FMAs:
    the battery holds it to the fp32 bar, it runs several times faster and compiles in a
    fraction of the time. GPUPARITY_FP32_DOT=ieee asks for the FMA path."""
    if triton_common.interpreting():
        return "upcast" if dtype == torch.bfloat16 else "ieee"
    if dtype != torch.float32:
        return "ieee"  # ignored for 16-bit inputs
    if triton_common.vendor() != "nvidia":
        return "ieee"
    return "tf32" if matmul_tf32() else strict_fp32_dot()


_STRICT_DOT: List[str] = caches.register("backends.triton_attention.launch.strict_dot", [])


def strict_fp32_dot() -> str:
    """The NVIDIA fp32 dot used when TF32 is off: "tf32x3" where this Triton has it, else
    "ieee"; GPUPARITY_FP32_DOT=ieee|tf32x3 chooses."""
    if not _STRICT_DOT:
        wanted = os.environ.get("GPUPARITY_FP32_DOT", "tf32x3")
        if wanted not in ("ieee", "tf32x3"):
            raise ValueError(f"GPUPARITY_FP32_DOT: expected ieee or tf32x3, got {wanted!r}")
        if wanted == "tf32x3":
            try:
                from triton.backends.nvidia.compiler import CUDAOptions
                if "tf32x3" not in CUDAOptions.allowed_dot_input_precisions:
                    wanted = "ieee"
            except Exception:  # noqa: BLE001 - no NVIDIA backend in this Triton: FMA dots
                wanted = "ieee"
        _STRICT_DOT.append(wanted)
    return _STRICT_DOT[0]


_DUMMIES: Dict[torch.device, torch.Tensor] = caches.register("backends.triton_attention.launch.dummies", {})


def _dummy(device) -> torch.Tensor:
    """A placeholder pointer for absent masks (the kernels never read it); one per device
    (a new one per call while traced for inductor: a kept one would be a fake tensor or a constant)."""
    if TRACED.on:
        return torch.zeros(16, dtype=torch.uint8, device=device)
    if device not in _DUMMIES:
        _DUMMIES[device] = torch.zeros(16, dtype=torch.uint8, device=device)
    return _DUMMIES[device]


def _common_constexprs(head_dim, masks: MaskArgs, is_causal, dropout_p, dtype, window=None, softcap=None):
    return dict(HEAD_DIM=head_dim, D_PAD=padded_head_dim(head_dim), IS_CAUSAL=bool(is_causal),
                # HAS_BOUNDS: the kept keys of each item lie in a range, scanned from the padding mask by
                # the kernels or given by key_lengths (masks.bounds)
                MASK_KIND=masks.kind, HAS_KPM=masks.kpm is not None,
                HAS_BOUNDS=masks.bounds is not None or masks.kpm is not None,
                DROPOUT=dropout_p > 0.0, DOT_PRECISION=dot_precision(dtype),
                HAS_WINDOW=window is not None, SOFTCAP=softcap is not None, HAS_ALIBI=masks.alibi is not None)


def _window_softcap_scalars(q_len: int, k_len: int, scale: float, window=None, softcap=None) -> tuple:
    """(window_left, window_right, cap_in, cap_out) as the kernels read them: an unbounded side
    (-1) becomes a reach past every key, so the kernels need no branch for it; softcap c gives
    cap_in = scale / c and cap_out = c * log2(e) (scores c * tanh(scale * s / c), in base 2)."""
    left, right = (-1, -1) if window is None else window
    reach = q_len + k_len + 1
    left = reach if left < 0 else int(left)
    right = reach if right < 0 else int(right)
    if softcap is None:
        return left, right, 0.0, 0.0
    return left, right, float(scale) / float(softcap), float(softcap) * LOG2E


def _output_like(q: torch.Tensor) -> torch.Tensor:
    """An output with q's memory layout when q is dense (so a (B,S,H,D) view stays one), else
    (B,S,H,D) when heads are inner to the sequence in q, else (B,H,S,D) contiguous."""
    if q.is_contiguous() or q.transpose(1, 2).is_contiguous():
        return torch.empty_like(q)
    batch, heads, q_len, head_dim = q.shape
    if q.stride(1) < q.stride(2):
        return torch.empty(batch, q_len, heads, head_dim, dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty(batch, heads, q_len, head_dim, dtype=q.dtype, device=q.device)


# Launches prepared per call signature (shapes, strides, dtype, mask layout, flags): a training
# loop repeats a few signatures, and re-deriving tile configs, constexprs and ~50 launch
# arguments on every call is host time that short sequences cannot hide. Calls with dropout
# (a new seed each time) are not kept.
_PLANS = PlanCache()


def _plan_key(q, k, v, masks: MaskArgs, is_causal: bool, scale: float, dropout_p: float, extra=()) -> Optional[tuple]:
    if dropout_p > 0.0:
        return None
    key = (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, masks.kind,
           None if masks.mask is None else masks.mask.dtype, masks.mask_strides,
           None if masks.kpm is None else masks.kpm.dtype, masks.kpm_strides, masks.bounds is not None,
           masks.alibi is not None, masks.alibi_stride, is_causal, scale, triton_common.interpreting(), *extra)
    if q.dtype == torch.float32:
        key += (matmul_tf32(),)
    return key


def _planned(key: Optional[tuple], build):
    if key is None:
        return build()
    plan = _PLANS.get(key)
    return plan if plan is not None else _PLANS.keep(key, build())


def _mask_tensors(q, masks: MaskArgs) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dummy = _dummy(q.device)
    return (dummy if masks.mask is None else masks.mask, dummy if masks.kpm is None else masks.kpm,
            dummy if masks.bounds is None else masks.bounds, dummy if masks.alibi is None else masks.alibi)


def _forward_launch(q, k, v, out, masks: MaskArgs, is_causal, scale, dropout_p, seed, window=None, softcap=None
                    ) -> Tuple[PreparedLaunch]:
    batch, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    cfg = tile_config("fwd", q.device, head_dim, q.dtype, k_len)
    grid = (cdiv(q_len, cfg.block_m), batch * heads)
    order = causal_order("fwd", is_causal, window is not None, grid[0] * grid[1], q.device)
    return (PreparedLaunch(kernel_table()["fwd"], grid, (
        scale * LOG2E, float(dropout_p), int(seed), *_window_softcap_scalars(q_len, k_len, scale, window, softcap),
        k_len - q_len,   # ALiBi's shift: query i sits at key position i + Sk - Sq (FlashAttention)
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *masks.mask_strides, *masks.kpm_strides, masks.alibi_stride,
        heads, heads // kv_heads, q_len, k_len),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.stages(masks.kind != MASK_NONE), SCAN=SCAN_BLOCK,
        ORDER=order,
        **_common_constexprs(head_dim, masks, is_causal, dropout_p, q.dtype, window, softcap)),)


class _Plan:
    """The prepared launches of one call signature: the forward's, and the backward's per
    layout of dout (built on the first backward that has it). The autograd Function keeps the
    plan from its forward, so its backward looks nothing up again."""

    __slots__ = ("forward", "backward")

    def __init__(self, forward: PreparedLaunch) -> None:
        self.forward = forward
        self.backward: Dict[tuple, Tuple[PreparedLaunch, PreparedLaunch]] = {}


def _forward(q, k, v, masks: MaskArgs, is_causal: bool, scale: float, dropout_p: float, seed: int, window,
             softcap, with_delta: bool) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[_Plan]]:
    """(out, lse, delta, plan). with_delta: lse and the backward's delta (2, B, H, Sq) float32 come
    from one allocation (one fewer in the backward, where host time is scarcest); plan: None for
    empty inputs, kept per call signature except for dropout calls (a new seed each time)."""
    batch, heads, q_len, _ = q.shape
    out = _output_like(q)
    if with_delta:   # one allocation: lse, then delta's two planes
        both = torch.empty(3, batch, heads, q_len, dtype=torch.float32, device=q.device)
        lse, delta = both[0], both[1:]
    else:
        lse, delta = torch.empty(batch, heads, q_len, dtype=torch.float32, device=q.device), None
    if out.numel() == 0:
        return out, lse, delta, None
    if k.shape[2] == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse, delta, None
    plan = _planned(_plan_key(q, k, v, masks, is_causal, scale, dropout_p, ("fwd", window, softcap)),
                    lambda: _Plan(*_forward_launch(q, k, v, out, masks, is_causal, scale, dropout_p, seed, window,
                                                   softcap)))
    plan.forward(q, k, v, out, lse, *_mask_tensors(q, masks))
    return out, lse, delta, plan


def attention_forward(q, k, v, masks: MaskArgs, is_causal: bool, scale: float, dropout_p: float = 0.0,
                      seed: int = 0, window=None, softcap=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): lse is (B, H, Sq) float32 in base 2, +inf for rows with no key."""
    out, lse, _, _ = _forward(q, k, v, masks, is_causal, scale, dropout_p, seed, window, softcap, False)
    return out, lse


def _backward_launches(q, k, v, out, dout, dq, dk, dv, masks: MaskArgs, is_causal, scale, dropout_p, seed,
                       window=None, softcap=None) -> Tuple[PreparedLaunch, ...]:
    """(dq launch, dk/dv launch), or (one launch,) where tiles.fused_backward says so."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    constexprs = _common_constexprs(head_dim, masks, is_causal, dropout_p, q.dtype, window, softcap)
    extra = _window_softcap_scalars(q_len, k_len, scale, window, softcap)
    dense_mask = masks.kind != MASK_NONE
    dq_cfg = tile_config("dq", q.device, head_dim, q.dtype, k_len)
    kv_cfg = tile_config("dkdv", q.device, head_dim, q.dtype, k_len, alibi=masks.alibi is not None)
    scalars = (scale * LOG2E, scale, float(dropout_p), int(seed), *extra, k_len - q_len)
    if fused_backward(q_len, head_dim, dq_cfg, kv_cfg, q.dtype):
        q_blocks = cdiv(q_len, dq_cfg.block_m)
        grid = (q_blocks * (heads // kv_heads) + cdiv(k_len, kv_cfg.block_n), batch * kv_heads)
        return (PreparedLaunch(kernel_table()["bwd"], grid, (
            *scalars, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *dout.stride(), *dq.stride(),
            *dk.stride(), *dv.stride(), *masks.mask_strides, *masks.kpm_strides, masks.alibi_stride,
            heads, kv_heads, heads // kv_heads, q_len, k_len, q_blocks),
            BLOCK_M=dq_cfg.block_m, BLOCK_N=dq_cfg.block_n, KV_BLOCK_M=kv_cfg.block_m, KV_BLOCK_N=kv_cfg.block_n,
            num_warps=kv_cfg.num_warps, num_stages=kv_cfg.stages(dense_mask), SCAN=SCAN_BLOCK, **constexprs),)
    dq_grid = (cdiv(q_len, dq_cfg.block_m), batch * heads)
    dq_launch = PreparedLaunch(kernel_table()["dq"], dq_grid, (
        *scalars, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *dout.stride(), *dq.stride(),
        *masks.mask_strides, *masks.kpm_strides, masks.alibi_stride,
        heads, heads // kv_heads, q_len, k_len),
        BLOCK_M=dq_cfg.block_m, BLOCK_N=dq_cfg.block_n, num_warps=dq_cfg.num_warps,
        num_stages=dq_cfg.stages(dense_mask), SCAN=SCAN_BLOCK,
        SPLIT_KPM=masks.kpm is not None and split_kpm_dq(q.device, head_dim),
        ORDER=causal_order("dq", is_causal, window is not None, dq_grid[0] * dq_grid[1], q.device), **constexprs)
    dkdv_args = (*scalars, *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
                 *masks.mask_strides, *masks.kpm_strides, masks.alibi_stride, heads, kv_heads, heads // kv_heads,
                 q_len, k_len)
    key_blocks = cdiv(k_len, kv_cfg.block_n)
    order = causal_order("dkdv", is_causal, window is not None, key_blocks * batch * kv_heads, q.device)
    dkdv_grid = (cdiv(key_blocks, 2) if order == ORDER_FOLD else key_blocks, batch * kv_heads)
    dkdv_options = dict(BLOCK_M=kv_cfg.block_m, BLOCK_N=kv_cfg.block_n, num_warps=kv_cfg.num_warps,
                        num_stages=kv_cfg.stages(dense_mask), SCAN=SCAN_BLOCK, ORDER=order, **constexprs)
    dkdv_launch = PreparedLaunch(kernel_table()["dkdv"], dkdv_grid, dkdv_args, **dkdv_options)
    if tma_backward(q.device, q.dtype, q_len, k_len, head_dim, kv_cfg):
        views = tuple(_rows_view(t) for t in (q, dout, k, v))
        if None not in views:
            dkdv_launch = _DescriptorLaunch(dkdv_launch, dkdv_grid, dkdv_args, views,
                                            (kv_cfg.block_m, kv_cfg.block_m, kv_cfg.block_n, kv_cfg.block_n),
                                            dkdv_options)
    return dq_launch, dkdv_launch


def _rows_view(t: torch.Tensor):
    """t (B, H, S, D) as rows of a 2-D tensor for a tensor descriptor: (shape, strides, rb, rh, ch),
    where row m of (batch, head) is row batch * rb + head * rh + m, at column head * ch; None for
    a layout other than (B, H, S, D) or (B, S, H, D) dense."""
    batch, heads, seq, head_dim = t.shape
    if batch * heads * seq >= 2 ** 31 - 1024:   # descriptor coordinates are int32
        return None
    if t.is_contiguous():
        return [batch * heads * seq, head_dim], [head_dim, 1], heads * seq, seq, 0
    if t.transpose(1, 2).is_contiguous():
        return [batch * seq, heads * head_dim], [heads * head_dim, 1], seq, 0, head_dim
    return None


class _DescriptorLaunch:
    """The dk/dv launch through tensor descriptors (kernel "dkdv_tma"; tiles.tma_backward says
    where): called like the PreparedLaunch it wraps, which serves calls whose q, dout, k or v does
    not start 16-byte aligned (a descriptor's base must). Launched through Triton's own launcher
    (descriptors are made per call): tma_backward allows it only for long sequences, where a
    launch's host time is noise beside the kernel's."""

    __slots__ = ("pointers", "grid", "scalars", "views", "blocks", "options")

    def __init__(self, pointers: PreparedLaunch, grid, scalars, views, blocks, options) -> None:
        self.pointers, self.grid, self.scalars, self.views = pointers, tuple(grid), scalars, views
        self.blocks, self.options = blocks, options

    def __call__(self, q, k, v, dout, lse, delta, dk, dv, mask, kpm, bounds, alibi) -> None:
        tensors = (q, dout, k, v)
        # traced for inductor (triton_common.TRACED): fake tensors, and host-made descriptors
        # are not something wrap_triton takes; the pointer form serves the compiled graph
        if TRACED.on or any(t.data_ptr() & 15 for t in tensors):
            self.pointers(q, k, v, dout, lse, delta, dk, dv, mask, kpm, bounds, alibi)
            return
        from triton.tools.tensor_descriptor import TensorDescriptor
        head_dim = q.shape[-1]
        descriptors, origins = [], []
        for t, (shape, strides, *origin), rows in zip(tensors, self.views, self.blocks):
            descriptors.append(TensorDescriptor(t, shape, strides, [rows, head_dim]))
            origins.extend(origin)
        kernel_table()["dkdv_tma"][self.grid](q, k, v, dout, lse, delta, dk, dv, mask, kpm, bounds, alibi, *descriptors,
                                              *self.scalars, *origins, **self.options)


def attention_backward(dout, q, k, v, out, lse, masks: MaskArgs, is_causal: bool, scale: float,
                       dropout_p: float = 0.0, seed: int = 0, window=None, softcap=None, *,
                       delta: Optional[torch.Tensor] = None, plan: Optional[_Plan] = None):
    """(dq, dk, dv). delta: a (2, B, H, Sq) float32 buffer to use for the dq kernel's delta and top
    (backward_kernels._dq_loops; else one is allocated where the two-launch form needs it); plan: the forward's (_forward), whose backward launches are then
    found by dout's strides alone. dq, dk, dv take q's, k's and v's layouts (three empty_like:
    cheaper on the host than one allocation taken apart: 4.8 vs 6.8 us,
    benchmarks/records/h200/attention-host-ab-2026-11-26.md)."""
    batch, heads, q_len, _ = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    # out's and dq/dk/dv's strides follow from q's, k's and v's (the key's); dout's do not
    launches = None if plan is None else plan.backward.get(dout.stride())
    if launches is None:
        key = _plan_key(q, k, v, masks, is_causal, scale, dropout_p, ("bwd", dout.stride(), window, softcap))
        launches = _planned(key, lambda: _backward_launches(
            q, k, v, out, dout, dq, dk, dv, masks, is_causal, scale, dropout_p, seed, window, softcap))
        if plan is not None:
            plan.backward[dout.stride()] = launches
    mask, kpm, bounds, alibi = _mask_tensors(q, masks)
    if len(launches) == 1:   # one launch: delta is computed where it is used
        launches[0](q, k, v, out, dout, lse, dq, dk, dv, mask, kpm, bounds, alibi)
        return dq, dk, dv
    dq_launch, dkdv_launch = launches
    if delta is None:
        delta = torch.empty(2, batch, heads, q_len, dtype=torch.float32, device=q.device)
    # dq first: it also computes delta = rowsum(out * dout), which the dk/dv kernel reads
    dq_launch(q, k, v, out, dout, lse, delta, dq, mask, kpm, bounds, alibi)
    dkdv_launch(q, k, v, dout, lse, delta, dk, dv, mask, kpm, bounds, alibi)
    return dq, dk, dv


def _forward_saving_ctx(ctx, q, k, v, call) -> Tuple[torch.Tensor, torch.Tensor]:
    """The autograd forward of TritonAttention(Lse): (out, lse in base 2), what the backward needs kept in ctx."""
    masks, is_causal, scale, dropout_p, seed, window, softcap = call
    out, lse, delta, plan = _forward(q, k, v, masks, is_causal, scale, dropout_p, seed, window, softcap, True)
    # the masks go through save_for_backward too: a mask changed in place before the
    # backward then raises (autograd's version check) instead of giving wrong gradients
    ctx.save_for_backward(q, k, v, out, lse, masks.mask, masks.kpm, masks.bounds, masks.alibi)
    ctx.meta = (masks.kind, masks.mask_strides, masks.kpm_strides, masks.alibi_stride, is_causal, scale,
                dropout_p, seed, window, softcap, delta, plan)
    return out, lse


class TritonAttention(torch.autograd.Function):
    """Inputs q, k, v and one tuple of everything else (fewer arguments through autograd's
    Python layer: it costs per argument, on every call, forward and backward)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        return _forward_saving_ctx(ctx, q, k, v, call)[0]

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, mask, kpm, bounds, alibi = ctx.saved_tensors
        (kind, mask_strides, kpm_strides, alibi_stride, is_causal, scale, dropout_p, seed, window, softcap, delta,
         plan) = ctx.meta
        masks = MaskArgs(kind, mask, mask_strides, kpm, kpm_strides, bounds, alibi, alibi_stride)
        dq, dk, dv = attention_backward(dout, q, k, v, out, lse, masks, is_causal, scale, dropout_p, seed,
                                        window, softcap, delta=delta, plan=plan)
        return dq, dk, dv, None


def natural_lse(ctx, lse: torch.Tensor) -> torch.Tensor:
    """The kernels' base-2 log-sum-exp as the natural one, marked as having no gradient."""
    lse = lse * LN2
    ctx.mark_non_differentiable(lse)
    return lse


class TritonAttentionLse(torch.autograd.Function):
    """TritonAttention that also returns the kernels' own log-sum-exp in natural log: fp32 (B, H, Sq),
    +inf for a row with no key, no gradient (FlashAttention's softmax_lse, with no second pass)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        out, lse = _forward_saving_ctx(ctx, q, k, v, call)
        return out, natural_lse(ctx, lse)

    @staticmethod
    def backward(ctx, dout, _dlse):
        return TritonAttention.backward(ctx, dout)


def triton_attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
                     key_lengths=None, dropout_p: float = 0.0, seed: Optional[int] = None, window=None,
                     softcap=None, alibi_slopes=None, return_lse: bool = False):
    """The kernel behind backend "triton". Inputs are assumed validated (gpuparity.attention
    does that). key_lengths (B,) int: keys at or past a batch item's length are padding
    (an alternative to key_padding_mask that needs no mask reads). dropout_p applies to the
    attention probabilities (as nn.MultiheadAttention in training); seed makes it repeatable.
    window (left, right) and softcap: as gpuparity.attention (validated there; (-1, -1) and a
    softcap of None mean off). alibi_slopes fp32 (H,) or (B, H): FlashAttention's ALiBi, computed in
    the kernels (no bias tensor): -slope * |i + Sk - Sq - j| added to the scaled (softcapped) scores,
    query i at key position i + Sk - Sq (bottom-right, whatever is_causal's top-left alignment; with
    key_lengths at i + key_lengths[b] - Sq, as FlashAttention's KV cache aligns on cache_seqlens);
    no gradient to the slopes (checked here: the battery calls this function directly).
    return_lse: (out, lse), lse the kernels' fp32 (B, H, Sq) natural log-sum-exp (+inf for a row with
    no key; no gradient)."""
    if attn_mask is not None and attn_mask.dtype != torch.bool and attn_mask.requires_grad:
        raise ValueError("attn_mask: a float mask that requires grad is not supported by the triton "
                         "backend (no gradient for the mask); detach it or use backend='sdpa_math'")
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, q.shape[0], q.shape[1], q.device)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if dropout_p > 0.0 and seed is None:
        seed = dropout_seed(q.device)
    masks = prepare_masks(q, k, attn_mask, key_padding_mask, key_lengths, alibi_slopes)
    window = None if window is None or tuple(window) == (-1, -1) else (int(window[0]), int(window[1]))
    softcap = None if not softcap else float(softcap)
    call = (masks, bool(is_causal), scale, float(dropout_p), int(seed or 0), window, softcap)
    return TritonAttentionLse.apply(q, k, v, call) if return_lse else TritonAttention.apply(q, k, v, call)


# ----------------------------------------------------------------------------- dropout
# Seeds stay below 2**30: the kernels add batch * H + head to the seed in int32.
SEED_LIMIT = 2 ** 30


def _splitmix(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)


def dropout_seed(device: torch.device, generator: Optional[torch.Generator] = None) -> int:
    """A kernel seed in [0, 2**30) drawn from `generator`, else torch's default generator for
    `device`, with no device sync: a CPU generator draws on the host; a CUDA generator's seed
    and Philox offset are host values, so the seed is derived from them and the offset advanced
    (as torch's own dropout kernels reserve their share). torch.manual_seed(s) makes it repeatable."""
    if generator is None:
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            generator = torch.cuda.default_generators[index]
        else:
            generator = torch.default_generator
    if generator.device.type == "cpu":
        return int(torch.randint(0, SEED_LIMIT, (1,), generator=generator).item())
    offset = generator.get_offset()
    generator.set_offset(offset + 4)
    return _splitmix((generator.initial_seed() << 20) ^ offset) % SEED_LIMIT


def dropout_mask(batch: int, heads: int, q_len: int, k_len: int, dropout_p: float, seed: int,
                 device) -> torch.Tensor:
    """Bool (B, H, Sq, Sk), True = kept: the keep mask the kernels apply for (seed, dropout_p),
    regenerated by a kernel that calls the same Triton function (kernels.dropout_keep)."""
    keep = torch.empty(batch * heads, q_len, k_len, dtype=torch.int8, device=device)
    if keep.numel():
        block_m, block_n = 16, 32
        kernel_table()["dropout_mask"][(cdiv(q_len, block_m), batch * heads)](
            keep, float(dropout_p), int(seed), q_len, k_len, BLOCK_M=block_m, BLOCK_N=block_n)
    return keep.view(batch, heads, q_len, k_len).bool()
