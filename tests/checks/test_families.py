"""Regime families (checks/families.py): every family of every op runs at the default level,
regime-only bugs are caught there, sized cases that cannot run say why, and --explore draws."""
from __future__ import annotations

import os

import pytest
import torch

from gpuparity.checks import families
from gpuparity.checks.battery import plan, run_battery
from gpuparity.checks.execute import make_inputs
from gpuparity.checks.explore import closeness, explore
from gpuparity.checks.results import Status
from gpuparity.contracts import OPS, get_spec

HERE = os.path.dirname(__file__)
REGIMES = os.path.join(HERE, "planted_regimes.py")
IMPLS = os.path.join(HERE, "planted_impls.py")


def _families_planned(op, impl=None):
    """The families the default level samples (a check planned or skipped for its arguments or
    size), less those of a higher level, whose members are only listed as not run here, and the
    relation checks (relation.<relation>.<case>: checks/relations.py)."""
    tasks, decided = plan([op], "default", "cpu", impl=impl)
    above = {f.name for f in get_spec(op).families() if f.level == "full"}
    return {families.family_of(item.case) for item in list(tasks) + list(decided)} - {None, "relation"} - above


@pytest.mark.parametrize("op", OPS)
def test_every_family_of_every_op_is_sampled_at_the_default_level(op):
    spec = get_spec(op)
    wanted = {f.name for f in families.all_families(spec, "default") if f.level != "full"}
    assert wanted, f"{op} has no regime family"
    # the doctor (every backend) and check --impl (one implementation) both sample every family
    assert _families_planned(op) == wanted
    assert _families_planned(op, impl=f"{IMPLS}:attention_correct") == wanted


def test_attention_families_cover_the_regimes():
    names = {f.name for f in get_spec("attention").families()}
    assert {"tile", "seq_ratio", "long", "batch", "values", "masks", "layouts", "head_dim", "gqa", "scale"} <= names


def test_check_impl_runs_the_long_cases_the_doctor_leaves_to_full_and_says_why():
    impl = f"{REGIMES}:attention_d128_sq_ne_sk"
    tasks, decided = plan(["attention"], "default", "cpu", impl=impl)
    run = {t.case for t in tasks}
    assert {"long.sq64_sk16448_padding", "long.sq16448_sk64_bool", "long.sq4160_sk4160_bool"} <= run
    skipped = {r.case: r.reason for r in decided}
    # > 2^31 elements: not silently absent; the reason names memory or the level's budget
    assert "long.sq32832_sk32832_b1_h2" in skipped
    assert "memory" in skipped["long.sq32832_sk32832_b1_h2"] or "budget" in skipped["long.sq32832_sk32832_b1_h2"]
    doctor_tasks, doctor_decided = plan(["attention"], "default", "cpu")
    assert not any(t.case == "long.sq4160_sk4160_bool" for t in doctor_tasks)
    assert any(r.case == "long.sq4160_sk4160_bool" and "budget" in r.reason for r in doctor_decided)


