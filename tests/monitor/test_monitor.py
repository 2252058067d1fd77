"""gpuparity.monitor on CPU: a planted wrong op is caught at the sampled step, the run's loss and
gradients are bitwise those without the monitor, and F.* is restored on exit."""
import runpy
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpuparity
from gpuparity.shadow import capture


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 48)
        self.norm = nn.LayerNorm(16)

    def forward(self, x, mask):
        h = self.norm(x)
        q, k, v = self.proj(h).view(2, 12, 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return (out.transpose(1, 2).reshape(2, 12, 16) + x).pow(2).mean()


def _run(monitored, every=1, planted=None):
    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(2, 12, 16)
    mask = torch.ones(12, 12, dtype=torch.bool).tril()
    losses = []
    mon = gpuparity.monitor(model, every=every, max_pending=64, max_overhead=None) if monitored else None
    if mon:
        mon.__enter__()
    try:
        for step in range(3):
            if planted:
                planted["step"] = step
            loss = model(x, mask)
            loss.backward()
            losses.append(loss.detach())
    finally:
        if mon:
            mon.__exit__(None, None, None)
    return losses, [p.grad for p in model.parameters()], mon


def test_no_difference_to_the_run():
    plain_losses, plain_grads, _ = _run(False)
    losses, grads, mon = _run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, grads))
    report = mon.report()
    assert report.passed and report.checked.get("F.scaled_dot_product_attention") == 3
    assert F.scaled_dot_product_attention is capture._ORIGINALS.get("x", F.scaled_dot_product_attention)
    assert not hasattr(F.layer_norm, "__gpuparity_watched__")
    assert not hasattr(F.scaled_dot_product_attention, "__gpuparity_watched__")


def test_planted_wrong_layer_norm_caught_at_sampled_step(monkeypatch):
    real = F.layer_norm
    planted = {"step": 0}

    def wrong(x, shape, weight=None, bias=None, eps=1e-5):
        out = real(x, shape, weight, bias, eps)
        return out * 1.05 if planted["step"] >= 2 else out   # wrong from step 2 on
    monkeypatch.setattr(F, "layer_norm", wrong)
    _, _, mon = _run(True, every=2, planted=planted)
    failures = mon.report().failures
    assert failures and failures[0]["op"] == "F.layer_norm" and failures[0]["step"] == 2
    assert F.layer_norm is wrong


