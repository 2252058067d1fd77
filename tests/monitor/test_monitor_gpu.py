"""gpuparity.monitor on a GPU (GPUPARITY_TEST_DEVICE=cuda): the float64 checks run on the call's
GPU on a side stream, find a planted NaN grad_query, pass correct SDPA and gpuparity.attention
calls with masks, and leave the run's loss and gradients bitwise unchanged."""
import pytest
import torch
import torch.nn.functional as F

import gpuparity
from device_env import ON_GPU

pytestmark = pytest.mark.skipif(not ON_GPU, reason="a GPU run (GPUPARITY_TEST_DEVICE=cuda)")


def _step(q, k, v, mask, padding):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = out + gpuparity.attention(q, k, v, key_padding_mask=padding, is_causal=True)
    return out.float().square().mean()


def _inputs():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=gen).cuda().to(torch.bfloat16).requires_grad_(True)
               for _ in range(3))
    mask = torch.ones(64, 64, dtype=torch.bool, device="cuda").tril()
    padding = torch.zeros(2, 64, dtype=torch.bool, device="cuda")
    padding[1, 50:] = True
    return q, k, v, mask, padding


def test_checks_run_on_the_gpu_and_change_nothing():
    q, k, v, mask, padding = _inputs()
    _step(q, k, v, mask, padding).backward()
    plain = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    with gpuparity.monitor(every=1, check_device="device", max_pending=8, max_overhead=None) as mon:
        _step(q, k, v, mask, padding).backward()
    report = mon.report()
    assert report.passed and not report.errors, (report.failures, report.errors)
    assert report.checked_on == {"cuda:0": sum(report.checked.values())} and len(report.checked) == 2
    assert all(torch.equal(t.grad, g) for t, g in zip((q, k, v), plain))


def test_planted_nan_grad_query_caught_on_the_gpu(monkeypatch, tmp_path):
    real = F.scaled_dot_product_attention

    def wrong(q, k, v, attn_mask=None, **kw):     # query row 3's gradient becomes NaN
        q = q.view_as(q)
        q.register_hook(lambda g: g.index_fill(2, torch.tensor([3], device=g.device), float("nan")))
        return real(q, k, v, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", wrong)
    q, k, v, mask, padding = _inputs()
    with gpuparity.monitor(every=1, check_device="device", repro_dir=str(tmp_path), max_overhead=None) as mon:
        _step(q, k, v, mask, padding).backward()
    failures = mon.report().failures     # (gpuparity.attention too where its backend calls SDPA)
    assert any(f["op"] == "F.scaled_dot_product_attention" and "grad_query" in f["reason"] for f in failures)
    assert failures[0]["device"] == "cuda:0" and "repro" in failures[0]


def test_sliced_checks_on_the_gpu_judge_rows_and_the_whole_weight_gradient(monkeypatch):
    """A bf16 rms_norm of 1024 rows: float64 on strided rows on the side stream, the weight's
    gradient whole; a row wrong by 5% (row 1000) is caught by the sample whose rows hold it."""
    real = F.rms_norm

    def wrong(x, shape, weight=None, eps=None):
        out = real(x, shape, weight, eps)
        return torch.cat((out[:1000], out[1000:1001] * 1.05, out[1001:])) if out.shape[0] == 1024 else out
    monkeypatch.setattr(F, "rms_norm", wrong)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 512, generator=gen).cuda().to(torch.bfloat16).requires_grad_(True)
    w = torch.ones(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with gpuparity.monitor(every=1, check_device="device", max_pending=64, max_overhead=None,
                           slice_rows_above=64 * 512) as mon:        # 64 of 1024 rows: one in 16
        for _ in range(16):
            F.rms_norm(x, (512,), w).float().square().mean().backward()
    report = mon.report()
    assert report.checked == report.due == {"F.rms_norm": 16} and report.checked_on == {"cuda:0": 16}
    assert [f["call"] for f in report.failures] == [1000 % 16], report.summary()
    assert "rows" in report.failures[0]["reason"] and report.check_gpu_wait_s > 0
