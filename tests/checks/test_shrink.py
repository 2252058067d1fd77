"""A failing check is shrunk to a minimal failing case and handed over as a standalone repro
script that fails on the planted bug and passes on a correct implementation."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import torch

from gpuparity.checks import families
from gpuparity.checks.battery import run_battery
from gpuparity.checks.execute import run_case
from gpuparity.checks.results import Status
from gpuparity.checks.shrink import shrink
from gpuparity.contracts import get_spec

HERE = os.path.dirname(__file__)
REGIMES = os.path.join(HERE, "planted_regimes.py")
IMPLS = os.path.join(HERE, "planted_impls.py")


def _failing(name, case, dtype="float32", **overrides):
    spec = get_spec("attention")
    found = families.lookup(spec, case)
    found = spec.make_case(case, **{**found.params, **overrides})
    run = run_battery(["attention"], "default", "cpu", impl=f"{REGIMES}:{name}", dtypes=[dtype], isolate=False,
                      case_lists={"attention": [found]})
    [result] = run.results
    assert result.status == Status.FAIL
    return result


def _run_script(path, **env):
    # a clean environment: the script needs torch and the implementation, not gpuparity's test setup
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "GPUPARITY"))}
    return subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120,
                          env={**environ, **env}, cwd=os.path.dirname(path))


def test_shrinker_reduces_a_tile_remainder_bug_to_its_minimal_case(tmp_path):
    impl = f"{REGIMES}:attention_tile_remainder_64"
    original = _failing("attention_tile_remainder_64", "tile.sq192_sk192_bool_d64", D=8)
    shrunk = shrink(original, impl=impl, isolate=False, seconds=120, repro_dir=str(tmp_path))
    p = shrunk.params
    assert shrunk.minimal and shrunk.result.status == Status.FAIL
    # the smallest key length that is 64 mod 128, one item, one head, the mask gone
    assert (p["Sk"], p["B"], p["H"], p["Sq"], p["mask"]) == (64, 1, 1, 1, "none"), shrunk.steps
    assert p["D"] < original.params["D"]
    assert shrunk.steps[0].startswith("sizes:")

    # the repro runs standalone and fails on the bug, printing the numbers
    proc = _run_script(shrunk.repro)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "relative L2 error" in proc.stdout and "allowed" in proc.stdout and "FAILS" in proc.stdout
    source = open(shrunk.repro).read()
    assert not re.search(r"^\s*(import|from) gpuparity", source, re.M)  # only torch and the implementation

    # the same case written for a correct implementation passes
    correct = os.path.join(str(tmp_path), "correct")
    status, _, _ = run_case("attention", _load(f"{IMPLS}:attention_correct"), p, torch.float32, torch.device("cpu"),
                            shrunk.result.seed, repro={"stem": correct, "impl": f"{IMPLS}:attention_correct",
                                                       "case": "shrunk"})
    assert status == Status.PASS
    proc = _run_script(correct + ".py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passes" in proc.stdout


def test_shrinking_keeps_the_regime_that_makes_the_bug():
    # NaN grad_q only on massive-activation rows with a mask: values and mask must survive
    impl = f"{REGIMES}:attention_massive_rows_nan_grad"
    original = _failing("attention_massive_rows_nan_grad", "values.massive_neg_bool_mask_d64")
    shrunk = shrink(original, impl=impl, isolate=False, seconds=120)
    assert shrunk.params["value"] == "massive_neg" and shrunk.params["mask"] != "none"
    assert shrunk.params["Sq"] <= 2 and shrunk.params["B"] == 1


def test_repro_keeps_the_layout_the_implementation_received(tmp_path):
    spec = get_spec("attention")
    case = families.lookup(spec, "layouts.q_offset_k_expanded_v_sliced")
    impl = f"{REGIMES}:attention_noncontiguous_v"
    stem = os.path.join(str(tmp_path), "layout")
    status, _, _ = run_case("attention", _load(impl), case.params, torch.float32, torch.device("cpu"), 3,
                            repro={"stem": stem, "impl": impl, "case": case.name})
    assert status == Status.FAIL
    saved = torch.load(stem + ".pt", weights_only=False)
    q, k, v = saved["impl_args"][:3]
    assert q["offset"] == 3 and k["stride"][0] == 0 and v["stride"][-1] == 2
    assert _run_script(stem + ".py").returncode == 1


def _load(target):
    from gpuparity.checks.execute import load_impl
    return load_impl(target)


def test_repro_of_a_torch_backend_calls_torch_directly(tmp_path):
    # gpuparity's sdpa_math backend: the script pins torch's SDPA to the math kernel itself
    from gpuparity.dispatch import get
    spec = get_spec("attention")
    case = families.lookup(spec, "gqa.h8_hkv2_bool")
    stem = os.path.join(str(tmp_path), "sdpa")
    status, _, _ = run_case("attention", get("attention", "sdpa_math").fn, case.params, torch.float32,
                            torch.device("cpu"), 5, repro={"stem": stem, "backend": "sdpa_math", "case": case.name})
    assert status == Status.PASS
    source = open(stem + ".py").read()
    assert "SDPBackend.MATH" in source and not re.search(r"^\s*(import|from) gpuparity", source, re.M)
    proc = _run_script(stem + ".py")
    assert proc.returncode == 0 and "passes" in proc.stdout, proc.stdout + proc.stderr


def test_shrinking_an_error_keeps_its_exception_type():
    """Before: an ERROR shrank onto any candidate that ERRORed (conv2d's refused weight view
    ended on a channel mismatch); now only on one that raises the same exception type."""
    spec = get_spec("softmax")
    found = spec.make_case("large_logits_x4", **families.lookup(spec, "large_logits_x4").params)
    run = run_battery(["softmax"], "default", "cpu", impl=f"{IMPLS}:softmax_error_by_width", dtypes=["float32"],
                      isolate=False, case_lists={"softmax": [found]})
    [original] = run.results
    assert original.status == Status.ERROR and original.reason.startswith("raised ValueError"), original.reason
    shrunk = shrink(original, impl=f"{IMPLS}:softmax_error_by_width", isolate=False, seconds=60)
    assert shrunk.result.status == Status.ERROR
    assert shrunk.result.reason.startswith("raised ValueError"), (shrunk.result.reason, shrunk.steps)
    # it still shrank: one row, and the narrowest width that raises the same way
    assert tuple(shrunk.params["shape"]) == (1, 5), shrunk.steps


def test_a_shrink_step_keeps_only_the_same_kind_of_failure():
    from gpuparity.checks.shrink import _same_failure
    from gpuparity.checks.results import CheckResult
    from gpuparity.tolerance import Comparison

    def result(status, reason="", off=()):
        return CheckResult("attention", "b", "c", "float32", "cpu", status, reason=reason,
                           comparisons=[Comparison(name, name not in off) for name in ("out", "grad_q", "grad_k")])
    value_error = result(Status.ERROR, "raised ValueError: no (planted) at x.py:3")
    assert _same_failure(value_error, result(Status.ERROR, "raised ValueError: other words at y.py:9"))
    assert not _same_failure(value_error, result(Status.ERROR, "raised RuntimeError: mismatch at x.py:4"))
    assert not _same_failure(value_error, result(Status.ERROR, "the check itself raised ValueError: no"))
    assert not _same_failure(value_error, result(Status.CRASH, "worker died"))
    assert not _same_failure(result(Status.CRASH), result(Status.TIMEOUT))
    grad_q = result(Status.FAIL, "grad_q: relative error ...", off=("grad_q", "grad_k"))
    assert _same_failure(grad_q, result(Status.FAIL, off=("grad_q",)))
    assert not _same_failure(grad_q, result(Status.FAIL, off=("out",)))
    # a numeric FAIL and a returned-value problem (no comparison: wrong shape, dtype) are not one kind
    problem = CheckResult("attention", "b", "c", "float32", "cpu", Status.FAIL,
                          reason="the implementation returned the wrong shape (1,), expected (2,)")
    assert not _same_failure(grad_q, problem) and not _same_failure(problem, grad_q)
    assert _same_failure(problem, problem)
