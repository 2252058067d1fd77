"""The tolerance policy of docs/design.md, on hand-made numbers."""
from __future__ import annotations

import pytest
import torch

from gpuparity import tolerance


def test_pass_when_within_twice_the_baseline_or_the_floor():
    ref = torch.ones(100, dtype=torch.float64)
    baseline = ref * (1 + 0.02)           # baseline error 0.02
    good = ref * (1 + 0.039)              # < 2 * 0.02
    bad = ref * (1 + 0.041)
    assert tolerance.judge("out", good.float(), ref, baseline.float(), torch.float32).passed
    result = tolerance.judge("out", bad.float(), ref, baseline.float(), torch.float32)
    assert not result.passed and abs(result.allowed - 0.04) < 1e-6
    exact_baseline = tolerance.judge("out", (ref * (1 + 5e-6)).float(), ref, ref.float(), torch.float32)
    assert exact_baseline.passed and exact_baseline.allowed == tolerance.FLOOR[torch.float32]


def test_nan_where_reference_is_finite_fails():
    ref = torch.zeros(4, 4, dtype=torch.float64)
    out = torch.zeros(4, 4)
    out[2, 3] = float("nan")
    result = tolerance.judge("out", out, ref, None, torch.float32)
    assert not result.passed and "NaN" in result.reason and result.worst_index == [2, 3]


def test_rows_that_must_be_zero_must_be_exactly_zero():
    ref = torch.randn(2, 3, 5, dtype=torch.float64)
    empty = torch.zeros(2, 3, 1, dtype=torch.bool)
    empty[1, 2] = True
    ref[1, 2] = 0
    out = ref.clone().float()
    assert tolerance.judge("out", out, ref, None, torch.float32, must_be_zero=empty).passed
    out[1, 2, 4] = 1e-30
    result = tolerance.judge("out", out, ref, None, torch.float32, must_be_zero=empty)
    assert not result.passed and "exactly 0" in result.reason


def test_wrong_shape_and_tf32_floor():
    gen = torch.Generator().manual_seed(0)  # seeded: the noise must sit between the two floors
    ref = torch.randn(3, 3, dtype=torch.float64, generator=gen)
    assert "wrong shape" in tolerance.judge("out", torch.zeros(3), ref, None, torch.float32).reason
    noisy = (ref * (1 + 5e-4 * torch.randn(3, 3, dtype=torch.float64, generator=gen))).float()
    assert not tolerance.judge("out", noisy, ref, None, torch.float32).passed
    assert tolerance.judge("out", noisy, ref, None, torch.float32, precision="tf32").passed


def test_a_vanishing_reference_is_judged_per_element_not_by_the_norm_of_its_noise():
    """grad_q of an attention over one key is exactly 0 in float64: a correct kernel's rounding
    noise (1e-6 per element, over 100k elements: an L2 norm of 3e-4) passes; a wrong value fails."""
    ref = torch.zeros(100_000, dtype=torch.float64)
    noise = torch.full((100_000,), 1e-6, dtype=torch.float32)
    assert tolerance.judge("grad_q", noise, ref, torch.zeros(100_000), torch.float32).passed
    assert not tolerance.judge("grad_q", torch.full((100_000,), 1e-3), ref, torch.zeros(100_000), torch.float32).passed


def test_the_floor_rises_with_the_reduction_length_as_output_dtype_accumulation_does():
    """A bf16 gradient summed over 16448 query rows in blocks of 256 (torch's CPU flash attention
    adds each block into the bf16 gradient) errs ~1% while being correct: the floor follows
    ROUNDING * sqrt(blocks / 2) times the baseline factor, not the flat 1e-2; short reductions
    keep the flat floor, and a 5% error still fails."""
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(4096, dtype=torch.float64, generator=gen)
    off = (ref * (1 + 0.0102 * torch.randn(4096, dtype=torch.float64, generator=gen))).to(torch.float32)
    assert not tolerance.judge("grad_v", off, ref, None, torch.bfloat16).passed
    assert tolerance.judge("grad_v", off, ref, None, torch.bfloat16, reduction=16448).passed
    assert tolerance.error_floor(torch.bfloat16, reduction=300) == tolerance.FLOOR[torch.bfloat16]
    bf16 = tolerance.error_floor(torch.bfloat16, reduction=16448)
    assert abs(bf16 - 2 * 2.0 ** -8 / 3 ** 0.5 * (16448 / 512) ** 0.5) < 1e-12 and bf16 < 0.03
    far = (ref * (1 + 0.05 * torch.randn(4096, dtype=torch.float64, generator=gen))).to(torch.float32)
    assert not tolerance.judge("grad_v", far, ref, None, torch.bfloat16, reduction=16448).passed
    # fp32 accumulation is what every fp32 kernel does: its floor does not move at these lengths
    assert tolerance.error_floor(torch.float32, reduction=131136) == tolerance.FLOOR[torch.float32]


