"""Tile configurations of the attention kernels: per-vendor tables, the short-key tables, the
device's family, JSON overrides ($GPUPARITY_ATTENTION_CONFIGS) and tile_config() to pick one."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, Optional, Tuple

import torch

from .. import triton_common
from ..triton_common import clear_plans
from ... import caches

MAX_HEAD_DIM = 256  # the largest head-dim bucket the tables have


@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # A dense attn_mask adds a mask tile to every pipeline stage: configs whose stages would
    # then overflow shared memory name the stage count to use with one (None: num_stages).
    masked_stages: Optional[int] = None

    def stages(self, dense_mask: bool) -> int:
        return self.masked_stages if dense_mask and self.masked_stages is not None else self.num_stages


# Per vendor family, kernel, head-dim bucket (the padded head dim; a bucket a family lacks
# uses the next larger one) and element size (2 for fp16/bf16, 4 for fp32). Hopper configs
# (227 KiB of shared memory) were tuned on an H100 with benchmarks/tune_attention.py;
# Ampere ones fit an A100's 163 KiB; AMD ones fit 64 KiB of LDS, and RDNA (wave32) gets
# smaller tiles. aot_specs() lists every entry; CI compiles each for its family's targets.
_SM90 = {
    "fwd": {
        (32, 2): TileConfig(64, 64, 4, 3),
        # (128, 2): 128x64 with 8 warps, from a 2026-11-21 sweep on llm-8k (H200, same sm_90 as
        # the H100): 1.80 ms vs 2.70 for the 64x64 / 4-warp tile the first sweep had chosen;
        # with a dense mask 3 stages need 256 KiB (Triton 3.6), so 2 there
        (64, 2): TileConfig(64, 64, 4, 3), (128, 2): TileConfig(128, 64, 8, 3, masked_stages=2),
        (256, 2): TileConfig(64, 32, 4, 2),
        (64, 4): TileConfig(64, 32, 4, 2), (128, 4): TileConfig(64, 32, 4, 2), (256, 4): TileConfig(32, 32, 4, 1),
    },
    "dkdv": {
        # (32, 2) and dq's: from a 2026-11-21 sweep on aam-asv (S=1024) alone, H100: backward
        # 0.126 -> 0.114 ms with both; short keys (aam-nuc) keep their own, SHORT_CONFIGS
        (32, 2): TileConfig(64, 128, 4, 2),
        # (128, 2): 64x64 with 4 warps, 2 stages, from a 2026-11-21 sweep on llm-8k (H200):
        # backward 5.75 ms vs 6.17 with the 64x128 / 8-warp tile the first sweep had chosen
        (64, 2): TileConfig(32, 64, 4, 3), (128, 2): TileConfig(64, 64, 4, 2), (256, 2): TileConfig(16, 32, 4, 1),
        (64, 4): TileConfig(32, 64, 4, 2), (128, 4): TileConfig(32, 32, 4, 2), (256, 4): TileConfig(16, 32, 4, 1),
    },
    "dq": {
        (32, 2): TileConfig(64, 64, 4, 3),
        (64, 2): TileConfig(64, 32, 4, 3), (128, 2): TileConfig(128, 64, 8, 3), (256, 2): TileConfig(32, 16, 4, 1),
        (64, 4): TileConfig(64, 32, 4, 2), (128, 4): TileConfig(32, 32, 4, 2), (256, 4): TileConfig(32, 16, 4, 1),
    },
}
# A100 (163 KiB): at head dims 65-128 with a dense mask the forward and dq tiles take 2 stages.
# Built as a contiguous launch builds them (AotSpec.unit_params), 3 stages with every mask flag
# need 221,184 (forward) and 184,320 (dq) bytes, with 2: 122,880 and 135,168 (Triton 3.6 and 3.9
# alike). Unmeasured on an A100 (none is lent): chosen to launch at all.
_SM80 = {
    "fwd": {**_SM90["fwd"], (128, 2): TileConfig(64, 64, 4, 3, masked_stages=2)},  # 128x64: unmeasured on an A100
    "dkdv": {**_SM90["dkdv"], (128, 2): TileConfig(32, 64, 4, 3)},
    "dq": {**_SM90["dq"], (128, 2): TileConfig(128, 64, 8, 3, masked_stages=2)},
}
_SM80["fwd"].pop((32, 2))
_SM80["dkdv"].pop((32, 2))
_SM80["dq"].pop((32, 2))
_CDNA = {
    "fwd": {
        (64, 2): TileConfig(128, 64, 4, 1), (128, 2): TileConfig(128, 32, 4, 1), (256, 2): TileConfig(64, 32, 4, 1),
        (64, 4): TileConfig(64, 32, 4, 1), (128, 4): TileConfig(64, 32, 4, 1), (256, 4): TileConfig(32, 16, 4, 1),
    },
    "dkdv": {
        (64, 2): TileConfig(32, 64, 4, 1), (128, 2): TileConfig(32, 64, 4, 1), (256, 2): TileConfig(16, 32, 4, 1),
        (64, 4): TileConfig(32, 32, 4, 1), (128, 4): TileConfig(16, 32, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
    "dq": {
        (64, 2): TileConfig(64, 32, 4, 1), (128, 2): TileConfig(64, 32, 4, 1), (256, 2): TileConfig(32, 16, 4, 1),
        (64, 4): TileConfig(32, 32, 4, 1), (128, 4): TileConfig(32, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
}
_RDNA = {
    "fwd": {
        (64, 2): TileConfig(64, 32, 4, 1), (128, 2): TileConfig(64, 32, 4, 1), (256, 2): TileConfig(32, 16, 4, 1),
        (64, 4): TileConfig(32, 32, 4, 1), (128, 4): TileConfig(32, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
    "dkdv": {
        (64, 2): TileConfig(32, 32, 4, 1), (128, 2): TileConfig(16, 32, 4, 1), (256, 2): TileConfig(16, 16, 4, 1),
        (64, 4): TileConfig(16, 32, 4, 1), (128, 4): TileConfig(16, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
    "dq": {
        (64, 2): TileConfig(32, 32, 4, 1), (128, 2): TileConfig(32, 16, 4, 1), (256, 2): TileConfig(16, 16, 4, 1),
        (64, 4): TileConfig(32, 16, 4, 1), (128, 4): TileConfig(16, 16, 4, 1), (256, 4): TileConfig(16, 16, 4, 1),
    },
}
# Short key sequences (k_len <= SHORT_KEYS): smaller key blocks waste less of the last, partial
# block. From a 2026-11-21 sweep on aam-nuc (512, 4, 150, 32), H200: forward 0.060 ms with
# 64x32 vs 0.077 with 64x64; dk/dv 0.144 vs 0.158 with 32x64 vs 32x128 (the general table's
# tiles were tuned on aam-nuc and aam-asv, S=1024, together). Entries override CONFIGS' for
# their (bucket, element size) only.
SHORT_KEYS = 256
SHORT_CONFIGS: Dict[str, Dict[str, Dict[Tuple[int, int], TileConfig]]] = {
    "nvidia_sm90": {"fwd": {(32, 2): TileConfig(64, 32, 4, 3)}, "dkdv": {(32, 2): TileConfig(32, 64, 4, 3)},
                    # dq: the tile the general table had before aam-asv got its own (0.145 ms vs
                    # 0.168 for aam-asv's 64x64 on aam-nuc, H200)
                    "dq": {(32, 2): TileConfig(64, 32, 4, 3)}},
}
# Kernels compiled with ALiBi (HAS_ALIBI: a bias per score, more registers) where another tile
# wins for them. dk/dv at D 64, bf16, Hopper: 64x64 with 4 warps, 3 stages, from an alternated
# A/B on an H100 (2026-11-27, record benchmarks/records/h100/paged-alibi-2026-11-27.md):
# f+b with ALiBi at bert (32, 12, 512, 64) 0.395 ms against 0.415 with the shipped 32x64,
# s1k-d64 0.213 against 0.218, llm-4k unchanged (1.76 ms). The same tile without a bias lost at
# bert with a key padding mask (whole backward 0.307 ms against 0.286), so calls without ALiBi
# keep the general table. Entries override CONFIGS' and SHORT_CONFIGS' for their (bucket,
# element size) when the call has ALiBi.
ALIBI_CONFIGS: Dict[str, Dict[str, Dict[Tuple[int, int], TileConfig]]] = {
    "nvidia_sm90": {"dkdv": {(64, 2): TileConfig(64, 64, 4, 3)}},
}
# The backward in one launch (backward_kernels._attn_bwd_kernel: dq and dk/dv programs side by
# side, dk/dv computing delta itself) while query rows x padded head dim stay within this;
# larger calls take two launches (dq, which stores delta, then dk/dv). One launch saves a
# launch's host time (~20-35 us on an H100 host); it costs device time, since its programs
# reserve the shared memory of the larger half and dk/dv reads out beside dout for every block
# of rows, both of which grow with rows and head dim. Measured on an H100 (bf16, pad 0.25,
# CUDA-graph replays of the backward; record: benchmarks/records/h100/attention-host-2026-11-25.md),
# one launch / two: 0.93-0.95 at (128, 12, 128, 64), (256, 4, 256, 32), (512, 4, 150, 32), all
# within the bound; 1.12 at (64, 12, 197, 64), 1.21 at (16, 4, 1024, 32), 1.20 at (32, 12, 512, 64).
FUSED_BACKWARD_MAX_ROWS_X_DIM = 256 * 32
_BACKWARD_FORMS = ("fused", "split")


def fused_backward(q_len: int, head_dim: int, dq_cfg: TileConfig, kv_cfg: TileConfig, dtype: torch.dtype) -> bool:
    """Whether the backward runs as one launch: short sequences at small head dims, 16-bit inputs,
    and the two kernels' tiles share their warp count (the one launch has one). fp32 takes two:
    the one launch's dk/dv programs compute delta from out, which on a near one-hot softmax row
    leaves dk at the rounding of out (fp32: ~1e-7 * |dout| * |v| where dk is ~1e-40); two launches
    give them the dq kernel's delta, consistent with dp (backward_kernels._dq_loops). In 16-bit
    that rounding is within the dtype's own. $GPUPARITY_ATTENTION_BACKWARD=fused|split forces a
    form (benchmarks compare them; read when a call signature is first prepared)."""
    forced = os.environ.get("GPUPARITY_ATTENTION_BACKWARD")
    if forced is not None and forced not in _BACKWARD_FORMS:
        raise ValueError(f"GPUPARITY_ATTENTION_BACKWARD: expected one of {_BACKWARD_FORMS}, got {forced!r}")
    if dq_cfg.num_warps != kv_cfg.num_warps:
        return False
    if forced is not None:
        return forced == "fused"
    return dtype != torch.float32 and q_len * padded_head_dim(head_dim) <= FUSED_BACKWARD_MAX_ROWS_X_DIM


_TMA_CHOICES = ("auto", "1", "0")


# Descriptor launches go through Triton's own launcher (~0.1 ms of host time on the lent hosts):
# only calls whose kernels take long enough to hide it, and head dims where the H200 measured a
# gain. Both limits come from a first integration (q and dout through descriptors, k and v still
# through pointers): D=32 at (16, 4, 1024, 32) lost (dk/dv 0.071 -> 0.080 ms), and with every
# shape on, bert's and aam-asv's eager steps took 1.4-2.1x cuDNN's host time. Head dim 256 and
# GPUs after Hopper were not measured: they keep the pointer kernel under "auto".
TMA_MIN_SCORES = 1024 * 1024     # q_len * k_len
TMA_MIN_HEAD_DIM = 64
TMA_MAX_HEAD_DIM = 128


def tma_backward(device: torch.device, dtype: torch.dtype, q_len: int, k_len: int, head_dim: int,
                 kv_cfg: TileConfig) -> bool:
    """Whether the two-launch backward's dk/dv kernel reads its q, dout, k and v tiles through
    tensor descriptors (Hopper's TMA): on sm_90+ NVIDIA GPUs (family nvidia_sm90), 16-bit inputs,
    a head dim that is a power of two (the tile is the head dim, no padding), q_len a multiple of
    the kernel's query step (no query tile crosses into the next (batch, head)); under "auto" also
    Hopper itself (compute capability 9), head dims 64-128 and at least TMA_MIN_SCORES scores. The
    launcher also needs dense (B, H, S, D) or (B, S, H, D) layouts. The same bits as the pointer
    kernel (record: benchmarks/records/h200/attention-tma-2026-11-26.md); a descriptor forward did
    not gain (2.264 vs 2.218 ms at (2, 16, 8192, 128)), so the forward keeps its pointers.
    $GPUPARITY_ATTENTION_TMA: auto (default), 0 (never), 1 (wherever the layout allows, any size,
    the interpreter too: for tests); read when a call signature is first prepared (its launches
    are kept: gpuparity.backends.triton_common.clear_plans() forgets them)."""
    choice = os.environ.get("GPUPARITY_ATTENTION_TMA", "auto")
    if choice not in _TMA_CHOICES:
        raise ValueError(f"GPUPARITY_ATTENTION_TMA: expected one of {_TMA_CHOICES}, got {choice!r}")
    if choice == "0" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if head_dim != padded_head_dim(head_dim) or q_len % kv_cfg.block_m:
        return False
    if choice == "auto" and (family(device) != "nvidia_sm90" or torch.cuda.get_device_capability(device)[0] != 9
                             or not TMA_MIN_HEAD_DIM <= head_dim <= TMA_MAX_HEAD_DIM
                             or q_len * k_len < TMA_MIN_SCORES):
        return False
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401 - Triton >= 3.4
    except ImportError:
        return False
    return True


_ORDER_CHOICES = ("auto", "launch", "interleave", "fold")
# ORDER values of kernels.program_block (0-2) and the dk/dv kernels' fold (3)
ORDER_LAUNCH, ORDER_LAST_FIRST, ORDER_FIRST_FIRST, ORDER_FOLD = 0, 1, 2, 3
# auto reorders a grid of at most this many programs per SM (the H100 measurements: grids of
# 256-512 programs on 132 SMs gained 8-14%, grids of 2048 programs moved within their noise)
SMALL_GRID_PER_SM = 8


def causal_order(kernel: str, is_causal: bool, has_window: bool, programs: int, device: torch.device) -> int:
    """The order of a dense kernel's programs ("fwd", "dq" or "dkdv"; kernels.program_block), its
    grid holding `programs` programs as launched. Under a plain causal mask a block's work grows
    with its distance from the start of the diagonal: a query block's with its index, a key
    block's with the keys after it. The hardware starts programs in launch order, row by row, so
    as launched the forward's and dq's last rows end with their heaviest blocks running alone, and
    in a small dk/dv grid (few rows: the batch times GQA's k/v heads; every program resident at
    once) the heaviest program takes twice the mean. "interleave" starts every row's heaviest
    block first (1 for query blocks, 2 for key blocks); "fold" (3, dk/dv: the grid halves, a
    program takes key blocks p and last - p) gives every dk/dv program the same work, the forward
    and dq interleaved. Same programs, same arithmetic, same bits: only the order moves.
    auto (default): fold for a grid of at most SMALL_GRID_PER_SM programs per SM (any size where
    the SM count is unknown: the interpreter), else as launched (0), where interleaving rows cost
    the forward 5% once (cache reuse between a row's programs lost). Without causality, or with a
    window, blocks have about the same work: as launched. $GPUPARITY_ATTENTION_ORDER: auto,
    launch, interleave, fold; read when a call signature is first prepared."""
    choice = os.environ.get("GPUPARITY_ATTENTION_ORDER", "auto")
    if choice not in _ORDER_CHOICES:
        raise ValueError(f"GPUPARITY_ATTENTION_ORDER: expected one of {_ORDER_CHOICES}, got {choice!r}")
    if not is_causal or has_window or choice == "launch":
        return ORDER_LAUNCH
    if choice == "auto":
        sms = triton_common.sm_count(device)
        if sms is not None and programs > SMALL_GRID_PER_SM * sms:
            return ORDER_LAUNCH
    if kernel != "dkdv":
        return ORDER_LAST_FIRST
    return ORDER_FIRST_FIRST if choice == "interleave" else ORDER_FOLD


_SPLIT_CHOICES = ("auto", "1", "0")


def split_kpm_dq(device: torch.device, head_dim: int) -> bool:
    """Whether the dq kernel of a call with a key padding mask compiles separate loops for
    padding without holes (a suffix, per-item lengths: no mask reads, no branch in the loop) and
    for padding with holes (at pipeline depth 1, so both sets of buffers fit), as the forward
    does at head dims above 64. Under "auto" where measured: the nvidia_sm90 family at padded
    head dim 128 (benchmarks/records/h100/attention-dq-split-2026-11-26.md).
    $GPUPARITY_ATTENTION_DQ_SPLIT: auto (default), 0, 1 (any family and head dim, the interpreter
    too: for tests); read when a call signature is first prepared."""
    choice = os.environ.get("GPUPARITY_ATTENTION_DQ_SPLIT", "auto")
    if choice not in _SPLIT_CHOICES:
        raise ValueError(f"GPUPARITY_ATTENTION_DQ_SPLIT: expected one of {_SPLIT_CHOICES}, got {choice!r}")
    if choice != "auto":
        return choice == "1"
    return split_kpm_dq_default(family(device), head_dim)


def split_kpm_dq_default(fam: str, head_dim: int) -> bool:
    """split_kpm_dq's "auto" for a tile family (the AOT specs compile what it says)."""
    return fam == "nvidia_sm90" and padded_head_dim(head_dim) == 128


# The interpreter runs one program at a time in numpy: large tiles, few programs.
_INTERP = {kernel: {key: TileConfig(32, 32, 4, 1) for key in table} for kernel, table in _SM80.items()}

CONFIGS: Dict[str, Dict[str, Dict[Tuple[int, int], TileConfig]]] = {
    "nvidia_sm90": _SM90, "nvidia": _SM80, "amd_cdna": _CDNA, "amd_rdna": _RDNA, "interpreter": _INTERP,
}
FAMILY_TARGETS = {
    "nvidia_sm90": ("cuda:90",),
    "nvidia": ("cuda:80",),
    "amd_cdna": ("hip:gfx942", "hip:gfx90a"),
    "amd_rdna": ("hip:gfx1100",),
}


def padded_head_dim(head_dim: int) -> int:
    return max(16, triton_next_pow2(head_dim))


# The key-padding scan chunk (a constexpr): every kernel, forward and backward, scans its batch
# item's row of the mask for the kept-key range; one size for every length, so lengths never
# cause a compile of their own, and longer masks loop. (Sized to the key length instead, the
# one-launch backward of (512, 4, 150, 32) was 1% faster on an H100: not worth the compiles.)
SCAN_BLOCK = 1024


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


BUCKETS = (32, 64, 128, 256)


def _bucket(head_dim: int) -> int:
    """The head-dim bucket of the config tables: the padded head dim, 16 counting as 32."""
    return max(32, padded_head_dim(head_dim))


_FAMILIES: Dict[Tuple, str] = caches.register("backends.triton_attention.tiles.families", {})


def family(device: torch.device) -> str:
    """Which config table serves `device`: nvidia, amd_cdna (wave64), amd_rdna (wave32), or
    interpreter. Cached per device (it is asked on every call)."""
    key = (device.type, device.index, triton_common.interpreting())
    if key not in _FAMILIES:
        if device.type != "cuda" or triton_common.interpreting():
            name = "interpreter"
        elif triton_common.vendor() == "amd":
            arch = triton_common.device_arch(device.index)
            name = "amd_rdna" if arch.startswith(("gfx10", "gfx11", "gfx12")) else "amd_cdna"
        else:
            major = torch.cuda.get_device_capability(device)[0]
            name = "nvidia_sm90" if major >= 9 else "nvidia"
        _FAMILIES[key] = name
    return _FAMILIES[key]


def load_overrides(path: str) -> None:
    """Replace table entries from a JSON file ({"nvidia": {"fwd": {"64,2": [bm, bn, warps,
    stages]}}}), e.g. what benchmarks/tune_attention.py found on another GPU. Read once from
    $GPUPARITY_ATTENTION_CONFIGS when set."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    for fam, kernels_ in data.items():
        for kernel_name, entries in kernels_.items():
            for key, values in entries.items():
                bucket, elem = (int(x) for x in key.split(","))
                CONFIGS[fam][kernel_name][(bucket, elem)] = TileConfig(*[int(x) for x in values])
                # an override serves every key length: the short-key entry makes way for it
                SHORT_CONFIGS.get(fam, {}).get(kernel_name, {}).pop((bucket, elem), None)
    clear_plans()


_OVERRIDES_LOADED = []


def tile_config(kernel: str, device: torch.device, head_dim: int, dtype: torch.dtype,
                k_len: Optional[int] = None, alibi: bool = False) -> TileConfig:
    """The tile config for `kernel` here; k_len (the key length) picks SHORT_CONFIGS' entry
    for short key sequences where there is one, alibi (the kernel is compiled with ALiBi)
    ALIBI_CONFIGS' where there is one."""
    if not _OVERRIDES_LOADED:
        _OVERRIDES_LOADED.append(True)
        if os.environ.get("GPUPARITY_ATTENTION_CONFIGS"):
            load_overrides(os.environ["GPUPARITY_ATTENTION_CONFIGS"])
    elem = 4 if dtype == torch.float32 else 2
    fam = family(device)
    if alibi:
        chosen = ALIBI_CONFIGS.get(fam, {}).get(kernel, {}).get((_bucket(head_dim), elem))
        if chosen is not None:
            return chosen
    if k_len is not None and k_len <= SHORT_KEYS:
        short = SHORT_CONFIGS.get(fam, {}).get(kernel, {}).get((_bucket(head_dim), elem))
        if short is not None:
            return short
    table = CONFIGS[fam][kernel]
    # a family without its own entry for a small bucket uses the next larger bucket's
    for bucket in BUCKETS[BUCKETS.index(_bucket(head_dim)):]:
        if (bucket, elem) in table:
            return table[(bucket, elem)]
    raise KeyError(f"no {kernel} tile config for head_dim {head_dim}, {dtype} in {fam}")
