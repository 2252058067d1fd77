"""A check's ERROR whose message is a known issue's (its `error_markers`) names the issue, whoever's code
raised it: on the H100, a `check --impl` of a function calling torch's SDPA met torch's efficient kernel
faulting on views off 16-byte alignment ("CUDA error: misaligned address", SDPA-EFFICIENT-MISALIGNED)."""
from gpuparity.checks.battery import _label_known
from gpuparity.checks.results import CheckResult, Status
from gpuparity.known.avoid import named_by_error

MISALIGNED = "raised AcceleratorError: CUDA error: misaligned address\nSearch for `cudaErrorMisalignedAddress'"


def error(reason, backend="impl:my_attention.py:attn", status=Status.ERROR):
    return CheckResult("attention", backend, "cover3.14", "float32", "cuda:0", status, reason=reason)


def test_a_misaligned_address_error_names_the_sdpa_entries_on_a_gpu():
    ids = [issue for issue, _ in named_by_error(MISALIGNED, "cuda")]
    assert set(ids) == {"SDPA-EFFICIENT-MISALIGNED", "SDPA-CUDNN-MISALIGNED"}
    result = error(MISALIGNED)
    _label_known(result, "cuda")
    assert result.status == Status.ERROR
    assert result.reason.startswith("this error matches known issue ")
    assert "SDPA-EFFICIENT-MISALIGNED" in result.reason and result.reason.endswith(MISALIGNED)


def test_other_errors_and_cpu_errors_stay_as_they_were():
    for reason, device in (("raised ValueError: bad shape", "cuda"), (MISALIGNED, "cpu")):
        result = error(reason)
        _label_known(result, device)
        assert result.reason == reason
    passed = error(MISALIGNED, status=Status.PASS)
    _label_known(passed, "cuda")
    assert passed.reason == MISALIGNED
