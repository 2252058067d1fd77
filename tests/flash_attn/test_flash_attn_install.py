"""gpuparity.flash_attn as a drop-in: FlashAttention 2.8's names and defaults, install() making
`import flash_attn` (and its submodules: interface, bert_padding, layers.rotary, ops.triton.rotary,
ops.triton.cross_entropy, losses.cross_entropy) resolve to it, the CUDA-extension modules refused
at import, its refusal to shadow a real flash_attn unless forced, uninstall(), and the interface's
module-level USE_TRITON_ROCM / _get_block_size_n and its key-head check."""
from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest
import torch

import gpuparity.flash_attn as ours

NAMES = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.bert_padding", "flash_attn.layers",
         "flash_attn.layers.rotary", "flash_attn.ops", "flash_attn.ops.triton", "flash_attn.ops.triton.rotary",
         "flash_attn.ops.triton.cross_entropy", "flash_attn.losses", "flash_attn.losses.cross_entropy",
         "flash_attn.modules")
REFUSED = {"modules.mha": "gpuparity.nn.MultiheadAttention", "modules.mlp": "gpuparity.swiglu",
           "ops.fused_dense": "torch.nn.Linear", "ops.activations": "gpuparity.swiglu",
           "ops.layer_norm": "gpuparity.layer_norm", "ops.rms_norm": "gpuparity.rms_norm"}


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


def test_install_registers_the_modules(clean_modules, monkeypatch):
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
    from flash_attn.layers.rotary import RotaryEmbedding, apply_rotary_emb
    from flash_attn.losses.cross_entropy import CrossEntropyLoss
    from flash_attn.ops.triton.cross_entropy import cross_entropy_loss
    from flash_attn.ops.triton.rotary import apply_rotary
    from gpuparity.flash_attn.layers import rotary as our_rotary
    assert apply_rotary_emb is our_rotary.apply_rotary_emb and RotaryEmbedding is our_rotary.RotaryEmbedding
    assert flash_attn.ops.triton.rotary.apply_rotary is apply_rotary and CrossEntropyLoss and cross_entropy_loss
    assert sys.modules["flash_attn.losses.cross_entropy"] is ours.losses.cross_entropy
    ours.install()   # a second call is a no-op
    ours.uninstall()
    assert all(name not in sys.modules for name in NAMES)
    with pytest.raises(ImportError):
        import flash_attn.layers.rotary  # noqa: F401 - gone with uninstall()


@pytest.mark.parametrize("path", list(REFUSED))
def test_cuda_extension_modules_refuse_at_import_naming_the_equivalent(path, clean_modules, monkeypatch):
    for name in NAMES:
        sys.modules.pop(name, None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    ours.install()
    for full in (f"flash_attn.{path}", f"gpuparity.flash_attn.{path}"):
        with pytest.raises(ImportError) as caught:
            importlib.import_module(full)
        assert type(caught.value) is ImportError   # not ModuleNotFoundError: the path exists and refuses
        message = str(caught.value)
        assert message.startswith(f"flash_attn.{path} is not provided by gpuparity.flash_attn") and "\n" not in message
        assert REFUSED[path] in message
        assert full not in sys.modules
    ours.uninstall()


def test_use_triton_rocm_follows_flash_attention(monkeypatch):
    from gpuparity.flash_attn import flash_attn_interface as interface
    assert isinstance(interface.USE_TRITON_ROCM, bool)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", raising=False)
    assert interface._triton_rocm_flag() is False
    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")
    assert interface._triton_rocm_flag() is True
    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "FALSE")
    monkeypatch.setattr(torch.version, "hip", "6.2")   # ROCm torch without FlashAttention's extension: Triton
    assert interface._triton_rocm_flag() is True


def test_get_block_size_n_is_flash_attention_2s_table(monkeypatch):
    from gpuparity.flash_attn.flash_attn_interface import _get_block_size_n
    cpu = torch.device("cpu")
    table = {(32, False, False): 128, (64, False, True): 128, (64, True, False): 64, (80, False, False): 64,
             (128, False, False): 64, (128, True, True): 32, (160, True, False): 64, (256, False, True): 64}
    for (head_dim, dropout, causal), want in table.items():
        assert _get_block_size_n(cpu, head_dim, dropout, causal) == want, (head_dim, dropout, causal)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))   # sm86: 128 splits
    assert _get_block_size_n("cuda", 128, False, True) == 64 and _get_block_size_n("cuda", 128, False, False) == 32
    assert _get_block_size_n("cuda", 128, True, True) == 32
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert _get_block_size_n("cuda", 128, False, False) == 64
    with pytest.raises(ValueError, match=r"head_dim: expected an int in \[1, 256\]"):
        _get_block_size_n(cpu, 288, False, False)


def test_key_heads_not_dividing_query_heads_raise_in_the_callers_layout():
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 4, 2, 8)
    with pytest.raises(ours.FlashAttnArgumentError) as caught:
        ours.flash_attn_func(q, k, k)
    message = str(caught.value)
    assert "(batch_size, seqlen_k, nheads_k, headdim)" in message and "shape=(1, 4, 2, 8)" in message
    assert "nheads=3" in message and isinstance(caught.value, RuntimeError)


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


def test_backends_routes_layer_norm_fn_to_the_named_residual_norm_backend(monkeypatch):
    from gpuparity.flash_attn.ops.triton import layer_norm as fa_layer_norm
    seen = []
    real = fa_layer_norm.residual_norm

    def spy(*args, **kwargs):
        seen.append(kwargs.get("backend"))
        return real(*args, **kwargs)
    monkeypatch.setattr(fa_layer_norm, "residual_norm", spy)
    x, w = torch.randn(3, 8), torch.ones(8)
    with ours.backends(residual_norm="composition"):
        fa_layer_norm.rms_norm_fn(x, w, None)
    fa_layer_norm.rms_norm_fn(x, w, None)
    assert seen == ["composition", "auto"]
