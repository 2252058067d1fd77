"""gpuparity.patch serves a transformers model's apply_rotary_pos_emb with gpuparity.apply_rotary:
the calls reach it, logits and gradients vs a float64 copy under the tolerance policy (shared and
per-item position ids), HF's function kept for unpatched models and for calls of other shapes, the
summary's rotary entries and reasons, and a fullgraph compile of a patched Llama."""
from __future__ import annotations

import copy
import importlib

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import gpuparity  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402
from gpuparity.integrations import transformers_rotary as rotary  # noqa: E402
from test_transformers import DEVICE, KEY_BIASES, MARGINAL, build, inputs, run  # noqa: E402

DECODERS = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"]
LAYERS = 2


@pytest.fixture(autouse=True)
def _no_probing(monkeypatch):
    """backend="auto" without the first-call probes (the Triton kernels in the interpreter)."""
    monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "1")


@pytest.fixture
def served(monkeypatch):
    """The q and k shapes gpuparity's rotation was called with (through the integration: one
    apply_rotary_pair call per attention, q's shape then k's)."""
    calls = []
    real = rotary.apply_rotary_pair

    def record(q, k, *args, **kwargs):
        calls.extend((tuple(q.shape), tuple(k.shape)))
        return real(q, k, *args, **kwargs)

    monkeypatch.setattr(rotary, "apply_rotary_pair", record)
    return calls


def per_item_positions(batch):
    """Position ids that differ per item: counted over the real tokens (as generate() does for
    left padding) and shifted by 3 per item, so no two items share a cos/sin table."""
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + 3 * torch.arange(mask.shape[0], device=mask.device)[:, None]
    return dict(batch, position_ids=positions)


def hf_function(family):
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    function = module.apply_rotary_pos_emb
    return getattr(function, "gpuparity_original", function)


