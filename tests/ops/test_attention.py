"""gpuparity.attention: the public contract (SDPA / MultiheadAttention mask meanings), input
validation whose errors name the argument, and dispatch (named backends, reasons when one
cannot serve, verified auto-selection, explain_attention)."""
from __future__ import annotations

import pytest
import torch
from device_env import ON_GPU, TEST_DEVICE as DEVICE, require_device

from gpuparity import dispatch, reference
from gpuparity.checks import verdicts as verdicts_store
from gpuparity.contracts import attention as attention_contract
from gpuparity.tolerance import judge
from gpuparity.ops.attention import attention, attention_problem, explain_attention

require_device()


def qkv(batch=2, heads=2, kv_heads=2, q_len=12, k_len=12, head_dim=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen)
    return [t.to(DEVICE, dtype) for t in (q, k, v)]


def padding(batch, k_len, lengths):
    return (torch.arange(k_len).view(1, k_len) >= torch.tensor(lengths).view(batch, 1)).to(DEVICE)


# --------------------------------------------------------------------------- meaning
@pytest.mark.parametrize("backend", ["triton", "sdpa_math", "composition"])
def test_named_backends_agree_with_the_reference(backend):
    q, k, v = qkv(heads=4, kv_heads=2, q_len=13, k_len=21, head_dim=40, seed=1)
    kpm = padding(2, 21, [21, 6])
    bias = torch.randn(13, 21, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    bias[3] = float("-inf")  # an empty row through the float mask
    out = attention(q, k, v, attn_mask=bias, key_padding_mask=kpm, is_causal=True, backend=backend)
    ref = reference.attention(*(t.cpu().double() for t in (q, k, v)), attn_mask=bias.cpu().double(),
                              key_padding_mask=kpm.cpu(), is_causal=True)
    base = attention_contract.composition(q, k, v, attn_mask=bias, key_padding_mask=kpm, is_causal=True)
    empty = torch.zeros(1, 1, 13, 1, dtype=torch.bool)
    empty[..., 3, :] = True
    result = judge("out", out, ref, base, q.dtype, valid=~empty, must_be_zero=empty)
    assert result.passed, result.reason


def test_bool_mask_means_attend_and_key_padding_means_ignore():
    """attn_mask True = attend (SDPA); key_padding_mask True = padding (MultiheadAttention)."""
    q, k, v = qkv(batch=1, q_len=4, k_len=6)
    allow_first_two = torch.zeros(4, 6, dtype=torch.bool, device=DEVICE)
    allow_first_two[:, :2] = True
    pad_all_but_first_two = padding(1, 6, [2])
    by_mask = attention(q, k, v, attn_mask=allow_first_two, backend="sdpa_math")
    by_padding = attention(q, k, v, key_padding_mask=pad_all_but_first_two, backend="sdpa_math")
    sliced = attention(q, k[:, :, :2], v[:, :, :2], backend="sdpa_math")
    torch.testing.assert_close(by_mask, sliced)
    torch.testing.assert_close(by_padding, sliced)


def test_fully_masked_rows_are_zero_with_zero_gradients_on_triton():
    q, k, v = (t.requires_grad_() for t in qkv(batch=2, q_len=8, k_len=8))
    kpm = padding(2, 8, [8, 0])
    out = attention(q, k, v, key_padding_mask=kpm, backend="triton")
    out.sum().backward()
    assert (out[1] == 0).all()
    assert (q.grad[1] == 0).all() and (k.grad[1] == 0).all() and (v.grad[1] == 0).all()


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("change,error,words", [
    (lambda a: {**a, "q": a["q"][0]}, ValueError, "q: expected a 4-D tensor"),
    (lambda a: {**a, "q": a["q"].long()}, TypeError, "q: expected dtype"),
    (lambda a: {**a, "k": a["k"].double()}, TypeError, "k: expected dtype float32"),
    (lambda a: {**a, "k": a["k"][:, :, :, :8]}, ValueError, "k: expected shape"),
    (lambda a: {**a, "v": a["v"][:, :, :5]}, ValueError, "v: expected the shape of k"),
    (lambda a: {**a, "k": torch.cat([a["k"]] * 3, 1)[:, :3], "v": torch.cat([a["v"]] * 3, 1)[:, :3]},
     ValueError, "divides q's H=2"),
    (lambda a: {**a, "attn_mask": torch.zeros(5, 12, dtype=torch.bool)}, ValueError, "attn_mask: expected a tensor broadcastable"),
    (lambda a: {**a, "attn_mask": torch.zeros(12, 12, dtype=torch.int32)}, TypeError, "attn_mask: expected dtype bool"),
    (lambda a: {**a, "attn_mask": torch.zeros(1, 1, 1, 12, 12)}, ValueError, "attn_mask: expected at most 4 dims"),
    (lambda a: {**a, "key_padding_mask": torch.zeros(2, 12)}, TypeError, "key_padding_mask: expected dtype bool"),
    (lambda a: {**a, "key_padding_mask": torch.zeros(2, 11, dtype=torch.bool)}, ValueError,
     r"key_padding_mask: expected shape \(B, Sk\) = \(2, 12\)"),
    (lambda a: {**a, "key_padding_mask": torch.zeros(1, 12, dtype=torch.bool)}, ValueError, "key_padding_mask"),
    (lambda a: {**a, "is_causal": 1}, TypeError, "is_causal: expected a bool"),
    (lambda a: {**a, "scale": "0.1"}, TypeError, "scale: expected None or a real number"),
    (lambda a: {**a, "q": "q"}, TypeError, "q: expected a torch.Tensor"),
])
def test_validation_names_the_argument(change, error, words):
    q, k, v = qkv()
    args = change(dict(q=q, k=k, v=v))
    for name in ("attn_mask", "key_padding_mask"):
        if isinstance(args.get(name), torch.Tensor):
            args[name] = args[name].to(DEVICE)
    # good calls first: a remembered signature (calls.attention_call) must not let a bad one through
    attention(q, k, v, is_causal=True, backend="sdpa_math")
    attention(q, k, v, scale=0.1, backend="sdpa_math")
    with pytest.raises(error, match=words):
        attention(**args, backend="sdpa_math")


def test_validation_is_remembered_per_call_signature(monkeypatch):
    """A repeated call is validated once (host time: ~50 us per call on a GPU host); any change
    the checks read (a shape, dtype, mask, flag type or value) is validated again, and values
    the signature does not describe exactly (a list window) are validated on every call."""
    from gpuparity.contracts import attention as calls
    seen = []
    real = calls.attention_problem
    monkeypatch.setattr(calls, "attention_problem", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    monkeypatch.setattr(calls, "_SIGNED", {})
    q, k, v = qkv()
    kpm = padding(2, 12, [12, 5])
    for _ in range(3):
        attention(q, k, v, key_padding_mask=kpm, backend="sdpa_math")
    assert len(seen) == 1
    attention(q, k, v, key_padding_mask=padding(2, 12, [3, 5]), backend="sdpa_math")  # same signature, new values
    assert len(seen) == 1
    for changed in (dict(key_padding_mask=None), dict(is_causal=True), dict(window=(2, 0)), dict(scale=0.5),
                    dict(q=q.double(), k=k.double(), v=v.double()), dict(q=q[:, :1], k=k[:, :1], v=v[:, :1])):
        before = len(seen)
        attention(**{**dict(q=q, k=k, v=v, key_padding_mask=kpm), **changed}, backend="sdpa_math")
        attention(**{**dict(q=q, k=k, v=v, key_padding_mask=kpm), **changed}, backend="sdpa_math")
        assert len(seen) == before + 1, changed
    before = len(seen)
    for _ in range(2):
        attention(q, k, v, window=[2, 0], backend="sdpa_math")
    assert len(seen) == before + 2
    with pytest.raises(ValueError, match="window: left = 40 is larger"):
        attention(q, k, v, window=(40, 0), backend="sdpa_math")


def test_validation_rejects_masks_on_another_device():
    if not ON_GPU:
        pytest.skip("needs a second device type (a GPU run)")
    q, k, v = qkv()
    with pytest.raises(ValueError, match="key_padding_mask: expected a tensor on"):
        attention(q, k, v, key_padding_mask=torch.zeros(2, 12, dtype=torch.bool), backend="sdpa_math")


def test_backend_must_be_a_name():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend: expected one of"):
        attention(q, k, v, backend="nope")
    with pytest.raises(TypeError, match="backend: expected a backend name"):
        attention(q, k, v, backend=None)


def test_problem_describes_the_call():
    q, k, v = qkv(heads=4, kv_heads=2, head_dim=40)
    bias = torch.zeros(12, 12, device=DEVICE, requires_grad=True)
    problem = attention_problem(q, k, v, attn_mask=bias, key_padding_mask=padding(2, 12, [12, 3]), is_causal=True)
    assert problem.op == "attention" and problem.kind == "key_padding+float_mask+causal"
    assert problem.feature("head_dim") == 40 and problem.feature("gqa") is True
    assert problem.feature("has_mask") is True and problem.feature("mask_requires_grad") is True


# --------------------------------------------------------------------------- dispatch
def test_unsupported_named_backend_raises_with_reasons():
    q, k, v = qkv()
    bias = torch.zeros(12, 12, device=DEVICE, requires_grad=True)
    with pytest.raises(dispatch.BackendUnavailable, match="triton.*requires grad"):
        attention(q, k, v, attn_mask=bias, backend="triton")
    if not ON_GPU:
        with pytest.raises(dispatch.BackendUnavailable, match="sdpa_cudnn"):
            attention(q, k, v, backend="sdpa_cudnn")
    with pytest.raises(dispatch.BackendUnavailable, match="float64"):
        attention(*(t.double() for t in (q, k, v)), backend="triton")


def _store(problem, verdicts):
    verdicts_store.store_verdicts(problem.device, {
        verdicts_store.verdict_key(problem, dispatch.get("attention", name)): verdict for name, verdict in verdicts.items()})


def test_auto_picks_the_fastest_verified_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    verdicts_store.clear_cache()
    q, k, v = qkv()
    kpm = padding(2, 12, [12, 5])
    problem = attention_problem(q, k, v, key_padding_mask=kpm)
    names = [b.name for b in dispatch.backends("attention") if b.probed and not b.fallback]
    verdicts = {name: {"passed": False, "reason": "planted failure"} for name in names}
    verdicts.update({"triton": {"passed": True, "time_ms": 1.0}, "sdpa_math": {"passed": True, "time_ms": 5.0}})
    _store(problem, verdicts)
    try:
        explained = explain_attention(q, k, v, key_padding_mask=kpm)
        assert explained["chosen"] == "triton"
        rows = {r["name"]: r for r in explained["candidates"]}
        assert rows["sdpa_math"]["status"] == "verified"
        # a backend whose probe failed is never chosen, however fast it claims to be
        verdicts["triton"] = {"passed": False, "time_ms": 0.1, "reason": "planted failure"}
        _store(problem, verdicts)
        verdicts_store.clear_cache()
        explained = explain_attention(q, k, v, key_padding_mask=kpm)
        assert explained["chosen"] == "sdpa_math"
        assert {r["name"]: r for r in explained["candidates"]}["triton"]["status"] == "failed-probe"
        out = attention(q, k, v, key_padding_mask=kpm)  # auto
        torch.testing.assert_close(out, attention(q, k, v, key_padding_mask=kpm, backend="sdpa_math"))
    finally:
        verdicts_store.clear_cache()


def test_auto_without_any_verified_backend_uses_the_composition(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    verdicts_store.clear_cache()
    q, k, v = qkv()
    problem = attention_problem(q, k, v)
    names = [b.name for b in dispatch.backends("attention") if b.probed and not b.fallback]
    _store(problem, {name: {"passed": False, "reason": "planted"} for name in names})
    try:
        assert explain_attention(q, k, v)["chosen"] == "composition"
    finally:
        verdicts_store.clear_cache()


def test_auto_probes_for_real_on_a_fresh_cache(tmp_path, monkeypatch):
    """No cached verdicts: auto runs the probes on this machine and picks one that passed.
    (Without TRITON_INTERPRET, as a CPU user runs: probing triton under the interpreter on
    the default-level cases takes minutes.)"""
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    if not ON_GPU:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    verdicts_store.clear_cache()
    try:
        q, k, v = qkv(q_len=9, k_len=9)
        kpm = padding(2, 9, [9, 4])
        explained = explain_attention(q, k, v, key_padding_mask=kpm)
        chosen = {r["name"]: r for r in explained["candidates"]}[explained["chosen"]]
        assert chosen["status"] in ("verified", "fallback")
        out = attention(q, k, v, key_padding_mask=kpm)
        ref = reference.attention(*(t.cpu().double() for t in (q, k, v)), key_padding_mask=kpm.cpu())
        assert judge("out", out, ref, None, q.dtype).passed
    finally:
        verdicts_store.clear_cache()


def test_flex_backend_masks_and_empty_rows_eagerly(monkeypatch):
    """The flex backend's mask translation (block mask, score_mod, lse-based zeroing of empty
    rows), run through eager flex_attention: torch.compile's flex needs a GPU."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    from gpuparity.backends import flex
    monkeypatch.setattr(flex, "_compiled_flex", lambda: fa.flex_attention)
    real = fa.create_block_mask
    monkeypatch.setattr(fa, "create_block_mask",
                        lambda *a, **kw: real(*a, **{k: v for k, v in kw.items() if k != "_compile"}))
    flex._block_masks.clear()
    q, k, v = qkv(heads=4, kv_heads=2, q_len=20, k_len=20, seed=4)
    kpm = padding(2, 20, [14, 0])
    bias = torch.randn(20, 20, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    bias[5] = float("-inf")
    allowed = (torch.rand(1, 4, 20, 20, generator=torch.Generator().manual_seed(6)) > 0.3).to(DEVICE)
    for kwargs in (dict(key_padding_mask=kpm, is_causal=True), dict(attn_mask=bias, key_padding_mask=kpm),
                   dict(attn_mask=allowed)):
        out = flex.flex(q, k, v, **kwargs)
        ref_kwargs = {name: (t.cpu().double() if t.is_floating_point() else t.cpu()) if isinstance(t, torch.Tensor)
                      else t for name, t in kwargs.items()}
        ref = reference.attention(*(t.cpu().double() for t in (q, k, v)), **ref_kwargs)
        result = judge("out", out, ref, None, q.dtype)
        assert result.passed, result.reason
        if "key_padding_mask" in kwargs:
            assert (out[1] == 0).all()
    flex._block_masks.clear()
