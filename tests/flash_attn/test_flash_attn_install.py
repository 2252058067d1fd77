"""gpuparity.flash_attn as a drop-in: FlashAttention 2.8's names and defaults, install() making
`import flash_attn` (and its two submodules) resolve to it, its refusal to shadow a real
flash_attn unless forced, and uninstall()."""
from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest
import torch

import gpuparity.flash_attn as ours

NAMES = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.bert_padding")


@pytest.fixture
def clean_modules():
    saved = {name: sys.modules.get(name) for name in NAMES}
    yield
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def test_signatures_follow_flash_attention_2_8():
    dense = inspect.signature(ours.flash_attn_func).parameters
    assert list(dense) == ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
                           "alibi_slopes", "deterministic", "return_attn_probs"]
    assert [dense[n].default for n in list(dense)[3:]] == [0.0, None, False, (-1, -1), 0.0, None, False, False]
    varlen = list(inspect.signature(ours.flash_attn_varlen_func).parameters)
    assert varlen[:7] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    assert varlen[-1] == "block_table"
    kvcache = inspect.signature(ours.flash_attn_with_kvcache).parameters
    assert list(kvcache) == ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                             "cache_batch_idx", "cache_leftpad", "block_table", "softmax_scale", "causal",
                             "window_size", "softcap", "rotary_interleaved", "alibi_slopes", "num_splits",
                             "return_softmax_lse"]
    assert kvcache["rotary_interleaved"].default is True and kvcache["num_splits"].default == 0
    assert list(inspect.signature(ours.flash_attn_qkvpacked_func).parameters)[0] == "qkv"
    assert list(inspect.signature(ours.flash_attn_varlen_qkvpacked_func).parameters)[:3] == ["qkv", "cu_seqlens",
                                                                                             "max_seqlen"]


def test_install_registers_the_three_modules(clean_modules, monkeypatch):
    for name in NAMES:
        sys.modules.pop(name, None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)   # no real flash_attn here
    ours.install()
    import flash_attn
    from flash_attn.bert_padding import pad_input, unpad_input
    from flash_attn.flash_attn_interface import flash_attn_varlen_func
    assert flash_attn is ours and flash_attn.flash_attn_func is ours.flash_attn_func
    assert flash_attn_varlen_func is ours.flash_attn_varlen_func and unpad_input and pad_input
    q = torch.randn(1, 3, 2, 8)
    with ours.backends(attention="composition"):
        out = flash_attn.flash_attn_func(q, q, q, causal=True)
    assert out.shape == q.shape
    ours.install()   # a second call is a no-op
    ours.uninstall()
    assert all(name not in sys.modules for name in NAMES)


def test_install_refuses_to_shadow_a_real_flash_attn(clean_modules, monkeypatch):
    real = type(sys)("flash_attn")
    real.__file__ = "/site-packages/flash_attn/__init__.py"
    monkeypatch.setitem(sys.modules, "flash_attn", real)
    with pytest.raises(RuntimeError, match="a real flash_attn is installed.*force=True"):
        ours.install()
    assert sys.modules["flash_attn"] is real
    ours.install(force=True)
    assert sys.modules["flash_attn"] is ours
    with pytest.raises(TypeError, match="force"):
        ours.install(force="yes")


def test_install_refuses_when_flash_attn_is_importable(clean_modules, monkeypatch):
    for name in NAMES:
        sys.modules.pop(name, None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else None)
    with pytest.raises(RuntimeError, match="a real flash_attn is installed"):
        ours.install()
    assert "flash_attn" not in sys.modules


def test_backends_rejects_unknown_ops():
    with pytest.raises(TypeError, match="backends: unknown op"):
        with ours.backends(decode="triton"):
            pass
