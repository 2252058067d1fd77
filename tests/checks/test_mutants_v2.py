"""The mutation-score generator's version 2 (attention_varlen, attention_decode, residual_norm in
checks/mutants.py): seeded sets that load as --impl targets, faults that act only where their
trigger fires, and a mutant survives the default battery only when its fault stays below the
tolerance (ineffective)."""
from __future__ import annotations

import pytest
import torch

from gpuparity import targets
from gpuparity.checks import families, mutants
from gpuparity.checks.battery import run_battery
from gpuparity.contracts import get_spec
from gpuparity.contracts.decode import decode_composition
from gpuparity.contracts.residual_norm import residual_norm_composition

V2 = ("attention_varlen", "attention_decode", "residual_norm")


@pytest.mark.parametrize("op", V2)
def test_sample_is_seeded_and_names_load_as_impl_targets(op):
    first = [m.name for m in mutants.sample(op, 3, 5)]
    assert first == [m.name for m in mutants.sample(op, 3, 5)] != [m.name for m in mutants.sample(op, 4, 5)]
    loaded = targets.load(mutants.sample(op, 3, 1)[0].target)
    assert isinstance(loaded, mutants.Mutant) and loaded.name == first[0]
    assert op in mutants.OPS and op not in mutants.FROZEN_OPS


def test_a_page_fault_acts_only_on_paged_caches():
    m = mutants.mutant("attention_decode__paged__page_table_off_by_one")
    q = torch.randn(2, 2, 1, 16)
    cache = torch.randn(2, 2, 40, 16)
    lengths = torch.tensor([40, 17], dtype=torch.int32)
    assert torch.equal(m(q, cache, cache, lengths), decode_composition(q, cache, cache, lengths))
    assert m.fired == 0
    pool = torch.randn(9, 2, 8, 16)
    table = torch.randperm(9)[:8].view(2, 4).to(torch.int32)
    lengths = torch.tensor([30, 17], dtype=torch.int32)
    right = decode_composition(q, pool, pool, lengths, block_table=table)
    assert not torch.allclose(m(q, pool, pool, lengths, block_table=table), right, atol=1e-3)
    assert m.fired == 1


def test_a_residual_dtype_fault_acts_only_on_a_float32_stream():
    m = mutants.mutant("residual_norm__fp32_residual_stream__fp32_residual_read_as_x_dtype")
    x, weight = torch.randn(3, 40).bfloat16(), torch.randn(40).bfloat16()
    same = torch.randn(3, 40).bfloat16()
    assert all(torch.equal(a, b) for a, b in zip(m(x, same, weight), residual_norm_composition(x, same, weight)))
    stream = 100.0 + torch.randn(3, 40)     # a float32 residual stream with bits bf16 drops
    out, new_residual = m(x, stream, weight)
    assert not torch.equal(new_residual, residual_norm_composition(x, stream, weight)[1])
    assert m.fired == 1


def test_varlen_faults_keep_the_packing():
    """Each fault returns the composition's shape, (total_q, H, D), on packed sequences with an
    empty one and Sq != Sk."""
    q, k = torch.randn(12, 2, 16), torch.randn(15, 2, 16)
    cu_q, cu_k = torch.tensor([0, 5, 5, 12], dtype=torch.int32), torch.tensor([0, 9, 12, 15], dtype=torch.int32)
    family = mutants.catalog("attention_varlen")
    always = mutants.Trigger("always", lambda c: True, lambda p, rng: p)
    for fault in family.faults:
        out = mutants.Mutant(family, always, fault)(q, k, k, cu_q, cu_k, 7, 9, causal=True)
        assert out.shape == q.shape, fault.name


@pytest.fixture(scope="module")
def residual_battery():
    return mutants.BatteryCalls.plan("residual_norm")


def test_a_mutant_whose_fault_stays_under_the_tolerance_is_ineffective(residual_battery):
    # a float32 residual stream beside 16-bit x: the 16-bit output rounded through bf16 again changes nothing
    m = mutants.mutant("residual_norm__fp32_residual_stream__output_through_bf16")
    judged = mutants.judge(m, residual_battery, witness_count=3)
    assert not judged.effective and not judged.killed and judged.witnesses == 3


def test_drawn_mutants_survive_only_below_the_tolerance(residual_battery):
    judged = [mutants.judge(m, residual_battery, witness_count=4) for m in mutants.sample("residual_norm", 11, 4)]
    assert all(j.killed or not j.effective for j in judged), [(j.name, j.detail) for j in judged]
    assert any(j.killed for j in judged)


ROWS = {"attention_decode__len_partial_page__page_slot_off_by_one":
        lambda p: p["page"] is not None and p["page"] > 1 and p["S_max"] < 1000,
        "attention_varlen__causal_sq_ne_sk__causal_top_left":
        lambda p: p.get("causal") and p["q_lens"][0] != p["k_lens"][0] and max(p["k_lens"]) < 1000}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_the_covering_array_kills_paged_and_varlen_mutants(name):
    m = mutants.mutant(name)
    rows = [f"cover.{label}" for label, params in families.cover_family(get_spec(m.op), "cover").members
            if ROWS[name](get_spec(m.op).make_case("row", **params).params)][:2]
    run = run_battery([m.op], "default", "cpu", impl=m.target, dtypes=["float32"], isolate=False,
                      case_filter=lambda _op, case: case.name in rows)
    assert rows and any(r.status.bad for r in run.results), [(r.case, r.status.value) for r in run.results]
