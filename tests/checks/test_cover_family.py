"""The covering-array family (`cover`, checks/families.py over a contract's COVERING): every
row runs at the default level of check --impl, rows rerun by name, --level full runs the
triples' array instead, and a bug that needs two ordinary conditions at once (GQA and a strided
V), which no listed case or family member combines, is caught by it."""
from __future__ import annotations

import os

from gpuparity.checks import covering, families
from gpuparity.checks.battery import plan, run_battery
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec

HERE = os.path.dirname(__file__)
REGIMES = os.path.join(HERE, "planted_regimes.py")
BUG = f"{REGIMES}:attention_gqa_strided_v"


def _gqa_and_strided_v(params) -> bool:
    views = params.get("views") or {}
    strided = params["layout"] in ("bshd", "sliced") or views.get("v") in ("sliced", "transposed", "expanded")
    return params["H"] != params["Hkv"] and strided


def test_attention_arrays_hold_every_triple_of_their_groups_and_every_pair():
    # mixed strength: the key length's class with the mask form, Sq/Sk kinds with causal, each
    # optional feature with the key length and with causal (contracts/attention.py's groups)
    for name, declared in families.covering_declarations(get_spec("attention")).items():
        assert declared.groups, name
        rows = covering.build(declared.dimensions, 2, declared.seed, declared.allowed, groups=declared.groups)
        assert covering.missing(rows, declared.dimensions, 2, declared.allowed, groups=declared.groups) == [], name
        assert len(families.cover_family(get_spec("attention"), name).members) == len(rows)
    # e.g. a key length on a multiple of every tile (4096 keys) with key padding, and an ALiBi row with
    # causal and Sq != Sk
    spec = get_spec("attention")
    cover = [params for _, params in families.cover_family(spec, "cover").members]
    assert any(p["Sk"] % 128 == 0 and "key_padding" in p["mask"] and min(p["lengths"]) < p["Sk"] for p in cover)
    features = [params for _, params in families.cover_family(spec, "cover_features").members]
    assert any(p.get("alibi") and p.get("causal") and p["Sq"] != p["Sk"] and p["Sq"] > 1 for p in features)
    assert any(p.get("window") and p["Sk"] % 128 == 0 for p in features)


def test_default_level_runs_every_row_and_names_rerun_them():
    spec = get_spec("attention")
    cover = families.cover_family(spec, "cover")
    tasks, decided = plan(["attention"], "default", "cpu", impl=BUG)
    planned = {t.case for t in tasks} | {r.case for r in decided}
    for name in ("cover", "cover_features"):   # the second array: window, softcap, ALiBi (SKIP without them)
        assert {f"{name}.{label}" for label, _ in families.cover_family(spec, name).members} <= planned
    assert not any(t.case.startswith("cover") for t in plan(["attention"], "quick", "cpu", impl=BUG)[0])
    assert families.lookup(spec, "cover.3").params == cover.case(spec.make_case, "3", dict(cover.members)["3"]).params


def test_a_two_condition_bug_only_the_covering_array_catches():
    spec = get_spec("attention")
    tasks, _ = plan(["attention"], "default", "cpu", impl=BUG)
    # no listed case and no hand-written family member has GQA and a strided V together (the
    # relation checks run on the array's rows)
    assert not [t.case for t in tasks if not t.case.startswith(("cover", "relation.")) and _gqa_and_strided_v(t.params)]
    both = sorted({t.case for t in tasks if t.case.startswith("cover.") and _gqa_and_strided_v(t.params)
                   and t.params["Sk"] < 1000})
    assert both
    run = run_battery(["attention"], "default", "cpu", impl=BUG, dtypes=["float32"], isolate=False,
                      case_filter=lambda _op, case: case.name == both[0])
    assert [r.status for r in run.results] in ([Status.FAIL], [Status.ERROR])


def test_check_impl_runs_each_row_of_attention_arrays_in_about_one_dtype_every_value_in_each():
    """dtype_pairs (contracts/base.Covering): at the default level of check --impl a row runs in
    the dtypes covering.split_choices gives it, so that every value of every dimension meets fp32
    and bf16; --level full and a given --dtype run each row in each dtype asked."""
    spec = get_spec("attention")
    tasks, decided = plan(["attention"], "default", "cpu", impl=BUG)
    for name, declared in families.covering_declarations(spec).items():
        rows = covering.build(declared.dimensions, 2, declared.seed, declared.allowed, groups=declared.groups)
        dtypes = {}
        for item in list(tasks) + list(decided):
            if families.family_of(item.case) == name:
                dtypes.setdefault(item.case, set()).add(item.dtype)
        assert len(dtypes) == len(rows)
        assert sum(map(len, dtypes.values())) < 1.2 * len(rows)
        for dim, _ in declared.dimensions:
            for value in {repr(row[dim]) for row in rows}:
                met = set().union(*(dtypes[f"{name}.{n}"] for n, row in enumerate(rows) if repr(row[dim]) == value))
                assert met == {"float32", "bfloat16"}, (name, dim, value)
    one = plan(["attention"], "default", "cpu", impl=BUG, dtypes=["bfloat16"])[0]
    assert sum(1 for t in one if t.case.startswith("cover.")) == len(families.cover_family(spec, "cover").members)


def test_a_window_open_on_one_side_is_caught_by_the_feature_array_alone():
    """A window side of -1 is unbounded (FlashAttention's window_size); a kernel that reads it as 0
    is right on every bounded window. cover_features holds windows open on the left and on the
    right; no listed case or hand-written member does."""
    spec = get_spec("attention")
    bug = f"{REGIMES}:attention_window_open_side_as_zero"
    tasks, _ = plan(["attention"], "default", "cpu", impl=bug)

    def open_side(params, side):
        return params.get("window") is not None and params["window"][side] == -1

    assert not [t.case for t in tasks if not t.case.startswith("cover_features.") and
                (open_side(t.params, 0) or open_side(t.params, 1))]
    for side in (0, 1):
        rows = sorted((t.params["Sq"] * t.params["Sk"], t.case) for t in tasks
                      if t.case.startswith("cover_features.") and open_side(t.params, side)
                      and (t.params["Sq"] > 1 if side == 0 else not t.params.get("causal")))
        # (one query row sees no key left of it; causal closes the right side: there -1 and 0 agree)
        assert rows, side
        run = run_battery(["attention"], "default", "cpu", impl=bug, dtypes=["float32"], isolate=False,
                          case_filter=lambda _op, case, name=rows[0][1]: case.name == name)
        assert [r.status for r in run.results] == [Status.FAIL], (rows[0], [r.reason for r in run.results])