def test_planted_nan_grad_query_and_repro(monkeypatch, tmp_path):
    real = F.scaled_dot_product_attention

    class NanGradQ(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q):
            return q.view_as(q)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            grad[0, 0, 3] = float("nan")
            return grad

    def wrong(q, k, v, attn_mask=None, **kw):
        return real(NanGradQ.apply(q), k, v, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", wrong)
    torch.manual_seed(0)
    model, x = Tiny(), torch.randn(2, 12, 16)
    with gpuparity.monitor(model, every=1, repro_dir=str(tmp_path), max_overhead=None) as mon:
        model(x, torch.ones(12, 12, dtype=torch.bool).tril()).backward()
    failure = mon.report().failures[0]
    assert failure["op"] == "F.scaled_dot_product_attention" and "grad_query" in failure["reason"]
    script = failure["repro"]["script"]
    monkeypatch.undo()                                            # real torch: the repro passes
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit) as clean:
        runpy.run_path(script, run_name="__main__")
    assert clean.value.code == 0
    planted = ("import torch, torch.nn.functional as F, runpy\n"
               "real = F.scaled_dot_product_attention\n"
               "class N(torch.autograd.Function):\n"
               "    forward = staticmethod(lambda ctx, q: q.view_as(q))\n"
               "    backward = staticmethod(lambda ctx, g: g * float('nan'))\n"
               "F.scaled_dot_product_attention = lambda query, key, value, **k: real(\n"
               "    N.apply(query) if query.dtype != torch.float64 else query, key, value, **k)\n"
               f"runpy.run_path({script!r}, run_name='__main__')\n")
    bad = subprocess.run([sys.executable, "-c", planted], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "grad_query" in bad.stdout


def test_bad_arguments():
    with pytest.raises(ValueError, match="every"):
        gpuparity.monitor(None, every=0)
    with pytest.raises(TypeError, match="model"):
        gpuparity.monitor("model")


def test_trainer_callback_drives_a_monitor():
    from types import SimpleNamespace

    from gpuparity.integrations.monitor_callback import MonitorCallback
    torch.manual_seed(0)
    model, x = Tiny(), torch.randn(2, 12, 16)
    callback = MonitorCallback(every=1, max_pending=64, max_overhead=None)
    callback.on_train_begin(None, SimpleNamespace(global_step=0), None, model=model)
    for step in range(2):
        callback.on_step_begin(None, SimpleNamespace(global_step=step + 10), None)
        model(x, torch.ones(12, 12, dtype=torch.bool).tril()).backward()
    callback.on_train_end(None, None, None)
    report = callback.report
    assert report.passed and report.checked.get("F.scaled_dot_product_attention") == 2
    assert not hasattr(F.scaled_dot_product_attention, "__gpuparity_watched__")


def test_nested_monitors_and_exceptions_restore_functionals():
    before = (F.scaled_dot_product_attention, F.layer_norm, F.softmax)
    outer = gpuparity.monitor(None, every=1, max_overhead=None)
    with pytest.raises(RuntimeError, match="boom"):
        with outer:
            with gpuparity.monitor(None, every=1, max_overhead=None) as inner:
                F.softmax(torch.randn(3, 4, requires_grad=True), dim=-1).sum().backward()
            assert hasattr(F.softmax, "__gpuparity_watched__")       # the outer one still watches
            raise RuntimeError("boom")
    assert (F.scaled_dot_product_attention, F.layer_norm, F.softmax) == before
    assert inner.report().checked == {"F.softmax": 1} and outer.report().calls == {}


def test_compiled_model_is_said_once(caplog):
    model = Tiny()
    model.compile()
    with caplog.at_level("WARNING", logger="gpuparity"):
        with gpuparity.monitor(model, every=1, max_overhead=None) as mon:
            pass
    assert "torch.compile" in (mon.report().unseen or "")
    assert sum("torch.compile" in r.message for r in caplog.records) == 1


def test_large_attention_checked_on_a_slice_and_scanned_whole():
    from gpuparity.shadow import ops as shadow_ops
    from gpuparity.shadow.checker import SampledCall, check_call
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    mask = torch.rand(2, 1, 16, 16) > 0.3
    mask[..., 0] = True
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grad_out = torch.randn_like(out)
    grad_q = torch.randn_like(q)
    grad_q[1, 3, 5, 0] = float("nan")            # outside slice 0 (batch 0, head 0)
    bound = shadow_ops.SDPA.bind((q, k, v), {"attn_mask": mask})
    described = shadow_ops.describe_args(bound, shadow_ops.SDPA)

    def call(grads, index):
        return SampledCall(shadow_ops.SDPA, "sdpa", index, 0, dict(bound), out, described, grad_out=grad_out,
                           grads=grads, slice_above=100)
    comparisons = check_call(call({"grad_query": grad_q}, 0))
    failed = [c for c in comparisons if not c.passed]
    assert [c.name for c in failed][:1] == ["grad_query"] and "every element scanned" in failed[0].reason
    wrong = out.clone()
    wrong[0, 1] *= 1.1                           # slice 1 (batch 0, head 1)
    results = {index: [c.name for c in check_call(SampledCall(shadow_ops.SDPA, "sdpa", index, 0, dict(bound), wrong,
                                                              described, slice_above=100)) if not c.passed]
               for index in (0, 1)}
    assert results == {0: [], 1: ["out"]}


def test_gpuparity_ops_and_transformers_rmsnorm_bitwise():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=50, attn_implementation="sdpa")
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0

    def run(monitored):
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config)
        weight = torch.ones(32, requires_grad=True)
        with (gpuparity.monitor(model, every=1, max_pending=64, max_overhead=None) if monitored else torch.enable_grad()) as mon:
            hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
            loss = gpuparity.rms_norm(hidden, (32,), weight, backend="torch").pow(2).mean()
            loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()] + [weight.grad], mon
    plain_loss, plain_grads, _ = run(False)
    loss, grads, mon = run(True)
    assert torch.equal(plain_loss, loss)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(plain_grads, grads))
    report = mon.report()
    assert report.passed
    assert report.checked.get("RMSNorm module", 0) >= 2 and report.checked.get("gpuparity.rms_norm") == 1
    assert "F.rms_norm" not in report.calls          # the torch backend's own F.rms_norm is inside a watched call


