"""ALiBi in the split-KV decode kernel (gpuparity.flash_attn's alibi_slopes in its decode case):
-slope * |L_b - Sq + i - j| on each item's length, per-head and per-batch slopes, GQA, several
splits, contiguous and paged caches (shuffled pages that hold a whole tile and pages that split
one) against the float64 reference; the attention_decode contract's ALiBi cases pass the kernel
and catch a kernel that drops the bias, gives every item the first one's slopes or aligns it
top-left; the slopes' argument errors."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE  # sets TRITON_INTERPRET=1 on the CPU before triton imports

from gpuparity.backends import triton_decode as td
from gpuparity.contracts.decode import decode_composition, paged_decode_reference
from gpuparity.tolerance import judge

DEVICE = torch.device(TEST_DEVICE)
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")
BATCH, HEADS, KV_HEADS, HEAD_DIM = 3, 4, 2, 16


def inputs(q_len, page, slopes_shape, dtype=torch.float32, width=40, seed=0):
    """q (B, H, Sq, D), caches (contiguous (B, Hkv, width, D), or shuffled pools of `page`-token
    pages with spare ones and a table), lengths with an empty item, and fp32 slopes."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, HEADS, q_len, HEAD_DIM, generator=gen)
    table = None
    if page is None:
        k_cache, v_cache = (torch.randn(BATCH, KV_HEADS, width, HEAD_DIM, generator=gen) for _ in range(2))
    else:
        blocks = -(-width // page)
        pool = BATCH * blocks + 3
        k_cache, v_cache = (torch.randn(pool, KV_HEADS, page, HEAD_DIM, generator=gen) for _ in range(2))
        table = torch.randperm(pool, generator=gen)[:BATCH * blocks].view(BATCH, blocks).to(torch.int32).to(DEVICE)
    seqlens = torch.tensor([0, 17, width], dtype=torch.int32)
    slopes = torch.rand(slopes_shape, generator=gen) * 0.5 + 0.05
    q, k_cache, v_cache = (t.to(DEVICE, dtype) for t in (q, k_cache, v_cache))
    return q, k_cache, v_cache, seqlens.to(DEVICE), table, slopes.to(DEVICE)


def check(out, q, k_cache, v_cache, seqlens, table, slopes, softcap=None):
    ref = paged_decode_reference(q, k_cache, v_cache, seqlens.cpu(), softcap=softcap, block_table=table,
                                 alibi_slopes=slopes)
    base = decode_composition(q, k_cache, v_cache, seqlens, softcap=softcap, block_table=table, alibi_slopes=slopes)
    visible = seqlens.cpu().long().view(-1, 1, 1, 1) - q.shape[2] + 1 + torch.arange(q.shape[2]).view(1, 1, -1, 1)
    empty = (visible <= 0).expand(q.shape[0], q.shape[1], q.shape[2], 1)
    result = judge("out", out.cpu(), ref, base.cpu(), q.dtype, valid=~empty, must_be_zero=empty)
    assert result.passed, result.reason


# page 16 holds a whole interpreter tile (BLOCK_N 16), page 5 splits every tile over pages
@pytest.mark.parametrize("page, q_len, splits, slopes_shape, dtype", [
    (None, 1, 1, (HEADS,), torch.float32), (None, 3, 3, (BATCH, HEADS), torch.float32),
    (16, 2, 2, (BATCH, HEADS), torch.bfloat16), (5, 3, 3, (HEADS,), torch.float32)])
def test_decode_kernel_alibi_matches_the_reference(page, q_len, splits, slopes_shape, dtype):
    q, k_cache, v_cache, seqlens, table, slopes = inputs(q_len, page, slopes_shape, dtype, seed=q_len)
    out = td.triton_decode(q, k_cache, v_cache, seqlens, block_table=table, alibi_slopes=slopes, num_splits=splits)
    check(out, q, k_cache, v_cache, seqlens, table, slopes)
    # the bias changes the answer (a kernel that ignored the slopes would not pass the check above)
    plain = td.triton_decode(q, k_cache, v_cache, seqlens, block_table=table, num_splits=splits)
    assert (out - plain).abs().max() > 1e-2


def test_decode_kernel_alibi_after_the_softcap():
    """FlashAttention adds the bias to the softcapped scores (softcap, then ALiBi)."""
    q, k_cache, v_cache, seqlens, table, slopes = inputs(2, 5, (BATCH, HEADS), seed=7)
    out = td.triton_decode(q * 30.0, k_cache, v_cache, seqlens, softcap=20.0, block_table=table,
                           alibi_slopes=slopes, num_splits=2)
    check(out, q * 30.0, k_cache, v_cache, seqlens, table, slopes, softcap=20.0)


@pytest.mark.parametrize("slopes, error, pattern", [
    (torch.ones(HEADS, dtype=torch.float64), TypeError, "alibi_slopes: expected a float32 tensor"),
    (torch.ones(BATCH, HEADS + 1), ValueError, r"alibi_slopes: expected shape \(4,\) \(per head\) or \(3, 4\)"),
])
def test_bad_slopes_are_named(slopes, error, pattern):
    q, k_cache, v_cache, seqlens, table, _ = inputs(1, None, (HEADS,))
    with pytest.raises(error, match=pattern):
        td.triton_decode(q, k_cache, v_cache, seqlens, alibi_slopes=slopes.to(DEVICE))


# ----------------------------------------------------------------------------- the contract's cases
def _planted(kind):
    def planted(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None, alibi_slopes=None):
        if kind == "ignored":
            alibi_slopes = None
        elif kind == "first_row" and alibi_slopes.dim() == 2:   # item 0's slopes for every item
            alibi_slopes = alibi_slopes[0]
        elif kind == "top_left":   # query i at key position i (SDPA's alignment), not L_b - Sq + i
            if block_table is not None:
                k_cache, v_cache = td.gather_pages(k_cache, block_table), td.gather_pages(v_cache, block_table)
            q_len, s_max = q.shape[2], k_cache.shape[2]
            bias = -alibi_slopes.reshape(-1, q.shape[1], 1, 1) * (
                torch.arange(q_len, device=q.device).view(1, 1, -1, 1)
                - torch.arange(s_max, device=q.device).view(1, 1, 1, -1)).abs()
            allowed = td.decode_allowed(cache_seqlens, q_len, s_max)
            scores = (q @ td._repeat_kv(q, k_cache, v_cache)[0].transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            scores = (scores + bias).masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(scores, -1).nan_to_num(0.0)
            return probs @ td._repeat_kv(q, k_cache, v_cache)[1]
        return td.triton_decode(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap,
                                block_table=block_table, alibi_slopes=alibi_slopes)
    return planted


def test_the_batterys_decode_alibi_cases_pass_the_kernel_and_catch_wrong_biases():
    """The attention_decode contract's ALiBi cases, one for each kind a decode call with ALiBi can
    have (their verdicts are what gpuparity.flash_attn's auto path asks for): the kernel passes
    against float64; dropping the bias, item 0's slopes for every item, or the bias aligned top-left
    fail; the composition (no opt-in) is refused with the reason. (Any alignment at or past each
    item's last key is right: a causal query's keys all lie on one side of it, so moving it shifts
    every score of the row alike.)"""
    from gpuparity.checks.execute import run_case
    from gpuparity.checks.results import Status
    from gpuparity.contracts import get_spec
    from gpuparity.dispatch import get as get_backend
    spec = get_spec("attention_decode")
    cases = [c for c in spec.cases() if c.params.get("alibi")]
    assert {spec.kind(c.params) for c in cases} == {"default+alibi", "softcap+alibi", "paged+alibi",
                                                    "paged-softcap+alibi"}
    device = torch.device(DEVICE)
    baseline = get_backend("attention_decode", "composition").fn
    caught = {"ignored": set(), "first_row": set(), "top_left": set()}
    for case in cases:
        problem = spec.problem(case.params, torch.float32, device)
        assert get_backend("attention_decode", "triton").reasons(problem) == []
        assert "does not implement alibi" in " ".join(get_backend("attention_decode", "composition").reasons(problem))
        status, _, reason = run_case("attention_decode", get_backend("attention_decode", "triton").fn, case.params,
                                     torch.float32, device, 0, baseline_fn=baseline)
        assert status == Status.PASS, (case.name, reason)
        for kind in caught:
            status, _, reason = run_case("attention_decode", _planted(kind), case.params, torch.float32, device, 0,
                                         baseline_fn=baseline)
            assert status in (Status.PASS, Status.FAIL), (kind, case.name, reason)   # a planted bug fails; it never errors
            if status == Status.FAIL:
                caught[kind].add(case.name)
    assert caught["ignored"] == {c.name for c in cases}
    assert caught["top_left"] == {c.name for c in cases}
    assert caught["first_row"] == {c.name for c in cases if c.params["alibi"] == "batch"}


def test_an_implementation_without_alibi_slopes_keeps_its_signature():
    """`gpuparity check --op attention_decode --impl` with the documented signature (no
    alibi_slopes) is not refused as bad input: the ALiBi cases pass the slopes only to
    implementations that take them, the others get those cases as SKIP."""
    from gpuparity.checks.signature import signature_mismatch

    def decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
        return decode_composition(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap,
                                  block_table=block_table)
    assert signature_mismatch(decode, "attention_decode") is None
    from gpuparity.checks.execute import run_case
    from gpuparity.checks.results import Status
    from gpuparity.contracts import get_spec
    case = next(c for c in get_spec("attention_decode").cases() if c.params.get("alibi"))
    status, _, reason = run_case("attention_decode", decode, case.params, torch.float32, torch.device("cpu"), 0)
    assert status == Status.SKIP and "takes no alibi_slopes" in reason
