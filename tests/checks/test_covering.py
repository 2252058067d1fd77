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
