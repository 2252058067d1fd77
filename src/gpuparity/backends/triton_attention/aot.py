"""Ahead-of-time compile specs of the attention kernels, dense and packed variable-length: every
shipped tile configuration, with the flags that cost the most shared memory, as
triton_common.AotSpec for tests/backends/test_aot.py."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Dict, List, Tuple

from ..triton_common import AotSpec
from .launch import MASK_ADDITIVE, MASK_BOOL, MASK_NONE, kernel_table
from .tiles import (ALIBI_CONFIGS, CONFIGS, FAMILY_TARGETS, ORDER_FOLD, SCAN_BLOCK, SHORT_CONFIGS, TileConfig,
                    split_kpm_dq_default)

_POINTER_TYPES = {
    "LSE": "*fp32", "Delta": "*fp32", "Bounds": "*i32", "KPM": "*u8", "CuQ": "*i32", "CuK": "*i32",
    "Alibi": "*fp32",
}
_FLOAT_SCALARS = {"qk_scale", "sm_scale", "dropout_p", "cap_in", "cap_out"}


def _signature(kernel, dtype: str, mask_type: str, descriptor_blocks=None) -> Dict[str, str]:
    """descriptor_blocks: {parameter: (rows, cols)}, the tiles the *Desc parameters (tensor
    descriptors) load."""
    signature = {}
    # JITFunction and InterpretedFunction both keep the Python function in .fn
    for name, param in inspect.signature(getattr(kernel, "fn", kernel)).parameters.items():
        if "constexpr" in str(param.annotation):
            signature[name] = "constexpr"
        elif name.endswith("Desc"):
            rows, cols = descriptor_blocks[name]
            signature[name] = f"tensordesc<{dtype}[{rows}, {cols}]>"
        elif name in _POINTER_TYPES:
            signature[name] = _POINTER_TYPES[name]
        elif name == "Mask":
            signature[name] = mask_type
        elif name[:1].isupper():
            signature[name] = f"*{dtype}"
        elif name in _FLOAT_SCALARS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature


def _unit_strides(signature: Dict[str, str]) -> Tuple[str, ...]:
    """The strides a launch on contiguous tensors passes as 1 (AotSpec.unit_params): each
    tensor's head-dim stride (stride_*d) and the masks' key strides (stride_mn, stride_pn)."""
    return tuple(name for name, kind in signature.items() if kind == "i32" and name.startswith("stride_")
                 and (name.endswith("d") or name in ("stride_mn", "stride_pn")))


def _dtype_and_precision(fam: str, elem: int) -> Tuple[str, str]:
    """The spec's element type and dot precision: fp32 on NVIDIA ships split-TF32 tensor-core dots
    ("tf32x3", dot_precision's choice with TF32 off; with TF32 on it is "tf32": the same tiles and
    operands in shared memory, one product instead of three). AMD's Triton has FMA dots only."""
    return ("bf16" if elem == 2 else "fp32"), ("tf32x3" if elem == 4 and fam.startswith("nvidia") else "ieee")


def _aot_spec(fam, targets, kernel_name, head_dim, elem, cfg, dropout=False, dense_mask=True,
              window_softcap=False, fold=False) -> AotSpec:
    dtype, precision = _dtype_and_precision(fam, elem)
    kernel = kernel_table()[kernel_name]
    constexprs = dict(HEAD_DIM=head_dim, D_PAD=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      IS_CAUSAL=True, MASK_KIND=MASK_ADDITIVE if dense_mask else MASK_NONE, HAS_KPM=True,
                      HAS_BOUNDS=True, DROPOUT=dropout, DOT_PRECISION=precision,
                      HAS_WINDOW=window_softcap, SOFTCAP=window_softcap, HAS_ALIBI=window_softcap)
    constexprs["SCAN"] = SCAN_BLOCK   # every kernel scans the key padding mask
    if kernel_name == "dq" and split_kpm_dq_default(fam, head_dim):
        constexprs["SPLIT_KPM"] = True   # its second set of loops: more shared memory
    if fold:
        constexprs["ORDER"] = ORDER_FOLD     # the program inside a loop over its two key blocks
    return AotSpec(
        name=f"attention.{kernel_name}.{fam}.d{head_dim}.{dtype}.m{cfg.block_m}n{cfg.block_n}"
             f"w{cfg.num_warps}s{cfg.stages(dense_mask)}" + (".dropout" if dropout else "")
             + (".window_softcap_alibi" if window_softcap else "")
             + ("" if dense_mask else ".nomask") + (".fold" if fold else ""),
        kernel=kernel, signature=_signature(kernel, dtype, "*fp32"), constexprs=constexprs,
        num_warps=cfg.num_warps, num_stages=cfg.stages(dense_mask), targets=targets,
        unit_params=_unit_strides(_signature(kernel, dtype, "*fp32")))


