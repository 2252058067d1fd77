"""gpuparity.patch: a decoder's training forward builds no key/value cache unless asked
(integrations/transformers_cache.py). Training forwards return no cache and the same loss and
gradients; an explicit use_cache=True, a passed cache, eval mode and no_grad keep transformers'
cache; a compiled training step has no cache outputs; include= and a second patch add nothing."""
from __future__ import annotations

import copy
import inspect

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import gpuparity  # noqa: E402
from gpuparity.integrations import transformers_cache  # noqa: E402
from test_transformers import build, inputs  # noqa: E402


def cache_of(output):
    return getattr(output, "cache", None) if "cache" in output else output.get("past_key_values")


def training_pair():
    model = build("llama").train()
    base = copy.deepcopy(model)
    summary = gpuparity.patch(model)
    batch, _ = inputs("llama", torch.float32)
    return model, base, summary, dict(batch, labels=batch["input_ids"])


def test_training_forward_has_no_cache_and_the_same_loss_and_gradients():
    model, base, summary, batch = training_pair()
    assert [e.path for e in summary.replaced if e.reason == transformers_cache.REASON] == ["model"]
    assert cache_of(model(**batch)) is None and cache_of(base(**batch)) is not None   # transformers' default builds one
    # the same patched model with the cache asked for: the same computation, plus a cache
    grads = []
    for asked in ({}, {"use_cache": True}):
        model.zero_grad(set_to_none=True)
        output = model(**batch, **asked)
        output.loss.backward()
        grads.append((output.loss.detach(), [p.grad for p in model.parameters()]))
    (loss, ours), (loss_cached, cached) = grads
    torch.testing.assert_close(loss, loss_cached, rtol=1e-6, atol=0)
    for (name, _), got, want in zip(model.named_parameters(), ours, cached):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("how", ["use_cache=True", "eval", "no_grad", "cache passed"])
def test_asking_for_a_cache_keeps_it(how):
    model, _, _, batch = training_pair()
    if how == "use_cache=True":
        output = model(**batch, use_cache=True)
    elif how == "eval":
        output = model.eval()(**batch)
    elif how == "no_grad":
        with torch.no_grad():
            output = model(**batch)
    else:
        first = model(**batch, use_cache=True)
        cache = cache_of(first)
        step = {"input_ids": batch["input_ids"][:, -1:],
                "attention_mask": torch.cat([batch["attention_mask"], batch["attention_mask"][:, -1:]], 1)}
        name = "cache" if "cache" in inspect.signature(type(model.model).forward).parameters else "past_key_values"
        output = model(**step, **{name: cache})
    assert cache_of(output) is not None, how


def test_compiled_training_step_returns_no_cache_and_eager_gradients():
    model, _, _, batch = training_pair()
    outputs = []

    def recording(gm, example_inputs):
        outputs.append(len(next(n for n in gm.graph.nodes if n.op == "output").args[0]))
        return gm.forward

    for asked in ({}, {"use_cache": True}):
        torch._dynamo.reset()
        out = torch.compile(model, fullgraph=True, backend=recording)(**batch, **asked)
        assert (cache_of(out) is None) == (not asked)
    # asked for, the graph also returns each layer's cached keys and values
    assert outputs[1] - outputs[0] == 2 * model.config.num_hidden_layers, outputs
    torch._dynamo.reset()
    grads = []
    for forward in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        model.zero_grad(set_to_none=True)
        forward(**batch).loss.backward()
        grads.append(model.model.layers[0].self_attn.k_proj.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_include_and_a_second_patch_add_no_rule():
    model = build("llama").train()
    summary = gpuparity.patch(model, include=[transformers.models.llama.modeling_llama.LlamaRMSNorm])
    assert not [e for e in summary.replaced if e.reason == transformers_cache.REASON]
    assert not model.model._forward_pre_hooks
    gpuparity.patch(model)
    again = gpuparity.patch(model)
    assert len(model.model._forward_pre_hooks) == 1
    assert not [e for e in again.replaced if e.reason == transformers_cache.REASON]


def test_encoders_get_no_rule():
    model = build("bert").train()
    summary = gpuparity.patch(model)
    assert not [e for e in summary.replaced if e.reason == transformers_cache.REASON]
    assert not getattr(model.base_model, transformers_cache.MARK, False)
