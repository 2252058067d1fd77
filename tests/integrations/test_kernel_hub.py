"""transformers' kernel hub (transformers >= 5.25 with `kernels`): gpuparity.patch serves the
rotation through kernels' own kernelize with gpuparity's mapping, a user's own kernelize with
kernel_mapping() serves it too, nothing else of the model changes, and without `kernels` the
older swap (the module's function wrapped) still serves the rotation."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import gpuparity  # noqa: E402
from gpuparity.integrations import hub  # noqa: E402
from gpuparity.integrations import transformers_rotary as rotary  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402
from test_transformers import build, inputs, run  # noqa: E402

from transformers.models.llama import modeling_llama  # noqa: E402

HUB = hub.hub_function_original(modeling_llama.apply_rotary_pos_emb) is not modeling_llama.apply_rotary_pos_emb
needs_hub = pytest.mark.skipif(not HUB, reason="this transformers has no kernel hub on apply_rotary_pos_emb "
                                               "(older than 5.25, or `kernels` not installed)")


@pytest.fixture(autouse=True)
def _no_probing(monkeypatch):
    monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "1")


@pytest.fixture
def served(monkeypatch):
    calls = []
    real = rotary.apply_rotary_pair

    def record(q, k, *args, **kwargs):
        calls.append(tuple(q.shape))
        return real(q, k, *args, **kwargs)

    monkeypatch.setattr(rotary, "apply_rotary_pair", record)
    return calls


def test_hub_original_is_the_plain_function():
    plain = hub.hub_function_original(modeling_llama.apply_rotary_pos_emb)
    assert callable(plain) and not isinstance(plain, torch.nn.Module)
    assert list(__import__("inspect").signature(plain).parameters)[:4] == ["q", "k", "cos", "sin"]
    assert hub.hub_function_original(len) is len
    assert hub.hub_function_original(torch.nn.Linear(2, 2)) is None    # a module that is no hub function


@needs_hub
def test_patch_goes_through_the_hub_and_leaves_the_module_global(served):
    model = build("llama")
    global_before = modeling_llama.apply_rotary_pos_emb
    summary = gpuparity.patch(model)
    rotary_lines = [e.reason for e in summary.replaced if e.reason.startswith("rotary:")]
    assert len(rotary_lines) == 2 and all("kernel hub" in line for line in rotary_lines), summary.lines()
    assert modeling_llama.apply_rotary_pos_emb is global_before
    batch, valid = inputs("llama", torch.float32)
    with torch.no_grad():
        model(**batch)
    assert len(served) == 2                 # one pair call (q and k) per layer, 2 layers
    other = build("llama")                  # a model built after the patch: transformers' rotation
    del served[:]
    with torch.no_grad():
        other(**batch)
    assert not served


@needs_hub
def test_users_kernelize_with_gpuparity_mapping_matches_float64(served):
    kernels = pytest.importorskip("kernels")
    from gpuparity.integrations.kernel_hub import kernel_mapping

    model = build("llama")
    referee = copy.deepcopy(model).double()
    base = copy.deepcopy(model)
    with kernels.use_kernel_mapping(kernel_mapping()):
        kernels.kernelize(model, mode=kernels.Mode.TRAINING, device="cpu")
    batch, valid = inputs("llama", torch.float32)
    ref_logits, keep, ref_grads = run(referee, batch, valid, torch.float64)
    base_logits, _, base_grads = run(base, batch, valid, torch.float32)
    assert not served
    our_logits, _, our_grads = run(model, batch, valid, torch.float32)
    assert len(served) == 2
    results = [judge("logits", our_logits, ref_logits, base_logits, torch.float32, valid=keep.unsqueeze(-1))]
    results += [judge(name, our_grads[name], ref_grads[name], base_grads[name], torch.float32) for name in ref_grads]
    assert all(r.passed for r in results), [r.line() for r in results if not r.passed]


def test_kernel_mapping_refuses_a_bad_backend():
    from gpuparity.integrations.kernel_hub import kernel_mapping

    with pytest.raises(ValueError, match="backend"):
        kernel_mapping(backend=None)
    mapping = kernel_mapping("auto")
    assert set(mapping) == {"rotary_pos_emb"} and set(mapping["rotary_pos_emb"]) == set(hub.DEVICES)


def test_without_kernels_the_module_function_is_wrapped():
    """In a process where `kernels` cannot be imported transformers' decorators are no-ops and
    gpuparity wraps the module's function, as for transformers < 5.25."""
    script = textwrap.dedent("""
        import sys
        sys.modules["kernels"] = None          # find_spec and import both fail: not installed
        import torch, gpuparity
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.models.llama import modeling_llama
        from gpuparity.integrations import transformers_rotary as rotary
        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
        model = LlamaForCausalLM(config).eval()
        summary = gpuparity.patch(model)
        lines = [e.reason for e in summary.replaced if e.reason.startswith("rotary:")]
        assert len(lines) == 1 and "wrapped" in lines[0], summary.lines()
        calls = []
        real = rotary.apply_rotary_pair
        rotary.apply_rotary_pair = lambda *a, **k: calls.append(1) or real(*a, **k)
        with torch.no_grad():
            model(input_ids=torch.randint(0, 64, (2, 8)))
        assert calls == [1], calls
        assert "kernels" not in [m for m in sys.modules if sys.modules[m] is not None]
        print("ok")
    """)
    env = dict(os.environ, GPUPARITY_TRUST_UNPROBED="1")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@needs_hub
def test_a_hub_that_refuses_gpuparity_layer_leaves_the_wrapper_serving(served, monkeypatch):
    """A kernels release whose kernelize refuses the layer: patch() says so and wraps the
    module's function instead, so the rotation is still gpuparity's."""
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", modeling_llama.apply_rotary_pos_emb)  # restored after

    def refuse(*args, **kwargs):
        raise TypeError("Forward signature does not match")
    monkeypatch.setattr(hub, "kernelize_with", refuse)
    model = build("llama")
    summary = gpuparity.patch(model)
    lines = [e.reason for e in summary.replaced if e.reason.startswith("rotary:")]
    assert len(lines) == 2 and all("kernel hub refused" in line and "wrapped" in line for line in lines), lines
    batch, _ = inputs("llama", torch.float32)
    with torch.no_grad():
        model(**batch)
    assert len(served) == 2