def aot_specs() -> List[AotSpec]:
    """Every shipped tile configuration, compiled at the largest head dim that uses it, with
    the mask flags that cost the most shared memory (additive mask tiles, key padding, whose
    forward at D_PAD >= 128 has a second pair of loops, as dq where tiles.split_kpm_dq_default says,
    causal), and, for a config with fewer stages under a dense mask, also
    without one at its full depth. Dropout adds registers, not shared memory: it is compiled
    once per family and kernel (at the 64 bf16 config) to prove it builds; so are the sliding
    window, softcap and ALiBi together (a tanh, an abs and a few compares per tile: registers too)."""
    specs: List[AotSpec] = []
    for fam, targets in FAMILY_TARGETS.items():
        for kernel_name in ("fwd", "dkdv", "dq"):
            largest: Dict[Tuple[int, TileConfig], int] = {}
            entries = list(CONFIGS[fam][kernel_name].items())
            entries += list(SHORT_CONFIGS.get(fam, {}).get(kernel_name, {}).items())
            for (bucket, elem), cfg in entries:
                largest[(elem, cfg)] = max(bucket, largest.get((elem, cfg), 0))
            for (elem, cfg), head_dim in largest.items():
                specs.append(_aot_spec(fam, targets, kernel_name, head_dim, elem, cfg))
                if cfg.masked_stages is not None:  # its deeper pipeline, used without a dense mask
                    specs.append(_aot_spec(fam, targets, kernel_name, head_dim, elem, cfg, dense_mask=False))
            specs.append(_aot_spec(fam, targets, kernel_name, 64, 2, CONFIGS[fam][kernel_name][(64, 2)],
                                   dropout=True))
            specs.append(_aot_spec(fam, targets, kernel_name, 64, 2, CONFIGS[fam][kernel_name][(64, 2)],
                                   window_softcap=True))
            for (bucket, elem), cfg in ALIBI_CONFIGS.get(fam, {}).get(kernel_name, {}).items():
                if cfg != CONFIGS[fam][kernel_name].get((bucket, elem)):   # else compiled just above
                    specs.append(_aot_spec(fam, targets, kernel_name, bucket, elem, cfg, window_softcap=True))
            if kernel_name == "dkdv":   # the folded grid (tiles.causal_order) at the largest 16-bit tile
                bucket = max(b for b, e in CONFIGS[fam]["dkdv"] if e == 2)
                specs.append(_aot_spec(fam, targets, "dkdv", bucket, 2, CONFIGS[fam]["dkdv"][(bucket, 2)], fold=True))
    return specs + fused_backward_aot_specs() + varlen_aot_specs() + descriptor_aot_specs() + kvcache_alibi_aot_specs()


def _fused_spec(fam, targets, head_dim, elem, dq_cfg: TileConfig, kv_cfg: TileConfig) -> AotSpec:
    dtype, precision = _dtype_and_precision(fam, elem)
    kernel = kernel_table()["bwd"]
    constexprs = dict(HEAD_DIM=head_dim, D_PAD=head_dim, BLOCK_M=dq_cfg.block_m, BLOCK_N=dq_cfg.block_n,
                      KV_BLOCK_M=kv_cfg.block_m, KV_BLOCK_N=kv_cfg.block_n, IS_CAUSAL=True, MASK_KIND=MASK_ADDITIVE,
                      HAS_KPM=True, HAS_BOUNDS=True, DROPOUT=False, DOT_PRECISION=precision,
                      HAS_WINDOW=True, SOFTCAP=True, HAS_ALIBI=True, SCAN=SCAN_BLOCK)
    return AotSpec(
        name=f"attention.bwd.{fam}.d{head_dim}.{dtype}.m{dq_cfg.block_m}n{dq_cfg.block_n}"
             f".kvm{kv_cfg.block_m}n{kv_cfg.block_n}w{kv_cfg.num_warps}s{kv_cfg.stages(True)}",
        kernel=kernel, signature=_signature(kernel, dtype, "*fp32"), constexprs=constexprs,
        num_warps=kv_cfg.num_warps, num_stages=kv_cfg.stages(True), targets=targets,
        unit_params=_unit_strides(_signature(kernel, dtype, "*fp32")))


