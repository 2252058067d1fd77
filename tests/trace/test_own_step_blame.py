"""A module whose output tensor is its last child's is still judged on its own computation
(issue 43): a wrong op in a module that returns its child's tensor in float64 (and a new one in
low precision) is named at every nesting depth, by `gpuparity model` and by `trace compare`; a
parent that only passes its child's tensor on is never blamed. This file is also the SPEC:
test_own_step_blame.py:llama_factory / :nest_factory."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn

from gpuparity import cli
from gpuparity.trace.compare import compare
from gpuparity.trace.record import record_in_memory
from gpuparity.trace.model_check import check_model
from gpuparity.trace.store import MemoryTrace

HERE = os.path.abspath(__file__)
LLAMA = HERE + ":llama_factory"
NEST = HERE + ":nest_factory"


# --------------------------------------------------------------------------- models
def _scaled_in_low_precision(cls, scale: float):
    """A subclass of `cls` whose forward returns its output * scale except in float64, where it
    returns its last child's tensor itself: the float64 trace keys that output by the child."""
    class LowPrecisionScaled(cls):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            return out if out.dtype == torch.float64 else out * scale
    LowPrecisionScaled.__name__ = f"Scaled{cls.__name__}"
    return LowPrecisionScaled


def llama_factory(device="cpu", dtype=torch.float32, scale: float = 1.0):
    """A tiny random HF Llama from a config (no download); with scale != 1 the MLP of layer 1
    multiplies its output (down_proj's tensor in float64) by `scale` except in float64."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    model = transformers.LlamaModel(config).eval()
    if scale != 1.0:
        mlp = model.layers[1].mlp
        mlp.__class__ = _scaled_in_low_precision(type(mlp), scale)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return model.to(device, dtype), {"input_ids": ids.to(device)}


class Wrap(nn.Module):
    """Returns its child's output tensor itself: a pure pass-through parent."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class Nest(nn.Module):
    """inp -> `depth` nested Wraps around a Linear -> tanh -> head; with `scale`, the wrapper at
    `bug_depth` (1 = right around the linear) scales its output except in float64."""

    def __init__(self, depth: int, scale: float, bug_depth: int):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        body: nn.Module = nn.Linear(16, 16)
        for level in range(1, depth + 1):
            body = Wrap(body)
            if scale != 1.0 and level == bug_depth:
                body.__class__ = _scaled_in_low_precision(Wrap, scale)
        self.body = body
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.body(self.inp(x))))


def nest_factory(device="cpu", dtype=torch.float32, depth: int = 1, scale: float = 1.0, bug_depth: int = 1):
    torch.manual_seed(0)
    model = Nest(depth, scale, bug_depth).eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    return model.to(device, dtype), (x.to(device, dtype),)


class MaybeScale(nn.Module):
    """Returns its own input in float64 and input * 1.05 otherwise: keyed by its input there."""

    def forward(self, x):
        return x if x.dtype == torch.float64 else x * 1.05


class IdentityBug(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.scale, self.head = nn.Linear(8, 16), MaybeScale(), nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.scale(self.inp(x))))


def identity_factory(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    return IdentityBug().eval().to(device, dtype), (x.to(device, dtype),)


def _wrapper(depth: int, level: int) -> str:
    """The name of the wrapper at `level` (1 = right around the linear) in a Nest of `depth`."""
    return "body" + ".inner" * (depth - level)


def _compared(factory, **options):
    runs = []
    for dtype in (torch.float64, torch.bfloat16):
        model, inputs = factory(dtype=dtype, **options)
        runs.append(MemoryTrace(str(dtype), *record_in_memory(model, inputs)))
    return compare(*runs)


def _model(capsys, *argv):
    code = cli.main(["model", *argv])
    return code, capsys.readouterr().out


# --------------------------------------------------------------------------- tests
def test_every_call_output_has_its_own_key_and_later_calls_see_the_outermost():
    model = nn.Sequential(Wrap(Wrap(nn.Linear(4, 4))), nn.Linear(4, 4))
    meta, tensors = record_in_memory(model, (torch.randn(2, 4),))
    run = MemoryTrace("run", meta, tensors)
    calls = {c["key"]: c for c in meta["calls"]}
    assert calls["0"]["output_tensors"] == ["0:out"]
    assert calls["0.inner"]["output_tensors"] == ["0.inner:out"]
    assert meta["tensors"]["0:out"]["alias_of"] == "0.inner.inner:out"      # one copy, stored once
    assert meta["tensors"]["0.inner:out"]["alias_of"] == "0.inner.inner:out"
    assert "alias_of" not in meta["tensors"]["0.inner.inner:out"]
    assert "0:out" not in tensors and torch.equal(run.tensor("0:out"), tensors["0.inner.inner:out"])
    assert calls["1"]["input_tensors"] == ["0:out"]        # what the Sequential got back from its child 0
    assert meta["tensors"]["grad:0:out"]["alias_of"] == "grad:0.inner.inner:out"
    assert torch.equal(run.tensor("grad:0:out"), tensors["grad:0.inner.inner:out"])


@pytest.mark.parametrize("depth,level", [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2), (3, 3)])
def test_trace_compare_names_a_wrapper_that_scales_its_childs_tensor_at_every_depth(depth, level):
    result = _compared(nest_factory, depth=depth, scale=1.05, bug_depth=level)
    culprit = _wrapper(depth, level)
    assert result.first_forward is not None and result.first_forward.key == culprit, result.first_forward
    assert result.first_forward.tensor == f"{culprit}:out"
    failed = {r.key for r in result.forward if not r.passed}
    # the pass-through wrappers around it (same tensor, error inherited) are never blamed
    assert failed & {_wrapper(depth, up) for up in range(level + 1, depth + 1)} == set(), failed
    assert _wrapper(depth, 0) not in failed   # the linear inside is right


