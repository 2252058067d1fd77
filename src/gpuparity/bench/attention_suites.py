"""The feature suites of `gpuparity bench attention` beside the dense one: a causal sliding
window, packed variable-length sequences and decode against a KV cache, each with ours,
FlexAttention, SDPA and FlashAttention side by side (a Workload per case, see attention_measure).

TFLOP/s here count the (query, key) pairs a row attends (the window's band, each sequence's
own keys), not the dense square; decode reports GB/s of K+V read."""
from __future__ import annotations

import functools
from typing import Iterator, Sequence, Tuple

import torch

from .attention_measure import (SDPA_NAMES, Setup, Workload, cumulative, flash_function, flash_varlen, flex,
                                key_lengths, packed, relative_l2, sdpa)
from .names import DECODE_KV_HEADS, DECODE_SHAPES, SUITES, WINDOW_SHAPES, WINDOWS  # noqa: F401 - re-exported

REF_HEADS = 4          # the error is taken on the first batch item, up to 4 heads


def _not_a_peer(suite: str, name: str, why: str):
    raise ValueError(f"backend: {name!r} is not a peer of the {suite} suite ({why})")


def _randn(shape, dtype, gen, device, count):
    return [torch.randn(*shape, device=device, dtype=dtype, generator=gen) for _ in range(count)]


def _sdpa_names(name: str) -> bool:
    return name in SDPA_NAMES and name != "flash"


# --------------------------------------------------------------------------- sliding window
def window_workload(label: str, dims, left: int, dtype, device, seed: int) -> Workload:
    """Causal attention over the last `left` keys (window=(left, 0)) on a dense batch: ours
    with window=, flex with a sliding-window block mask, SDPA with the dense bool band, fa2/fa4
    with window_size."""
    from ..contracts import reference
    from ..ops.attention import attention
    batch, heads, seq, head_dim = dims
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, dout = _randn(dims, dtype, gen, device, 4)
    pos = torch.arange(seq, device=device)
    band = (pos.view(-1, 1) >= pos.view(1, -1)) & (pos.view(-1, 1) - pos.view(1, -1) <= left)
    h = min(REF_HEADS, heads)

    @functools.lru_cache(maxsize=None)
    def ref():
        with torch.no_grad():
            return reference.attention(*(t[:1, :h].double() for t in (q, k, v)), attn_mask=band)

    def error_bhsd(out):
        return relative_l2(out[:1, :h], ref())

    def build(name: str) -> Setup:
        if name == "triton":
            return Setup(lambda a, b, c: attention(a, b, c, window=(left, 0), backend="triton"), (q, k, v), dout,
                         error_bhsd)
        if name == "flex":
            fn = flex(lambda b, hh, qi, ki: (qi >= ki) & (qi - ki <= left), None, seq, seq, device)
            return Setup(fn, (q, k, v), dout, error_bhsd)
        if _sdpa_names(name):
            return Setup(sdpa(name, attn_mask=band), (q, k, v), dout, error_bhsd)
        if name in ("fa2", "fa4"):
            cu = torch.arange(batch + 1, device=device, dtype=torch.int32) * seq
            fn = flash_varlen(name, cu, cu, seq, seq, causal=True, window=(left, 0))
            flat = [t.transpose(1, 2).reshape(batch * seq, heads, head_dim).contiguous() for t in (q, k, v, dout)]
            return Setup(fn, tuple(flat[:3]), flat[3],
                         lambda out: error_bhsd(out.view(batch, seq, heads, head_dim).transpose(1, 2)))
        _not_a_peer("window", name, "it takes no window or mask")

    pairs = int(band.sum())
    return Workload(f"{label} window {left}", {"shape": list(dims), "pad": 0.0, "suite": "window", "window": left},
                    build, flops_fwd=4.0 * batch * heads * head_dim * pairs)


# --------------------------------------------------------------------------- packed sequences
def varlen_workload(label: str, dims, pad: float, dtype, device, seed: int) -> Workload:
    """The sequences of a padded batch (lengths as the dense suite's key padding at `pad`)
    packed: ours through attention_varlen, flex with a document mask over the packed tokens,
    fa2/fa4 through flash_attn_varlen_func; SDPA runs the padded batch (key-padding mask),
    which is what packing saves."""
    from ..contracts import reference
    from ..ops.varlen import attention_varlen
    batch, heads, seq, head_dim = dims
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, dout = _randn(dims, dtype, gen, device, 4)
    lengths = key_lengths(batch, seq, pad, seed)
    valid = (torch.arange(seq).view(1, seq) < lengths.view(batch, 1)).to(device)
    flat = [packed(t, valid) for t in (q, k, v, dout)]
    cu = cumulative(lengths).to(device)
    longest, first = int(lengths.max()), int(lengths[0])
    h = min(REF_HEADS, heads)

    @functools.lru_cache(maxsize=None)
    def ref():
        with torch.no_grad():
            return reference.attention(*(t[:1, :h, :first].double() for t in (q, k, v)))

    def error_bhsd(out):
        return relative_l2(out[:1, :h, :first], ref())

    def error_packed(out):
        return relative_l2(out[:first, :h].transpose(0, 1).unsqueeze(0), ref())

    def build(name: str) -> Setup:
        if name == "triton":
            return Setup(lambda a, b, c: attention_varlen(a, b, c, cu, cu, longest, longest, backend="triton"),
                         tuple(flat[:3]), flat[3], error_packed)
        if name == "flex":
            doc = torch.repeat_interleave(torch.arange(batch), lengths).to(device)
            total = doc.numel()
            fn = flex(lambda b, hh, qi, ki: doc[qi] == doc[ki], None, total, total, device)
            one = [t.transpose(0, 1).unsqueeze(0).contiguous() for t in flat]
            return Setup(fn, tuple(one[:3]), one[3], lambda out: relative_l2(out[:1, :h, :first], ref()))
        if _sdpa_names(name):
            return Setup(sdpa(name, attn_mask=valid.view(batch, 1, 1, seq)), (q, k, v), dout, error_bhsd)
        if name in ("fa2", "fa4"):
            return Setup(flash_varlen(name, cu, cu, longest, longest), tuple(flat[:3]), flat[3], error_packed)
        _not_a_peer("varlen", name, "it takes no mask")

    pairs = int((lengths.double() ** 2).sum())
    return Workload(f"{label} varlen", {"shape": list(dims), "pad": pad, "suite": "varlen",
                                        "tokens": int(lengths.sum())},
                    build, flops_fwd=4.0 * heads * head_dim * pairs)


