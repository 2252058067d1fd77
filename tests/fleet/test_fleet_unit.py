"""The fleet check's pieces without a launcher: sizes, exact inputs, launch environments, the
report, the watchdog and a single-process run."""
from __future__ import annotations

import sys
import threading
import time
import types

import pytest
import torch

from gpuparity import fleet
from gpuparity.cli import main


def test_busbw_factors_are_nccl_tests():
    assert fleet.busbw_factor("all_reduce", 4) == pytest.approx(1.5)
    assert fleet.busbw_factor("all_gather", 4) == pytest.approx(0.75)
    assert fleet.busbw_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert fleet.busbw_factor("all_to_all", 2) == pytest.approx(0.5)
    assert fleet.busbw_factor("broadcast", 16) == 1.0
    with pytest.raises(ValueError, match="collective"):
        fleet.busbw_factor("gather", 2)


@pytest.mark.parametrize("text,expected", [("8", 8), ("4K", 4096), ("1M", 1 << 20), ("256MiB", 256 << 20),
                                           ("1G", 1 << 30), ("64kb", 65536)])
def test_parse_size(text, expected):
    assert fleet.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "x", "-1", "1T", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        fleet.parse_size(text)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 64, 168, 256])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exact_inputs_stay_exact_in_every_partial_sum(world, dtype):
    k = fleet.value_range(dtype, world)
    index = torch.arange(0, 997, dtype=torch.int64)
    tdtype = fleet._torch_dtype(dtype)
    running = torch.zeros(997, dtype=torch.int64)
    running_low = torch.zeros(997, dtype=tdtype)
    for rank in range(world):
        values = fleet.pattern(rank, index, k)
        assert int(values.abs().max()) <= k
        running += values
        running_low += values.to(tdtype)  # the order a ring reduction adds in
        assert torch.equal(running_low.to(torch.int64), running)


def test_pattern_tells_ranks_and_offsets_apart():
    index = torch.arange(64)
    k = fleet.value_range("float32", 4)
    assert not torch.equal(fleet.pattern(0, index, k), fleet.pattern(1, index, k))
    assert not torch.equal(fleet.pattern(1, index, k), fleet.pattern(0, index + 1, k))


def test_plan_counts_follow_nccl_tests_bytes():
    assert fleet.plan_counts("all_reduce", 1024, "float32", 4) == (256, 1024)
    assert fleet.plan_counts("all_gather", 1024, "float32", 4) == (64, 1024)
    # too small to split: one element per rank, and the bytes say so
    assert fleet.plan_counts("all_to_all", 8, "float32", 4) == (1, 16)


def test_launch_env_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "29400",
           "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}
    got = fleet.launch_env(env)
    assert (got.rank, got.world_size, got.local_rank, got.launcher) == (3, 4, 1, "torchrun")
    assert (got.master_addr, got.master_port, got.run_tag) == ("n1", 29400, "abc.0")


def test_launch_env_srun_without_torchrun():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "99", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "12345", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    got = fleet.launch_env(env, first_host=lambda nodelist: "gpu07" if nodelist == "gpu[07-08]" else "?")
    assert (got.rank, got.world_size, got.local_rank, got.launcher) == (5, 8, 1, "srun")
    assert got.master_addr == "gpu07"
    assert got.master_port == 29500 + 12345 % 10000
    assert got.run_tag == "12345.0"


def test_launch_env_batch_script_is_not_a_step():
    # In the batch script itself (no srun step) SLURM_PROCID exists but only one process runs.
    got = fleet.launch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"})
    assert (got.rank, got.world_size, got.launcher) == (0, 1, "single")


