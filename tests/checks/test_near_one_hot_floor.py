"""The relation padding_appended on near one-hot rows (Sq = 1, logits x30, Sk = 127): its bound
takes twice the composition's own error on the case, which the composition on float64 inputs
(still an fp32 softmax) put at ~1e-7 where it errs 2.6e-3 in grad_q, so torch 2.13's CPU SDPA
failed by 6.8e-3 against 4.3e-5."""
from __future__ import annotations

import pytest
import torch

from gpuparity.backends.sdpa import BASELINE
from gpuparity.checks import execute, relations
from gpuparity.checks.execute import _round_inputs, make_inputs
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.contracts.attention import _case, composition

CPU = torch.device("cpu")


def _params(B, H, D, mask):
    return _case("near_one_hot", B=B, H=H, Sq=1, Sk=127, D=D, logit_scale=30.0, mask=mask).params


def test_the_relation_measures_the_compositions_own_error_against_the_referee():
    # the composition's error on the case as the battery's float64 check measures it (2.6e-3 in
    # grad_q); before, the composition on float64 inputs (still an fp32 softmax): ~1e-7
    spec, p, seed = get_spec("attention"), _params(2, 1, 64, "bool"), 1
    _, comparisons, _ = execute.run_case("attention", composition, p, torch.float32, CPU, seed, composition)
    battery = {c.name: c.baseline_err for c in comparisons}
    rounded = _round_inputs(make_inputs(spec, p, torch.float32, torch.Generator().manual_seed(seed)), spec,
                            torch.float32)
    first, _, _ = relations._sides(spec, composition, None, spec.cast_inputs(rounded, torch.float32, CPU), p,
                                   seed + 1, seed + 2, torch.float32)
    own = relations._own_error(spec, first, rounded, p, torch.float32, CPU, seed)
    assert battery["grad_q"] > 1e-3 and battery["grad_k"] > 1e-3
    for name in ("out", "grad_q", "grad_k", "grad_v"):
        assert own[name] == pytest.approx(battery[name], rel=1e-6, abs=1e-12), name


def test_torch_sdpa_passes_padding_appended_on_near_one_hot_rows():
    found = relations.check("attention", BASELINE.fn, relations.relation("padding_appended"), _params(2, 1, 64, "bool"),
                            torch.float32, seed=1)
    assert found.status == Status.PASS, found.reason