def test_a_module_that_returns_its_own_input_in_float64_is_judged_on_its_step():
    result = _compared(identity_factory)
    assert result.first_forward.key == "scale", result.first_forward


class NanLinear(nn.Linear):
    """Planted bug: NaN everywhere except in float64."""

    def forward(self, x):
        out = super().forward(x)
        return out if out.dtype == torch.float64 else torch.full_like(out, float("nan"))


@pytest.mark.parametrize("bad", ["scaled", "nan"])
def test_pure_pass_through_wrappers_around_a_wrong_leaf_are_never_blamed(bad):
    def factory(dtype=torch.float32):
        model, inputs = nest_factory(dtype=dtype, depth=3)
        leaf = model.body.inner.inner.inner
        leaf.__class__ = _scaled_in_low_precision(nn.Linear, 1.05) if bad == "scaled" else NanLinear
        return model, inputs
    result = _compared(factory)
    failed = [r.key for r in result.forward if not r.passed]
    assert failed and failed[0] == "body.inner.inner.inner", failed
    assert not {"body", "body.inner", "body.inner.inner"} & set(failed), failed
    check = check_model(factory, device="cpu", dtype=torch.bfloat16, grads=False, padding=False)
    assert check.culprit_forward.key == "body.inner.inner.inner"
    assert not any(r.failed for r in check.forward if r.key in ("body", "body.inner", "body.inner.inner"))


def test_model_check_names_the_wrapper_and_passes_the_clean_nest(capsys):
    code, out = _model(capsys, NEST, "--device", "cpu", "--dtype", "bfloat16", "--factory-arg", "depth=3")
    assert code == 0, out
    code, out = _model(capsys, NEST, "--device", "cpu", "--dtype", "bfloat16", "--factory-arg", "depth=3",
                       "--factory-arg", "scale=1.05", "--factory-arg", "bug_depth=2")
    assert code == 1 and "body.inner diverges" in out, out


@pytest.mark.parametrize("scale", [1.05, 1.3])
def test_model_check_names_the_llama_mlp_that_scales_only_in_low_precision(capsys, tmp_path, scale):
    report = str(tmp_path / "llama.json")
    code, out = _model(capsys, LLAMA, "--device", "cpu", "--dtype", "bfloat16", "--factory-arg", f"scale={scale}",
                       "--json", report)
    assert code == 1, out
    assert "layers.1.mlp diverges" in out
    data = json.load(open(report))
    assert data["culprit_forward"]["key"] == "layers.1.mlp"
    assert data["culprit_forward"]["tensor"] == "layers.1.mlp:out"


def test_trace_compare_cli_names_the_llama_mlp_not_its_layer(capsys, tmp_path):
    paths = {dtype: str(tmp_path / dtype) for dtype in ("float64", "bfloat16")}
    for dtype, path in paths.items():
        assert cli.main(["trace", "record", LLAMA, "--out", path, "--device", "cpu", "--dtype", dtype,
                         "--factory-arg", "scale=1.3"]) == 0
    report = str(tmp_path / "c.json")
    assert cli.main(["trace", "compare", paths["float64"], paths["bfloat16"], "--json", report]) == 1
    data = json.load(open(report))
    assert data["first_forward"]["key"] == "layers.1.mlp", data["first_forward"]
    assert data["first_forward"]["tensor"] == "layers.1.mlp:out"
    assert not [r for r in data["forward"] if r["key"] == "layers.1.mlp.down_proj" and not r["passed"]]


def test_a_trace_of_schema_1_is_compared_by_the_childs_key_with_a_note():
    runs = []
    for dtype in (torch.float64, torch.bfloat16):
        torch.manual_seed(0)
        model = nn.Sequential(Wrap(Wrap(nn.Linear(4, 4))), nn.Linear(4, 4)).to(dtype)
        runs.append(record_in_memory(model, (torch.randn(3, 4, generator=torch.Generator().manual_seed(1)).to(dtype),)))
    meta, tensors = runs[1]     # B as gpuparity before schema 2 wrote it: no keys of its own for pass-throughs
    old = dict(meta, schema_version=1, tensors={k: m for k, m in meta["tensors"].items() if "alias_of" not in m})
    result = compare(MemoryTrace("new", *runs[0]), MemoryTrace("old", old, tensors))
    rows = {r.key: r for r in result.forward}
    assert rows["0"].tensor == "0:out" and rows["0"].err is not None and rows["0"].passed
    assert rows["0"].err == rows["0.inner.inner"].err
    assert any("trace schema 1" in note for note in result.notes), result.notes
