"""evaluate() on this machine: probes run crash-isolated for the entries that may apply; a crash
or hang of a probe confirms its entry with the stderr tail as evidence."""
import json
import os
import textwrap

import pytest

from gpuparity.known import (CONFIRMED, DOES_NOT_APPLY, MAY_APPLY, RULED_OUT, evaluate, load_issues, results_json)
from gpuparity.known import engine
from gpuparity import platform as platform_mod


def test_evaluate_with_probes_on_this_machine():
    calls = []
    results = {r.id: r for r in evaluate(progress=lambda done, total, label: calls.append((done, total, label)))}
    assert len(results) == len(load_issues())
    if platform_mod.current()["vendor"] == "cpu":
        # Measured on the CPU build: fully masked rows give zeros (ruled out); checkpointing with
        # the math backend chosen around the forward only breaks the recompute, which is torch
        # behaviour everywhere, so the entry stays "may apply" with the probe's finding.
        assert results["SDPA-FULLMASK-NAN"].status == RULED_OUT
        assert results["SDPA-FULLMASK-NAN"].probe_outcome["status"] == "ok"
        assert results["CKPT-METADATA"].status == MAY_APPLY
        assert results["CKPT-METADATA"].why[-1].startswith("probe inconclusive: fine when the backend is chosen")
        assert "Recomputed values" in results["CKPT-METADATA"].why[-1]
        assert results["SDPA-CAUSAL-ALIGN"].status == MAY_APPLY
        assert results["SDPA-MASK-ROCM"].status == DOES_NOT_APPLY
        assert results["TORCH-CPU-BF16-LN-GRAD"].status == CONFIRMED  # torch 2.13 CPU, found by the battery
        assert results["TORCH-CPU-FP16-LN-GRAD"].status == CONFIRMED  # its fp16 twin (false-alarm audit)
        assert results["TORCH-CPU-FP16-CE-MEAN"].status == CONFIRMED  # fp16 cross_entropy mean: inf
        assert results["TORCH-CPU-BF16-CE-ONEHOT"].status == CONFIRMED  # bf16 near one-hot losses 14% off
        assert calls[-1] == (6, 6, "")
    probed = [r for r in results.values() if r.probe_outcome]
    assert all(r.status in (CONFIRMED, RULED_OUT, MAY_APPLY) for r in probed)
    document = results_json(list(results.values()), platform_mod.current(), probes_ran=True)
    assert json.loads(json.dumps(document))["schema_version"] == 1


@pytest.fixture
def fake_probes(tmp_path, monkeypatch):
    """Point the probe runner at a test-only module whose probes abort, hang or raise."""
    (tmp_path / "fake_known_probes.py").write_text(textwrap.dedent("""
        import os, sys, time

        def sdpa_fullmask_nan(device):
            sys.stderr.write("HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: fake aperture violation\\n")
            sys.stderr.flush()
            os.abort()

        def checkpoint_masked_attention(device):
            time.sleep(60)

        def conv_train_step(device):
            raise ValueError("a bug in the probe")

        def norm_weight_grads(device):
            return {"failed": None, "detail": "no kernel here"}
    """))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(engine, "PROBE_MODULE", "fake_known_probes")


def test_a_probe_that_aborts_confirms_with_evidence(fake_probes):
    (result,) = evaluate(ids=["SDPA-FULLMASK-NAN"], device="cpu")
    assert result.status == CONFIRMED
    assert result.probe_outcome["status"] == "crash"
    assert "SIGABRT" in result.probe_outcome["detail"]
    assert "fake aperture violation" in result.probe_outcome["stderr_tail"]
    assert result.why[-1] == ("probe failed here: the probe process killed by SIGABRT before answering; "
                              "stderr: HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: fake aperture violation")


def test_a_probe_that_hangs_confirms(fake_probes):
    (result,) = evaluate(ids=["CKPT-METADATA"], device="cpu", timeout=3)
    assert result.status == CONFIRMED
    assert result.probe_outcome["status"] == "timeout"
    assert result.why[-1] == ("probe failed here: the probe gave no answer within 3 s, nor within 6 s on a "
                              "second try (a hang?)")


def _always(issue_id, probe, **extra):
    base = {issue["id"]: issue for issue in load_issues()}[issue_id]
    return {**base, "rule": {"always": True}, "probe": probe, **extra}


def test_a_probe_that_raises_or_cannot_tell_leaves_may_apply(fake_probes):
    raising, undecided = evaluate(issues=[_always("RDNA-MTYPE-CRASH", "conv_train_step", probe_needs_gpu=False),
                                          _always("LN-BWD-WAVE32", "norm_weight_grads", probe_needs_gpu=False)],
                                  device="cpu")
    assert raising.status == MAY_APPLY and "probe raised ValueError: a bug in the probe" in raising.why[-1]
    assert undecided.status == MAY_APPLY and undecided.why[-1] == "probe inconclusive: no kernel here"


def test_gpu_only_probes_do_not_run_on_a_cpu_device(fake_probes):
    (result,) = evaluate(issues=[_always("SDPA-MASK-ROCM", "sdpa_fullmask_nan", probe_needs_gpu=True)], device="cpu")
    assert result.status == MAY_APPLY and result.probe_outcome is None
    assert "needs a GPU device" in result.why[-1]


def test_probes_false_is_rules_only():
    results = evaluate(probes=False)
    assert all(r.probe_outcome is None for r in results)
    assert {r.status for r in results} <= {MAY_APPLY, DOES_NOT_APPLY}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="device: 'gpu:7'"):
        evaluate(probes=False, device="gpu:7")
    with pytest.raises(TypeError, match="platform: expected a platform report dict"):
        evaluate("env.json")
    with pytest.raises(ValueError, match="ids: no known issue NOPE"):
        evaluate(probes=False, ids=["NOPE"])
    with pytest.raises(ValueError, match="timeout"):
        evaluate(probes=False, timeout=0)