def test_launch_env_rejects_bad_values():
    with pytest.raises(ValueError, match="RANK"):
        fleet.launch_env({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "x"})
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        fleet.launch_env({"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        fleet.launch_env({"RANK": "0", "WORLD_SIZE": "2"})


def test_first_slurm_host_without_scontrol(monkeypatch):
    monkeypatch.setattr(fleet.launch.shutil, "which", lambda name: None)
    assert fleet.first_slurm_host("node[03-05,9]") == "node03"
    assert fleet.first_slurm_host("a1,b2") == "a1"
    assert fleet.first_slurm_host("single") == "single"


def test_config_validation_names_the_argument():
    with pytest.raises(ValueError, match="dtypes"):
        fleet.FleetConfig(dtypes=("float16",)).validate()
    with pytest.raises(ValueError, match="timeout"):
        fleet.FleetConfig(timeout_s=0).validate()
    with pytest.raises(ValueError, match="collectives"):
        fleet.FleetConfig(collectives=("gather",)).validate()
    with pytest.raises(ValueError, match="iters"):
        fleet.FleetConfig(iters=0).validate()


def _rank(rank, host, tflops=100.0, gbps=1000.0, status="PASS", **extra):
    row = {"rank": rank, "host": host, "local_rank": rank % 2, "status": status, "reason": "",
           "battery": {"status": "SKIP"}, "backend": "gloo",
           "probes": {"matmul": {"status": "PASS", "tflops": tflops}, "copy": {"status": "PASS", "gbps": gbps}},
           "collectives": [{"collective": "all_reduce", "dtype": "float32", "requested_bytes": 1024, "bytes": 1024,
                            "status": "PASS", "wrong": 0, "time_us": 10.0}]}
    row.update(extra)
    return row


def test_summarize_flags_slow_ranks_and_missing_ranks():
    config = fleet.FleetConfig().validate()
    results = {0: _rank(0, "a"), 1: _rank(1, "a", tflops=80.0), 2: _rank(2, "b")}
    report = fleet.summarize(results, 4, config, hellos={3: {"host": "b", "local_rank": 1}})
    summary = report["summary"]
    assert report["schema_version"] == fleet.SCHEMA_VERSION
    assert summary["slow_ranks"] == [1]
    assert report["ranks"][1]["probes"]["matmul"]["fraction_of_median"] == pytest.approx(0.8)
    assert report["ranks"][3]["status"] == "TIMEOUT" and report["ranks"][3]["host"] == "b"
    assert summary["suspect_ranks"] == [3] and summary["suspect_hosts"] == ["b"]
    assert summary["exit_code"] == 1
    (all_reduce,) = report["collectives"]
    assert all_reduce["algbw_gbps"] == pytest.approx(1024 / 10e-6 / 1e9)
    assert all_reduce["busbw_gbps"] == pytest.approx(all_reduce["algbw_gbps"] * 1.5)


def test_summarize_healthy_and_fail_slow():
    results = {0: _rank(0, "a"), 1: _rank(1, "a", gbps=500.0)}
    assert fleet.summarize(results, 2, fleet.FleetConfig().validate())["summary"]["exit_code"] == 0
    strict = fleet.summarize(results, 2, fleet.FleetConfig(fail_slow=True).validate())["summary"]
    assert strict["exit_code"] == 1 and strict["suspect_ranks"] == [1]


def test_summarize_fleet_wide_battery_failures_are_not_a_node():
    config = fleet.FleetConfig().validate()
    shared = {"status": "FAIL", "failing": ["attention/efficient/masked/float16"]}
    own = {"status": "FAIL", "failing": ["attention/efficient/masked/float16", "rms_norm/triton/odd/bfloat16"]}
    results = {0: _rank(0, "a", status="FAIL", battery=shared), 1: _rank(1, "b", status="FAIL", battery=own),
               2: _rank(2, "c", status="FAIL", battery=shared)}
    summary = fleet.summarize(results, 3, config)["summary"]
    assert summary["fleet_wide_battery_failures"] == ["attention/efficient/masked/float16"]
    assert summary["suspect_ranks"] == [1] and summary["suspect_hosts"] == ["b"]
    assert summary["exit_code"] == 1


def test_battery_summary_from_a_battery(monkeypatch):
    from gpuparity.checks.results import CheckResult, Status

    def run_battery(level, device):
        assert (level, device) == ("quick", "cpu")
        results = [CheckResult("rms_norm", "torch", "basic", "float32", "cpu", Status.PASS),
                   CheckResult("attention", "sdpa", "masked", "float32", "cpu", Status.FAIL, reason="err 1e-1"),
                   CheckResult("rope", "triton", "odd", "float32", "cpu", Status.SKIP)]
        return types.SimpleNamespace(results=results, duration_s=1.5)

    fake = types.ModuleType("gpuparity.checks.battery")
    fake.run_battery = run_battery
    monkeypatch.setitem(sys.modules, "gpuparity.checks.battery", fake)
    summary = fleet.battery_summary("quick", "cpu")
    assert summary["status"] == "FAIL"
    assert summary["failing"] == ["attention/sdpa/masked/float32"]
    assert summary["counts"]["PASS"] == 1 and summary["counts"]["SKIP"] == 1


def test_battery_summary_skips_when_the_battery_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "gpuparity.checks.battery", None)  # import raises ImportError
    summary = fleet.battery_summary("quick", "cpu")
    assert summary["status"] == "SKIP" and "not available" in summary["reason"]


def test_wait_all_turns_a_hang_into_a_timeout():
    class StuckWork:
        def wait(self):
            time.sleep(30)

    started = time.monotonic()
    with pytest.raises(fleet._Timeout):
        fleet.wait_all([StuckWork()], torch.device("cpu"), 0.3)
    assert time.monotonic() - started < 5


def test_wait_all_passes_errors_on():
    class BrokenWork:
        def wait(self):
            raise RuntimeError("connection closed by peer")

    with pytest.raises(RuntimeError, match="connection closed"):
        fleet.wait_all([BrokenWork()], torch.device("cpu"), 5)


def test_watchdog_reports_a_stuck_step():
    fired = []
    event = threading.Event()
    dog = fleet.Watchdog(lambda step, elapsed: (fired.append(step), event.set()), grace_s=0.1)
    dog.start()
    with dog.step("quick", 5):
        pass
    with dog.step("slow step", 0.1):
        assert event.wait(5)
    assert fired == ["slow step"]


def test_probes_on_the_cpu_are_exact():
    matmul = fleet.probe_matmul("cpu", size=64, iters=1)
    copy = fleet.probe_copy("cpu", nbytes=1 << 16, iters=1)
    assert matmul["wrong"] == 0 and matmul["checked"] == 4 * 64 and matmul["tflops"] > 0
    assert copy["wrong"] == 0 and copy["gbps"] > 0


def test_single_process_run_in_process():
    reports = []
    config = fleet.FleetConfig(sizes=(8, 4096), battery=False, probes=False, timeout_s=20)
    code = fleet.run(config, on_report=reports.append, environ={})
    assert code == 0
    (report,) = reports
    assert report["world_size"] == 1 and report["summary"]["status"] == "HEALTHY"
    entries = report["ranks"][0]["collectives"]
    assert len(entries) == 2 * 5 * 2
    assert all(e["status"] == "PASS" and e["wrong"] == 0 for e in entries)
    assert report["ranks"][0]["platform"]["schema_version"] >= 1


def test_cli_rejects_bad_arguments(capsys):
    assert main(["fleet", "--dtypes", "fp16", "--no-battery"]) == 2
    assert "dtypes" in capsys.readouterr().err
    assert main(["fleet", "--sizes", "8,huge", "--no-battery"]) == 2