def fused_backward_aot_specs() -> List[AotSpec]:
    """The one-launch backward (tiles.fused_backward) at every pair of dq and dk/dv tiles it can
    be given: per head-dim bucket and element size, the general tables' pair, the short-key one
    and the one with ALiBi's dk/dv tile, where their warp counts agree, with every mask flag on
    (the most shared memory)."""
    specs: List[AotSpec] = []
    seen = set()
    for fam, targets in FAMILY_TARGETS.items():
        short = SHORT_CONFIGS.get(fam, {})
        for key, dq_cfg in CONFIGS[fam]["dq"].items():
            kv_cfg = CONFIGS[fam]["dkdv"][key]
            pairs = [(dq_cfg, kv_cfg), (short.get("dq", {}).get(key, dq_cfg), short.get("dkdv", {}).get(key, kv_cfg)),
                     (dq_cfg, ALIBI_CONFIGS.get(fam, {}).get("dkdv", {}).get(key, kv_cfg))]
            for pair in pairs:
                if pair[0].num_warps != pair[1].num_warps or (fam, key, pair) in seen:
                    continue
                seen.add((fam, key, pair))
                specs.append(_fused_spec(fam, targets, key[0], key[1], *pair))
    return specs


# The varlen kernels (varlen_kernels.py) launch with the dense kernels' tile tables
# (varlen.py: tile_config) and never a dense mask, so the stages are cfg.stages(False).
_VARLEN_KERNELS = {"fwd": "varlen_fwd", "dq": "varlen_dq", "dkdv": "varlen_dkdv"}


def _varlen_spec(fam, targets, kernel_name, head_dim, elem, cfg) -> AotSpec:
    from .varlen import varlen_kernel_table
    dtype, precision = _dtype_and_precision(fam, elem)
    kernel = varlen_kernel_table()[_VARLEN_KERNELS[kernel_name]]
    # causal, window, softcap and ALiBi all on: the most registers; shared memory is the tiles'
    constexprs = dict(HEAD_DIM=head_dim, D_PAD=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=True,
                      DOT_PRECISION=precision, HAS_WINDOW=True, SOFTCAP=True, HAS_ALIBI=True)
    return AotSpec(
        name=f"attention_varlen.{kernel_name}.{fam}.d{head_dim}.{dtype}.m{cfg.block_m}n{cfg.block_n}"
             f"w{cfg.num_warps}s{cfg.stages(False)}",
        kernel=kernel, signature=_signature(kernel, dtype, "*fp32"), constexprs=constexprs,
        num_warps=cfg.num_warps, num_stages=cfg.stages(False), targets=targets,
        unit_params=_unit_strides(_signature(kernel, dtype, "*fp32")))


def varlen_aot_specs() -> List[AotSpec]:
    """The varlen forward, dq and dk/dv kernels at every tile configuration they can be given
    (the dense tables, short-key and ALiBi entries included), each at the largest head dim that
    uses it."""
    specs: List[AotSpec] = []
    for fam, targets in FAMILY_TARGETS.items():
        for kernel_name in _VARLEN_KERNELS:
            largest: Dict[Tuple[int, TileConfig], int] = {}
            entries = list(CONFIGS[fam][kernel_name].items())
            entries += list(SHORT_CONFIGS.get(fam, {}).get(kernel_name, {}).items())
            entries += list(ALIBI_CONFIGS.get(fam, {}).get(kernel_name, {}).items())
            for (bucket, elem), cfg in entries:
                largest[(elem, cfg)] = max(bucket, largest.get((elem, cfg), 0))
            specs.extend(_varlen_spec(fam, targets, kernel_name, head_dim, elem, cfg)
                         for (elem, cfg), head_dim in largest.items())
    return specs


