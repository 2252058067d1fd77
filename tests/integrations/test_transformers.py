"""gpuparity.patch on Hugging Face transformers models (tiny, random, built from configs):
patched and unpatched logits and gradients against a float64 copy under the tolerance policy,
padded batches, state_dict kept, the summary, HF's mask formats, and a short training run."""
from __future__ import annotations

import copy
import os
import time

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import gpuparity  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402
from gpuparity.integrations import transformers as gp_hf  # noqa: E402

DEVICE = os.environ.get("GPUPARITY_TEST_DEVICE", "cpu")
VOCAB, BATCH, SEQ = 100, 3, 10
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64)
DECODER = dict(COMMON, attention_dropout=0.0, num_key_value_heads=2, head_dim=8)  # GQA: 4 query heads, 2 kv heads
ENCODER = dict(COMMON, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

# family -> (config class, model class, config kwargs)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER),
    "mistral": ("MistralConfig", "MistralForCausalLM", DECODER),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", DECODER),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", DECODER),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", DECODER),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(DECODER, attn_logit_softcapping=None, query_pre_attn_scalar=8)),
    "bert": ("BertConfig", "BertForMaskedLM", ENCODER),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", ENCODER),
    "esm": ("EsmConfig", "EsmForMaskedLM", dict(ENCODER, position_embedding_type="rotary", pad_token_id=1,
                                                 mask_token_id=2, token_dropout=False)),
    "vit": ("ViTConfig", "ViTForImageClassification", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                           num_attention_heads=4, image_size=16, patch_size=4,
                                                           num_labels=5, hidden_dropout_prob=0.0,
                                                           attention_probs_dropout_prob=0.0)),
}


# Gemma-2's eager attention is transformers' own reference (it declares no sdpa support)
HF_ATTENTION = {"gemma2": "eager"}


@pytest.fixture(autouse=True)
def _no_probing(request, monkeypatch):
    """backend="auto" without the first-call probes (each runs the Triton kernels in the
    interpreter: about a minute per op, dtype and mask kind on this CPU); auto then takes the
    first listed backend. test_auto_with_real_probes runs the probes."""
    if request.node.name != "test_auto_with_real_probes":
        monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "1")


# transformers < 5: the (1 + weight) RMSNorm swap is left, not verified there (docs/transformers.md)
GEMMA_NORMS_LEFT = gp_hf.version_tuple(transformers.__version__) < (5,)


def build(family: str, **overrides):
    config_cls, model_cls, kwargs = FAMILIES[family]
    config = getattr(transformers, config_cls)(**{**kwargs, **overrides})
    config._attn_implementation = HF_ATTENTION.get(family, "sdpa")
    torch.manual_seed(0)
    try:
        model = getattr(transformers, model_cls)(config).eval()
    except ValueError:  # an older transformers without sdpa for this family (ESM in 4.53)
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norm weights off their init (Gemma's are 0, LayerNorm's 1): a wrong formula shows
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return model.to(DEVICE)


def inputs(family: str, dtype):
    gen = torch.Generator().manual_seed(2)
    if family == "vit":
        pixels = torch.randn(BATCH, 3, 16, 16, generator=gen).to(DEVICE)
        return {"pixel_values": pixels}, None
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    if family != "gemma2":
        # left padding: in a causal model the first rows have no key left. (Not for Gemma-2: its
        # float64 eager referee adds finfo.min to scores, overflows to -inf and NaNs those rows.)
        mask[2, :3] = 0
    return {"input_ids": ids.to(DEVICE), "attention_mask": mask.to(DEVICE)}, mask.bool().to(DEVICE)


def run(model, batch, valid, dtype):
    """Logits at the real tokens, and each parameter's gradient of a fixed random projection."""
    model.zero_grad(set_to_none=True)
    kwargs = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in batch.items()}
    logits = model(**kwargs).logits
    gen = torch.Generator().manual_seed(3)
    target = torch.randn(logits.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    keep = torch.ones(logits.shape[:-1], dtype=torch.bool, device=DEVICE) if valid is None or logits.dim() == 2 \
        else valid
    (logits.double() * target)[keep].sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), keep, grads


