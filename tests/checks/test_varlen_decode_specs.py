"""The battery's attention_varlen and attention_decode specs: `gpuparity check --op` and doctor
include them, planted bugs a kernel author makes (top-left causal, cu_seqlens_q used for the keys,
NaN on an empty sequence, an off-by-one cache length, the wrong GQA head) are caught, correct
implementations pass, and backend="auto" takes its verdicts from them."""
from __future__ import annotations

import pytest
import torch

from gpuparity.backends.triton_decode import gather_pages
from gpuparity.contracts.decode import decode_composition
from gpuparity.contracts.varlen import composition_varlen, packed
from gpuparity.contracts.attention import composition
from gpuparity.checks.battery import plan, run_battery
from gpuparity.checks.results import Status
from gpuparity.contracts import OPS

HERE = __file__


def run(op, name, level="quick", **kwargs):
    return run_battery([op], level, "cpu", impl=f"{HERE}:{name}", isolate=False, dtypes=["float32"], **kwargs)


def failed_cases(battery):
    return {r.case for r in battery.results if r.status.bad}


# ----------------------------------------------------------------------------- planted implementations
def varlen_correct(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
                   softcap=None, scale=None, alibi_slopes=None):
    return composition_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                              window=window, softcap=softcap, scale=scale, alibi_slopes=alibi_slopes)


def varlen_top_left_causal(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                           window=None, softcap=None, scale=None):
    """SDPA's top-left is_causal per sequence instead of FlashAttention's bottom-right."""
    def dense(q_i, k_i, v_i, *, attn_mask=None, scale=None, softcap=None):
        mask = None
        if causal:
            mask = torch.ones(q_i.shape[2], k_i.shape[2], dtype=torch.bool, device=q_i.device).tril()
        return composition(q_i, k_i, v_i, attn_mask=mask, scale=scale)
    return packed(dense, q, k, v, cu_seqlens_q, cu_seqlens_k, False, None, scale, None)


def varlen_keys_by_cu_q(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                        window=None, softcap=None, scale=None):
    """Slices the keys with the queries' offsets (fine only while Sq == Sk everywhere)."""
    total = min(q.shape[0], k.shape[0])
    cu = cu_seqlens_q.clamp(max=total)
    return composition_varlen(q, k[:total], v[:total], cu_seqlens_q, cu, max_seqlen_q, max_seqlen_k,
                              causal=causal, window=window, softcap=softcap, scale=scale)


def varlen_nan_on_empty(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                        window=None, softcap=None, scale=None):
    """Softmax over nothing: 0/0 on rows that see no key."""
    out = composition_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                             window=window, softcap=softcap, scale=scale)
    lengths_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).repeat_interleave(cu_seqlens_q[1:] - cu_seqlens_q[:-1])
    return torch.where((lengths_k == 0).view(-1, 1, 1), torch.full_like(out, float("nan")), out)


def decode_correct(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None,
                   alibi_slopes=None):
    return decode_composition(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap, block_table=block_table,
                              alibi_slopes=alibi_slopes)