def test_calls_whose_backward_never_comes_are_checked_forward_only():
    from gpuparity import shadow
    x = torch.randn(4, 8, requires_grad=True)
    with gpuparity.monitor(None, every=1, max_pending=64, max_overhead=None) as mon:
        for _ in range(shadow.MAX_WAITING + 4):
            F.layer_norm(x, (8,))                  # grad mode on, no backward
        assert len(mon._pending) <= shadow.MAX_WAITING
    report = mon.report()
    assert report.checked == {"F.layer_norm": shadow.MAX_WAITING + 4} and report.passed


def test_where_the_float64_check_runs(monkeypatch):
    """A GPU call is checked on its own GPU when its float64 is full rate (auto), on the CPU
    otherwise or when asked; a CPU call always on the CPU; the report says where checks ran."""
    from gpuparity.shadow import checker
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(checker, "fast_fp64", lambda device: device.index == 0)
    assert checker.where_to_check(gpu, "auto") == gpu
    assert checker.where_to_check(torch.device("cuda", 1), "auto") == torch.device("cpu")
    assert checker.where_to_check(torch.device("cuda", 1), "device") == torch.device("cuda", 1)
    assert checker.where_to_check(gpu, "cpu") == torch.device("cpu")
    assert checker.where_to_check(torch.device("cpu"), "device") == torch.device("cpu")
    with pytest.raises(ValueError, match="check_device"):
        gpuparity.monitor(every=1, check_device="gpu", max_overhead=None)
    _, _, mon = _run(True)
    report = mon.report()
    assert report.checked_on == {"cpu": sum(report.checked.values())} and report.moved_to_cpu == 0
    assert "float64 checks ran on cpu" in report.summary()


def test_masks_of_the_judged_elements_are_built_on_the_calls_device():
    """On a GPU the float64 check runs on the call's device: the masks of the elements that are
    judged (SDPA's defined rows, gpuparity.attention's zero rows) must be built there too (a
    CPU mask beside cuda tensors made every attention check on an H200 an error). The meta
    device stands in for the GPU here."""
    from gpuparity.shadow import ops
    q = torch.empty(2, 4, 8, 16, device="meta")
    padding = torch.zeros(2, 8, dtype=torch.bool, device="meta")
    zero = ops._gp_attention_zero({"q": q, "k": q, "v": q, "key_padding_mask": padding, "is_causal": True})
    valid = ops._sdpa_valid({"query": q, "key": q, "value": q, "is_causal": False,
                             "attn_mask": torch.ones(8, 8, dtype=torch.bool, device="meta")})
    assert {t.device.type for t in (*zero.values(), *valid.values())} == {"meta"}


def test_the_baseline_is_computed_only_when_the_floor_is_not_enough(monkeypatch):
    """Same verdicts, less work: a check within the dtype's floor never runs the same-dtype
    baseline; above the floor, the baseline is computed and decides (2 x its error)."""
    from gpuparity import tolerance
    from gpuparity.shadow import checker
    runs = []
    real_run = checker._run

    def counting(kind, args, dtype, grad_names, grad_out):
        runs.append(dtype)
        return real_run(kind, args, dtype, grad_names, grad_out)
    monkeypatch.setattr(checker, "_run", counting)
    _, _, mon = _run(True)
    assert mon.report().passed and set(runs) == {torch.float64}
    runs.clear()
    monkeypatch.setattr(tolerance, "error_floor", lambda *args, **kwargs: 1e-300)   # every check above the floor
    # a layer_norm 1e-4 off, so that checks fail and their comparisons can be read (a correct run's
    # failures, which this test once read, depended on the CPU's rounding luck: none on some CPUs)
    real = F.layer_norm
    monkeypatch.setattr(F, "layer_norm", lambda x, shape, weight=None, bias=None, eps=1e-5:
                        real(x, shape, weight, bias, eps) * (1 + 1e-4))
    _, _, mon = _run(True)
    assert torch.float32 in runs
    judged = [c for f in mon.report().failures for c in f["comparisons"] if c.get("err") is not None]
    assert judged and all(c["baseline_err"] is not None for c in judged)


