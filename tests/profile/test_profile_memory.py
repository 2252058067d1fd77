"""MemoryProfiler on the CPU (process RSS), automatic phases, and find_batch_size with an
injected out-of-memory error."""
from __future__ import annotations

import json

import pytest
import torch

import gpuparity.profile as gp
from gpuparity.cli import main
from gpuparity.profile.memory import MemoryProfiler, find_batch_size

MIB = 1 << 20


PEAK_SCRIPT = """
import torch
from gpuparity.profile import MemoryProfiler
MIB = 1 << 20
with MemoryProfiler("cpu") as prof:
    with prof.phase("big"):
        big = torch.ones(64 * MIB // 4)
        del big
    with prof.phase("small"):
        small = torch.ones(16)
if prof.report()["host_peak_per_phase"]:
    r = prof.records
    assert r["big"].peak_rss_bytes - r["small"].peak_rss_bytes > 32 * MIB, (r["big"], r["small"])
print("ok")
"""


def test_per_phase_peaks_in_a_fresh_process():
    """In a fresh process, so heap pages freed by earlier tests cannot absorb the allocation."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_phases_measure_their_own_peak_and_nest():
    with MemoryProfiler("cpu") as prof:
        with prof.phase("outer"):
            with prof.phase("big"):
                big = torch.ones(64 * MIB // 4)  # 64 MiB, touched
                del big
            with prof.phase("small"):
                small = torch.ones(16)
                del small
    records = prof.records
    assert set(records) == {"outer", "big", "small"}
    assert records["big"].depth == 1 and records["outer"].depth == 0
    assert records["outer"].peak_rss_bytes >= records["big"].peak_rss_bytes
    report = prof.report()
    assert report["schema_version"] == 1 and report["device"]["device"] == "cpu"
    assert report["peak_rss_bytes"] >= records["big"].peak_rss_bytes
    json.dumps(report)
    assert "big" in prof.table()


def test_repeated_phase_aggregates_and_phase_is_a_noop_without_profiler():
    with gp.phase("nothing active"):
        pass
    with MemoryProfiler("cpu") as prof:
        for _ in range(3):
            with gp.phase("step"):
                torch.ones(10)
    assert prof.records["step"].calls == 3


def test_auto_phases_record_forward_backward_step_and_to():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    original_backward = torch.Tensor.backward
    with MemoryProfiler("cpu", auto_phases=True) as prof:
        model.to("cpu")
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
    assert {name: r.calls for name, r in prof.records.items()} == {
        "to(device)": 1, "forward": 2, "backward": 2, "optimizer step": 2}
    assert torch.Tensor.backward is original_backward  # restored


def test_only_one_profiler_at_a_time():
    with MemoryProfiler("cpu"):
        with pytest.raises(RuntimeError, match="already active"):
            MemoryProfiler("cpu").__enter__()


def test_bad_device_and_phase_names():
    with pytest.raises(ValueError, match="device"):
        MemoryProfiler("meta")
    with MemoryProfiler("cpu") as prof:
        with pytest.raises(ValueError, match="name"):
            prof.enter("")


def _oom_above(limit, tries):
    def step(batch):
        tries.append(batch)
        if batch > limit:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch} GiB")
        return torch.ones(batch)
    return step


@pytest.mark.parametrize("limit", [1, 2, 37, 64, 100, 1000])
def test_find_batch_size_doubles_then_bisects(limit):
    tries = []
    assert find_batch_size(_oom_above(limit, tries), max_batch=4096, device="cpu") == limit
    assert len(tries) <= 2 * 13 + 2


def test_find_batch_size_sequence_of_tries():
    tries = []
    assert find_batch_size(_oom_above(37, tries), start=4, device="cpu") == 37
    assert tries == [4, 8, 16, 32, 64, 48, 40, 36, 38, 37]


def test_find_batch_size_caps_at_max_batch():
    tries = []
    assert find_batch_size(_oom_above(10 ** 9, tries), max_batch=100, device="cpu") == 100
    assert tries[-1] == 100


def test_find_batch_size_plain_runtime_error_out_of_memory_counts():
    def step(batch):
        if batch > 5:
            raise RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB")
    assert find_batch_size(step, device="cpu") == 5


def test_find_batch_size_errors():
    with pytest.raises(RuntimeError, match="start=8"):
        find_batch_size(_oom_above(4, []), start=8, device="cpu")

    def broken(batch):
        raise ValueError("shape mismatch")
    with pytest.raises(ValueError, match="shape mismatch"):
        find_batch_size(broken, device="cpu")
    with pytest.raises(ValueError, match="start"):
        find_batch_size(lambda b: None, start=0, device="cpu")
    with pytest.raises(ValueError, match="max_batch"):
        find_batch_size(lambda b: None, start=8, max_batch=4, device="cpu")
    with pytest.raises(TypeError, match="step_fn"):
        find_batch_size(3, device="cpu")


SCRIPT = """
import sys
import torch
import gpuparity.profile as gp
with gp.phase("model creation"):
    model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    gp.step()
sys.exit(int(sys.argv[2]))
"""


def test_cli_memory_wraps_a_script(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "mem.json"
    assert main(["profile", "memory", "--device", "cpu", "--json", str(out), "--", "python", str(script), "3", "0"]) == 0
    report = json.loads(out.read_text())
    calls = {p["name"]: p["calls"] for p in report["phases"]}
    assert calls == {"script": 1, "model creation": 1, "forward": 3, "backward": 3, "optimizer step": 3}
    assert report["script_exit_code"] == 0
    assert "model creation" in capsys.readouterr().out
    # the script's own failure is the command's failure, and the profile is still written
    assert main(["profile", "memory", "--device", "cpu", "--json", str(out), "--", "python", str(script), "1", "3"]) == 1
    assert json.loads(out.read_text())["script_exit_code"] == 3


def test_cli_memory_bad_usage(tmp_path):
    assert main(["profile", "memory"]) == 2
    assert main(["profile", "memory", "--", "python", str(tmp_path / "missing.py")]) == 2
    assert main(["profile", "memory", "--", "python", "-X", "dev", "t.py"]) == 2


def test_phase_rows_and_format_table_show_the_columns_of_the_device():
    from gpuparity.profile.memory import format_table, phase_rows
    phase = {"name": "forward", "depth": 1, "calls": 2, "duration_s": 0.5, "peak_allocated_bytes": 2**21,
             "peak_reserved_bytes": 2**22, "allocated_bytes": 2**20, "allocated_delta_bytes": 0,
             "peak_rss_bytes": 3 * 2**20, "rss_bytes": None, "host_available_bytes": 2**30}
    cpu = {"device": {"device": "cpu"}, "phases": [phase]}
    assert phase_rows(cpu) == [["  forward", "2", "0.500", "3.0", "-", "0.0"]]
    apu = {"device": {"device": "cuda:0", "is_apu": True}, "phases": [phase]}
    assert phase_rows(apu) == [["  forward", "2", "0.500", "2.0", "4.0", "1.0", "0.0", "3.0", "1,024.0"]]
    assert "host avail MiB" in format_table(apu) and "1,024.0" in format_table(apu)