# --------------------------------------------------------------------------- whole models
def check(family, dtype, positions, served, backend="auto"):
    model = build(family)
    referee = copy.deepcopy(model).double()
    base = copy.deepcopy(model).to(dtype)
    ours = copy.deepcopy(base)
    summary = gpuparity.patch(ours, backend=backend)
    assert [e.path for e in summary.replaced if e.reason.startswith("rotary:")] == [
        f"model.layers.{i}.self_attn" for i in range(LAYERS)], summary.lines()
    batch, valid = inputs(family, dtype)
    if positions == "per-item":
        batch = per_item_positions(batch)
    ref_logits, keep, ref_grads = run(referee, batch, valid, torch.float64)
    base_logits, _, base_grads = run(base, batch, valid, dtype)
    assert not served, "unpatched models must not reach gpuparity.apply_rotary"
    our_logits, _, our_grads = run(ours, batch, valid, dtype)
    rows = batch["input_ids"].numel()
    # q and k per layer; per-item tables: the batch as one sequence of B * S positions
    expected_lead = (1, rows) if positions == "per-item" else tuple(batch["input_ids"].shape)
    assert [shape[:2] for shape in served] == [expected_lead] * (2 * LAYERS), served
    results = [judge("logits", our_logits, ref_logits, base_logits, dtype, valid=keep.unsqueeze(-1))]
    results += [judge(f"d{n}", our_grads[n], ref_grads[n], base_grads.get(n), dtype) for n in ref_grads
                if not n.endswith(KEY_BIASES)]
    marginal = MARGINAL.get((family, dtype), ())
    failed = [r.reason for r in results if not r.passed and not (
        marginal and r.name.endswith(marginal) and r.err <= 1.5 * r.allowed)]
    assert not failed, f"{family} {dtype} {positions}:\n" + "\n".join(failed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", DECODERS)
def test_per_item_positions_served_and_match_float64(family, dtype, served):
    check(family, dtype, "per-item", served)


# The Triton interpreter truncates fp32 -> bf16 stores (max relative error 2^-7, not 2^-8): on CPU
# a bf16 Triton run carries twice a GPU's rounding, so the Triton case runs in fp32 here.
@pytest.mark.parametrize("backend, dtype", [pytest.param("triton", torch.float32, marks=pytest.mark.triton),
                                            ("composition", torch.bfloat16)], ids=["triton-fp32", "composition-bf16"])
def test_per_item_positions_with_a_forced_backend(backend, dtype, served):
    """The strided half-tables and the (1, B * S) view through the Triton kernel (interpreter on
    CPU) and the plain composition, not only the backend auto picks."""
    if backend == "triton":
        pytest.importorskip("triton")
    check("llama", dtype, "per-item", served, backend=backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_shared_positions_served_and_match_float64(dtype, served):
    check("llama", dtype, "shared", served)


# --------------------------------------------------------------------------- the rotation itself
def random_call(batch=3, heads=4, kv_heads=2, seqlen=5, dim=8, per_item=True, dtype=torch.float64):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(batch, heads, seqlen, dim, generator=gen, dtype=dtype)
    k = torch.randn(batch, kv_heads, seqlen, dim, generator=gen, dtype=dtype)
    positions = torch.randint(0, 40, (batch if per_item else 1, seqlen), generator=gen)
    freqs = positions[..., None].double() / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.cat([freqs, freqs], -1)
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("per_item", [True, False], ids=["per-item", "shared"])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_rotation_equals_hf_function(per_item, unsqueeze_dim):
    q, k, cos, sin = random_call(per_item=per_item)
    if unsqueeze_dim == 2:   # q, k as (B, S, H, D)
        q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    want = hf_function("llama")(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    got = rotary._rotate(q, k, cos, sin, unsqueeze_dim, "auto")
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["partial", "mrope", "promoting dtype", "cos with grad", "unsqueeze 0"])
def test_calls_it_does_not_take_go_to_hf_function(case, served):
    q, k, cos, sin = random_call(dtype=torch.float32)
    unsqueeze_dim = 1
    if case == "partial":
        cos, sin = cos[..., :4], sin[..., :4]
    elif case == "mrope":
        cos, sin = cos.expand(3, *cos.shape), sin.expand(3, *sin.shape)
    elif case == "promoting dtype":
        q, k = q.bfloat16(), k.bfloat16()
    elif case == "cos with grad":
        cos = cos.clone().requires_grad_()
    else:
        unsqueeze_dim = 0
    assert rotary._rotate(q, k, cos, sin, unsqueeze_dim, "auto") is None
    seen = []

    def hf(q, k, cos, sin, unsqueeze_dim=1):   # transformers' signature: only the shapes refuse
        seen.append(1)
        return "hf"

    wrapper = rotary._wrapper(hf)
    rotary._SERVING.backends.append("auto")
    try:
        assert wrapper(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim) == "hf"
    finally:
        rotary._SERVING.backends.pop()
    assert seen == [1] and not served


# --------------------------------------------------------------------------- scope
def test_unpatched_model_in_the_same_process_keeps_hf_function(served):
    other = build("llama")
    batch, _ = inputs("llama", torch.float32)
    with torch.no_grad():
        before = other(**batch).logits
        patched = gpuparity.patch(build("llama"))
        assert [e for e in patched.replaced if e.reason.startswith("rotary:")], patched.lines()
        after = other(**batch).logits
    assert not served and torch.equal(before, after)


def test_switch_is_cleared_after_a_forward_that_raises(served):
    model = build("llama")
    gpuparity.patch(model)
    layer = model.model.layers[0].self_attn
    with pytest.raises(ValueError, match="attention_mask"):   # in the attention forward, after the rotary
        layer(torch.randn(1, 3, 32, device=DEVICE), position_embeddings=(torch.ones(1, 3, 8, device=DEVICE),) * 2,
              attention_mask=torch.ones(2, 2, 2, 2, 2, device=DEVICE))
    assert served and rotary._SERVING.backends == []


# --------------------------------------------------------------------------- summary
def test_summary_lists_rotary_and_patching_twice_adds_nothing():
    model = build("llama")
    summary = gpuparity.patch(model)
    entries = [e for e in summary.replaced if e.reason.startswith("rotary:")]
    assert [e.path for e in entries] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all("gpuparity.apply_rotary" in e.reason and "backend='auto'" in e.reason for e in entries)
    assert [e.path for e in summary.left if e.reason.startswith("rotary:")] == ["model.rotary_emb"]
    again = gpuparity.patch(model)
    assert again == [] and not [e for e in again.replaced if e.reason.startswith("rotary:")]
    assert len(model.model.layers[0].self_attn._forward_pre_hooks) == 1


def test_family_not_checked_is_left_with_reason():
    config = transformers.OlmoConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=64)
    model = transformers.OlmoForCausalLM(config)
    summary = gpuparity.patch(model)
    left = [e for e in summary.left if e.reason.startswith("rotary:") and e.path.endswith("self_attn")]
    assert len(left) == 2 and all("'olmo' is not a family" in e.reason for e in left), summary.lines()
    assert not [e for e in summary.replaced if e.reason.startswith("rotary:")]


def test_other_signature_is_left_with_reason(monkeypatch):
    module = transformers.models.mistral.modeling_mistral
    monkeypatch.setattr(module, "apply_rotary_pos_emb", lambda q, k, cos, sin, interleave=False: (q, k))
    summary = gpuparity.patch(build("mistral"))
    left = [e for e in summary.left if e.path.endswith("self_attn") and e.reason.startswith("rotary:")]
    assert len(left) == 2 and all("is not (q, k, cos, sin" in e.reason for e in left), summary.lines()


def test_cos_sin_without_equal_halves_is_left_with_reason():
    model = build("qwen2")
    real = model.model.rotary_emb.forward

    def uneven(x, position_ids):
        cos, sin = real(x, position_ids)
        return cos * torch.linspace(0.5, 1.0, cos.shape[-1], device=cos.device), sin
    model.model.rotary_emb.forward = uneven
    summary = gpuparity.patch(model)
    left = [e for e in summary.left if e.path.endswith("self_attn") and e.reason.startswith("rotary:")]
    assert len(left) == 2 and all("do not repeat one half" in e.reason for e in left), summary.lines()


# --------------------------------------------------------------------------- torch.compile
@pytest.mark.triton
def test_patched_llama_compiles_fullgraph_with_gpuparity_rotary():
    # forced (patch's default leaves the rotation to inductor under compile) and served by the
    # Triton kernel, which stays one op in the graph (a composition would be traced inline)
    model = build("llama")
    gpuparity.patch(model, force=("rotary",))
    for module in model.modules():
        if hasattr(module, "gpuparity_rotary_backend"):
            module.gpuparity_rotary_backend = "triton"
    batch, valid = inputs("llama", torch.float32)
    batch = per_item_positions(batch)
    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(**batch).logits
        compiled = torch.compile(model, fullgraph=True, backend=recording)(**batch).logits   # raises on a break
    # q and k in one op (the Triton kernel's pair launch), one per layer
    assert sum("gpuparity.apply_rotary_pair" in t for t in targets) == LAYERS, targets
    assert not [t for t in targets if t.startswith("gpuparity.apply_rotary.")], targets
    torch.testing.assert_close(compiled[valid], eager[valid], atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()   # and trained: the op's backward through aot_eager gives eager's gradients
    grads = []
    for forward in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        model.zero_grad(set_to_none=True)
        forward(**batch).logits[valid].square().sum().backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()


def test_generate_with_left_padding_matches_unpatched(served):
    """Prefill and one-token decode steps with a cache, left padding: greedy tokens as unpatched."""
    model = build("llama")
    base = copy.deepcopy(model)
    gpuparity.patch(model)
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(9)).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    options = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    ours = model.generate(ids, **options)
    assert [shape[:2] for shape in served[-2:]] in ([(2, 1)] * 2, [(1, 2)] * 2)   # a decode step was served
    served.clear()
    assert torch.equal(ours, base.generate(ids, **options)) and not served