def test_a_long_bf16_reduction_gets_the_batterys_floor_not_the_flat_one():
    """A correct kernel that sums 16384 query rows into bf16 grad_key / grad_value errs past the
    flat bf16 floor (1e-2): the battery raises that output's floor by its reduction length
    (tolerance.error_floor), and the monitor judges by the same rule. Planted: grad_value 1.6%
    off the float64 reference (within the raised floor, 2.6%, not the flat one), grad_key 6% off
    (past both)."""
    from gpuparity import tolerance
    from gpuparity.shadow import checker, ops
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen).to(torch.bfloat16) for n in (16384, 8, 8))
    args = ops.SDPA.bind((q, k, v), {})
    out = F.scaled_dot_product_attention(q, k, v)
    grad_out = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    gk, gv = torch.autograd.grad(F.scaled_dot_product_attention(q64, k64, v64), (k64, v64), grad_out.double())

    def off(ref, rel):
        noise = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        return (ref + noise * (rel * ref.norm() / noise.norm())).to(torch.bfloat16)

    call = checker.SampledCall(ops.SDPA, "math", 0, 0, args, out, {}, grad_out=grad_out,
                               grads={"grad_key": off(gk, 0.06), "grad_value": off(gv, 0.016)})
    assert tolerance.floor_for(torch.bfloat16) < 0.016 < tolerance.error_floor(torch.bfloat16, reduction=16384)
    verdicts = {c.name: c.passed for c in checker.check_call(call)}
    assert verdicts == {"out": True, "grad_key": False, "grad_value": True}


def test_max_overhead_bounds_the_checks_share_of_the_monitored_time():
    """With max_overhead, a due sample is not taken while the checker's busy time (the running
    check included) is above that share of the monitored time; the first is always taken, the
    report counts the rest, and max_overhead=None takes every due sample. Bad values fail early."""
    x = torch.randn(64, 32, requires_grad=True)
    with gpuparity.monitor(None, every=1, max_pending=64, max_overhead=1e-6) as mon:
        for _ in range(20):
            F.layer_norm(x, (32,)).sum().backward()
        mon.wait(60)
        for _ in range(5):
            F.layer_norm(x, (32,)).sum().backward()
    report = mon.report()
    assert report.sampled["F.layer_norm"] >= 1 and report.checked["F.layer_norm"] == report.sampled["F.layer_norm"]
    assert report.sampled["F.layer_norm"] + report.over_budget == 25 and report.over_budget >= 5
    assert "max_overhead=0%" in report.summary() and report.passed
    assert report.due == {"F.layer_norm": 25} and report.not_checked == report.over_budget
    assert report.summary().startswith(f"gpuparity monitor: {report.checked['F.layer_norm']} of 25 due samples "
                                       f"checked, 0 failed; not checked: {report.over_budget} over budget")
    with gpuparity.monitor(None, every=1, max_pending=64, max_overhead=None) as mon:
        for _ in range(5):
            F.layer_norm(x, (32,)).sum().backward()
    assert mon.report().over_budget == 0 and mon.report().sampled["F.layer_norm"] == 5
    for bad in (0, 1.5, -0.1, True, "1%"):
        with pytest.raises(ValueError, match="max_overhead"):
            gpuparity.monitor(None, every=1, max_overhead=bad)


def test_a_first_calls_own_checks_are_not_counted_as_the_runs_calls(monkeypatch, tmp_path):
    """A first backend="auto" call inside the monitor verifies its backend on a few cases in
    this process (CPU): those checks' F.scaled_dot_product_attention / F.rms_norm calls are
    gpuparity's, not the run's. They were counted (and sampled) beside the ops: a patched Llama's
    summary read `F.scaled_dot_product_attention: 3 calls` next to `gpuparity.attention: 8`."""
    from gpuparity import caches
    from gpuparity.checks import selection

    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))   # an empty verdict store
    caches.clear_all()                                          # and no resolution in memory
    verified = []
    original_verify = selection.verify
    monkeypatch.setattr(selection, "verify", lambda *a, **k: verified.append(a[0]) or original_verify(*a, **k))
    q = torch.randn(2, 2, 8, 16, requires_grad=True)
    x, w = torch.randn(4, 16, requires_grad=True), torch.ones(16, requires_grad=True)
    try:
        with gpuparity.monitor(None, every=1, max_pending=64, max_overhead=None) as mon:
            for _ in range(2):
                loss = gpuparity.attention(q, q, q, is_causal=True).sum() + gpuparity.rms_norm(x, (16,), w).sum()
                loss.backward()
    finally:
        caches.clear_all()
    assert sorted(set(verified)) == ["attention", "rms_norm"]   # the first calls did verify, in the monitor
    report = mon.report()
    assert report.calls == {"gpuparity.attention": 2, "gpuparity.rms_norm": 2}, report.summary()
    assert report.sampled == report.calls and report.passed


