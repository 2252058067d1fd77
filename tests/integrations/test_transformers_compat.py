"""gpuparity.patch against what transformers' own test suites found (tiny random models from
configs): the causal LM keeps its forward signature (generate() passes logits_to_keep), an
explicit attn_implementation is kept, output_attentions=True is served, the compiled
compositions do not recompile across grad modes, patch(mode=...) says why each module was left,
and a compiled patched Llama's generated code holds no opaque gpuparity op per call."""
from __future__ import annotations

import functools
import inspect
import logging

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import gpuparity  # noqa: E402
from test_transformers import DEVICE, FAMILIES, build, inputs  # noqa: E402


@pytest.fixture(autouse=True)
def _no_probing(monkeypatch):
    """backend="auto" without the first-call probes (the Triton kernels in the interpreter)."""
    monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "1")


def test_patched_causal_lm_keeps_its_forward_signature():
    model, plain = build("llama"), build("llama")
    gpuparity.patch(model)
    assert "forward" in vars(model), "the LM-head + loss patch is on the instance"
    assert inspect.signature(model.forward) == inspect.signature(plain.forward)
    assert "logits_to_keep" in inspect.signature(model.forward).parameters


def test_generate_passes_logits_to_keep_to_a_patched_model():
    """generate() passes logits_to_keep=1 only to a forward whose signature names it: then the
    LM head runs on the last position only at prefill, (B, 1, H), not (B, S, H)."""
    model = build("llama")
    gpuparity.patch(model)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(tuple(args[0].shape)))
    batch, _ = inputs("llama", torch.float32)
    model.generate(**batch, max_new_tokens=2, do_sample=False, pad_token_id=0)
    hidden = model.config.hidden_size
    assert seen and seen[0] == (batch["input_ids"].shape[0], 1, hidden), seen


def _llama_with(attn_implementation):
    config_cls, _, kwargs = FAMILIES["llama"]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()
    return model.to(DEVICE)


def test_explicit_eager_attention_is_kept_and_named_in_the_summary():
    model = _llama_with("eager")
    summary = gpuparity.patch(model)
    assert model.config._attn_implementation == "eager"
    left = [e for e in summary.left if e.reason.startswith("attention:")]
    assert left and all("'eager' was chosen" in e.reason for e in left), summary.lines()
    assert not [e for e in summary.replaced if e.reason.startswith("attention:")]
    batch, _ = inputs("llama", torch.float32)
    out = model(**batch, output_attentions=True)
    assert len(out.attentions) == model.config.num_hidden_layers
    forced = _llama_with("eager")
    gpuparity.patch(forced, force=("attention",))
    assert forced.config._attn_implementation == "gpuparity"


def test_output_attentions_is_served_by_eager_attention_for_that_call(caplog):
    model = build("llama")
    eager = _llama_with("eager")
    eager.load_state_dict(model.state_dict())
    gpuparity.patch(model)
    assert model.config._attn_implementation == "gpuparity"
    batch, valid = inputs("llama", torch.float32)
    with caplog.at_level(logging.INFO, logger="gpuparity"):
        got = model(**batch, output_attentions=True)
        model(**batch, output_attentions=True)
    want = eager(**batch, output_attentions=True)
    assert len(got.attentions) == model.config.num_hidden_layers
    assert sum("output_attentions=True" in r.getMessage() for r in caplog.records) == 1, "logged once"
    for ours, theirs in zip(got.attentions, want.attentions):
        assert ours.shape == theirs.shape
        rows = valid[:, None, :, None].expand_as(ours)      # query rows of real tokens
        torch.testing.assert_close(ours[rows], theirs[rows], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.logits[valid], want.logits[valid], rtol=1e-4, atol=1e-5)


