"""The mutation-score generator's version 3 (cross_entropy in checks/mutants.py): seeded sets that
load as --impl targets, faults that act only where their trigger fires, and a mutant survives the
default battery only when its fault stays below the tolerance (ineffective)."""
from __future__ import annotations

import pytest
import torch

from gpuparity import targets
from gpuparity.checks import mutants
from gpuparity.contracts.basic import cross_entropy_composition


def test_sample_is_seeded_and_names_load_as_impl_targets():
    first = [m.name for m in mutants.sample("cross_entropy", 3, 5)]
    assert first == [m.name for m in mutants.sample("cross_entropy", 3, 5)] != \
        [m.name for m in mutants.sample("cross_entropy", 4, 5)]
    loaded = targets.load(mutants.sample("cross_entropy", 3, 1)[0].target)
    assert isinstance(loaded, mutants.Mutant) and loaded.name == first[0]
    assert "cross_entropy" in mutants.V3_OPS and "cross_entropy" not in mutants.FROZEN_OPS + mutants.V2_OPS


def test_a_fault_acts_only_where_its_trigger_fires():
    m = mutants.mutant("cross_entropy__custom_ignore_index__custom_ignore_as_default")
    logits, target = torch.randn(9, 33), torch.randint(0, 33, (9,))
    target[::3] = -100
    assert torch.equal(m(logits, target), cross_entropy_composition(logits, target)) and m.fired == 0
    target[::3] = -1
    right = cross_entropy_composition(logits, target, ignore_index=-1, reduction="none")
    wrong = m(logits, target, ignore_index=-1, reduction="none")
    assert torch.allclose(wrong[1::3], right[1::3], rtol=1e-5) and bool((wrong[::3] > 0).all()) and m.fired == 1


def test_every_fault_keeps_the_output_and_its_gradient():
    family = mutants.catalog("cross_entropy")
    always = mutants.Trigger("always", lambda c: True, lambda p, rng: p)
    logits = torch.randn(7, 40).bfloat16().requires_grad_(True)
    target = torch.tensor([0, 39, 5, 3, 3, 21, 3])
    for reduction in ("mean", "sum", "none"):
        right = cross_entropy_composition(logits, target, ignore_index=3, label_smoothing=0.1, reduction=reduction)
        for fault in family.faults:
            out = mutants.Mutant(family, always, fault)(logits, target, ignore_index=3, label_smoothing=0.1,
                                                        reduction=reduction)
            assert out.shape == right.shape and out.dtype == right.dtype and out.requires_grad, fault.name


@pytest.fixture(scope="module")
def battery():
    return mutants.BatteryCalls.plan("cross_entropy")


def test_a_mutant_whose_fault_stays_under_the_tolerance_is_ineffective(battery):
    # the target of the row before, on a single row: its own (the fault's math, rounding apart)
    m = mutants.mutant("cross_entropy__n_eq1__target_of_row_before")
    judged = mutants.judge(m, battery, witness_count=3)
    assert not judged.effective and not judged.killed and judged.witnesses == 3


@pytest.mark.parametrize("name", ["cross_entropy__c_mod16_eq15__mean_over_every_row",
                                  "cross_entropy__logits_row_stride__logits_as_contiguous",
                                  "cross_entropy__smoothing__grad_without_smoothing"])
def test_an_effective_mutant_is_killed(battery, name):
    judged = mutants.judge(mutants.mutant(name), battery, witness_count=3)
    assert judged.effective and judged.killed, judged
