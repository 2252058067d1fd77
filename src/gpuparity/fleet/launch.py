"""This process's rank, world size and rendezvous address, from torchrun's variables or a bare
SLURM `srun` step."""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from typing import Callable, Optional


@dataclasses.dataclass
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    launcher: str                    # torchrun | env | srun | single
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    run_tag: str = "local"


def _env_int(env, name: str) -> int:
    value = env.get(name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected an integer in the environment, got {value!r}") from None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list (`scontrol show hostnames`, as the sbatch templates do)."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=30)
            hosts = out.stdout.split()
            if out.returncode == 0 and hosts:
                return hosts[0]
        except (OSError, subprocess.SubprocessError):
            pass  # fall back to reading the list ourselves
    # Without scontrol, a plain list ("node1,node2") or one bracket range ("node[01-04,07]").
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        raise ValueError(f"SLURM_JOB_NODELIST: cannot read a host from {nodelist!r}; set MASTER_ADDR")
    prefix, ranges = match.group(1), match.group(2)
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def launch_env(environ=None, first_host: Callable[[str], str] = first_slurm_host) -> LaunchEnv:
    """Rank, world size and rendezvous address of this process.

    torchrun (or anything that exports RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
    MASTER_PORT) wins. Under a bare `srun` step the SLURM variables stand in: SLURM_PROCID,
    SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID; MASTER_ADDR defaults to the first
    host of the job and MASTER_PORT to 29500 + SLURM_JOB_ID % 10000. Without either, a single
    process (world size 1).
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
        local = _env_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
    elif "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        rank = _env_int(env, "SLURM_PROCID")
        world = _env_int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
        local = _env_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        launcher = "srun"
    else:
        return LaunchEnv(0, 1, 0, "single")
    if world < 1:
        raise ValueError(f"WORLD_SIZE: expected >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"RANK: expected 0 <= RANK < WORLD_SIZE={world}, got {rank}")
    if local < 0:
        raise ValueError(f"LOCAL_RANK: expected >= 0, got {local}")
    addr = env.get("MASTER_ADDR")
    port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None
    if launcher == "srun":
        if not addr:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if not nodelist:
                raise ValueError("MASTER_ADDR: not set and no SLURM_JOB_NODELIST to take the first host from")
            addr = first_host(nodelist)
        if port is None:
            port = 29500 + int(env.get("SLURM_JOB_ID", "0") or 0) % 10000
    if launcher in ("torchrun", "env") and world > 1 and not addr:
        raise ValueError("MASTER_ADDR: not set; launch with torchrun or export MASTER_ADDR and MASTER_PORT")
    if env.get("TORCHELASTIC_RUN_ID"):
        tag = f"{env['TORCHELASTIC_RUN_ID']}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    elif env.get("SLURM_JOB_ID"):
        tag = f"{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', env.get('SLURM_STEPID', '0'))}"
    else:
        tag = "local"
    return LaunchEnv(rank, world, local, launcher, addr, port, tag)
