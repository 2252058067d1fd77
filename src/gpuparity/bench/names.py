"""The benches' names and default shapes, importable without torch: `gpuparity bench ... --help`
and a bad usage list them and refuse at once (the bench modules import torch when they run)."""
from __future__ import annotations

from typing import Dict, Tuple

DTYPE_NAMES = ("bf16", "fp16", "fp32")
GRAPH = ":graph"
MODES = ("fwd", "fwd+bwd", "fwd" + GRAPH, "fwd+bwd" + GRAPH)

# attention: name -> (B, H, S, D), from docs/targets.md
SHAPES: Dict[str, Tuple[int, int, int, int]] = {
    "aam-nuc": (512, 4, 150, 32),
    "aam-asv": (16, 4, 1024, 32),
    "bert": (32, 12, 512, 64),
    "llm-4k": (4, 16, 4096, 64),
    "llm-8k": (2, 16, 8192, 128),
}
# CPU-sized shapes: the default of `bench attention` on a CPU, where the shapes above take
# minutes each (llm-4k: 69 GFLOP per forward, a minute per call on a loaded CPU)
CPU_SHAPES: Dict[str, Tuple[int, int, int, int]] = {
    "cpu-s": (2, 4, 256, 32),
    "cpu-m": (2, 4, 512, 64),
}
BACKENDS = ("math", "efficient", "cudnn", "flex", "flash", "triton", "fa2", "fa4")
SUITES = ("dense", "window", "varlen", "decode")
WINDOWS = (1024, 4096)
WINDOW_SHAPES = ("llm-4k", "llm-8k")
# decode: B 1/8/64 x Sk 4k/32k/128k at H 32, D 128 (one query); Hkv from --kv-heads (default 8)
DECODE_SHAPES: Dict[str, Tuple[int, int, int, int]] = {
    f"decode-b{b}-{sk // 1024}k": (b, 32, sk, 128) for sk in (4096, 32768, 131072) for b in (1, 8, 64)}
DECODE_KV_HEADS = 8
# each suite's default shapes, on a GPU and on a CPU
SUITE_SHAPES = {"dense": tuple(SHAPES), "varlen": tuple(SHAPES), "window": WINDOW_SHAPES,
                "decode": tuple(DECODE_SHAPES)}
CPU_SUITE_SHAPES = {"dense": tuple(CPU_SHAPES), "varlen": tuple(CPU_SHAPES), "window": ("cpu-m",),
                    "decode": ("decode-b1-4k", "decode-b8-4k")}

NORM_BACKENDS = ("triton", "torch", "eager", "compile", "liger")
NORM_OPS = ("rms", "ln")
NORM_SHAPES = "16384x4096,65536x1024,131072x128"
NORM_CPU_SHAPES = "1024x1024,4096x128"
ROPE_BACKENDS = ("triton", "eager", "compile", "liger")
LAYOUTS = ("half", "interleaved", "varlen")
ROPE_SHAPES = "8x32x4096x128,64x4x1024x32"
ROPE_CPU_SHAPES = "1x8x512x64,4x4x256x32"
