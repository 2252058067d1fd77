"""trace.record: what a trace holds, and the rules both machines must apply alike."""
from __future__ import annotations

import json
import os

import pytest
import torch

from gpuparity import trace
from gpuparity.trace import store
from gpuparity.trace.record import ROOT, probe_weights

from trace_models import Shared, factory


def test_calls_are_in_execution_order_with_repeated_calls_and_structured_outputs(tmp_path):
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(3, 8)
    recorded = trace.record(model, {"x": x, "scale": 0.5}, str(tmp_path / "t"))
    keys = [c["key"] for c in recorded.calls]
    # children complete before their parent; the second call of proj is proj#1
    assert keys == ["proj", "proj#1", "split", ROOT]
    root = recorded.calls[-1]
    assert set(root["outputs"]["dict"]) == {"sum", "pair"}
    assert len(root["outputs"]["dict"]["pair"]["tuple"]) == 2
    assert root["inputs"]["kwargs"]["dict"]["scale"] == 0.5
    # proj's output is proj#1's input after an inline multiply: the trace knows who made what
    split_meta = recorded.tensor_meta[recorded.calls[2]["input_tensors"][0]]
    assert split_meta["origin"] == "output" and split_meta["owner"] == "proj#1"
    inline = recorded.tensor_meta[recorded.calls[1]["input_tensors"][0]]
    assert inline["origin"] == "inline" and inline["owner"] == ROOT
    # the root's "pair" output passes proj's tensors on unchanged: keyed by the root (its own
    # output, judged as its step), no second copy is stored
    pair = root["outputs"]["dict"]["pair"]["tuple"]
    assert pair[0]["tensor"] == "(model):out.pair.0"
    assert recorded.tensor_meta["(model):out.pair.0"]["alias_of"] == "proj:out"
    assert recorded.stored_key("(model):out.pair.0") == "proj:out"
    torch.testing.assert_close(recorded.tensor("(model):out.pair.0"), model.proj(x))
    torch.testing.assert_close(recorded.tensor("proj:out"), model.proj(x))
    from safetensors import safe_open
    with safe_open(str(tmp_path / "t" / "tensors.safetensors"), framework="pt") as handle:
        assert "proj:out" in handle.keys() and "(model):out.pair.0" not in handle.keys()


def test_gradients_and_own_backward_are_recorded(tmp_path):
    model, inputs = factory()
    recorded = trace.record(model, inputs, str(tmp_path / "t"))
    fc = next(c for c in recorded.calls if c["key"] == "blocks.0.fc")
    own = fc["own_backward"]
    assert set(own["params"]) == {"weight", "bias"}
    grad_out = recorded.tensor("grad:blocks.0.fc:out")
    x_in = recorded.tensor(fc["input_tensors"][0])
    # the Linear's own weight gradient is grad_out^T @ input
    torch.testing.assert_close(recorded.tensor(own["params"]["weight"]), grad_out.T @ x_in)
    # the model's parameters got no .grad: record uses autograd.grad, not backward()
    assert all(p.grad is None for p in model.parameters())


def test_include_and_max_elements(tmp_path):
    model, inputs = factory()
    recorded = trace.record(model, inputs, str(tmp_path / "t"), include=["blocks.1*"], max_elements=50)
    assert {c["module"] for c in recorded.calls} == {"blocks.1", "blocks.1.ln", "blocks.1.fc", "blocks.1.act"}
    sampled = [k for k, m in recorded.tensor_meta.items() if m.get("sampled")]
    assert sampled and all(recorded.tensor(k).numel() <= 50 for k in sampled)
    with pytest.raises(ValueError, match="include"):
        trace.record(model, inputs, str(tmp_path / "u"), include=["nothing.*"])


def test_sampling_depends_only_on_shape():
    first = store.sample_indices((64, 33), 100)
    assert torch.equal(first, store.sample_indices((64, 33), 100))
    assert not torch.equal(first, store.sample_indices((33, 64), 100))
    assert first.numel() <= 100 and bool((first[1:] > first[:-1]).all())
    assert torch.equal(probe_weights((4, 5)), probe_weights((4, 5)))


def test_trace_is_json_and_safetensors_only(tmp_path):
    model, inputs = factory()
    path = tmp_path / "t"
    trace.record(model, inputs, str(path), spec="x.py:factory", factory_args={"bug": "none"})
    assert sorted(os.listdir(path)) == sorted([store.META_FILE, store.TENSOR_FILE])
    meta = json.loads((path / store.META_FILE).read_text())
    assert meta["schema_version"] == store.SCHEMA_VERSION and meta["platform"]["vendor"] == "cpu"
    assert meta["spec"] == "x.py:factory" and meta["factory_args"] == {"bug": "none"}
    from safetensors.torch import load_file
    # every tensor stored once: a call's output that is a tensor recorded before is an alias of it
    stored = {k for k, m in meta["tensors"].items() if "alias_of" not in m}
    assert set(load_file(str(path / store.TENSOR_FILE))) == stored
    assert {m["alias_of"] for m in meta["tensors"].values() if "alias_of" in m} <= stored


def test_fingerprints_match_across_dtypes_but_not_across_weights():
    fp32, _ = factory()
    bf16, _ = factory(dtype=torch.bfloat16)
    other, _ = factory(weights_seed=5)
    named = lambda m: list(m.named_parameters())  # noqa: E731
    a, b, c = (store.fingerprint(named(m)) for m in (fp32, bf16, other))
    assert store.match_fingerprints("weights", a, a) == "identical"
    assert store.match_fingerprints("weights", a, b) == "equal within rounding"
    with pytest.raises(store.TraceMismatch, match="different weights"):
        store.match_fingerprints("weights", a, c)
