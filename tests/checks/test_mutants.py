"""The mutation-score generator (checks/mutants.py): seeded mutant sets, mutants that are the
composition exactly where their trigger does not fire, ineffective mutants told apart, and the
battery's verdict on a mutant."""
from __future__ import annotations

import torch

from gpuparity import targets
from gpuparity.checks import mutants
from gpuparity.contracts.norms import rms_norm_composition


def test_sample_is_seeded_and_names_load_as_impl_targets():
    first = [m.name for m in mutants.sample("attention", 3, 5)]
    assert first == [m.name for m in mutants.sample("attention", 3, 5)]
    assert first != [m.name for m in mutants.sample("attention", 4, 5)]
    loaded = targets.load(mutants.sample("rotary", 3, 1)[0].target)
    assert isinstance(loaded, mutants.Mutant) and loaded.name == mutants.sample("rotary", 3, 1)[0].name


def test_fault_acts_only_where_the_trigger_fires():
    m = mutants.mutant("rms_norm__w_mod64_eq1__drop_last_features")
    x = torch.randn(3, 64)
    assert torch.equal(m(x, (64,)), rms_norm_composition(x, (64,)))   # 64 % 64 == 0: the composition
    assert m.fired == 0
    x = torch.randn(3, 65)
    assert not torch.allclose(m(x, (65,)), rms_norm_composition(x, (65,)), atol=1e-4)
    assert m.fired == 1


def test_ineffective_mutant_is_told_apart():
    # rounding a bf16 output through bf16 changes nothing
    assert not mutants.effective(mutants.mutant("rms_norm__dtype_bf16__output_through_bf16"), count=2)[0]
    assert mutants.effective(mutants.mutant("rms_norm__dtype_fp32__output_through_bf16"), count=2)[0]


def test_battery_kills_a_mutant_and_runs_only_checks_where_it_fires():
    battery = mutants.BatteryCalls.plan("rms_norm")
    strided = mutants.mutant("rms_norm__x_noncontig__x_as_contiguous")
    killed, where, ran = mutants.killed_by_battery(strided, battery)
    # killed by a check whose x is not contiguous (strided_rows, transposed_view, a layouts or cover member)
    assert killed and ran >= 1 and where.split("/")[0] in {task.case for task in battery.fired(strided)}, where
    # every rms_norm trigger fires on some default-level check (rows of 257 since the array has them):
    # a trigger over widths past 2^20 fires on none
    family = mutants.catalog("rms_norm")
    huge = mutants.Trigger("w_gt1048576", lambda c: c["W"] > 2 ** 20, lambda p, rng: None)
    quiet = mutants.Mutant(family, huge, family.fault("ignore_weight"))
    assert battery.fired(quiet) == []
    assert battery.fired(mutants.mutant("rms_norm__rows_ge256__ignore_weight"))
    assert mutants.killed_by_battery(quiet, battery) == (False, "", 0)
