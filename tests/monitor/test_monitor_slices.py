"""The monitor checks what it samples (issue 43, item 6): every due sample of a short monitored
CPU run is checked under the default max_overhead, on slices (float64 on strided rows, weight
gradients whole), and a wrong op is still caught, also one wrong only in rows outside a slice."""
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpuparity
from gpuparity.shadow import checker, ops, slices


class _Block(nn.Module):
    """rms_norm (with a weight: its gradient sums every row), SDPA and softmax: 256 rows of 64."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.width, self.heads = width, heads
        self.weight = nn.Parameter(torch.ones(width))
        self.proj = nn.Linear(width, 3 * width)

    def forward(self, x):
        b, s, w = x.shape
        h = F.rms_norm(x, (w,), self.weight)
        q, k, v = self.proj(h).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, w)
        p = F.softmax(h @ h.transpose(1, 2) / 8, dim=-1)
        return (x + a + p @ h).square().mean()


def _monitored_run(steps, every, step_s, **options):
    """A run whose step waits step_s seconds beside its CPU work, as a GPU-bound step's host does
    (the checks run then): the default max_overhead must admit every due sample."""
    torch.manual_seed(0)
    model, x = _Block(), torch.randn(4, 64, 64)
    with gpuparity.monitor(model, every=every, slice_rows_above=1024, slice_attention_above=4096, **options) as mon:
        for step in range(steps):
            mon.step(step)
            model(x).backward()
            time.sleep(step_s)
    return mon.report()


def test_every_due_sample_is_checked_and_a_wrong_row_outside_the_first_slices_is_caught(monkeypatch):
    """Softmax wrong in one row (batch item 3, position 50: row 242 of 256) that the first
    samples' rows (0, 16, ... and 1, 17, ...) miss: the third sample's rows (2, 18, ..., 242)
    hold it. Every due sample is checked, none over budget or dropped."""
    real = F.softmax

    def wrong(x, dim=None, _stacklevel=3, dtype=None):
        out = real(x, dim=dim)
        if x.dim() == 3 and x.shape[0] == 4:
            out = out.clone()
            out[3, 50] *= 1.1
        return out
    monkeypatch.setattr(F, "softmax", wrong)
    report = _monitored_run(steps=6, every=2, step_s=0.4)
    assert report.due == {"F.rms_norm": 3, "F.scaled_dot_product_attention": 3, "F.softmax": 3}, report.summary()
    assert report.checked == report.due and report.over_budget == 0 and report.dropped == 0, report.summary()
    assert [(f["op"], f["step"]) for f in report.failures] == [("F.softmax", 4)], report.summary()
    assert "checked on 16 of 256 rows: 2, 18, ..." in report.failures[0]["reason"]
    assert report.summary().startswith("gpuparity monitor: 9 of 9 due samples checked, 1 failed")


def test_strided_rows_cover_every_row_once_per_stride():
    for rows, stride in ((256, 16), (10, 3), (7, 7), (5, 1)):
        seen = sorted(r for pick in range(stride) for r in range(rows)[slices.strided_rows(rows, stride, pick)])
        assert seen == list(range(rows))
        assert slices.strided_rows(rows, stride, stride + 1) == slices.strided_rows(rows, stride, 1)


def _norm_call(x, weight, out, grad_out, grads, pick, budget=64):
    args = ops.RMS_NORM.bind((x, (x.shape[-1],), weight), {})
    return checker.SampledCall(ops.RMS_NORM, "torch", pick, 0, args, out, ops.describe_args(args, ops.RMS_NORM),
                               grad_out=grad_out, grads=grads, slice_rows_above=budget, pick=pick)


def _rms_with_grads(x, weight):
    x, weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    out = F.rms_norm(x, (x.shape[-1],), weight)
    grad_out = torch.randn_like(out)
    gx, gw = torch.autograd.grad(out, (x, weight), grad_out)
    return out.detach(), grad_out, {"grad_input": gx, "grad_weight": gw}


def test_float64_runs_on_the_slice_and_the_weight_gradient_whole(monkeypatch):
    """A row slice's reference has only the input as a leaf; the weight's gradient (a sum over
    every row) is judged by a second, whole reference with only the weight as a leaf. A weight
    gradient 1% off is caught; an output wrong in a row outside the slice is not, until the
    sample whose rows hold it; NaN anywhere is caught by the whole scan."""
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(32, 16, generator=gen), torch.randn(16, generator=gen)
    out, grad_out, grads = _rms_with_grads(x, weight)
    runs = []
    real_run = checker._run
    monkeypatch.setattr(checker, "_run", lambda kind, args, dtype, names, g: runs.append(
        (tuple(args["input"].shape), sorted(names))) or real_run(kind, args, dtype, names, g))
    assert all(c.passed for c in checker.check_call(_norm_call(x, weight, out, grad_out, grads, 0)))
    assert runs == [((4, 16), ["input"]), ((32, 16), ["weight"])]    # budget 64 = 4 rows of 16: every 8th row
    wrong_w = {**grads, "grad_weight": grads["grad_weight"] * 1.01}
    failed = [c.name for c in checker.check_call(_norm_call(x, weight, out, grad_out, wrong_w, 0)) if not c.passed]
    assert failed == ["grad_weight"]
    wrong_row = out.clone()
    wrong_row[13] *= 1.05                                           # row 13: picks 5, 13, ... (13 % 8)
    verdicts = {pick: [c.name for c in checker.check_call(_norm_call(x, weight, wrong_row, grad_out, grads, pick))
                       if not c.passed] for pick in range(8)}
    assert verdicts == {pick: (["out"] if pick == 5 else []) for pick in range(8)}
    nan_grad = {**grads, "grad_input": grads["grad_input"].clone()}
    nan_grad["grad_input"][14, 3] = float("nan")                   # outside pick 0's rows
    comparisons = checker.check_call(_norm_call(x, weight, out, grad_out, nan_grad, 0))
    assert [c.name for c in comparisons if not c.passed] == ["grad_input"]
    assert "every element scanned" in comparisons[0].reason


@pytest.mark.parametrize("layout", ["rotary", "softmax"])
def test_rotary_heads_and_softmax_rows_slices_are_exact(layout):
    """Rotary is sliced by heads (each position has its own angle), softmax by the rows of its
    other dims (dim becomes -1): a correct call passes on every slice."""
    gen = torch.Generator().manual_seed(0)
    if layout == "rotary":
        kind = ops.GPUPARITY["rotary"]
        x = torch.randn(2, 8, 6, 16, generator=gen)
        angles = torch.randn(8, 8, generator=gen)
        args = kind.bind((x, angles.cos(), angles.sin()), {})
        fn = kind.reference
    else:
        kind = ops.SOFTMAX
        x = torch.randn(3, 10, 5, generator=gen)
        args = kind.bind((x,), {"dim": 1})
        fn = kind.reference
    leaf = x.clone().requires_grad_()
    out = fn({**args, kind.tensors[0]: leaf})
    grad_out = torch.randn(out.shape, generator=gen)
    (gx,) = torch.autograd.grad(out, leaf, grad_out)
    layout_rows = slices.rows_of(kind, args)
    assert layout_rows.rows == (6 if layout == "rotary" else 15)
    for pick in range(3):
        call = checker.SampledCall(kind, "torch", pick, 0, args, out.detach(), {}, grad_out=grad_out,
                                   grads={"grad_" + kind.tensors[0]: gx}, slice_rows_above=x.numel() // 3, pick=pick)
        comparisons = checker.check_call(call)
        assert [c.name for c in comparisons] == ["out", "grad_" + kind.tensors[0]]
        assert all(c.passed for c in comparisons), [c.reason for c in comparisons]


def test_slice_options_are_validated():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="slice_rows_above"):
            gpuparity.monitor(None, every=1, slice_rows_above=bad)


def test_the_nan_scan_is_one_sum_and_an_overflowing_sum_is_no_failure():
    big = torch.full((4, 8), 3e38)                   # finite, but its float32 sum overflows
    nan = torch.zeros(4, 8)
    nan[2, 5] = float("nan")
    masked = nan.clone()
    assert slices.nonfinite_any([big, nan, masked], [None, None, torch.zeros(4, 1, dtype=torch.bool)]).tolist() == \
        [True, True, False]
    failed = slices.scan_nonfinite([("out", big), ("grad_x", nan)], {})
    assert [(c.name, c.worst_index) for c in failed] == [("grad_x", [2, 5])]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_rows_and_the_loss_in_chunks(reduction, monkeypatch):
    """(N, C) cross-entropy with class weights, ignored targets and label smoothing: grad_input
    judged on strided rows (the loss of those rows, its upstream gradient over the call's
    denominator for "mean"), the reduced loss against float64 over every row in chunks; a
    correct call passes on every slice, one wrong grad_input row is caught by the slice that
    holds it, a loss 1% off by the chunked reference."""
    monkeypatch.setattr(slices, "LOSS_CHUNK", 64 * 10)              # 64 rows of 10 classes per chunk
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 10, generator=gen)
    target = torch.randint(0, 10, (256,), generator=gen)
    target[::7] = -100
    weight = torch.rand(10, generator=gen) + 0.5
    args = ops.CROSS_ENTROPY.bind((x, target), {"weight": weight, "reduction": reduction, "label_smoothing": 0.1})
    leaf = x.clone().requires_grad_()
    out = F.cross_entropy(leaf, target, weight=weight, reduction=reduction, label_smoothing=0.1)
    grad_out = torch.randn(out.shape, generator=gen)
    (gx,) = torch.autograd.grad(out, leaf, grad_out)

    def check(pick, got_out=out.detach(), got_grad=gx):
        call = checker.SampledCall(ops.CROSS_ENTROPY, "torch", pick, 0, args, got_out, {}, grad_out=grad_out,
                                   grads={"grad_input": got_grad}, slice_rows_above=16 * 10, pick=pick)
        return {c.name: c.passed for c in checker.check_call(call)}
    assert all(all(check(pick).values()) for pick in range(3))
    wrong = gx.clone()
    wrong[36] *= 1.2                                            # row 36: the slice of pick 4 (36 % 16)
    assert [check(pick, got_grad=wrong)["grad_input"] for pick in (3, 4)] == [True, False]
    if reduction != "none":
        assert check(0, got_out=out.detach() * 1.01) == {"out": False, "grad_input": True}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_one_read_summary_passes_exactly_what_tolerance_judge_passes(dtype):
    """A check reads every comparison's norms in one host copy (checker._summary) and decides a
    clear pass itself; anything else (near the bound, NaN/Inf, a masked row that is not 0, a
    wrong shape) goes to tolerance.judge. Where the summary says pass, judge passes with the same
    error; where judge fails, the summary never says pass."""
    from gpuparity import tolerance
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(6, 5, 8, generator=gen, dtype=torch.float64)
    valid = torch.rand(6, 5, 1, generator=gen) > 0.3
    zero = torch.zeros(6, 5, 1, dtype=torch.bool)
    zero[2] = True
    floor = tolerance.floor_for(dtype)

    def noisy(rel):
        noise = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        return ref + noise * (rel * ref.norm() / noise.norm())
    nan = noisy(0.0)
    nan[0, 0, 0] = float("nan")
    not_zero = noisy(0.0).masked_fill(zero, 0.0)
    not_zero[2, 1, 3] = 1e-3
    cases = [(noisy(0.1 * floor), None, None), (noisy(0.5 * floor), valid, None), (noisy(0.3 * floor).masked_fill(zero, 0.0), None, zero),
             (noisy(floor * (1 - 1e-9)), None, None), (noisy(1.5 * floor), valid, zero), (nan, None, None),
             (nan, valid & (torch.arange(6).view(6, 1, 1) > 0), None), (not_zero, None, zero),
             (torch.zeros_like(ref), None, None), (noisy(0.2 * floor)[:, :4], None, None)]
    quick_passes = 0
    for got, mask, must_be_zero in cases:
        reference = torch.zeros_like(ref) if got.abs().sum() == 0 else ref
        expected = tolerance.judge("out", got, reference, None, dtype, mask, must_be_zero)
        values = checker._summary(got, reference, mask, must_be_zero)
        quick = None if values is None else checker._passed(
            "out", [float(v) for v in values], tuple(reference.shape), dtype, None)
        if quick is None:
            continue
        quick_passes += 1
        assert expected.passed and quick.passed
        assert quick.err == pytest.approx(expected.err, rel=1e-12, abs=1e-300)
        assert quick.max_abs == pytest.approx(expected.max_abs, rel=1e-12) and quick.allowed == expected.allowed
    assert quick_passes == 5        # the clear passes (zeros against zeros, a NaN in a row not judged)