def test_massive_activation_rows_have_logsumexp_below_fp32_exp_range():
    spec = get_spec("attention")
    case = families.lookup(spec, "values.massive_neg_bool_mask_d64")
    inputs = make_inputs(spec, case.params, torch.bfloat16, torch.Generator().manual_seed(0))
    q, k = inputs["q"].to(torch.bfloat16).double(), inputs["k"].to(torch.bfloat16).double()
    scores = (q @ k.transpose(-2, -1)) * case.params["D"] ** -0.5
    scores = scores.masked_fill(~inputs["attn_mask"], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    assert float(lse[:, 0, ::2].max()) < -88.7 and float(lse[:, 1].min()) > -30


def test_views_give_each_input_the_layout_named():
    x = torch.randn(3, 4, 5, 6)
    views = families.apply_views({"a": x, "b": x, "c": x, "d": x},
                                  {"a": "offset", "b": "sliced", "c": "transposed", "d": "expanded"})
    assert views["a"].storage_offset() == 3 and torch.equal(views["a"], x)
    assert not views["b"].is_contiguous() and torch.equal(views["b"], x)
    assert not views["c"].is_contiguous() and torch.equal(views["c"], x)
    assert views["d"].stride()[0] == 0 and torch.equal(views["d"], x[:1].expand_as(x))


# Each regime-only bug and the family whose default members must catch it (cheap members only:
# the long-sequence bugs are checked on the two long cases below).
CHEAP_REGIME_BUGS = {
    "attention_tile_remainder_64": "tile",
    "attention_query_tile_plus_one": "tile",
    "attention_massive_rows_nan_grad": "values",
    "attention_all_true_mask_as_causal": "masks",
    "attention_batch_items_past_two": "batch",
    "attention_d128_sq_ne_sk": "head_dim",
    "attention_noncontiguous_v": "layouts",
    "attention_finfo_min_mask_overflow": "masks",
}


@pytest.mark.parametrize("name,family", sorted(CHEAP_REGIME_BUGS.items()))
def test_regime_only_bug_is_caught_at_the_default_level(name, family):
    run = run_battery(["attention"], "default", "cpu", impl=f"{REGIMES}:{name}", dtypes=["float32"], isolate=False,
                      case_filter=lambda _op, case: families.family_of(case.name) == family)
    assert run.results and not run.ok, f"{name}: the default level's {family} members missed it"


@pytest.mark.parametrize("name,case", [("attention_long_drop_past_4096", "long.sq64_sk16448_padding"),
                                       ("attention_long_queries_past_8192", "long.sq16448_sk64_bool")])
def test_long_sequence_bug_is_caught_by_a_default_long_case(name, case):
    run = run_battery(["attention"], "default", "cpu", impl=f"{REGIMES}:{name}", dtypes=["float32"], isolate=False,
                      case_filter=lambda _op, c: c.name == case)
    assert [r.status for r in run.results] == [Status.FAIL]


def test_correct_attention_passes_the_hostile_families():
    # (the whole default level, every family, both dtypes, is run on every shipped CPU backend by hand:
    # docs/verification.md; here the families where a false alarm would come from, in bf16)
    run = run_battery(["attention"], "default", "cpu", impl=f"{IMPLS}:attention_correct", dtypes=["bfloat16"],
                      isolate=False, case_filter=lambda _op, case: families.family_of(case.name) in (
                          "values", "masks", "layouts"))
    assert len(run.results) >= 8
    assert not [f"{r.case}: {r.reason}" for r in run.results if r.status.bad]


def test_explore_draws_new_members_that_rerun_by_name():
    found = explore(4.0, ["softmax"], "cpu", backends=["torch"], isolate=False)
    assert found and all(families.family_of(r.case) for r in found)
    assert not [f"{r.key}: {r.reason}" for r in found if r.status != Status.PASS]
    named = [(r.case, r.dtype) for r in found]
    assert len(set(named)) == len(named)  # no member twice
    # a drawn member is reproducible by its name (the rerun line's --case)
    spec = get_spec("attention")
    tile = next(f for f in spec.families() if f.name == "tile")
    assert families.lookup(spec, "tile.draw3").params == families.drawn(spec, tile, 3).params


def test_closeness_is_err_over_bound_and_failures_rank_past_it():
    run = run_battery(["softmax"], "quick", "cpu", backends=["torch"], dtypes=["float32"], isolate=False)
    ratios = [closeness(r) for r in run.results]
    assert all(ratio is not None and 0 <= ratio <= 1 for ratio in ratios)
    bad = run_battery(["softmax"], "quick", "cpu", impl=f"{IMPLS}:softmax_nan", dtypes=["float32"], isolate=False)
    assert max(closeness(r) for r in bad.results if r.status.bad) >= 1.0


def test_check_impl_runs_each_long_member_in_one_dtype_in_turn():
    """The long family (dtypes_in_turn): check --impl at the default level runs member i in the
    i-th dtype, so fp32 and bf16 both meet long sequences, at half the referee's time; a given
    --dtype runs every member in it."""
    spec = get_spec("attention")
    long = next(f for f in spec.families() if f.name == "long")
    assert long.dtypes_in_turn
    tasks, _ = plan(["attention"], "default", "cpu", impl=f"{IMPLS}:attention_correct")
    dtypes = {}
    for t in tasks:
        if families.family_of(t.case) == "long":
            dtypes.setdefault(t.case, []).append(t.dtype)
    labels = [label for label, _ in long.members]
    assert dtypes and all(d == [("float32", "bfloat16")[labels.index(c.partition(".")[2]) % 2]]
                          for c, d in dtypes.items())
    assert set(sum(dtypes.values(), [])) == {"float32", "bfloat16"}
    one, _ = plan(["attention"], "default", "cpu", impl=f"{IMPLS}:attention_correct", dtypes=["bfloat16"])
    assert {t.case for t in one if families.family_of(t.case) == "long"} == set(dtypes)
