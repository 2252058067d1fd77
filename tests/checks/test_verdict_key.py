"""The verdict store's key: one type builds and parses "op|backend|dtype|kind"."""
import pytest
import torch

from gpuparity.registry import Problem
from gpuparity.checks.verdicts import VerdictKey, verdict_key


def test_a_key_survives_its_string_form():
    key = VerdictKey("attention", "sdpa_math", "float32+tf32", "causal")
    assert key.encode() == "attention|sdpa_math|float32+tf32|causal"
    assert VerdictKey.decode(key.encode()) == key
    op, backend, dtype, kind = VerdictKey.decode(key.encode())
    assert (op, backend, dtype, kind) == ("attention", "sdpa_math", "float32+tf32", "causal")


@pytest.mark.parametrize("bad", ["attention|sdpa_math|float32", "a|b|c|d|e", "a||c|d", "", None])
def test_a_malformed_key_is_refused_naming_what_it_got(bad):
    with pytest.raises(ValueError, match=r"verdict key: got .*need 'op\|backend\|dtype\|kind'"):
        VerdictKey.decode(bad)


def test_the_store_key_of_a_call_is_the_types_encoding():
    problem = Problem("rms_norm", torch.device("cpu"), torch.bfloat16, "default", (("hidden", 8),))
    key = VerdictKey.of(problem, "torch")
    assert key == VerdictKey("rms_norm", "torch", "bfloat16", "default")

    class _Backend:
        name = "torch"
    assert verdict_key(problem, _Backend()) == key.encode()
