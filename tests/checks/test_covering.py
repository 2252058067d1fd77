"""checks/covering.py: every allowed pair (t = 2) or triple (t = 3) of values appears in a row,
rows obey the constraints, the array is seeded, and far smaller than the product."""
from __future__ import annotations

import math

import pytest

from gpuparity.checks import covering

DIMS = [("sq", [1, 16, 17, 63, 64, 65]), ("sk", [16, 17, 4160]), ("mask", ["none", "bool", "float", "padding"]),
        ("layout", ["contiguous", "sliced", "transposed"]), ("causal", [False, True]), ("heads", ["h2", "h4_kv1"])]


def allowed(row):
    # long keys only with few query rows; a causal float mask is not a combination we allow
    if row.get("sk") == 4160 and row.get("sq", 1) > 17:
        return False
    return not (row.get("causal") and row.get("mask") == "float")


@pytest.mark.parametrize("strength", [2, 3])
def test_every_allowed_tuple_is_covered_and_rows_obey_constraints(strength):
    rows = covering.build(DIMS, strength, seed=5, allowed=allowed)
    assert all(allowed(row) for row in rows)
    assert covering.missing(rows, DIMS, strength, allowed) == covering.impossible(DIMS, strength, allowed)
    assert len(rows) < math.prod(len(values) for _, values in DIMS) / (8 if strength == 2 else 2)


def test_pairs_without_constraints_and_seeded():
    rows = covering.build(DIMS, 2, seed=1)
    assert covering.missing(rows, DIMS, 2) == []
    assert rows == covering.build(DIMS, 2, seed=1)
    # the lower bound: the two largest dimensions' product
    assert 6 * 4 <= len(rows) <= 40


def test_a_missing_pair_is_found():
    rows = covering.build(DIMS, 2, seed=1)
    dropped = rows[0]
    left = covering.missing(rows[1:], DIMS, 2)
    assert left and all(all(dropped[name] == value for name, value in pair.items()) for pair in left)


def test_bad_dimensions_are_named():
    with pytest.raises(ValueError, match="strength"):
        covering.build(DIMS, 7)
    with pytest.raises(ValueError, match="names must differ"):
        covering.build([("a", [1]), ("a", [2])], 1)


GROUP = (("sk", "mask", "causal"), 3)


def test_mixed_strength_covers_every_triple_of_the_group_and_every_pair():
    rows = covering.build(DIMS, 2, seed=5, allowed=allowed, groups=[GROUP])
    assert all(allowed(row) for row in rows)
    assert covering.missing(rows, DIMS, 2, allowed, groups=[GROUP]) == covering.impossible(DIMS, 2, allowed,
                                                                                          groups=[GROUP])
    # every (sk, mask, causal) the constraints allow, checked here by hand
    held = {(row["sk"], row["mask"], row["causal"]) for row in rows}
    wanted = {(sk, mask, causal) for sk in (16, 17, 4160) for mask in ("none", "bool", "float", "padding")
              for causal in (False, True) if not (causal and mask == "float")}
    assert wanted <= held
    assert rows == covering.build(DIMS, 2, seed=5, allowed=allowed, groups=[GROUP])
    # more rows than the pairs alone, far fewer than every triple
    assert len(covering.build(DIMS, 2, seed=5, allowed=allowed)) < len(rows) < len(covering.build(DIMS, 3, seed=5,
                                                                                                  allowed=allowed))


def test_a_pairwise_array_misses_a_triple_of_the_group():
    rows = covering.build(DIMS, 2, seed=5, allowed=allowed)
    assert covering.missing(rows, DIMS, 2, allowed) == []
    assert covering.missing(rows, DIMS, 2, allowed, groups=[GROUP])   # some (sk, mask, causal) triple is absent


def test_interactions_drop_the_pairs_a_group_holds():
    combos = covering.interactions(DIMS, 2, [GROUP])
    assert (1, 2, 4) in combos and (1, 2) not in combos and (0, 1) in combos
    with pytest.raises(ValueError, match="unknown dimension"):
        covering.interactions(DIMS, 2, [(("sk", "nope"), 2)])
    with pytest.raises(ValueError, match="strength of"):
        covering.interactions(DIMS, 2, [(("sk", "mask"), 3)])


@pytest.mark.parametrize("choices", [1, 2, 3])
def test_split_choices_meets_every_value_with_every_choice_on_about_one_choice_a_row(choices):
    rows = covering.build(DIMS, 2, seed=5, allowed=allowed)
    picks = covering.split_choices(rows, DIMS, choices)
    assert len(picks) == len(rows) and all(p and p == sorted(set(p)) for p in picks)
    for name, _ in DIMS:
        for value in {repr(row[name]) for row in rows}:
            met = {c for row, p in zip(rows, picks) if repr(row[name]) == value for c in p}
            assert met == set(range(choices)), (name, value, met)
    assert sum(len(p) for p in picks) < len(rows) * choices or choices == 1
    assert picks == covering.split_choices(rows, DIMS, choices)   # deterministic
    # a value held by one row alone: that row runs in every choice
    lone = rows + [{**rows[0], "heads": "h8_kv8"}]
    dims = [(n, v + ["h8_kv8"] if n == "heads" else v) for n, v in DIMS]
    assert covering.split_choices(lone, dims, 2)[-1] == [0, 1]
    with pytest.raises(ValueError, match="choices"):
        covering.split_choices(rows, DIMS, 0)
