"""An --impl's ERROR that looks like a known torch fault is run again with torch's kernel set aside
(checks/attribute.py): a correct function that calls torch's SDPA passes, with the fault named; a
function whose own code raised the same words keeps its ERROR.

The GPU fault (torch 2.11's efficient SDPA, "CUDA error: misaligned address" on an fp32 view off
16-byte alignment) is played on the CPU by a function that raises those words while torch's
efficient kernel is allowed and an input is misaligned, as the real one does on an H100; the
labels are a GPU's (set_aside_for with "cuda")."""
import os

import pytest
import torch
from test_false_alarms import sdpa

from gpuparity.checks import attribute as attribute_mod
from gpuparity.checks import battery
from gpuparity.checks.results import CheckResult, Status
from gpuparity.known.sidestep import sdpa_set_aside, without_sdpa

FAULT = ("CUDA error: misaligned address\nCUDA kernel errors might be asynchronously reported at some other API call, "
         "so the stacktrace below might be incorrect.")
HERE = os.path.abspath(__file__)
CASES = ["layouts.q_offset_k_expanded_v_sliced", "cover.0"]   # fp32 cases with a view off 16-byte alignment


def _misaligned(*tensors):
    return any(t.data_ptr() % 16 for t in tensors)


def calls_faulting_sdpa(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Correct, but its SDPA call meets torch's fault: what the efficient kernel does on a GPU."""
    if torch.backends.cuda.mem_efficient_sdp_enabled() and _misaligned(q, k, v):
        raise RuntimeError(FAULT)
    return sdpa(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=scale)


def faults_itself(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Its own kernel faults on a misaligned input, whatever torch's SDPA would do."""
    if _misaligned(q, k, v):
        raise RuntimeError(FAULT)
    return sdpa(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=scale)


def wrong_without_the_fault(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Meets torch's fault, and computes the wrong attention when torch's efficient kernel is set aside."""
    if torch.backends.cuda.mem_efficient_sdp_enabled() and _misaligned(q, k, v):
        raise RuntimeError(FAULT)
    return sdpa(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=scale) * 1.01


def _fused_sdpa_allowed():
    return (torch.backends.cuda.flash_sdp_enabled() or torch.backends.cuda.mem_efficient_sdp_enabled()
            or torch.backends.cuda.cudnn_sdp_enabled())


def wrong_on_fused_sdpa(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Correct arithmetic, but torch's fused kernel (played here) returns wrong numbers for its call:
    what torch 2.11's cuDNN SDPA did on an H100 for bf16 views off 16-byte alignment."""
    out = sdpa(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=scale)
    return out * 1.1 if _fused_sdpa_allowed() else out


def wrong_on_cudnn_sdpa(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Torch's cuDNN kernel (played here) returns wrong numbers for the call; its other kernels are
    right: what torch 2.11's cuDNN SDPA does on an H100 for a bf16 input off 16-byte alignment."""
    out = sdpa(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=scale)
    return out * 1.1 if torch.backends.cuda.cudnn_sdp_enabled() else out


def wrong_itself(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return sdpa(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=scale) * 1.1


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """Labels as on a GPU (the SDPA misaligned entries name GPU errors only)."""
    monkeypatch.setattr(battery, "set_aside_for", lambda result, device_type: attribute_mod.set_aside_for(result, "cuda"))


def _run(fn_name):
    return battery.run_battery(["attention"], "default", "cpu", ["float32"], None, f"{HERE}:{fn_name}", 0,
                               case_filter=None, case_lists={"attention": _cases()}, isolate=False)


def _cases():
    from gpuparity.checks.relations import lookup
    from gpuparity.contracts import get_spec
    spec = get_spec("attention")
    return [lookup(spec, name) for name in CASES]


def test_the_sdpa_entries_name_the_kernels_to_set_aside():
    assert sdpa_set_aside(["SDPA-EFFICIENT-MISALIGNED"]) == ["EFFICIENT_ATTENTION"]
    assert sdpa_set_aside(["SDPA-CUDNN-MISALIGNED", "SDPA-EFFICIENT-MISALIGNED"]) == ["EFFICIENT_ATTENTION",
                                                                                      "CUDNN_ATTENTION"]
    assert sdpa_set_aside(["TORCH-CPU-FP16-CE-MEAN"]) == []
    with pytest.raises(ValueError, match="names: expected SDPA kernels"):
        without_sdpa(len, ["MATH"])


def test_a_correct_function_calling_faulting_sdpa_passes_with_the_fault_named(as_on_a_gpu):
    run = _run("calls_faulting_sdpa")
    assert [r.status for r in run.results] == [Status.PASS] * len(CASES), [r.reason for r in run.results]
    for result in run.results:
        assert result.reason.startswith(attribute_mod.SET_ASIDE + "FLASH_ATTENTION, EFFICIENT_ATTENTION, "
                                                                  "CUDNN_ATTENTION set aside")
        assert "SDPA-EFFICIENT-MISALIGNED" in result.reason and "misaligned address" in result.reason
        assert result.comparisons and all(c.passed for c in result.comparisons)
    assert run.ok


def test_without_the_rerun_the_same_function_errors(monkeypatch):
    """What the rerun changes: labelled on the CPU (no GPU entry names a CPU error), the ERRORs stay."""
    run = _run("calls_faulting_sdpa")
    assert [r.status for r in run.results] == [Status.ERROR] * len(CASES)


def test_a_function_that_faults_itself_keeps_its_error(as_on_a_gpu):
    run = _run("faults_itself")
    assert [r.status for r in run.results] == [Status.ERROR] * len(CASES)
    for result in run.results:
        assert "set aside the same inputs gave ERROR" in result.reason and "not (only) torch's fault" in result.reason
    assert not run.ok


def test_a_wrong_function_behind_the_fault_keeps_its_error_and_says_it_fails(as_on_a_gpu):
    run = _run("wrong_without_the_fault")
    assert [r.status for r in run.results] == [Status.ERROR] * len(CASES)
    assert all("set aside the same inputs gave FAIL" in r.reason for r in run.results)


def test_a_rerun_not_run_leaves_the_error():
    result = CheckResult("attention", "impl:x.py:f", "cover.0", "float32", "cuda:0", Status.ERROR, reason="raised X")
    rerun = CheckResult("attention", "impl:x.py:f", "cover.0", "float32", "cuda:0", Status.NOT_RUN,
                        reason="the run's budget was spent")
    attribute_mod.settle(result, ["SDPA-EFFICIENT-MISALIGNED"], ["EFFICIENT_ATTENTION"], rerun)
    assert result.status == Status.ERROR and "was not run: the run's budget was spent" in result.reason


def test_registered_backends_and_other_errors_are_not_rerun():
    for backend, reason in (("sdpa_efficient", FAULT), ("impl:x.py:f", "raised ValueError: bad shape")):
        result = CheckResult("attention", backend, "cover.0", "float32", "cuda:0", Status.ERROR, reason=reason)
        assert attribute_mod.set_aside_for(result, "cuda") == ([], [])
    result = CheckResult("attention", "impl:x.py:f", "cover.0", "float32", "cpu", Status.ERROR, reason=FAULT)
    assert attribute_mod.set_aside_for(result, "cpu") == ([], [])
    issues, kernels = attribute_mod.set_aside_for(result, "cuda")
    assert set(issues) == {"SDPA-EFFICIENT-MISALIGNED", "SDPA-CUDNN-MISALIGNED"} and kernels


def test_a_malformed_sidestep_is_refused_when_the_base_loads():
    from gpuparity.known.engine import load_issues, validate_issue
    entry = next(issue for issue in load_issues() if issue["id"] == "SDPA-EFFICIENT-MISALIGNED")
    for bad in ({"sidestep_sdpa": ["MATH"]}, {"sidestep_sdpa": "EFFICIENT_ATTENTION"},
                {"error_markers": [], "sidestep_sdpa": ["EFFICIENT_ATTENTION"]}):
        with pytest.raises(ValueError, match="sidestep_sdpa"):
            validate_issue({**entry, **bad})
    for bad in ({"wrong_sdpa": ["MATH"]}, {"wrong_sdpa": "CUDNN_ATTENTION"}):
        with pytest.raises(ValueError, match="wrong_sdpa"):
            validate_issue({**entry, **bad})


def test_a_fail_that_torchs_fused_sdpa_kernel_causes_stays_a_fail_and_says_so(as_on_a_gpu):
    """On a GPU, an --impl's attention FAIL is rerun with torch's fused SDPA kernels set aside: the
    function's results are wrong as called (FAIL), and the reason says the numbers come from
    torch's kernel, not from the function's arithmetic; a function wrong on its own says that."""
    run = _run("wrong_on_fused_sdpa")
    assert [r.status for r in run.results] == [Status.FAIL] * len(CASES)
    for result in run.results:
        assert result.reason.startswith(attribute_mod.FUSED_WRONG), result.reason
        assert "FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION set aside the same inputs pass" in result.reason
        assert "relative error" in result.reason   # the first run's numbers are kept
        assert "kernels give them (alone, the others set aside, each fails the check)" in result.reason
    run = _run("wrong_itself")
    assert [r.status for r in run.results] == [Status.FAIL] * len(CASES)
    assert all(r.reason.endswith("[the same with torch's fused SDPA kernels set aside: not torch's kernel]")
               for r in run.results)


def test_the_fused_kernel_that_gives_the_wrong_numbers_is_named(as_on_a_gpu, monkeypatch):
    """Each FAIL that torch's fused kernels cause reruns once per fused kernel with only it allowed:
    the one that fails alone is named; past MAX_KERNEL_HUNTS such FAILs none is named."""
    run = _run("wrong_on_cudnn_sdpa")
    assert [r.status for r in run.results] == [Status.FAIL] * len(CASES)
    for result in run.results:
        assert result.reason.startswith(attribute_mod.FUSED_WRONG), result.reason
        assert ("torch's CUDNN_ATTENTION kernel gives them (alone, the others set aside, it fails the check; "
                "FLASH_ATTENTION and EFFICIENT_ATTENTION alone pass, raise or have no kernel for the call)") in result.reason
        # the base's silent faults of that kernel are listed, the one found this way among them
        known = result.reason.split("the known issues of wrong numbers from that kernel: ", 1)[1].split(" (", 1)[0]
        assert {"SDPA-MISALIGNED-SILENT", "SDPA-CUDNN-MASK-LSE"} <= set(known.split(", ")), result.reason
        assert "SDPA-EFF-STRIDE0" not in known   # the efficient kernel's
    monkeypatch.setattr(attribute_mod, "MAX_KERNEL_HUNTS", 1)
    reasons = [r.reason for r in _run("wrong_on_cudnn_sdpa").results]
    assert sorted("CUDNN_ATTENTION kernel gives them" in r for r in reasons) == [False, True], reasons
    assert all(r.startswith(attribute_mod.FUSED_WRONG) for r in reasons)


def test_fail_reruns_are_capped_and_only_for_attention_on_a_gpu(as_on_a_gpu, monkeypatch):
    monkeypatch.setattr(attribute_mod, "MAX_FAIL_RERUNS", 1)
    run = _run("wrong_on_fused_sdpa")
    told = [r.reason.startswith(attribute_mod.FUSED_WRONG) for r in run.results]
    assert sorted(told) == [False, True], [r.reason for r in run.results]
    for op, device in (("rms_norm", "cuda"), ("attention", "cpu")):
        result = CheckResult(op, "impl:x.py:f", "cover.0", "float32", device, Status.FAIL, reason="out: relative error")
        assert attribute_mod.set_aside_for(result, device) == ([], [])
    result = CheckResult("attention", "sdpa_cudnn", "cover.0", "bfloat16", "cuda:0", Status.FAIL, reason="x")
    assert attribute_mod.set_aside_for(result, "cuda") == ([], [])