def test_compiled_compositions_do_not_recompile_across_grad_modes(monkeypatch):
    """The "compile" backend (rms_norm and rotary) called with grad, under no_grad and
    inference_mode, with three sequence lengths: each autograd state compiles once, and no
    call recompiles (dynamo raises on a recompile here). dynamo's guards are what is tested:
    the compiled functions run with its "eager" backend (no codegen)."""
    from gpuparity.backends import compiled
    if compiled.compile_unavailable_reason("cpu"):
        pytest.skip(compiled.compile_unavailable_reason("cpu"))
    monkeypatch.setattr(compiled, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    w = torch.randn(16, requires_grad=True)
    cos, sin = torch.randn(16, 4), torch.randn(16, 4)

    def call(x):
        y = gpuparity.rms_norm(x, (16,), w, 1e-6, backend="compile")
        return y + gpuparity.apply_rotary(x.view(1, x.shape[0], 2, 8), cos, sin, backend="compile").view(x.shape)

    for rows in (5, 7, 9):
        x = torch.randn(rows, 16, requires_grad=True)
        call(x).sum().backward()
        with torch.no_grad():
            call(x)
        with torch.inference_mode():
            call(torch.randn(rows, 16))
        call(x.detach())
    assert len(compiled._COMPILED) == 8      # 2 compositions x 4 autograd states


def test_the_compiled_prior_swaps_the_rotation_and_loss_where_they_were_measured_to_win():
    """On an H100 the rotary kernel and the one-pass loss beat inductor's under torch.compile (the
    patching module's comment cites the record); ROCm was not measured, a CPU has no kernel."""
    from gpuparity import patching
    for kind in ("rotary", "loss"):
        assert patching.Plan("nvidia", "compiled").serves(kind) == (True, True)
        for family in ("cpu", "amd"):
            assert patching.Plan(family, "compiled").serves(kind) == (False, False)
            assert "force=" in patching.Plan(family, "compiled").left(kind)
    assert patching.Plan("nvidia", "compiled").serves("rms_norm") == (False, False)


def test_mode_compiled_leaves_fused_modules_with_reasons_and_force_swaps_them():
    from gpuparity import patching
    model = build("llama")
    summary = gpuparity.patch(model, mode="compiled")
    left = {e.path: e.reason for e in summary.left}
    assert "inductor fuses" in left["model.norm"] and "mode='compiled'" in left["model.norm"]
    assert "inductor fuses" in left["model.layers.0.mlp"]
    if patching.device_family(model) == "nvidia":       # measured to win there: swapped
        assert any(e.path == "model.layers.0.self_attn" and e.reason.startswith("rotary:") for e in summary.replaced)
    else:
        assert "rotary" in left["model.layers.0.self_attn"] and "force=('rotary',)" in left["model.layers.0.self_attn"]
    assert any(e.reason.startswith("attention:") for e in summary.replaced)
    if patching.device_family(model) == "nvidia":       # the one-pass loss, measured to win there
        assert any(e.path == "lm_head" for e in summary.replaced)
    else:
        assert "transformers' loss" in left["lm_head"]
    assert "lm_head" in gpuparity.patch(build("llama"), mode="compiled", force=("loss",))
    every = {path for path, module in model.named_modules() if type(module).__name__.endswith(("RMSNorm", "MLP"))}
    assert every <= set(left), "every module left is listed with its reason"
    forced = gpuparity.patch(build("llama"), mode="compiled", force=("rms_norm",))
    assert "model.norm" in forced
    with pytest.raises(ValueError, match="mode"):
        gpuparity.patch(build("llama"), mode="fast")
    with pytest.raises(ValueError, match="force"):
        gpuparity.patch(build("llama"), force=("norms",))


def test_mode_auto_serves_eagerly_and_leaves_the_norm_to_inductor_when_compiled(monkeypatch):
    from gpuparity.integrations import transformers as gp_hf
    calls = []
    real = gp_hf.rms_norm
    monkeypatch.setattr(gp_hf, "rms_norm", lambda *a, **k: calls.append(torch.compiler.is_compiling()) or real(*a, **k))
    model = build("llama")
    summary = gpuparity.patch(model)      # mode="auto"
    assert "model.norm" in summary
    entry = next(e for e in summary.replaced if e.path == "model.norm")
    assert "under torch.compile transformers' own runs" in entry.reason
    ids = torch.randint(3, 100, (1, 6)).to(DEVICE)
    model(input_ids=ids)
    assert calls and not any(calls)
    calls.clear()
    torch._dynamo.reset()
    torch.compile(model, backend="eager", fullgraph=True)(input_ids=ids)
    assert calls == [], "under torch.compile the norm is transformers' own, traced inline"


def test_compiled_patched_llama_graph_has_compositions_inline_and_no_opaque_gpuparity_op(monkeypatch):
    """A compiled patched tiny Llama (every kind forced, training): the graphs AOTAutograd hands
    inductor (forward and backward) hold the traced compositions (sdpa, the RMSNorm's rsqrt, the
    SwiGLU's silu) and no gpuparity op, whose body would run Python of ours per call, where no
    kernel needs one. On the CPU the backends are torch's (the Triton kernels are the
    interpreter's, which inductor cannot call); on a GPU the swapped modules run the Triton
    kernels, which reach inductor as their triton_op twins ("gpuparity::<name>_kernels", whose
    kernels inductor calls from its own code) and nothing else of ours, where the twins are asked
    for (GPUPARITY_COMPILED_KERNELS=twin; the default, opaque, keeps the ops opaque)."""
    from torch._dynamo.backends.common import aot_autograd
    monkeypatch.setenv("GPUPARITY_COMPILED_KERNELS", "twin")
    from functorch.compile import make_boxed_func
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    model = build("llama", num_hidden_layers=1)
    plain = build("llama", num_hidden_layers=1)
    summary = gpuparity.patch(model, mode="compiled", force=True)
    assert not [e for e in summary.left if "inductor fuses" in e.reason]
    batch, valid = inputs("llama", torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    out = compiled(**batch)
    out.logits[valid].square().sum().backward()
    targets = [str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    ours = sorted({t for t in targets if t.startswith("gpuparity.")})
    if DEVICE.startswith("cuda"):
        # no opaque body; auto may also leave an fp32 call to a composition traced inline (an H100
        # chose that for every module here), so no kernel is required to appear
        assert [t for t in ours if not t.split(".")[1].endswith("_kernels")] == [], ours
    else:
        assert ours == [], ours
        assert any("rsqrt" in t for t in targets) and any(("silu" in t or "sigmoid" in t) for t in targets), \
            sorted(set(targets))
        assert any("softmax" in t for t in targets), sorted(set(targets))   # sdpa (math), decomposed
    want = plain(**batch)
    torch.testing.assert_close(out.logits[valid], want.logits[valid], rtol=1e-4, atol=1e-5)
