"""SLURM scripts: valid bash (bash -n, shellcheck where installed), the right launch for one GPU,
one node and many nodes, the recommended environment, and a pre-flight that stops the job -
proven by running the script against stub srun / scontrol / torchrun / gpuparity."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from gpuparity.cli import main
from gpuparity.templates import recommended_environment, slurm_script
from gpuparity.templates.slurm import torchrun_target

SHAPES = [dict(nodes=1, gpus_per_node=1), dict(nodes=1, gpus_per_node=8), dict(nodes=42, gpus_per_node=4)]


def _check_shell(path, shell="bash"):
    subprocess.run([shell, "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "-s", shell, str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("shape", SHAPES, ids=["1gpu", "1node", "42nodes"])
@pytest.mark.parametrize("vendor", ["amd", "nvidia"])
def test_scripts_are_valid_bash(tmp_path, shape, vendor):
    text = slurm_script(["python", "train.py", "--lr", "3e-4", "--name", "it's"], vendor=vendor, partition="gpu",
                        time="04:00:00", account="proj-1", container="/sw/gpuparity.sif", **shape)
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    _check_shell(path)
    assert text.startswith("#!/bin/bash\n")
    assert f"#SBATCH --nodes={shape['nodes']}\n" in text
    assert f"#SBATCH --gpus-per-node={shape['gpus_per_node']}\n" in text
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --time=04:00:00" in text
    assert "#SBATCH --account=proj-1" in text
    assert "gpuparity doctor --quick" in text
    assert ("apptainer exec --rocm /sw/gpuparity.sif" if vendor == "amd" else
            "apptainer exec --nv /sw/gpuparity.sif") in text


def test_launch_per_shape():
    one = slurm_script(["python", "train.py"], nodes=1, gpus_per_node=1, vendor="nvidia")
    assert "torchrun" not in one and "srun --ntasks=1 python train.py" in one
    node = slurm_script(["python", "train.py"], nodes=1, gpus_per_node=8, vendor="nvidia")
    assert "torchrun --standalone --nproc-per-node=8" in node and "rdzv-backend" not in node
    many = slurm_script(["python", "-m", "pkg.train", "--x", "1"], nodes=42, gpus_per_node=4, vendor="amd")
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)' in many
    assert "torchrun --nnodes=42 --nproc-per-node=4" in many
    assert "--rdzv-backend=c10d" in many and '"--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT"' in many
    assert "-m pkg.train --x 1" in many


def test_torchrun_target():
    assert torchrun_target(["python3", "train.py", "-v"]) == ["train.py", "-v"]
    assert torchrun_target(["/usr/bin/python3.11", "-m", "gpuparity", "fleet"]) == ["-m", "gpuparity", "fleet"]
    assert torchrun_target(["./run.sh", "a"]) == ["--no-python", "./run.sh", "a"]
    with pytest.raises(ValueError, match="command"):
        torchrun_target(["python", "-u", "train.py"])


def test_amd_environment_from_the_known_issue_base():
    multi = slurm_script(["python", "t.py"], nodes=2, gpus_per_node=4, vendor="amd")
    assert "\nexport HSA_FORCE_FINE_GRAIN_PCIE=1" in multi
    assert "unset HSA_OVERRIDE_GFX_VERSION" in multi
    assert "export HSA_OVERRIDE_GFX_VERSION" not in multi
    single = slurm_script(["python", "t.py"], nodes=2, gpus_per_node=1, vendor="amd")
    assert "HSA_FORCE_FINE_GRAIN_PCIE" not in single
    nvidia = slurm_script(["python", "t.py"], nodes=2, gpus_per_node=4, vendor="nvidia")
    assert "HSA_" not in nvidia


def test_undecided_advice_is_commented_out_not_exported():
    settings, undecided, _ = recommended_environment("nvidia", 8)
    # NCCL_P2P_DISABLE is for consumer cards: the arguments do not say which card it is.
    assert "NCCL_P2P_DISABLE" not in {s.name for s in settings}
    assert "NCCL_P2P_DISABLE" in {s.name for s in undecided}
    text = slurm_script(["python", "t.py"], nodes=1, gpus_per_node=8, vendor="nvidia")
    assert "# export NCCL_P2P_DISABLE=1" in text and "\nexport NCCL_P2P_DISABLE" not in text


def test_platform_report_decides(tmp_path):
    platform = {"schema_version": 1, "vendor": "amd", "hostname": "node1",
                "torch": {"version": "2.9.0+rocm7.2.0", "hip": "7.2.0"},
                "devices": [{"index": i, "name": "AMD Radeon AI PRO R9700", "arch": "gfx1201"} for i in range(2)],
                "libraries": {"rccl": "2.27.7"}, "env": {}, "kernel_params": {"amdgpu": {}, "iommu": {}},
                "hsa_override": None, "numerics": {"deterministic_algorithms": False}}
    settings, undecided, source = recommended_environment("amd", 2, platform=platform)
    names = {s.name: s.value for s in settings}
    assert names.get("NCCL_PROTO") == "Simple"
    assert "compute node" in source


def test_builtin_defaults_without_the_base(monkeypatch):
    monkeypatch.setitem(sys.modules, "gpuparity.known", None)
    settings, undecided, source = recommended_environment("amd", 4)
    assert [(s.name, s.value) for s in settings] == [("HSA_FORCE_FINE_GRAIN_PCIE", "1")]
    assert "built-in" in source


@pytest.mark.parametrize("kwargs,match", [
    (dict(nodes=0), "nodes"), (dict(gpus_per_node=0), "gpus_per_node"), (dict(vendor="intel"), "vendor"),
    (dict(time="soon"), "time"), (dict(partition="a b"), "partition"), (dict(account="x;rm -rf /"), "account"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    base = dict(nodes=1, gpus_per_node=1, vendor="amd")
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        slurm_script(["python", "t.py"], **base)
    with pytest.raises(ValueError, match="command"):
        slurm_script([], nodes=1, gpus_per_node=1, vendor="amd")


def test_cli_exit_codes_and_output(tmp_path, capsys):
    assert main(["template", "slurm", "--nodes", "0", "--gpus-per-node", "4", "--vendor", "amd",
                 "--", "python", "t.py"]) == 2
    assert "nodes" in capsys.readouterr().err
    assert main(["template", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--vendor", "amd"]) == 2
    out = tmp_path / "job.sbatch"
    assert main(["template", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--vendor", "nvidia",
                 "--out", str(out), "--", "python", "train.py"]) == 0
    assert out.stat().st_mode & stat.S_IXUSR
    assert "--rdzv-backend=c10d" in out.read_text()
    dry = tmp_path / "dry.sbatch"
    assert main(["template", "slurm", "--nodes", "1", "--gpus-per-node", "1", "--vendor", "amd",
                 "--out", str(dry), "--dry-run", "--", "python", "train.py"]) == 0
    assert not dry.exists() and "#SBATCH --nodes=1" in capsys.readouterr().out


STUBS = {
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    # many hosts, so that a reader that stops early would SIGPIPE the writer
    "scontrol": '#!/bin/bash\nfor i in $(seq -w 1 5000); do echo "node$i"; done\n',
    "torchrun": '#!/bin/bash\necho "torchrun $*" >> "$STUB_LOG"\n',
    "gpuparity": '#!/bin/bash\necho "gpuparity $*" >> "$STUB_LOG"\nexit "${DOCTOR_EXIT:-0}"\n',
}


def _run_with_stubs(tmp_path, script, doctor_exit):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        path = bin_dir / name
        path.write_text(body)
        path.chmod(0o755)
    log = tmp_path / "stub.log"
    log.write_text("")
    job = tmp_path / "job.sbatch"
    job.write_text(script)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", STUB_LOG=str(log), DOCTOR_EXIT=str(doctor_exit),
               SLURM_JOB_ID="123456", SLURM_JOB_NODELIST="node[01-02]", SLURM_SUBMIT_DIR=str(tmp_path))
    proc = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=60)
    return proc, log.read_text().splitlines()


def test_script_runs_preflight_on_every_gpu_then_the_job(tmp_path):
    script = slurm_script(["python", "train.py", "--epochs", "2"], nodes=2, gpus_per_node=2, vendor="amd")
    proc, calls = _run_with_stubs(tmp_path, script, doctor_exit=0)
    assert proc.returncode == 0, proc.stderr
    doctors = [c for c in calls if c.startswith("gpuparity doctor")]
    assert [c.split("--device ")[1].split()[0] for c in doctors] == ["cuda:0", "cuda:1"]
    (job,) = [c for c in calls if c.startswith("torchrun")]
    assert "--nnodes=2 --nproc-per-node=2 --rdzv-id=123456 --rdzv-backend=c10d" in job
    assert "--rdzv-endpoint=node0001:" + str(29500 + 123456 % 10000) in job
    assert job.endswith("train.py --epochs 2")


def test_failed_preflight_stops_the_job(tmp_path):
    script = slurm_script(["python", "train.py"], nodes=2, gpus_per_node=2, vendor="nvidia")
    proc, calls = _run_with_stubs(tmp_path, script, doctor_exit=1)
    assert proc.returncode == 1
    assert "pre-flight FAILED" in proc.stderr
    assert not any(c.startswith("torchrun") for c in calls)
