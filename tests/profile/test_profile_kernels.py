"""KernelProfiler and `gpuparity profile kernels|compare` on the CPU: steps counted by
gpuparity.profile.step() or optimizer.step(), the top list, and two profiles side by side."""
from __future__ import annotations

import json

import pytest
import torch

import gpuparity.profile as gp
from gpuparity.cli import main
from gpuparity.profile import KernelProfiler, compare_profiles


def _train(steps, explicit=True, optimizer=True):
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(16, 32)).square().mean().backward()
        if optimizer:
            opt.step()
        if explicit:
            gp.step()


@pytest.mark.parametrize("explicit,optimizer,source", [(True, True, "step()"), (False, True, "optimizer.step"),
                                                        (True, False, "step()")])
def test_steps_are_counted(explicit, optimizer, source):
    with KernelProfiler(steps=3, warmup=1, device="cpu") as prof:
        _train(6, explicit=explicit, optimizer=optimizer)
    report = prof.report(top=5)
    assert report["step_source"] == source
    assert report["steps_seen"] == 6 and report["steps_profiled"] == 3
    assert report["time_basis"] == "cpu"
    assert len(report["top"]) == 5
    names = [op["name"] for op in report["ops"]]
    assert "aten::addmm" in names or "aten::mm" in names
    assert sum(op["share"] for op in report["ops"]) == pytest.approx(1.0)
    mm = next(op for op in report["ops"] if op["name"] in ("aten::addmm", "aten::mm"))
    assert mm["calls"] >= 3  # one forward matmul per recorded step at least
    json.dumps(report)


def test_too_few_steps_is_an_error_not_an_empty_profile():
    with KernelProfiler(steps=3, warmup=2, device="cpu") as prof:
        _train(1)
    assert "warmup" in prof.report()["error"]


def test_warmup_zero_records_a_script_without_steps():
    with KernelProfiler(steps=3, warmup=0, device="cpu") as prof:
        _train(2, explicit=False, optimizer=False)
    report = prof.report()
    assert report["steps_profiled"] == 1 and report["ops"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        KernelProfiler(steps=0)
    with pytest.raises(ValueError, match="warmup"):
        KernelProfiler(warmup=-1)


def _profile(ops, steps=2, basis="device"):
    return {"schema_version": 1, "kind": "gpuparity.kernel_profile", "time_basis": basis, "steps_profiled": steps,
            "machine": "m", "device": "cuda:0",
            "ops": [{"name": n, "calls": 2 * steps, "device_time_us": t * steps, "self_cpu_time_us": 1.0}
                    for n, t in ops.items()]}


def test_compare_matches_ops_by_name():
    a = _profile({"aten::mm": 100.0, "aten::_efficient_attention_forward": 50.0})
    b = _profile({"aten::mm": 150.0, "aten::_scaled_dot_product_flash_attention": 20.0}, steps=4)
    result = compare_profiles(a, b)
    rows = {r["name"]: r for r in result["ops"]}
    assert rows["aten::mm"]["ratio_b_over_a"] == pytest.approx(1.5)
    assert rows["aten::mm"]["a_share"] == pytest.approx(100 / 150)
    assert rows["aten::_efficient_attention_forward"]["only_in"] == "a"
    assert rows["aten::_scaled_dot_product_flash_attention"]["only_in"] == "b"
    assert result["ratio_total_b_over_a"] == pytest.approx(170 / 150)
    assert [r["name"] for r in result["ops"]][0] == "aten::mm"


def test_compare_rejects_other_files():
    with pytest.raises(ValueError, match="kernel profile"):
        compare_profiles({"kind": "gpuparity.memory_profile"}, _profile({}))
    with pytest.raises(ValueError, match="recorded nothing"):
        compare_profiles(dict(_profile({}), error="no steps"), _profile({}))


SCRIPT = """
import torch
import gpuparity.profile as gp
model = torch.nn.Linear(32, 32)
for _ in range(5):
    model(torch.randn(8, 32)).sum().backward()
    gp.step()
"""


def test_cli_kernels_and_compare(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        assert main(["profile", "kernels", "--device", "cpu", "--steps", "2", "--top", "4", "--json", str(path),
                     "--", "python", str(script)]) == 0
    report = json.loads(a.read_text())
    assert report["steps_profiled"] == 2 and len(report["top"]) == 4
    assert main(["profile", "compare", str(a), str(b), "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["ops"]
    assert "b / a" in capsys.readouterr().out
    assert main(["profile", "kernels", "--device", "cpu", "--steps", "2", "--warmup", "9",
                 "--", "python", str(script)]) == 1
    assert main(["profile", "compare", str(a), str(tmp_path / "missing.json")]) == 2