def kvcache_alibi_aot_specs() -> List[AotSpec]:
    """The forward as gpuparity.flash_attn's KV-cache path launches it with ALiBi (its calls
    outside the split-KV decode kernel): each item's keys bounded by its length (HAS_BOUNDS
    without a padding mask, where the kernels move each item's ALiBi diagonal to its own length),
    at D 128 bf16, with a bool mask (left padding, a window, causal Sq > 1: the masked stages) and
    without (its full pipeline depth)."""
    specs: List[AotSpec] = []
    for fam, targets in FAMILY_TARGETS.items():
        dtype, precision = _dtype_and_precision(fam, 2)
        cfg = CONFIGS[fam]["fwd"][(128, 2)]
        kernel = kernel_table()["fwd"]
        for masked in (True, False):
            constexprs = dict(HEAD_DIM=128, D_PAD=128, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=False,
                              MASK_KIND=MASK_BOOL if masked else MASK_NONE, HAS_KPM=False, HAS_BOUNDS=True,
                              DROPOUT=False, DOT_PRECISION=precision, HAS_WINDOW=False, SOFTCAP=False, HAS_ALIBI=True,
                              SCAN=SCAN_BLOCK)
            signature = _signature(kernel, dtype, "*u8")
            specs.append(AotSpec(
                name=f"attention.fwd.{fam}.d128.{dtype}.m{cfg.block_m}n{cfg.block_n}w{cfg.num_warps}"
                     f"s{cfg.stages(masked)}.kvcache_alibi" + ("" if masked else ".nomask"),
                kernel=kernel, signature=signature, constexprs=constexprs, num_warps=cfg.num_warps,
                num_stages=cfg.stages(masked), targets=targets, unit_params=_unit_strides(signature)))
    return specs


def descriptor_aot_specs() -> List[AotSpec]:
    """The dk/dv kernel that reads q, dout, k and v through tensor descriptors (tiles.tma_backward:
    sm_90 family, 16-bit inputs) at every sm_90 dk/dv tile, every mask flag on."""
    specs: List[AotSpec] = []
    fam = "nvidia_sm90"
    kernel = kernel_table()["dkdv_tma"]
    entries = list(CONFIGS[fam]["dkdv"].items()) + list(SHORT_CONFIGS.get(fam, {}).get("dkdv", {}).items())
    entries += [entry for entry in ALIBI_CONFIGS.get(fam, {}).get("dkdv", {}).items() if entry not in entries]
    for (bucket, elem), cfg in entries:
        if elem != 2:
            continue
        dtype, precision = _dtype_and_precision(fam, elem)
        constexprs = dict(HEAD_DIM=bucket, D_PAD=bucket, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=True,
                          MASK_KIND=MASK_ADDITIVE, HAS_KPM=True, HAS_BOUNDS=True, DROPOUT=False,
                          DOT_PRECISION=precision, HAS_WINDOW=True, SOFTCAP=True, HAS_ALIBI=True, SCAN=SCAN_BLOCK)
        signature = _signature(kernel, dtype, "*fp32", {
            "QDesc": (cfg.block_m, bucket), "DODesc": (cfg.block_m, bucket),
            "KDesc": (cfg.block_n, bucket), "VDesc": (cfg.block_n, bucket)})
        specs.append(AotSpec(
            name=f"attention.dkdv_tma.{fam}.d{bucket}.{dtype}.m{cfg.block_m}n{cfg.block_n}"
                 f"w{cfg.num_warps}s{cfg.stages(True)}",
            kernel=kernel, signature=signature, constexprs=constexprs, num_warps=cfg.num_warps,
            num_stages=cfg.stages(True), targets=FAMILY_TARGETS[fam], unit_params=_unit_strides(signature)))
    largest = max(specs, key=lambda spec: spec.constexprs["HEAD_DIM"], default=None)
    if largest is not None:   # the folded grid (tiles.causal_order) at the largest tile
        specs.append(dataclasses.replace(largest, name=largest.name + ".fold",
                                         constexprs={**largest.constexprs, "ORDER": ORDER_FOLD}))
    return specs