# --------------------------------------------------------------------------- decode
def decode_workload(label: str, dims, kv_heads: int, dtype, device, seed: int) -> Workload:
    """One new query per item against a full KV cache of Sk keys (B, H, Sk, D; Hkv kv_heads):
    ours through attention_decode, SDPA with enable_gqa and a length mask, flex with a length
    block mask, fa2 through flash_attn_with_kvcache, fa4 through its varlen entry point.
    Forward only; GB/s = K+V bytes read / time (benchmarks/bench_decode.py's measure)."""
    from ..contracts import reference
    from ..ops.decode import attention_decode
    batch, heads, seq, head_dim = dims
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"--kv-heads: expected a divisor of H={heads} (shape {label}), got {kv_heads}")
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype, generator=gen)
    k, v = _randn((batch, kv_heads, seq, head_dim), dtype, gen, device, 2)
    lengths = torch.full((batch,), seq, dtype=torch.int32, device=device)

    @functools.lru_cache(maxsize=None)
    def ref():
        with torch.no_grad():
            return reference.attention(*(t[:1].double() for t in (q, k, v)))

    def error_bhsd(out):
        return relative_l2(out[:1], ref())

    def build(name: str) -> Setup:
        if name == "triton":
            return Setup(lambda a, b, c: attention_decode(a, b, c, lengths, backend="triton"), (q, k, v), None,
                         error_bhsd)
        if _sdpa_names(name):
            mask = (torch.arange(seq, device=device).view(1, seq) < lengths.view(batch, 1)).view(batch, 1, 1, seq)
            return Setup(sdpa(name, attn_mask=mask, enable_gqa=True), (q, k, v), None, error_bhsd)
        if name == "flex":
            fn = flex(lambda b, hh, qi, ki: ki < lengths[b], batch, 1, seq, device, enable_gqa=True)
            return Setup(fn, (q, k, v), None, error_bhsd)
        if name == "fa2":
            with_cache = flash_function("fa2", "flash_attn_with_kvcache")
            bshd = tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))
            return Setup(lambda a, b, c: with_cache(a, b, c, cache_seqlens=lengths, causal=True), bshd, None,
                         lambda out: error_bhsd(out.transpose(1, 2)))
        if name == "fa4":
            steps = torch.arange(batch + 1, device=device, dtype=torch.int32)
            fn = flash_varlen("fa4", steps, steps * seq, 1, seq, causal=True)
            inputs = (q[:, :, 0].contiguous(),) + tuple(
                t.transpose(1, 2).reshape(batch * seq, kv_heads, head_dim).contiguous() for t in (k, v))
            return Setup(fn, inputs, None, lambda out: error_bhsd(out.view(batch, heads, 1, head_dim)))
        _not_a_peer("decode", name, "it takes no mask")

    name = label if label.startswith("decode") else f"{label} decode"
    return Workload(f"{name} Hkv {kv_heads}", {"shape": list(dims), "pad": 0.0, "suite": "decode",
                                                 "kv_heads": kv_heads}, build,
                    bytes_fwd=2.0 * batch * kv_heads * seq * head_dim * q.element_size(), forward_only=True)


def suite_workloads(suite: str, shapes: Sequence[Tuple[str, Tuple[int, int, int, int]]], pads: Sequence[float],
                    dtype, device: str, seed: int, *, windows: Sequence[int] = WINDOWS,
                    kv_heads: int = DECODE_KV_HEADS) -> Iterator[Workload]:
    """The workloads of one feature suite, made one at a time. varlen takes the nonzero pads
    (0.25 when there is none: pad 0 packs nothing); window and decode take no padding."""
    if suite == "window":
        for label, dims in shapes:
            for left in windows:
                yield window_workload(label, dims, left, dtype, device, seed)
    elif suite == "varlen":
        for label, dims in shapes:
            for pad in [p for p in pads if p > 0] or [0.25]:
                yield varlen_workload(label, dims, pad, dtype, device, seed)
    elif suite == "decode":
        for label, dims in shapes:
            yield decode_workload(label, dims, kv_heads, dtype, device, seed)
    else:
        raise ValueError(f"suite: expected one of {list(SUITES[1:])} here, got {suite!r}")
