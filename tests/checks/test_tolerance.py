"""The tolerance policy of docs/design.md, on hand-made numbers."""
from __future__ import annotations

import torch

from gpuparity import tolerance


def test_pass_when_within_twice_the_baseline_or_the_floor():
    ref = torch.ones(100, dtype=torch.float64)
    baseline = ref * (1 + 0.02)           # baseline error 0.02
    good = ref * (1 + 0.039)              # < 2 * 0.02
    bad = ref * (1 + 0.041)
    assert tolerance.compare("out", good.float(), ref, baseline.float(), torch.float32).passed
    result = tolerance.compare("out", bad.float(), ref, baseline.float(), torch.float32)
    assert not result.passed and abs(result.allowed - 0.04) < 1e-6
    exact_baseline = tolerance.compare("out", (ref * (1 + 5e-6)).float(), ref, ref.float(), torch.float32)
    assert exact_baseline.passed and exact_baseline.allowed == tolerance.FLOOR[torch.float32]


def test_nan_where_reference_is_finite_fails():
    ref = torch.zeros(4, 4, dtype=torch.float64)
    out = torch.zeros(4, 4)
    out[2, 3] = float("nan")
    result = tolerance.compare("out", out, ref, None, torch.float32)
    assert not result.passed and "NaN" in result.reason and result.worst_index == [2, 3]


def test_rows_that_must_be_zero_must_be_exactly_zero():
    ref = torch.randn(2, 3, 5, dtype=torch.float64)
    empty = torch.zeros(2, 3, 1, dtype=torch.bool)
    empty[1, 2] = True
    ref[1, 2] = 0
    out = ref.clone().float()
    assert tolerance.compare("out", out, ref, None, torch.float32, must_be_zero=empty).passed
    out[1, 2, 4] = 1e-30
    result = tolerance.compare("out", out, ref, None, torch.float32, must_be_zero=empty)
    assert not result.passed and "exactly 0" in result.reason


def test_wrong_shape_and_tf32_floor():
    gen = torch.Generator().manual_seed(0)  # seeded: the noise must sit between the two floors
    ref = torch.randn(3, 3, dtype=torch.float64, generator=gen)
    assert "wrong shape" in tolerance.compare("out", torch.zeros(3), ref, None, torch.float32).reason
    noisy = (ref * (1 + 5e-4 * torch.randn(3, 3, dtype=torch.float64, generator=gen))).float()
    assert not tolerance.compare("out", noisy, ref, None, torch.float32).passed
    assert tolerance.compare("out", noisy, ref, None, torch.float32, precision="tf32").passed


def test_a_vanishing_reference_is_judged_per_element_not_by_the_norm_of_its_noise():
    """grad_q of an attention over one key is exactly 0 in float64: a correct kernel's rounding
    noise (1e-6 per element, over 100k elements: an L2 norm of 3e-4) passes; a wrong value fails."""
    ref = torch.zeros(100_000, dtype=torch.float64)
    noise = torch.full((100_000,), 1e-6, dtype=torch.float32)
    assert tolerance.compare("grad_q", noise, ref, torch.zeros(100_000), torch.float32).passed
    assert not tolerance.compare("grad_q", torch.full((100_000,), 1e-3), ref, torch.zeros(100_000), torch.float32).passed
