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


# --------------------------------------------------------------------------- issue 30: dropout, padding, known issues
class MaskIgnoringAttention(Attention):
    """A mask ignored in every dtype: the float64 run of the same code agrees with it."""

    def mask_for(self, x, key_padding_mask):
        return None


def always_ignores_mask_factory(device="cpu", dtype=torch.float32):
    model, inputs = factory(device, dtype)
    model.blocks[1].attn.__class__ = MaskIgnoringAttention
    return model, inputs


class Noisy(Net):
    """Randomness in the forward: a Dropout module, a hand-written dropout (no module to see; its
    mask from torch.rand_like differs between float32 and float64 even from one seed), or noise
    in any mode."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.drop = nn.Dropout(0.5) if kind == "module" else nn.Identity()

    def forward(self, x, key_padding_mask):
        h = super().forward(x, key_padding_mask)
        if self.kind == "noise":
            return h + torch.randn_like(h)
        if self.kind == "handwritten" and self.training:
            return h * (torch.rand_like(h) > 0.5) * 2
        return self.drop(h)


def dropout_factory(device="cpu", dtype=torch.float32, kind: str = "module"):
    torch.manual_seed(0)
    model = Noisy(kind).train()
    _, inputs = factory(device, dtype)
    return model.to(device, dtype), inputs


class LargeMeanNorm(nn.Module):
    """Rows with mean ~20 into a plain LayerNorm: torch's CPU bf16 backward is off there."""

    def __init__(self):
        super().__init__()
        self.inp, self.ln1, self.head = nn.Linear(8, 64), nn.LayerNorm(64), nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.ln1(self.inp(x) + 20.0))


def large_mean_factory(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(4, 16, 8, generator=torch.Generator().manual_seed(1))
    return LargeMeanNorm().eval().to(device, dtype), (x.to(device, dtype),)


@pytest.mark.parametrize("kind", ["module", "handwritten"])
def test_training_mode_dropout_is_compared_in_eval_mode_never_blamed(capsys, tmp_path, kind):
    report = str(tmp_path / "drop.json")
    code, out, _ = _run(capsys, HERE + ":dropout_factory", "--device", "cpu", "--factory-arg", f"kind={kind}",
                        "--json", report, "--no-padding-check")
    assert code == 0, out
    data = json.load(open(report))
    assert data["run_mode"] == "eval" and data["culprit_forward"] is None and data["culprit_backward"] is None
    assert any("both ran in eval mode" in n for n in data["notes"])
    assert "in eval mode against cpu float64" in " ".join(out.split())


def test_random_forward_in_eval_mode_cannot_be_compared(capsys):
    code, out, err = _run(capsys, HERE + ":dropout_factory", "--device", "cpu", "--factory-arg", "kind=noise")
    assert code == 2, out
    assert "draws random numbers in eval mode" in err and len(err.strip().splitlines()) == 1


def test_mask_ignored_in_every_dtype_is_named_by_padding_invariance(capsys, tmp_path):
    report = str(tmp_path / "pad.json")
    code, out, _ = _run(capsys, HERE + ":always_ignores_mask_factory", "--device", "cpu", "--json", report)
    assert code == 1, out
    assert "blocks.1.attn ignores the padding mask" in " ".join(out.split())
    data = json.load(open(report))
    # float64 runs the same wrong code: the comparison finds nothing; the padding check does
    assert data["culprit_forward"] is None and data["culprit_backward"] is None
    assert data["padding"]["checked"] and data["padding"]["culprit_forward"]["key"] == "blocks.1.attn"
    assert data["padding"]["perturbed"] == ["args[0]"]


def test_correct_model_passes_padding_invariance():
    from gpuparity.trace.padding import check_padding
    model, inputs = factory()
    result = check_padding(model, inputs)
    assert result.checked and result.passed and not result.rows, result
    result = check_padding(*llama_factory()) if _has_transformers() else None
    assert result is None or (result.checked and result.passed and result.mask == "attention_mask")


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def test_padding_mask_conventions():
    from gpuparity.trace.padding import find_padding
    x = torch.zeros(2, 4, 3)
    pad_true = torch.tensor([[False, False, False, True], [False, False, False, False]])   # torch MHA: True = pad
    found, _ = find_padding((x, pad_true))
    assert found.valid.tolist() == (~pad_true).tolist()
    found, _ = find_padding({"x": x, "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 1]])})
    assert found.valid_value == 1 and found.path == "attention_mask"
    found, why = find_padding((x, torch.tensor([[True, True, False, False], [True, False, False, True]])))
    assert found is None and "cannot tell" in why
    ids = torch.zeros(2, 4, dtype=torch.long)
    assert find_padding({"input_ids": ids, "token_type_ids": torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])})[0] is None
    found, why = find_padding((x, torch.ones(2, 4, dtype=torch.bool)))
    assert found is None and "no padded position" in why
    assert find_padding((x,))[0] is None


def test_layer_norm_bf16_backward_on_cpu_is_labelled_with_the_known_issue(capsys, tmp_path):
    report = str(tmp_path / "ln.json")
    code, out, _ = _run(capsys, HERE + ":large_mean_factory", "--device", "cpu", "--dtype", "bfloat16",
                        "--json", report)
    assert code == 1, out
    culprit = json.load(open(report))["culprit_backward"]
    assert culprit["key"] == "ln1" and culprit["known_issue"] == "TORCH-CPU-BF16-LN-GRAD", json.load(open(report))["notes"]
    assert "known issue TORCH-CPU-BF16-LN-GRAD" in " ".join(out.split())
