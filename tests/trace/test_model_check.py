"""gpuparity model SPEC: device run against float64 on one machine; the planted padding bug is
named, the clean model passes. This file is also the SPEC: test_model_check.py:factory."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpuparity import cli
from gpuparity.trace.model_check import RAM_ENV, ModelTooBig, check_model

HERE = os.path.abspath(__file__)
SPEC = HERE + ":factory"
LLAMA = HERE + ":llama_factory"


# --------------------------------------------------------------------------- models
class Attention(nn.Module):
    """Self-attention with a key padding mask (True = a real token)."""

    def __init__(self, width: int, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def mask_for(self, x, key_padding_mask):
        return key_padding_mask[:, None, None, :]

    def forward(self, x, key_padding_mask=None):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        mask = self.mask_for(x, key_padding_mask) if key_padding_mask is not None else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(b, t, d))


class MaskDroppingAttention(Attention):
    """Planted bug: a "fast path" (every dtype but float64, as a low-precision kernel would be
    picked) that ignores the padding mask; the float64 path is right."""

    def mask_for(self, x, key_padding_mask):
        return None if x.dtype != torch.float64 else super().mask_for(x, key_padding_mask)


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.attn = Attention(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x, key_padding_mask):
        x = x + self.attn(self.ln(x), key_padding_mask=key_padding_mask)
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 2):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x, key_padding_mask):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, key_padding_mask)
        return self.head(h)


def factory(device="cpu", dtype=torch.float32, bug: str = "none"):
    torch.manual_seed(0)
    model = Net().eval()
    if bug == "padding":
        model.blocks[1].attn.__class__ = MaskDroppingAttention
    x = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(1))
    pad = torch.ones(3, 6, dtype=torch.bool)
    pad[1, 4:] = False  # a padded batch: the second sequence has 4 real tokens
    return model.to(device, dtype), (x.to(device, dtype), pad.to(device))


def llama_factory(device="cpu", dtype=torch.float32, bug: str = "none"):
    """A tiny random Llama from a config (no download), right-padded batch."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention

    class MaskDroppingLlamaAttention(LlamaAttention):
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
            if hidden_states.dtype != torch.float64:  # the planted bug, as in MaskDroppingAttention
                attention_mask = None
            return super().forward(hidden_states, position_embeddings, attention_mask, **kwargs)

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    model = transformers.LlamaModel(config).eval()
    if bug == "padding":
        model.layers[1].self_attn.__class__ = MaskDroppingLlamaAttention
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    return model.to(device, dtype), {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _run(capsys, *argv):
    code = cli.main(["model", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# --------------------------------------------------------------------------- tests
def test_clean_model_passes_and_the_planted_padding_bug_is_named(capsys, tmp_path):
    code, out, _ = _run(capsys, SPEC, "--device", "cpu")
    assert code == 0, out
    assert "agrees with float64" in out
    report = str(tmp_path / "bad.json")
    code, out, _ = _run(capsys, SPEC, "--device", "cpu", "--factory-arg", "bug=padding", "--json", report,
                        "--html", str(tmp_path / "bad.html"))
    assert code == 1, out
    assert "blocks.1.attn diverges" in out
    data = json.load(open(report))
    assert data["culprit_forward"]["key"] == "blocks.1.attn"
    # the comparison flagged the attention's own code (the inline attention), and only its re-run blames it
    assert data["comparison"]["first_forward"]["key"] == "blocks.1.attn"
    assert "blocks.1.attn" in open(tmp_path / "bad.html").read()


def test_json_report_has_schema_version_and_platform(capsys, tmp_path):
    report = str(tmp_path / "m.json")
    code, _, _ = _run(capsys, SPEC, "--device", "cpu", "--dtype", "bfloat16", "--json", report)
    assert code == 0
    data = json.load(open(report))
    assert data["schema_version"] == 1 and data["kind"] == "gpuparity-model-check"
    assert isinstance(data["platform"], dict) and data["platform"]
    assert data["dtype"] == "bfloat16" and data["reference"] == "cpu float64" and data["mode"] == "full"


@pytest.mark.parametrize("spec", ["no_such_module_xyz:factory", "no_colon_here", "/no/such/file.py:factory"])
def test_bad_spec_is_a_one_line_usage_error(capsys, spec):
    code, _, err = _run(capsys, spec, "--device", "cpu")
    assert code == 2
    # argparse's usage lines may come first (a SPEC file checked at parse time); the error is one line
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpuparity model: error:") and "SPEC" in last or spec.split(":")[0] in last


def test_include_checks_matching_modules_on_their_recorded_inputs(capsys, tmp_path):
    report = str(tmp_path / "inc.json")
    code, out, _ = _run(capsys, SPEC, "--device", "cpu", "--factory-arg", "bug=padding", "--include", "blocks.1",
                        "--json", report)
    assert code == 1, out
    data = json.load(open(report))
    assert data["mode"] == "include" and data["comparison"] is None
    # only blocks.1 was recorded; its re-run names the sub-module inside it
    assert data["culprit_forward"]["key"] == "blocks.1.attn"
    code, out, _ = _run(capsys, SPEC, "--device", "cpu", "--factory-arg", "bug=padding", "--include", "blocks.0*",
                        "--json", report)
    assert code == 0, out
    data = json.load(open(report))
    assert data["forward"] and all(r["key"].startswith("blocks.0") for r in data["forward"])


def test_too_big_for_a_float64_copy_is_refused_and_include_is_the_way_out(capsys, monkeypatch):
    model, _ = factory()
    whole = 16 * sum(p.numel() for p in model.parameters())
    monkeypatch.setenv(RAM_ENV, str(whole // 2))
    code, _, err = _run(capsys, SPEC, "--device", "cpu")
    assert code == 2
    assert "needs about" in err and "--include" in err and len(err.strip().splitlines()) == 1
    code, out, _ = _run(capsys, SPEC, "--device", "cpu", "--include", "blocks.0.attn")
    assert code == 0, out
    with pytest.raises(ModelTooBig, match="narrow --include"):
        check_model(factory, device="cpu", include=["blocks.0"], ram_bytes=100)


def test_library_returns_data_and_prints_nothing(capsys):
    result = check_model(factory, device="cpu", dtype=torch.bfloat16, factory_args={"bug": "padding"})
    assert capsys.readouterr().out == ""
    assert not result.passed and result.culprit_forward.key == "blocks.1.attn"
    assert all(r.key != "blocks.0.attn" for r in result.forward if r.failed)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_llama_clean_passes_and_ignored_padding_mask_is_named(capsys, tmp_path, dtype):
    pytest.importorskip("transformers")
    code, out, _ = _run(capsys, LLAMA, "--device", "cpu", "--dtype", dtype)
    assert code == 0, out
    report = str(tmp_path / "llama.json")
    code, out, _ = _run(capsys, LLAMA, "--device", "cpu", "--dtype", dtype, "--factory-arg", "bug=padding",
                        "--json", report)
    assert code == 1, out
    assert "layers.1.self_attn diverges" in out
    assert json.load(open(report))["culprit_forward"]["key"] == "layers.1.self_attn"
