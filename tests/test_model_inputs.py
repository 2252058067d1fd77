"""gpuparity.model_inputs: example inputs as a call, and a map over every tensor inside them."""
from __future__ import annotations

import torch

from gpuparity.model_inputs import as_call, flatten_tensors, map_tensors


def test_as_call_reads_a_dict_as_keywords_a_sequence_as_positions_else_one_argument():
    x = torch.ones(2)
    assert as_call({"x": x}) == ((), {"x": x})
    assert as_call([x, 3]) == ((x, 3), {})
    assert as_call(x) == ((x,), {})


def test_map_tensors_reaches_nested_tensors_and_keeps_container_types():
    value = {"a": [torch.ones(2), (torch.zeros(1), "keep")], "b": 5}
    out = map_tensors(value, lambda t: t + 1)
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert torch.equal(out["a"][0], torch.full((2,), 2.0)) and torch.equal(out["a"][1][0], torch.ones(1))
    assert out["a"][1][1] == "keep" and out["b"] == 5


def test_flatten_tensors_keeps_a_dicts_order_unless_asked_to_sort_by_key():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    value = {"z": a, "y": [b, ("skip", c)]}
    assert [t.item() for t in flatten_tensors(value)] == [0.0, 1.0, 2.0]
    assert [t.item() for t in flatten_tensors(value, sort_keys=True)] == [1.0, 2.0, 0.0]
    assert flatten_tensors("no tensors") == []