# Per-head q/k norms (hidden 8, 120 rows) in bf16: the weight gradient of F.rms_norm and of the
# Triton kernel lands at 1.0-1.13x the policy bound (the plain composition at 0.6x); held to
# 1.5x here and reported, not hidden (see docs/transformers.md).
KEY_BIASES = ("k_proj.bias", "key.bias")
MARGINAL = {("qwen3", torch.bfloat16): ("q_norm.weight", "k_norm.weight")}


def check_family(family, dtype, backend="auto", **overrides):
    model = build(family, **overrides)
    referee = copy.deepcopy(model).double()
    base = copy.deepcopy(model).to(dtype)
    ours = copy.deepcopy(base)
    # the referee's eager attention is set on the config; where the installed transformers reads
    # that as the user's choice (its Gemma-2 declares sdpa support), patch keeps it unless forced
    force = ("attention",) if family in HF_ATTENTION else ()
    summary = gpuparity.patch(ours, backend=backend, force=force)
    assert summary.replaced, f"{family}: patch replaced nothing"
    batch, valid = inputs(family, dtype)
    ref_logits, keep, ref_grads = run(referee, batch, valid, torch.float64)
    base_logits, _, base_grads = run(base, batch, valid, dtype)
    our_logits, _, our_grads = run(ours, batch, valid, dtype)
    assert torch.isfinite(our_logits).all(), f"{family}: NaN/Inf in the patched logits (padding rows included)"
    results = [judge("logits", our_logits, ref_logits, base_logits, dtype, valid=keep.unsqueeze(-1))]
    assert our_grads.keys() == ref_grads.keys()
    # A key projection's bias has an exactly zero gradient (softmax is shift-invariant per query
    # row): its rounding noise has no relative error to speak of, so it is not compared.
    results += [judge(f"d{n}", our_grads[n], ref_grads[n], base_grads.get(n), dtype) for n in ref_grads
                if not n.endswith(KEY_BIASES)]
    marginal = MARGINAL.get((family, dtype), ())
    failed = [r.reason for r in results if not r.passed and not (
        r.name.endswith(marginal) and r.err <= 1.5 * r.allowed)] if marginal else \
        [r.reason for r in results if not r.passed]
    assert not failed, f"{family} {dtype}:\n" + "\n".join(failed)
    return summary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_model_matches_float64_referee(family, dtype):
    summary = check_family(family, dtype)
    kinds = {e.reason.split(":")[0].split(" ")[0] for e in summary.replaced}
    attention_left = [e for e in summary.left if e.reason.startswith("attention:")]
    # an older transformers (BERT/RoBERTa/ESM/ViT before their AttentionInterface refactor) is
    # named in the summary; the installed one must route every family
    assert any(e.reason.startswith("attention:") for e in summary.replaced) or (
        attention_left and all("not through AttentionInterface" in e.reason for e in attention_left)
        and family in ("bert", "roberta", "esm", "vit")), summary.lines()
    if family in ("gemma", "gemma2") and GEMMA_NORMS_LEFT:
        assert [e for e in summary.left if e.reason.startswith("RMSNorm: not verified on transformers")], \
            summary.lines()
    elif family in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"):
        assert "RMSNorm" in kinds, summary.lines()
    else:
        assert any("LayerNorm" in e.reason for e in summary.replaced), summary.lines()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patch_keeps_state_dict(family):
    model = build(family)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gpuparity.patch(model)
    after = model.state_dict()
    assert list(after) == list(before)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, changed
    model.load_state_dict(before)  # and it still loads


def test_summary_lists_replaced_and_left():
    model = build("llama")
    summary = gpuparity.patch(model)
    replaced = {e.path: e for e in summary.replaced}
    left = {e.path: e for e in summary.left}
    assert replaced["model.layers.0.self_attn"].cls.endswith("LlamaAttention")
    assert "model.norm" in replaced and "model.layers.1.post_attention_layernorm" in replaced
    assert "rotary" in left["model.rotary_emb"].reason
    assert model.config._attn_implementation == "gpuparity"
    assert gpuparity.patch(model) == [], "patching twice must not replace anything again"


