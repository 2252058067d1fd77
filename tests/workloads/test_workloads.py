"""Workloads: seeded data with a signal, a padding-invariant model, and `workload compare`
passing for two correct attention backends and failing for the planted mask bug."""
from __future__ import annotations

import json
import os

import pytest
import torch

from gpuparity import cli
from gpuparity.workloads import compare_runs, run
from gpuparity.workloads.aam import AAM, AamConfig
from gpuparity.workloads.data import IGNORE, MASK, PAD, NucleotideConfig, NucleotideSets


def test_nucleotide_data_is_seeded_and_padded():
    cfg = NucleotideConfig(sets=3, set_size=5, min_len=6, max_len=16, pad_len=32, motifs=4)
    first, again = NucleotideSets(cfg, seed=1).batch(2), NucleotideSets(cfg, seed=1).batch(2)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["tokens"], NucleotideSets(cfg, seed=2).batch(2)["tokens"])
    tokens, targets = first["tokens"], first["targets"]
    assert tokens.shape[:2] == (3, 5) and tokens.shape[2] <= 16       # dynamic padding
    assert NucleotideSets(cfg, seed=1).batch(2, pad_to=32)["tokens"].shape == (3, 5, 32)
    masked = targets != IGNORE
    assert bool((tokens[masked] == MASK).all()) and bool(((targets[masked] >= 0) & (targets[masked] < 4)).all())
    assert bool((tokens == PAD).any())                                # padding, and empty slots
    assert first["pair_mask"].diagonal(dim1=1, dim2=2).sum() == 0


def test_aam_output_does_not_depend_on_padding():
    """The property the evaluation relies on: with a correct mask, more padding changes nothing."""
    torch.manual_seed(0)
    model = AAM(AamConfig(positions=64, attn="sdpa_math")).eval()
    data = NucleotideSets(NucleotideConfig(sets=2, set_size=4, min_len=6, max_len=16, pad_len=64), seed=0)
    short, long = data.batch(0, pad_to=16), data.batch(0, pad_to=64)
    with torch.no_grad():
        a, b = model(short["tokens"]), model(long["tokens"])
    torch.testing.assert_close(a["nuc_logits"], b["nuc_logits"][..., :16, :], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a["distances"], b["distances"], atol=1e-5, rtol=1e-4)
    model.pool.core.backend = "planted_ignore_mask"
    with torch.no_grad():
        c, d = model(short["tokens"]), model(long["tokens"])
    assert (c["distances"] - d["distances"]).abs().max() > 1e-2


@pytest.fixture(scope="module")
def aam_runs():
    return {attn: run("aam", attn=attn, device="cpu", size="small")
            for attn in ("sdpa_math", "composition", "planted_ignore_mask")}


def test_aam_learns(aam_runs):
    record = aam_runs["sdpa_math"]
    assert record["status"] == "ok" and len(record["metrics"]) == record["steps"] == 30
    assert record["final"]["nuc_acc"] > 0.45          # chance is 0.25
    losses = [row["loss"] for row in record["metrics"]]
    assert sum(losses[-5:]) < sum(losses[:5])


def test_two_correct_backends_agree(aam_runs):
    result = compare_runs(aam_runs["sdpa_math"], aam_runs["composition"])
    assert result.passed, result.problems
    assert result.worst_rel_diff < 1e-3


def test_planted_mask_bug_fails_compare(aam_runs):
    result = compare_runs(aam_runs["sdpa_math"], aam_runs["planted_ignore_mask"])
    assert not result.passed
    failing = {m.name for m in result.final if not m.passed}
    assert "loss_dist" in failing, result.problems


def test_runs_of_different_seeds_are_not_comparable(aam_runs):
    other = dict(aam_runs["sdpa_math"], seed=5)
    with pytest.raises(ValueError, match="seed"):
        compare_runs(aam_runs["sdpa_math"], other)


def test_cnn_runs_isolated():
    record = run("cnn", device="cpu", size="small", steps=4)
    assert record["isolated"] and record["status"] == "ok", record.get("error")
    assert len(record["metrics"]) == 4 and "acc" in record["final"]


def test_a_hung_isolated_run_is_a_result():
    record = run("cnn", device="cpu", size="small", steps=4, timeout=0.05)
    assert record["status"] == "timeout" and record["metrics"] == [] and "no answer" in record["error"]


def test_cnn_rejects_an_attention_backend():
    with pytest.raises(ValueError, match="no attention"):
        run("cnn", attn="sdpa_math", device="cpu")


@pytest.mark.parametrize("name,data_field,model_field", [("aam", "sets", "heads"), ("cnn", "batch", "width")])
def test_presets_take_overrides_and_name_what_is_wrong(name, data_field, model_field):
    from gpuparity.workloads.aam import AamWorkload
    from gpuparity.workloads.cnn import CnnWorkload
    cls = {"aam": AamWorkload, "cnn": CnnWorkload}[name]
    small = cls.sizes["small"]
    workload = cls(size="small", overrides={data_field: 3, model_field: 4})
    assert (workload.lr, workload.default_steps) == (small["lr"], small["steps"])
    assert getattr(workload.data_config, data_field) == 3 and getattr(workload.model_config, model_field) == 4
    assert getattr(small["data"], data_field) != 3  # the preset itself is copied, not changed
    assert workload.config()["model"][model_field] == 4
    with pytest.raises(ValueError, match=f"{name}: no setting 'nonsense'"):
        cls(size="small", overrides={"nonsense": 1})
    with pytest.raises(ValueError, match="size: expected one of"):
        cls(size="huge")


def test_workload_cli(tmp_path, capsys):
    a, b, c = (str(tmp_path / f"{n}.json") for n in ("a", "b", "c"))
    common = ["--device", "cpu", "--size", "small", "--steps", "4"]
    assert cli.main(["workload", "run", "aam", "--attn", "sdpa_math", "--out", a, *common]) == 0
    assert cli.main(["workload", "run", "aam", "--attn", "composition", "--out", b, *common]) == 0
    record = json.load(open(a))
    assert record["schema_version"] == 1 and record["attn"] == "sdpa_math" and record["platform"]["vendor"]
    plot = str(tmp_path / "curves.png")
    assert cli.main(["workload", "compare", a, b, "--plot", plot, "--json", c]) == 0
    assert os.path.getsize(plot) > 1000 and json.load(open(c))["passed"] is True
    assert "the runs agree" in capsys.readouterr().out
    assert cli.main(["workload", "run", "aam", "--attn", "no_such_backend", "--out", c, *common]) == 2
    assert "no_such_backend" in capsys.readouterr().err