def decode_one_key_too_many(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    """Reads the cache one past its length (the <= for < of a kernel's bound)."""
    if block_table is not None:
        k_cache, v_cache = gather_pages(k_cache, block_table), gather_pages(v_cache, block_table)
    return decode_composition(q, k_cache, v_cache, (cache_seqlens + 1).clamp(max=k_cache.shape[2]), scale=scale,
                              softcap=softcap)


def decode_wrong_gqa_head(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    """Query head h reads KV head h % Hkv instead of h // (H / Hkv)."""
    if block_table is not None:
        k_cache, v_cache = gather_pages(k_cache, block_table), gather_pages(v_cache, block_table)
    group = q.shape[1] // k_cache.shape[1]
    k, v = k_cache.repeat(1, group, 1, 1), v_cache.repeat(1, group, 1, 1)
    return decode_composition(q, k, v, cache_seqlens, scale=scale, softcap=softcap)


def decode_pages_in_pool_order(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    """Reads item b's pages in the pool's order, not through its table (a paged kernel that
    ignores the shuffle); a contiguous cache is read correctly."""
    if block_table is not None:
        block_table = torch.arange(block_table.numel(), device=block_table.device).view_as(block_table)
    return decode_composition(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap, block_table=block_table)


# ----------------------------------------------------------------------------- tests
def test_check_and_doctor_include_both_ops():
    assert {"attention_varlen", "attention_decode"} <= set(OPS)      # `check --op` choices
    tasks, decided = plan(None, "quick", "cpu")                      # doctor's plan: every op
    ops = {t.op for t in tasks} | {r.op for r in decided}
    assert {"attention_varlen", "attention_decode"} <= ops


def test_cli_check_accepts_the_new_ops():
    from gpuparity.cli import build_parser
    args = build_parser().parse_args(["check", "--op", "attention_varlen"])
    assert args.op == "attention_varlen"


@pytest.mark.parametrize("op, name, must_catch", [
    ("attention_varlen", "varlen_top_left_causal", {"causal_sq_ne_sk_bottom_right", "causal_window_scale"}),
    ("attention_varlen", "varlen_keys_by_cu_q", {"empty_and_single_sequences", "causal_sq_ne_sk_bottom_right"}),
    ("attention_varlen", "varlen_nan_on_empty", {"empty_and_single_sequences"}),
    ("attention_decode", "decode_one_key_too_many", {"lengths_0_1_full", "sq4_fewer_keys_than_queries"}),
    ("attention_decode", "decode_wrong_gqa_head", {"sq4_fewer_keys_than_queries", "lengths_0_1_full"}),
    ("attention_decode", "decode_pages_in_pool_order", {"paged_p16_gqa", "paged_p5_sq3_mqa", "paged_softcap_p16"}),
])
def test_planted_bug_is_caught(op, name, must_catch):
    caught = failed_cases(run(op, name))
    assert must_catch <= caught, f"{name}: missed {must_catch - caught}; caught {sorted(caught)}"


@pytest.mark.parametrize("op, name", [("attention_varlen", "varlen_correct"), ("attention_decode", "decode_correct")])
def test_correct_implementation_passes_every_default_case(op, name):
    # every listed case and family member but the long ones (seconds each; test_families.py has those)
    battery = run(op, name, level="default", case_filter=lambda _op, case: not case.name.startswith("long."))
    statuses = {r.case: r.status for r in battery.results}
    # a sampled relation whose row gives it nothing to compare SKIPs (e.g. contiguous_copy on a row
    # whose views are contiguous after all: a bshd q with one head); no other status but PASS
    assert statuses and all(s == Status.PASS or (s == Status.SKIP and c.startswith("relation."))
                            for c, s in statuses.items()), statuses
    assert sum(s == Status.PASS for s in statuses.values()) > 0.9 * len(statuses), statuses


def test_varlen_checks_gradients_and_empty_rows_must_be_zero():
    battery = run("attention_varlen", "varlen_correct")
    result = next(r for r in battery.results if r.case == "empty_and_single_sequences")
    assert {c.name for c in result.comparisons} == {"out", "grad_q", "grad_k", "grad_v"}
    decode = next(r for r in run("attention_decode", "decode_correct").results if r.case == "lengths_0_1_full")
    assert {c.name for c in decode.comparisons} == {"out"}          # inference only: forward


def test_sdpa_decode_softcap_cases_skip_with_the_reason():
    battery = run_battery(["attention_decode"], "quick", "cpu", backends=["sdpa"], isolate=False, dtypes=["float32"])
    skipped = [r for r in battery.results if r.case == "softcap_x30_logits"]
    assert skipped and skipped[0].status == Status.SKIP and "no logit softcap" in skipped[0].reason


def test_a_varlen_impl_with_the_documented_signature_is_checked_and_skips_alibi():
    """`check --op attention_varlen --impl` with the documented signature (no alibi_slopes) was
    refused as bad input ("unexpected keyword argument 'alibi_slopes'"): the ALiBi cases pass
    the slopes only to implementations that take them; the others get those cases as SKIP."""
    from gpuparity.checks.execute import run_case
    from gpuparity.checks.signature import signature_mismatch
    from gpuparity.contracts import get_spec

    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
               softcap=None, scale=None):
        return composition_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                  window=window, softcap=softcap, scale=scale)
    assert signature_mismatch(varlen, "attention_varlen") is None
    case = next(c for c in get_spec("attention_varlen").cases() if c.params.get("alibi"))
    status, _, reason = run_case("attention_varlen", varlen, case.params, torch.float32, torch.device("cpu"), 0)
    assert status == Status.SKIP and "takes no alibi_slopes" in reason