def test_silu_mlps_go_to_swiglu_and_gelu_mlps_are_left(monkeypatch):
    from gpuparity.integrations import transformers_mlp
    calls = []
    real = transformers_mlp.swiglu
    monkeypatch.setattr(transformers_mlp, "swiglu", lambda g, u, **kw: calls.append(g.shape) or real(g, u, **kw))
    model = build("llama")
    summary = gpuparity.patch(model)
    mlps = [e for e in summary.replaced if "gpuparity.swiglu" in e.reason]
    assert [e.path for e in mlps] == [f"model.layers.{i}.mlp" for i in range(model.config.num_hidden_layers)]
    model(input_ids=torch.randint(0, model.config.vocab_size, (1, 5)).to(next(model.parameters()).device))
    assert len(calls) == model.config.num_hidden_layers
    gemma = gpuparity.patch(build("gemma"))
    assert any(e.path.endswith("layers.0.mlp") and "gpuparity.swiglu is silu(gate) * up only" in e.reason
               for e in gemma.left)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gemma2_with_its_logit_softcap_is_served_and_matches_float64(dtype):
    """Gemma-2 at its default softcap (attn_logit_softcapping=50; small here so that it bites):
    gpuparity.attention's softcap serves it, logits and gradients under the policy."""
    summary = check_family("gemma2", dtype, attn_logit_softcapping=2.0)
    assert not [e for e in summary.left if e.reason.startswith("attention:")]
    norms = [e for e in (summary.left if GEMMA_NORMS_LEFT else summary.replaced)
             if ("not verified" if GEMMA_NORMS_LEFT else "1 + weight") in e.reason]
    assert len(norms) >= 5  # 4 per layer and the final norm


def test_softcap_reaches_gpuparity_attention(monkeypatch):
    seen = []
    monkeypatch.setattr(gp_hf, "attention", lambda *a, **k: seen.append(k.get("softcap")) or a[0])
    model = build("gemma2", attn_logit_softcapping=50.0)
    gp_hf.attention_forward(model.model.layers[0].self_attn, *[torch.randn(1, 4, 3, 8)] * 3, None, softcap=50.0)
    assert seen == [50.0]


def test_attention_dropout_named_in_summary_and_served_by_gpuparity(monkeypatch):
    model = build("llama", attention_dropout=0.1)
    summary = gpuparity.patch(model)
    attention_entries = [e for e in summary.replaced if e.reason.startswith("attention:")]
    assert attention_entries and all("gpuparity.attention(dropout_p=0.1)" in e.reason for e in attention_entries)
    calls, sdpa_calls = [], []
    real = gp_hf.attention
    monkeypatch.setattr(gp_hf, "attention", lambda *a, **k: calls.append(k.get("dropout_p")) or real(*a, **k))
    import transformers.integrations.sdpa_attention as hf_sdpa
    monkeypatch.setattr(hf_sdpa, "sdpa_attention_forward", lambda *a, **k: sdpa_calls.append(1))
    model.train()
    batch, _ = inputs("llama", torch.float32)
    torch.manual_seed(5)
    first = model(**batch).logits
    torch.manual_seed(5)
    again = model(**batch).logits
    torch.manual_seed(6)
    other = model(**batch).logits
    assert calls == [0.1] * 6 and not sdpa_calls
    assert torch.equal(first, again) and not torch.equal(first, other)   # repeatable for a seed
    calls.clear()
    model.eval()
    model(**batch)
    assert calls == [None, None], "inference: no dropout"


# --------------------------------------------------------------------------- masks, GQA
class _Attn(torch.nn.Module):
    def __init__(self, is_causal):
        super().__init__()
        self.is_causal = is_causal


def _qkv(kv_heads=2, q_len=5, k_len=5):
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, q_len, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, kv_heads, k_len, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, kv_heads, k_len, 8, generator=gen, dtype=torch.float64)
    return q, k, v


def _reference(q, k, v, allowed, scale):
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # no key left: zeros
    return (probs @ v).transpose(1, 2)


