"""Equivalence relations (checks/relations.py): each kills a planted bug that the float64 check
of the same case passes, and correct implementations (the composition, torch's SDPA) pass
every relation that applies, in fp32 and bf16 (the composition and torch's SDPA on 7 listed
cases x both dtypes x every relation that applies passed on this CPU when they were written;
three here)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from gpuparity import targets
from gpuparity.checks import execute, families, relations
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.dispatch import get as get_backend

PLANTED = os.path.join(os.path.dirname(__file__), "planted_relations.py")


def sdpa(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        attn_mask = keep if attn_mask is None else (attn_mask & keep if attn_mask.dtype == torch.bool
                                                    else attn_mask.masked_fill(~keep, float("-inf")))
    if is_causal and attn_mask is not None:
        band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        attn_mask = attn_mask & band if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~band, float("-inf"))
        is_causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.parametrize("name, bug, case", [
    ("batch_items", "batch_of_one_ignores_padding", "key_padding_varlen"),
    ("key_permutation", "padding_taken_as_suffix", "key_padding_varlen"),
    ("scale_fold", "scale_clamped_to_one", "causal_scale_sq_lt_sk"),
    ("gqa_repeat", "heads_past_one_without_gqa", "gqa_key_padding"),
    ("causal_band", "square_2d_mask_transposed", "mqa_causal"),
    ("contiguous_copy", "contiguous_path_drops_odd_key", "strided_bshd_d40"),
    ("padding_appended", "uniform_padding_ignored", "plain"),
])
def test_relation_kills_a_bug_the_float64_case_misses(name, bug, case):
    bug = targets.load(f"{PLANTED}:{bug}")
    spec = get_spec("attention")
    params = families.lookup(spec, case).params
    rel = relations.relation(name)
    assert relations.applicable(rel, params)
    status, _, reason = execute.run_case("attention", bug, params, torch.float32, torch.device("cpu"), 7,
                                         get_backend("attention", "composition").fn)
    assert status == Status.PASS, f"the float64 case already catches it: {reason}"
    found = relations.check("attention", bug, rel, params, torch.float32, seed=7)
    assert found.status == Status.FAIL, found
    assert name in found.reason


@pytest.mark.parametrize("case, dtype", [("gqa_key_padding", torch.float32), ("strided_bshd_d40", torch.float32),
                                         ("key_padding_varlen", torch.bfloat16)])
def test_a_correct_implementation_passes_every_relation(case, dtype):
    # (the composition is the relations' baseline; torch's SDPA is another correct algorithm)
    params = families.lookup(get_spec("attention"), case).params
    results = relations.check_case("attention", sdpa, params, dtype, seed=3)
    assert results and all(r.status == Status.PASS for r in results), [r.reason for r in results]
