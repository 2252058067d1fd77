"""The size-probe family: bugs past 2^31 / 2^32 elements or bytes (32-bit offsets that wrap in a
kernel). Each probe states the memory it needs and runs only where the device has that much free
(with a margin, since the doctor's battery may run beside it); otherwise it says why it did not
run ("cannot tell"), never silently. Results are checked on the slice past the boundary, against
float64 or an exact answer, so the reference stays small."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F

from ...contracts.attention import attention as reference_attention
from ...contracts.norms import layer_norm as reference_layer_norm
from .base import finding, inconclusive, is_rocm, judge, probe, randn, summarize, sync

GiB = 2 ** 30
MARGIN = 1.25     # free memory wanted beyond the probe's own need


def memory_shortfall(dev: torch.device, needed_bytes: int) -> Optional[Dict[str, Any]]:
    """A "did not run" finding when `dev` lacks `needed_bytes` (times MARGIN) free; None when it has it."""
    if dev.type != "cuda":
        return inconclusive(f"not run: this size probe needs a GPU with {needed_bytes * MARGIN / GiB:.1f} GiB free "
                            f"(device {dev}); a CPU run would take minutes and tens of GiB of host memory",
                            needed_gib=round(needed_bytes / GiB, 2))
    free, total = torch.cuda.mem_get_info(dev)
    if free < needed_bytes * MARGIN:
        return inconclusive(f"not run: needs {needed_bytes * MARGIN / GiB:.1f} GiB free on {dev}, has "
                            f"{free / GiB:.1f} of {total / GiB:.1f} GiB", needed_gib=round(needed_bytes / GiB, 2),
                            free_gib=round(free / GiB, 2))
    return None


def _release(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


@probe(gpu=True)
def layer_norm_2pow32(dev: torch.device) -> Dict[str, Any]:
    """F.layer_norm over (2^22 + 64, 1024) bf16 (numel just past 2^32): the rows past the 2^32-th
    element against float64 (pytorch/pytorch#181555: zeros there)."""
    rows, width = 2 ** 22 + 64, 1024
    if (skip := memory_shortfall(dev, 2 * rows * width * 2)) is not None:
        return skip
    # one random row repeated (a cheap fill), the last 256 rows random: those are checked
    x = randn((1, width), dev, torch.bfloat16, 1).expand(rows, width).contiguous()
    tail = randn((256, width), dev, torch.bfloat16, 2)
    x[-256:] = tail
    out = F.layer_norm(x, (width,))
    sync(dev)
    got = out[-256:].float().cpu()
    zero_rows = int((got == 0).all(dim=-1).sum())
    ref = reference_layer_norm(tail.detach().to("cpu", torch.float64), (width,))
    comparison = judge("layer_norm rows past 2^32 elements", got.to(torch.bfloat16), ref, None, torch.bfloat16)
    del x, out
    _release(dev)
    result = summarize([comparison], f"layer_norm of ({rows}, {width}) bf16 ({rows * width / 2 ** 32:.4f} x 2^32 "
                                     f"elements), last 256 rows")
    result["zero_rows"] = zero_rows
    return result


@probe(gpu=True)
def cumsum_2pow32(dev: torch.device) -> Dict[str, Any]:
    """torch.cumsum(dim=1) of zeros (309504, 1, 16384) fp16 (5.07e9 elements): every sum must be
    0 (pytorch/pytorch#167086: a uint32 product in the scan kernel wraps)."""
    shape = (309504, 1, 16384)
    numel = shape[0] * shape[1] * shape[2]
    if (skip := memory_shortfall(dev, 2 * numel * 2)) is not None:
        return skip
    x = torch.zeros(shape, dtype=torch.float16, device=dev)
    out = torch.cumsum(x, dim=1)
    peak = float(out.abs().max())
    sync(dev)
    del x, out
    _release(dev)
    return finding(peak != 0.0, f"cumsum(dim=1) of zeros {shape} fp16 ({numel / 2 ** 32:.2f} x 2^32 elements): "
                                f"max |sum| = {peak:g} (0 expected)", max_abs=peak)


def _gemm_tail(dev: torch.device, m: int, n: int, k: int, dtype=torch.bfloat16) -> Dict[str, Any]:
    """A GEMM into a NaN-prefilled (m, n) output: rows never written stay NaN."""
    size = torch.tensor([], dtype=dtype).element_size()
    if (skip := memory_shortfall(dev, (m * n + (m + n) * k) * size)) is not None:
        return skip
    a, b = randn((m, k), dev, dtype, 1), randn((k, n), dev, dtype, 2)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
    torch.matmul(a, b, out=out)
    sync(dev)
    bad = torch.isnan(out).any(dim=1)
    nan_rows = int(bad.sum())
    first = int(bad.nonzero()[0, 0]) if nan_rows else None
    del a, b, out, bad
    _release(dev)
    return finding(nan_rows > 0, f"{nan_rows} of {m} output rows never written (still NaN)"
                   + (f", first at row {first}" if nan_rows else f"; output {m * n * size / GiB:.2f} GiB"),
                   unwritten_rows=nan_rows)


@probe(gpu=True)
def gemm_4gib_tail(dev: torch.device) -> Dict[str, Any]:
    """bf16 GEMM whose output passes 4 GiB with M % 256 != 0: is every row written
    (ROCm/rocm-libraries#8767: the edge-tile store offset is 32-bit on gfx942/gfx950)?"""
    return _gemm_tail(dev, 2 ** 18 + 100, 8192, 64)


@probe(gpu=True)
def gemm_huge_m(dev: torch.device) -> Dict[str, Any]:
    """f16 GEMM with M = 114278400, N = 16, K = 144 (the shape of ROCm/rocm-libraries#6664):
    writes past the 2^31-byte buffer limit dropped?"""
    return _gemm_tail(dev, 114278400, 16, 144, torch.float16)


@probe(gpu=True)
def triton_buffer_ops_2gib(dev: torch.device) -> Dict[str, Any]:
    """A Triton copy kernel reading a 3 GiB bf16 tensor with 32-bit offsets: elements at byte
    offsets between 2 and 4 GiB read back as 0 when AMD buffer ops mis-handle them
    (ROCm/triton#871, #944)."""
    numel = 3 * GiB // 2
    if (skip := memory_shortfall(dev, 2 * numel * 2)) is not None:
        return skip
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        return inconclusive(f"triton is not importable here ({exc})")

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(dst + offsets, tl.load(src + offsets, mask=mask, other=0.0), mask=mask)

    src = torch.full((numel,), 1.5, dtype=torch.bfloat16, device=dev)
    dst = torch.zeros_like(src)
    copy[(triton.cdiv(numel, 1024),)](src, dst, numel, BLOCK=1024)
    sync(dev)
    past = dst[GiB:]            # element GiB = byte offset 2 GiB
    zeros = int((past == 0).sum())
    head_zeros = int((dst[:GiB] == 0).sum())
    del src, dst, past
    _release(dev)
    where = "ROCm" if is_rocm() else "CUDA"
    return finding(zeros + head_zeros > 0, f"Triton copy of {numel * 2 / GiB:.0f} GiB bf16 on {where}: {zeros} zeros "
                                           f"at byte offsets 2-3 GiB, {head_zeros} below 2 GiB (0 expected)",
                   zeros_past_2gib=zeros, zeros_below_2gib=head_zeros)


@probe(gpu=True)
def sdpa_long_mask(dev: torch.device) -> Dict[str, Any]:
    """SDPA (the default backend choice) with a block-diagonal float attn_mask over 131072 keys,
    1024 queries, bf16: 8 query rows against float64 (pytorch/pytorch#162588 reports wrong output
    above ~100k tokens with a mask; this probe's Lq is shorter than the report's, to stay small)."""
    q_len, k_len, dim, groups = 1024, 131072, 64, 8
    if (skip := memory_shortfall(dev, q_len * k_len * 2 * 3 + k_len * dim * 2 * 2)) is not None:
        return skip
    q = randn((1, 1, q_len, dim), dev, torch.bfloat16, 1, scale=3.0)
    k, v = randn((1, 1, k_len, dim), dev, torch.bfloat16, 2, scale=3.0), randn((1, 1, k_len, dim), dev, torch.bfloat16, 3)
    mask = torch.full((q_len, k_len), float("-inf"), dtype=torch.bfloat16, device=dev)
    q_step, k_step = q_len // groups, k_len // groups
    for g in range(groups):   # query group g sees key group g only
        mask[g * q_step:(g + 1) * q_step, g * k_step:(g + 1) * k_step] = 0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
    sync(dev)
    rows = torch.tensor([0, q_step - 1, 3 * q_step, 4 * q_step + 5, 6 * q_step, q_len - 64, q_len - 2, q_len - 1])
    got = out[0, 0, rows.to(dev)].float().cpu()
    ref = reference_attention(q[:, :, rows.to(dev)].detach().to("cpu", torch.float64),
                              k.detach().to("cpu", torch.float64), v.detach().to("cpu", torch.float64),
                              attn_mask=mask[rows.to(dev)].detach().to("cpu", torch.float64)[None, None])[0, 0]
    del q, k, v, mask, out
    _release(dev)
    return summarize([judge("SDPA 131072 keys, float mask, 8 rows", got.to(torch.bfloat16), ref, None,
                              torch.bfloat16)], f"SDPA bf16 Lq={q_len} Lk={k_len} with a block-diagonal float mask")


@probe(gpu=True)
def conv3d_bf16_large(dev: torch.device, shape=(16, 124, 1282, 722)) -> Dict[str, Any]:
    """bf16 conv3d of (1, 16, 124, 1282, 722) with a (1, 3, 3) kernel (1.8e9 input elements, the
    report's shape; `shape` is channels, depth, height, width) on cuDNN: the first, middle and last
    depth slices against float64 conv2d on the CPU (the kernel's depth is 1, so each output slice
    depends on its input slice only; pytorch/pytorch#163539: wrong bf16 results on large inputs
    since cuDNN 9.10.2)."""
    channels, depth, height, width = shape
    numel = channels * depth * height * width
    if (skip := memory_shortfall(dev, 2 * numel * 2 + 2 ** 30)) is not None:
        return skip
    generator = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((1, channels, depth, height, width), generator=generator, device=dev, dtype=torch.bfloat16)
    weight = randn((channels, channels, 1, 3, 3), dev, torch.bfloat16, 1, scale=1 / 12)
    out = F.conv3d(x, weight)
    sync(dev)
    comparisons = []
    weight64 = weight[:, :, 0].detach().to("cpu", torch.float64)
    for index in (0, depth // 2, depth - 1):
        ref = F.conv2d(x[:, :, index].detach().to("cpu", torch.float64), weight64)
        comparisons.append(judge(f"conv3d depth slice {index}", out[:, :, index].cpu(), ref, None, torch.bfloat16))
    del x, out
    _release(dev)
    return summarize(comparisons, f"bf16 conv3d (1, {channels}, {depth}, {height}, {width}) x (1, 3, 3), "
                                  f"{numel / 2 ** 31:.2f} x 2^31 input elements, 3 depth slices")