@pytest.mark.parametrize("form", ["none-causal", "bool4d", "float4d", "padding2d"])
def test_attention_forward_takes_hf_mask_formats(form, monkeypatch):
    q, k, v = _qkv()
    seen = []
    real = gp_hf.attention
    monkeypatch.setattr(gp_hf, "attention", lambda *a, **kw: seen.append(a[1].shape[1]) or real(*a, **kw))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    keep = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)
    allowed = causal.view(1, 1, 5, 5) & keep.view(2, 1, 1, 5)
    if form == "none-causal":
        mask, allowed = None, causal.view(1, 1, 5, 5).expand(2, 1, 5, 5)
    elif form == "bool4d":
        mask = allowed
    elif form == "float4d":  # eager style: finfo.min where masked; row 0 of batch 1 has no key left
        mask = torch.zeros(2, 1, 5, 5, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    else:
        mask, allowed = keep.long(), keep.view(2, 1, 1, 5).expand(2, 1, 5, 5)
    out, weights = gp_hf.attention_forward(_Attn(is_causal=form == "none-causal"), q, k, v, mask, scaling=0.3)
    assert weights is None and out.shape == (2, 5, 4, 8)
    assert seen == [2], "GQA: k must reach gpuparity.attention with its 2 heads (no repeat_kv)"
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, _reference(q, k, v, allowed, 0.3))
    if form in ("bool4d", "float4d"):
        assert (out[1, 0] == 0).all(), "a query row with no key left returns zeros"


def test_attention_forward_single_query_is_not_causal():
    q, k, v = _qkv(q_len=1, k_len=5)
    out, _ = gp_hf.attention_forward(_Attn(True), q, k, v, None, scaling=0.3)
    torch.testing.assert_close(out, _reference(q, k, v, torch.ones(1, 1, 1, 5, dtype=torch.bool), 0.3))


def test_attn_implementation_by_name():
    gp_hf.register()
    config_cls, model_cls, kwargs = FAMILIES["qwen2"]
    config = getattr(transformers, config_cls)(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="gpuparity").eval().to(DEVICE)
    assert model.config._attn_implementation == "gpuparity"
    reference = copy.deepcopy(model)
    if hasattr(reference, "set_attn_implementation"):
        reference.set_attn_implementation("sdpa")
    else:  # transformers < 4.56
        reference.config._attn_implementation = "sdpa"
    batch, valid = inputs("qwen2", torch.float32)
    got, want = model(**batch).logits, reference(**batch).logits
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- training, triton
def test_training_run_tracks_unpatched_loss_curve():
    def curve(model, dtype, steps=8):   # the float64 loss falls 4.63 -> 3.31 in 8 steps
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        batch, valid = inputs("llama", dtype)
        labels = batch["input_ids"].masked_fill(~valid, -100)
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().double())
        return torch.stack(losses)

    model = build("llama")
    ref = curve(copy.deepcopy(model).double(), torch.float64)
    base = curve(copy.deepcopy(model), torch.float32)
    ours_model = copy.deepcopy(model)
    gpuparity.patch(ours_model)
    ours = curve(ours_model, torch.float32)
    assert ref[-1] < ref[0] - 0.5, "the run must actually train"
    result = judge("loss curve", ours, ref, base, torch.float32)
    assert result.passed, result.reason


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("GPUPARITY_TEST_REAL_PROBES") != "1",
                    reason="the probes run the Triton kernels in the interpreter: 330 s on a 2-core CPU "
                           "(GPUPARITY_TEST_REAL_PROBES=1 runs it; GPU runs always do)")
def test_auto_with_real_probes():
    """backend="auto" as users get it: the probes verify the backends first."""
    check_family("llama", torch.float32)


@pytest.mark.triton
def test_forced_triton_backend_on_a_tiny_model():
    pytest.importorskip("triton")
    start = time.monotonic()
    summary = check_family("llama", torch.float32, backend="triton")
    assert all("backend='triton'" in e.reason for e in summary.replaced if e.reason.startswith("attention:"))
    assert time.monotonic() - start < 120


def test_padded_causal_batches_reach_the_kernel_as_key_padding_not_a_dense_mask(monkeypatch):
    """compact_mask: a plain causal model with padding and no cache hands gpuparity.attention a
    (B, Sk) key_padding_mask and is_causal=True, which the Triton kernel serves from per-item key
    bounds, instead of a dense (B, 1, Sq, Sk) mask it would read tile by tile."""
    seen = []
    real = gp_hf.attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask"), kwargs.get("key_padding_mask"), kwargs.get("is_causal")))
        return real(*args, **kwargs)

    monkeypatch.setattr(gp_hf, "attention", spy)
    model = build("llama")
    gpuparity.patch(model)
    batch, _ = inputs("llama", torch.float32)
    model(**batch)
    assert seen and all(mask is None and kpm is not None and causal for mask, kpm, causal in seen)