def test_the_floor_rises_with_the_logits_an_exponential_is_taken_of():
    """exp of an fp32 logit of size |s| carries ~u|s| of relative error: at logits of ~120 (a
    massive-activation row) a correct flash kernel's 1.6e-5 passes; at ordinary logits (< 20)
    the fp32 floor is unchanged, and a bf16 floor is never lowered."""
    gen = torch.Generator().manual_seed(1)
    ref = torch.randn(4096, dtype=torch.float64, generator=gen)
    off = (ref * (1 + 1.6e-5 * torch.randn(4096, dtype=torch.float64, generator=gen))).to(torch.float32)
    assert not tolerance.judge("grad_q", off, ref, None, torch.float32).passed
    assert tolerance.judge("grad_q", off, ref, None, torch.float32, logit_peak=123.0).passed
    assert tolerance.error_floor(torch.float32, logit_peak=20.0) == tolerance.FLOOR[torch.float32]
    assert tolerance.error_floor(torch.bfloat16, logit_peak=123.0) == tolerance.FLOOR[torch.bfloat16]
    wrong = (ref * (1 + 1e-3 * torch.randn(4096, dtype=torch.float64, generator=gen))).to(torch.float32)
    assert not tolerance.judge("grad_q", wrong, ref, None, torch.float32, logit_peak=123.0).passed


def test_the_floor_rises_with_the_condition_of_a_rows_mean():
    """layer_norm's x - mean cancels: a correct fp32 mean of 256 terms errs ~ROUNDING * sqrt(256 / 3)
    relative (a running sum; a tree's sqrt(8 + 1) at 8 terms and under), amplified by |mean| / std
    (1000 at huge_mean_1000): a correct kernel's 1e-4 passes,
    a well-conditioned row keeps the flat floor, bf16 takes fp32 statistics (no blind 16-bit
    floor), and a 1e-3 error still fails."""
    gen = torch.Generator().manual_seed(2)
    ref = torch.randn(4096, dtype=torch.float64, generator=gen)
    off = (ref * (1 + 1e-4 * torch.randn(4096, dtype=torch.float64, generator=gen))).to(torch.float32)
    assert not tolerance.judge("out", off, ref, None, torch.float32).passed
    assert tolerance.judge("out", off, ref, None, torch.float32, mean_condition=1000.0, mean_terms=256).passed
    raised = tolerance.error_floor(torch.float32, mean_condition=1000.0, mean_terms=256)
    assert abs(raised - 2 * 2.0 ** -24 / 3 ** 0.5 * (256 / 3) ** 0.5 * 1000) < 1e-12
    assert abs(tolerance.mean_rounding(torch.float32, 8) - 2.0 ** -24 / 3 ** 0.5 * (3 + 8 / 256) ** 0.5) < 1e-15
    assert tolerance.error_floor(torch.float32, mean_condition=3.0, mean_terms=256) == tolerance.FLOOR[torch.float32]
    assert tolerance.error_floor(torch.bfloat16, mean_condition=1000.0, mean_terms=256) == tolerance.FLOOR[torch.bfloat16]
    wrong = (ref * (1 + 1e-3 * torch.randn(4096, dtype=torch.float64, generator=gen))).to(torch.float32)
    assert not tolerance.judge("out", wrong, ref, None, torch.float32, mean_condition=1000.0, mean_terms=256).passed
    with pytest.raises(ValueError, match="terms"):
        tolerance.mean_rounding(torch.float32, 0)


def test_layer_norm_floor_terms_are_the_condition_numbers_of_its_outputs():
    """Rows of mean 1000 and std 1: out, grad_x and grad_weight are conditioned ~1000 (out a bit
    less: the bias adds to its norm); rows of mean 0 ~0; constant rows: |mean| / sqrt(eps)."""
    from gpuparity.contracts.norms import layer_norm_floor_terms
    gen = torch.Generator().manual_seed(3)
    x = 1000 + torch.randn(4, 256, dtype=torch.float64, generator=gen)
    w = torch.ones(256, dtype=torch.float64)
    terms = layer_norm_floor_terms(x, 256, w, None, 1e-5)
    assert set(terms) == {"out", "grad_x", "grad_weight"} and terms["out"]["mean_terms"] == 256
    for name in terms:
        assert 900 < terms[name]["mean_condition"] < 1100, name
    assert layer_norm_floor_terms(x - x.mean(-1, keepdim=True), 256, w)["out"]["mean_condition"] < 1e-9
    constant = torch.full((2, 64), 2.0, dtype=torch.float64)   # out is exactly 0: judged per element
    assert abs(layer_norm_floor_terms(constant, 64, None, None, 1e-4)["out"]["mean_condition"] - 200) < 1e-6
    assert layer_norm_floor_terms(constant, 64, None, None, 0.0) == {}   # the reference is not finite


def test_a_scalar_output_that_fails_says_its_numbers():
    # a loss reduced to a scalar: its failure names the error and the values (it was empty)
    result = tolerance.judge("out", torch.tensor(2.5), torch.tensor(2.0, dtype=torch.float64), None, torch.float32)
    assert not result.passed and "relative error 0.25" in result.reason and "got 2.5, expected 2" in result.reason
