"""benchmarks/scripts/fa_own_tests_plugin.py, the harness that runs FlashAttention's own test files
against gpuparity.flash_attn.install(): its seeded covering sampler keeps every parameter value
(on grids and on a synthetic parametrized test file collected through the plugin), deselects tests
that call FlashAttention's C++ internals, and the old transformers rotary functions it supplies to
tests/layers/test_rotary.py follow their formulas (checked against a float64 rotation)."""
from __future__ import annotations

import itertools
import json
import os
import random
import sys
from types import SimpleNamespace

import pytest
import torch

import gpuparity.flash_attn  # noqa: F401  (imported before pytester's in-process run, which drops what it imports)

pytest_plugins = ["pytester"]

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "scripts")
sys.path.insert(0, os.path.abspath(SCRIPTS))
import fa_own_tests_plugin as plugin  # noqa: E402


def _grid(rng: random.Random):
    sizes = [rng.randint(1, 5) for _ in range(rng.randint(1, 6))]
    cases = [dict(zip((f"p{k}" for k in range(len(sizes))), (repr(v) for v in combo)))
             for combo in itertools.product(*(range(n) for n in sizes))]
    keep = rng.uniform(0.3, 1.0)     # a ragged subset, as conditional parametrize lists give
    sub = [c for c in cases if rng.random() < keep] or cases[:1]
    return sub


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_cases", [0, 1, 5, 40])
def test_covering_keeps_every_value(seed, max_cases):
    cases = _grid(random.Random(seed))
    picked, cover = plugin.covering_sample(cases, max_cases, seed)
    assert len(set(picked)) == len(picked)
    assert len(picked) == max(cover, min(max_cases, len(cases)))
    every = {pair for case in cases for pair in case.items()}
    assert every == {pair for i in picked[:cover] for pair in cases[i].items()}
    assert picked == plugin.covering_sample(cases, max_cases, seed)[0]      # deterministic


def test_covering_is_small_on_a_full_product():
    cases = [{"a": repr(a), "b": repr(b), "c": repr(c)} for a in range(4) for b in range(3) for c in range(2)]
    picked, cover = plugin.covering_sample(cases, 0, 7)
    assert cover == 4      # the widest parameter's value count: one case per value of a suffices
    assert {cases[i]["a"] for i in picked} == {"0", "1", "2", "3"}


def test_plugin_samples_and_deselects_on_a_parametrized_file(pytester):
    pytester.makepyfile(test_synthetic="""
        import pytest

        @pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
        @pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
        @pytest.mark.parametrize("causal", [False, True])
        @pytest.mark.parametrize("seqlen", [1, 7, 128, 1000])
        def test_grid(seqlen, causal, d, dtype):
            pass

        def test_plain():
            pass

        @pytest.mark.parametrize("x", [1, 2])
        def test_internal(x):
            from flash_attn.flash_attn_interface import flash_attn_gpu
            flash_attn_gpu.fwd()
        """)
    out = pytester.path / "fa.json"
    result = pytester.runpytest_inprocess("-p", "fa_own_tests_plugin", "-p", "no:cacheprovider", "--collect-only",
                                          "-q", "--fa-max-cases-per-test", "3", "--fa-results", str(out))
    assert result.ret == 0
    record = json.loads(out.read_text())
    grid = [n for n in record["selected"] if "test_grid[" in n]
    sampling = record["sampling"]["test_synthetic.py::test_grid"]
    assert sampling["cases"] == 120 and sampling["covering"] == 5 and len(grid) == 5
    ids = [n.split("[")[1].rstrip("]").split("-") for n in grid]       # seqlen-causal-d-dtype
    assert {i[0] for i in ids} == {"1", "7", "128", "1000"}
    assert {i[1] for i in ids} == {"False", "True"}
    assert {i[2] for i in ids} == {"32", "64", "96", "128", "256"}
    assert {i[3] for i in ids} == {"fp16", "bf16", "fp32"}
    assert "test_synthetic.py::test_plain" in record["selected"]
    assert not any("test_internal" in n for n in record["selected"])
    [internal] = record["deselected_internals"]
    assert internal["test"] == "test_synthetic.py::test_internal" and internal["calls"] == ["flash_attn_gpu"]
    assert record["install"]["flash_attn"] == "gpuparity.flash_attn"


def test_plugin_backend_option_names_the_backends():
    """--fa-backend triton: every flash_attn op with a Triton backend runs on it from the plugin's
    configure to its unconfigure (recorded); a name no op has is a usage error. (Called directly:
    its registry lookups inside pytester's in-process run left a later test's patch of a backend
    module unseen.)"""
    from gpuparity.flash_attn import flash_attn_interface, uninstall
    options = {"--fa-backend": "triton", "--fa-assume-capability": None}
    config = SimpleNamespace(getoption=options.get)
    try:
        plugin.pytest_configure(config)
        backends = dict(flash_attn_interface._BACKENDS)
        assert plugin._state["backends"] == backends == {key: "triton" for key in backends}
        assert set(backends) >= {"attention", "attention_varlen", "cross_entropy", "residual_norm"}
    finally:
        plugin.pytest_unconfigure(config)
        uninstall()
    assert set(flash_attn_interface._BACKENDS.values()) == {"auto"}
    assert plugin.backend_names("auto") == {}
    with pytest.raises(pytest.UsageError, match="no gpuparity.flash_attn op has a backend named 'nosuch'"):
        plugin.backend_names("nosuch")


