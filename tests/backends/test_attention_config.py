"""Choices the attention launcher makes without running a kernel: the fp32 dot on NVIDIA and
which runtime ints Triton specializes on."""
from __future__ import annotations

import pytest
import torch

from gpuparity.backends import triton_attention as ta

triton = pytest.importorskip("triton")


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.setattr(ta, "_STRICT_DOT", [])
    yield
    ta._STRICT_DOT.clear()


def test_strict_fp32_dot_defaults_to_split_tf32_where_triton_has_it(monkeypatch, fresh_choice):
    monkeypatch.delenv("GPUPARITY_FP32_DOT", raising=False)
    from triton.backends.nvidia.compiler import CUDAOptions
    expected = "tf32x3" if "tf32x3" in CUDAOptions.allowed_dot_input_precisions else "ieee"
    assert ta.strict_fp32_dot() == expected


def test_strict_fp32_dot_can_be_asked_for_fma(monkeypatch, fresh_choice):
    monkeypatch.setenv("GPUPARITY_FP32_DOT", "ieee")
    assert ta.strict_fp32_dot() == "ieee"


def test_strict_fp32_dot_rejects_unknown_values(monkeypatch, fresh_choice):
    monkeypatch.setenv("GPUPARITY_FP32_DOT", "fp64")
    with pytest.raises(ValueError, match="GPUPARITY_FP32_DOT.*ieee or tf32x3.*'fp64'"):
        ta.strict_fp32_dot()


def test_sixteen_bit_inputs_ignore_the_fp32_choice():
    assert ta.dot_precision(torch.bfloat16) in ("ieee", "upcast")


def test_lengths_and_seed_are_not_specialized_but_strides_are():
    for kernel in ta.kernels().values():
        params = {p.name: p for p in getattr(kernel, "params", [])}
        if not params:  # the interpreter's wrapper keeps no parameter table
            continue
        for name in ("q_len", "k_len", "seed", "num_heads"):
            assert params[name].do_not_specialize, name
        assert not params["stride_qm"].do_not_specialize
