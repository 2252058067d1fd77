"""The fleet check as users launch it: torchrun with gloo at 2 and 4 ranks, and a bare
srun-style launch (SLURM variables, rank 0 hosting the store). A planted wrong rank must FAIL,
a planted hang must become TIMEOUT, and every job must end."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
TORCHRUN = str(VENV_BIN / "torchrun")
JOB_LIMIT_S = 120  # a hang must never outlive this
FAST = ["--no-battery", "--sizes", "8,4K,64K", "--iters", "2", "--warmup", "1"]

pytestmark = pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun is not installed next to python")


def _env(**plants):
    env = dict(os.environ)
    for name in ("GPUPARITY_FLEET_PLANT_WRONG_RANK", "GPUPARITY_FLEET_PLANT_HANG_RANK",
                 "GPUPARITY_FLEET_PLANT_HANG_STEP"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in plants.items()})
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(tmp_path, nproc, *args, **plants):
    out = tmp_path / "fleet.json"
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "-m", "gpuparity", "fleet",
           "--json", str(out), *args]
    proc = subprocess.run(cmd, env=_env(**plants), capture_output=True, text=True, timeout=JOB_LIMIT_S)
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def _collective(row, name, dtype="float32"):
    return [e for e in row["collectives"] if e["collective"] == name and e["dtype"] == dtype]


def test_clean_run_two_ranks_with_probes(tmp_path):
    proc, report = _torchrun(tmp_path, 2, *FAST)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["schema_version"] == 1 and report["world_size"] == 2 and report["backend"] == "gloo"
    assert report["summary"]["status"] == "HEALTHY" and report["summary"]["suspect_ranks"] == []
    for row in report["ranks"]:
        assert row["status"] == "PASS"
        assert row["platform"]["vendor"] == "cpu"
        assert row["probes"]["matmul"]["wrong"] == 0 and row["probes"]["copy"]["wrong"] == 0
        assert {e["collective"] for e in row["collectives"]} == {
            "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}
        assert all(e["status"] == "PASS" and e["wrong"] == 0 and e["time_us"] > 0 for e in row["collectives"])
    assert "HEALTHY" in proc.stdout


def test_clean_run_four_ranks(tmp_path):
    proc, report = _torchrun(tmp_path, 4, *FAST, "--no-probes")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [row["status"] for row in report["ranks"]] == ["PASS"] * 4
    all_reduce = [c for c in report["collectives"] if c["collective"] == "all_reduce"]
    assert all(c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * 1.5) for c in all_reduce)


def test_planted_wrong_rank_fails_its_all_reduce(tmp_path):
    proc, report = _torchrun(tmp_path, 4, *FAST, "--no-probes", GPUPARITY_FLEET_PLANT_WRONG_RANK=2)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    planted = report["ranks"][2]
    assert planted["status"] == "FAIL"
    for entry in _collective(planted, "all_reduce") + _collective(planted, "all_reduce", "bfloat16"):
        assert entry["status"] == "FAIL" and entry["wrong"] > 0 and entry["sent_wrong"] > 0
    # the other collectives of the same rank are fine: the count points at all_reduce
    assert all(e["status"] == "PASS" for e in _collective(planted, "all_gather"))
    assert report["summary"]["suspect_ranks"] == [2]
    assert report["summary"]["exit_code"] == 1


def test_planted_hang_becomes_timeout_and_the_job_ends(tmp_path):
    proc, report = _torchrun(tmp_path, 2, *FAST, "--no-probes", "--timeout", "4",
                             GPUPARITY_FLEET_PLANT_HANG_RANK=1)
    assert proc.returncode != 0
    assert report is not None, proc.stderr[-3000:]
    hung = report["ranks"][1]
    assert hung["status"] == "TIMEOUT" and "planted hang" in hung["stuck_step"]
    waiting = report["ranks"][0]
    assert _collective(waiting, "all_reduce")[0]["status"] == "TIMEOUT"
    assert report["summary"]["suspect_ranks"] == [1] and report["summary"]["exit_code"] == 1


def test_hang_in_local_checks_of_rank_zero_skips_collectives(tmp_path):
    proc, report = _torchrun(tmp_path, 4, *FAST, "--no-probes", "--timeout", "4",
                             GPUPARITY_FLEET_PLANT_HANG_RANK=0, GPUPARITY_FLEET_PLANT_HANG_STEP="local")
    assert proc.returncode != 0
    assert report is not None, proc.stderr[-3000:]
    assert report["ranks"][0]["status"] == "TIMEOUT"
    for row in report["ranks"][1:]:
        assert row["status"] == "PASS" and row["collective_phase"].startswith("skipped")
    assert report["summary"]["suspect_ranks"] == [0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_srun_style_launch_with_a_hang_ends_every_process(tmp_path):
    """No torchrun: SLURM variables give the ranks, rank 0 hosts the store; a hung rank still
    ends on its own, with the same exit code as rank 0."""
    port, out = _free_port(), tmp_path / "fleet.json"
    procs = []
    for rank in range(2):
        env = _env(GPUPARITY_FLEET_PLANT_HANG_RANK=1)
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
            env.pop(name, None)
        env.update(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank), SLURM_STEP_ID="0",
                   SLURM_JOB_ID="4242", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "gpuparity", "fleet", "--json", str(out), *FAST,
                                       "--no-probes", "--timeout", "4"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    codes = []
    for proc in procs:
        try:
            proc.communicate(timeout=JOB_LIMIT_S)
        finally:
            proc.kill()
        codes.append(proc.returncode)
    assert codes == [1, 1]
    report = json.loads(out.read_text())
    assert report["launcher"] == "srun"
    assert report["ranks"][1]["status"] == "TIMEOUT" and report["summary"]["suspect_ranks"] == [1]
