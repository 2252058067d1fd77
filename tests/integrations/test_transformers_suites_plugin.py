"""scripts/transformers_suites.py and its pytest plugin, on a tiny stand-in suite (CI cannot fetch
transformers' own tests): the modes change what they should, the report classifies failures."""
from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import transformers_suites  # noqa: E402
import transformers_suites_plugin as plugin  # noqa: E402


def _config(**extra):
    return transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, use_cache=False, **extra)


@pytest.fixture
def uninstalled():
    yield
    plugin.uninstall()


def test_impl_mode_defaults_to_gpuparity_and_keeps_an_explicit_choice(uninstalled):
    if not hasattr(transformers.PreTrainedModel, "_check_and_adjust_attn_implementation"):
        with pytest.raises(RuntimeError, match="use --gpuparity-mode patch"):
            plugin.install("impl")
        return
    plugin.install("impl")
    model = transformers.LlamaModel(_config()).eval()
    assert model.config._attn_implementation == "gpuparity"
    model(input_ids=torch.tensor([[1, 2, 3]]))
    config = _config()
    config._attn_implementation = "eager"
    assert transformers.LlamaModel(config).config._attn_implementation == "eager"
    plugin.uninstall()
    assert transformers.LlamaModel(_config()).config._attn_implementation != "gpuparity"


def test_patch_mode_patches_the_outermost_model_once(uninstalled, monkeypatch):
    import gpuparity
    patched = []
    monkeypatch.setattr(gpuparity, "patch", lambda model, **kw: patched.append(type(model).__name__))
    plugin.install("patch")
    transformers.LlamaForCausalLM(_config())
    assert patched == ["LlamaForCausalLM"]          # not its inner LlamaModel, built inside its __init__
    assert plugin._state["models"] == 2 and plugin._state["patched_types"] == ["LlamaForCausalLM"]


def test_asserts_implementation_name():
    def names_it(self):
        model = None
        self.assertEqual(model.config._attn_implementation, "sdpa")

    def does_not(self):
        model = None
        self.assertTrue(model(attn_implementation="eager") is not None)

    assert plugin.asserts_implementation_name(names_it)
    assert not plugin.asserts_implementation_name(does_not)


SUITE = '''
import torch, transformers

def config():
    return transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, use_cache=False)

def test_forward():
    model = transformers.LlamaModel(config()).eval()
    assert model(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state.shape == (1, 3, 16)

def test_default_is_sdpa():
    model = transformers.LlamaModel(config())
    assert model.config._attn_implementation == "sdpa"

def _check(model):
    assert model.config._attn_implementation == "sdpa"

def test_name_checked_in_a_helper():
    _check(transformers.LlamaModel(config()))

def test_broken_here():
    raise RuntimeError("broken without gpuparity too")

def test_skipped():
    import pytest
    pytest.skip("not on this machine")
'''


def test_script_runs_a_suite_through_the_plugin(tmp_path, monkeypatch):
    source = tmp_path / "transformers"
    (source / "tests" / "models" / "tiny").mkdir(parents=True)
    (source / "tests" / "models" / "tiny" / "test_modeling_tiny.py").write_text(textwrap.dedent(SUITE))
    monkeypatch.setenv("PYTHONPATH", os.path.join(ROOT, "src"))
    out = tmp_path / "out"
    code = transformers_suites.main(["--transformers-src", str(source), "--families", "tiny", "--modes", "impl",
                                     "--out", str(out), "--device", "cpu"])
    results = json.load(open(out / "results.json"))["results"]["tiny"]["impl"]
    outcome = {t["nodeid"].rsplit("::", 1)[-1]: (t["outcome"], t.get("class")) for t in results["tests"]}
    assert outcome["test_default_is_sdpa"] == ("failed", "expected: asserts an attention implementation's name")
    assert outcome["test_name_checked_in_a_helper"] == ("failed", "expected: asserts an attention implementation's name")
    assert outcome["test_forward"] == ("passed", None)
    assert outcome["test_broken_here"] == ("failed", "finding")     # no baseline ran to explain it
    assert outcome["test_skipped"][0] == "skipped" and "not on this machine" in results["tests"][-1]["message"]
    assert results["defaulted_to_gpuparity"] >= 1
    summary = (out / "summary.md").read_text()
    assert "## Expected differences (2)" in summary and "## Findings (1)" in summary and "test_broken_here" in summary
    assert code == 1


def test_failures_that_baseline_shares_are_not_findings():
    def run(*tests):
        return {"tests": [{"nodeid": n, "outcome": o, "message": "", "asserts_implementation_name": a}
                          for n, o, a in tests]}
    results = {"tiny": {"baseline": run(("t::a", "failed", False), ("t::b", "passed", True)),
                        "impl": run(("t::a", "failed", False), ("t::b", "failed", True)),
                        "patch": run(("t::a", "passed", False), ("t::b", "failed", True))}}
    transformers_suites.classify(results)
    classes = {m: [t.get("class") for t in d["tests"]] for m, d in results["tiny"].items()}
    assert classes == {"baseline": ["baseline: fails without gpuparity", None],
                       "impl": ["fails in baseline too", "expected: asserts an attention implementation's name"],
                       "patch": [None, "finding"]}