def _rotate(x, pos, inv_freq, pairs):
    """float64 rotation of the (i, j) pairs of x's last dim by angle pos * inv_freq[k]."""
    out = x.clone()
    angle = pos[:, None] * inv_freq[None, :]
    for k, (i, j) in enumerate(pairs):
        c, s = torch.cos(angle[:, k]), torch.sin(angle[:, k])
        out[..., i] = x[..., i] * c - x[..., j] * s
        out[..., j] = x[..., j] * c + x[..., i] * s
    return out


def test_supplied_old_transformers_rotary_formulas():
    dim, total, offset, seq = 8, 12, 5, 7
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    pos = torch.arange(offset, offset + seq, dtype=torch.float64)
    torch.manual_seed(0)
    # GPT-NeoX: [batch, heads, seq, dim], halves paired
    q, k = torch.randn(2, 3, seq, dim), torch.randn(2, 3, seq, dim)
    cos, sin = plugin._neox_rotary_embedding()(dim, total)(q, seq_len=total)
    q_out, k_out = plugin.neox_apply_rotary_pos_emb(q, k, cos, sin, offset=offset)
    halves = [(i, i + dim // 2) for i in range(dim // 2)]
    torch.testing.assert_close(q_out.double(), _rotate(q.double(), pos, inv_freq, halves), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out.double(), _rotate(k.double(), pos, inv_freq, halves), rtol=1e-5, atol=1e-5)
    # GPT-J: [batch, seq, heads, dim], neighbours paired
    x = torch.randn(2, seq, 3, dim)
    sincos = plugin.gptj_fixed_pos_embedding(x, seq_dim=1, seq_len=total)
    got = plugin.gptj_apply_rotary_pos_emb(x, sincos, offset=offset)
    want = _rotate(x.double().transpose(1, 2), pos, inv_freq, [(2 * i, 2 * i + 1) for i in range(dim // 2)])
    torch.testing.assert_close(got.double(), want.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_supplied_only_while_test_rotary_is_imported():
    import transformers.models.gptj.modeling_gptj as gptj
    before = gptj.apply_rotary_pos_emb
    saved = plugin._supply_old_transformers()
    assert gptj.fixed_pos_embedding is plugin.gptj_fixed_pos_embedding
    plugin._restore(saved)
    assert gptj.apply_rotary_pos_emb is before and not hasattr(gptj, "fixed_pos_embedding")


def test_deadline_past_skips_as_not_run_budget(pytester):
    pytester.makepyfile(test_two="""
        import pytest

        @pytest.mark.parametrize("x", [1, 2])
        def test_x(x):
            pass
        """)
    out = pytester.path / "fa.json"
    result = pytester.runpytest_inprocess("-p", "fa_own_tests_plugin", "-p", "no:cacheprovider", "-q",
                                          "--fa-deadline", "1", "--fa-results", str(out))
    result.assert_outcomes(skipped=2)
    tests = json.loads(out.read_text())["tests"]
    assert sorted(t["outcome"] for t in tests.values()) == ["not_run_budget", "not_run_budget"]


def test_record_written_after_each_case(tmp_path, monkeypatch):
    path = tmp_path / "fa.json"
    config = SimpleNamespace(getoption=lambda name: {"--fa-results": str(path), "collectonly": False}[name])
    monkeypatch.setattr(plugin, "_config", [config])
    monkeypatch.setattr(plugin, "_state", dict(plugin._state, tests={}))
    for when in ("setup", "call", "teardown"):
        plugin.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::test_a", when=when, duration=0.5, skipped=False,
                                                        failed=False, passed=True, longrepr=None))
    assert json.loads(path.read_text())["tests"]["t.py::test_a"] == {"outcome": "passed", "duration_s": 1.5}


def test_select_keeps_only_the_listed_cases_in_their_order(pytester):
    pytester.makepyfile(test_sel="""
        import pytest

        @pytest.mark.parametrize("d", [32, 64, 128])
        @pytest.mark.parametrize("causal", [False, True])
        def test_grid(causal, d):
            pass

        @pytest.mark.parametrize("x", [1, 2])
        def test_other(x):
            pass

        def test_plain():
            pass
        """)
    wanted = ["test_sel.py::test_grid[True-64]", "test_sel.py::test_plain", "test_sel.py::test_grid[False-32]",
              "test_sel.py::test_grid[True-7]"]
    select = pytester.path / "select.txt"
    select.write_text("".join(n + "\n" for n in wanted))
    out = pytester.path / "fa.json"
    result = pytester.runpytest_inprocess("-p", "fa_own_tests_plugin", "-p", "no:cacheprovider", "-q",
                                          "--fa-select", str(select), "--fa-results", str(out))
    result.assert_outcomes(passed=3)
    record = json.loads(out.read_text())
    assert record["selected"] == wanted[:3]
    assert record["select_missing"] == ["test_sel.py::test_grid[True-7]"]
    assert record["params"]["test_sel.py::test_grid[True-64]"] == {"causal": "True", "d": "64"}
    assert list(record["tests"]) == wanted[:3]
