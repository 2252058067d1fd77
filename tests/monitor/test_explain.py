"""gpuparity.explain / `gpuparity explain`: the SDPA backend reported is the one whose kernel ran,
calls are grouped, and a call inside a known issue's regime is marked."""
import json
import os

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import gpuparity
from gpuparity import cli
from gpuparity.shadow import ops

from gpuparity.trace import spec

FACTORY = os.path.join(os.path.dirname(__file__), "explain_factory.py") + ":tiny"


def tiny():
    built = spec.build(FACTORY)
    return built.model, built.inputs


def _sdpa_row(report):
    return next(r for r in report.rows if r["op"] == "F.scaled_dot_product_attention")


def test_reported_backend_is_the_kernel_that_ran():
    model, (x,) = tiny()
    row = _sdpa_row(gpuparity.explain(model, x, known=False))
    assert row["backend"] == "sdpa flash (cpu)" and row["options"]["enable_gqa"] is True
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in row["kernels"]["forward"]
    with sdpa_kernel([SDPBackend.MATH]):
        row = _sdpa_row(gpuparity.explain(model, x, known=False))
    assert row["backend"] == "sdpa math"
    assert "aten::_scaled_dot_product_attention_math" in row["kernels"]["forward"]
    assert not hasattr(F.scaled_dot_product_attention, "__gpuparity_watched__")


def test_known_issue_regime_marked():
    from gpuparity.explain_run import _regime_matches
    from gpuparity.known.engine import load_issues
    if not any(i["id"] == "SDPA-CUDNN-MASK-LSE" for i in load_issues()):
        pytest.skip("the base has no SDPA-CUDNN-MASK-LSE entry")
    q, k, v = (torch.randn(1, 2, 192, 64, requires_grad=True) for _ in range(3))
    bound = ops.SDPA.bind((q, k, v), {"attn_mask": torch.ones(192, 192, dtype=torch.bool)})
    first = {"kind": ops.SDPA, "bound": bound, "backend": "sdpa cudnn"}
    ids = [m["id"] for m in _regime_matches(first, torch.device("cuda"))]
    assert "SDPA-CUDNN-MASK-LSE" in ids
    bound = ops.SDPA.bind((q[:, :, :128], k[:, :, :128], v[:, :, :128]),
                          {"attn_mask": torch.ones(128, 128, dtype=torch.bool)})
    ids = [m["id"] for m in _regime_matches({**first, "bound": bound}, torch.device("cuda"))]
    assert "SDPA-CUDNN-MASK-LSE" not in ids                      # key length 128: outside the regime


def test_cli_json(capsys):
    code = cli.main(["explain", FACTORY, "--device", "cpu", "--no-known", "--json", "-"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    ops_seen = {r["op"]: r["calls"] for r in data["rows"]}
    assert ops_seen == {"F.layer_norm": 1, "F.scaled_dot_product_attention": 1}
    assert data["schema_version"] == 1 and "platform" in data