class _HugeMeanNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(256)

    def forward(self, x):
        return self.norm(x).pow(2).mean()


def _monitored_huge_mean_norm():
    torch.manual_seed(0)
    model = _HugeMeanNorm()
    with torch.no_grad():
        model.norm.weight.normal_()
    x = torch.randn(64, 256) + 1000.0        # rows of mean 1000 and std 1: x - mean cancels
    with gpuparity.monitor(model, every=1, max_overhead=None) as mon:
        model(x).backward()
    return mon.report()


def test_layer_norm_is_judged_with_the_batterys_centering_floor():
    """The monitor raises layer_norm's floor by the battery's centering terms (a correct fp32
    kernel rounds a row's mean of 1000 at 1000's size), under its own output names, and a correct
    layer_norm on such rows passes; a wrong variance on the same rows still fails (below)."""
    from gpuparity.contracts import norms as norms_contract
    from gpuparity.shadow import ops
    x, weight, bias = torch.randn(8, 64) + 1000.0, torch.randn(64), torch.randn(64)
    args = {"input": x, "normalized_shape": (64,), "weight": weight, "bias": bias, "eps": 1e-5}
    battery = norms_contract.layer_norm_floor_terms(x, (64,), weight, bias, 1e-5)
    monitor = ops.LAYER_NORM.error_terms(args)
    assert monitor == {"out": battery["out"], "grad_input": battery["grad_x"], "grad_weight": battery["grad_weight"]}
    assert monitor["grad_input"]["mean_condition"] > 100      # the rows' |mean| / std
    report = _monitored_huge_mean_norm()
    assert report.checked.get("F.layer_norm") == 1 and report.passed, report.failures


def test_a_wrong_layer_norm_on_huge_mean_rows_is_still_caught(monkeypatch):
    def one_pass_variance(x, shape, weight=None, bias=None, eps=1e-5):
        # E[x^2] - E[x]^2 in fp32: catastrophic cancellation on rows of mean 1000
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        out = (x - mean) / torch.sqrt(var.clamp_min(0) + eps)
        return out * weight + bias if weight is not None else out
    monkeypatch.setattr(F, "layer_norm", one_pass_variance)
    report = _monitored_huge_mean_norm()
    assert not report.passed and report.failures[0]["op"] == "F.layer_norm"


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "attention", "rotary"])
def test_repro_of_a_gpuparity_call_reruns_it_through_the_declared_public_signature(op, monkeypatch, tmp_path):
    """The repro script of a sampled gpuparity call calls gpuparity.<op> with the declaration's
    positional inputs and the rest as keywords (shadow/ops.GPUPARITY and shadow/repro read the
    op's contract declaration): it runs, and passes on a correct backend."""
    from gpuparity.shadow import ops as shadow_ops, repro
    from gpuparity.shadow.checker import SampledCall
    kind = shadow_ops.GPUPARITY[op]
    gen = torch.Generator().manual_seed(0)
    inputs = {"rms_norm": lambda: ((torch.randn(3, 8, generator=gen), [8], torch.randn(8, generator=gen)), {}),
              "layer_norm": lambda: ((torch.randn(3, 8, generator=gen), [8], torch.randn(8, generator=gen)), {}),
              "attention": lambda: (tuple(torch.randn(1, 2, 5, 8, generator=gen) for _ in range(3)),
                                    {"is_causal": True}),
              "rotary": lambda: ((torch.randn(1, 5, 2, 8, generator=gen), torch.randn(5, 4, generator=gen),
                                  torch.randn(5, 4, generator=gen)), {})}[op]
    args, kwargs = inputs()
    bound = kind.bind(args, kwargs)
    assert set(kind.signature.positional()) <= set(bound)
    call = SampledCall(kind=kind, backend="composition", index=0, step=0, args=bound, out=None,
                       described=shadow_ops.describe_args(bound, kind))
    written = repro.write(call, [], str(tmp_path))
    monkeypatch.setattr(sys, "argv", [written["script"]])
    with pytest.raises(SystemExit) as ran:
        runpy.run_path(written["script"], run_name="__main__")
    assert ran.value.code == 0
