"""safe_compile / compile-check: fall down the backend list on a wrong answer or an error, with
one warning; the float64-referee rule decides what is wrong."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

from gpuparity import cli
from gpuparity.compile import CompileFallbackWarning, compile_check, safe_compile


def perturbing_backend(gm, example_inputs):
    """A planted compiler that runs the graph and returns outputs 1% too large."""
    def run(*args):
        outputs = gm(*args)
        return type(outputs)(o * 1.01 if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                             for o in outputs)
    return run


def rocm_like_failing_backend(gm, example_inputs):
    raise RuntimeError("Loop-carried variable _tmp2 has initial type <[1, 2], int1> but is re-assigned to "
                       "<[1, 2], int8>")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)), torch.randn(4, 8)


def test_wrong_answer_falls_back_with_one_warning():
    model, x = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = safe_compile(model, (x,), backends=(perturbing_backend, "aot_eager", "eager"))
    ours = [w for w in caught if issubclass(w.category, CompileFallbackWarning)]
    assert len(ours) == 1
    assert "perturbing_backend gave a wrong answer" in str(ours[0].message)
    choice = chosen.gpuparity_compile
    assert choice.backend == "aot_eager" and choice.fell_back and choice.wrong_answer
    assert choice.attempts[0].err == pytest.approx(0.01, rel=0.05)
    assert choice.referee == "float64 on cpu"
    torch.testing.assert_close(chosen(x), model(x))


def test_compiler_error_falls_back_and_names_the_known_issue():
    model, x = _model()
    chosen, choice = compile_check(model, (x,), backends=(rocm_like_failing_backend, "eager"))
    assert chosen is model and choice.backend == "eager"
    assert choice.attempts[0].status == "error" and "Loop-carried variable" in choice.attempts[0].reason
    assert "COMPILE-ROCM-LOOPCARRIED" in choice.known_issues
    assert "COMPILE-ROCM-LOOPCARRIED" in choice.message and not choice.wrong_answer


def test_no_warning_when_the_first_backend_passes():
    model, x = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        chosen = safe_compile(model, (x,), backends=("aot_eager",))
    assert chosen.gpuparity_compile.backend == "aot_eager" and not chosen.gpuparity_compile.fell_back


def test_buffers_are_restored_after_the_check():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).train()
    before = model[1].running_mean.clone()
    compile_check(model, (torch.randn(16, 8),), backends=("aot_eager",))
    assert torch.equal(model[1].running_mean, before) and model.training


@pytest.mark.slow
def test_inductor_is_chosen_when_it_is_right():
    model, x = _model()
    chosen = safe_compile(model, (x,))
    assert chosen.gpuparity_compile.backend == "inductor", chosen.gpuparity_compile.to_dict()


def test_compile_check_cli_exit_code_on_a_wrong_answer(tmp_path, capsys):
    from torch._dynamo import list_backends, register_backend
    if "gpuparity_test_perturb" not in list_backends(exclude_tags=()):
        register_backend(perturbing_backend, name="gpuparity_test_perturb")
    spec = os.path.join(os.path.dirname(__file__), "trace", "trace_models.py") + ":factory"
    out = str(tmp_path / "c.json")
    assert cli.main(["compile-check", spec, "--device", "cpu", "--backends", "gpuparity_test_perturb,aot_eager",
                     "--json", out]) == 1
    assert "WRONG ANSWER" in capsys.readouterr().out
    assert cli.main(["compile-check", spec, "--device", "cpu", "--backends", "aot_eager"]) == 0


def test_known_issue_base_is_consulted(monkeypatch):
    """The base's own rules name a compile issue the error text and the heuristics do not: on an
    sm_120 machine (a saved platform report), a fallback that was no wrong answer still lists
    COMPILE-SM120-BF16, which its rule says may apply there."""
    import json
    import os
    from gpuparity import compile as compile_mod, platform
    from gpuparity.compile import known_issue_ids

    path = os.path.join(os.path.dirname(__file__), "fixtures", "platforms", "rtx5090x2_cuda.json")
    with open(path) as handle:
        report = json.load(handle)
    monkeypatch.setattr(platform, "current", lambda: report)
    ids = known_issue_ids("RuntimeError: something else", False, torch.device("cuda", 0))
    assert "COMPILE-SM120-BF16" in ids
    assert compile_mod.known_issue_ids("RuntimeError: x", False, torch.device("cpu")) == ids
