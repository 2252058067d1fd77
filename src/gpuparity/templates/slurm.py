"""sbatch scripts for one GPU, one node or many nodes: srun + torchrun rendezvous (c10d, the first
node of the job hosts it), the recommended environment, and a `gpuparity doctor` pre-flight on
every GPU that aborts the job before the real work starts."""
from __future__ import annotations

import os
import re
import shlex
from typing import Any, Dict, List, Optional, Sequence

from .environment import VENDORS, recommended_environment

_NAME = re.compile(r"^[A-Za-z0-9_.,:+-]+$")
# SLURM --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def _check_name(what: str, value: Optional[str]) -> None:
    if value is not None and not _NAME.match(value):
        raise ValueError(f"{what}: expected letters, digits and _ . , : + -, got {value!r}")


def torchrun_target(command: Sequence[str]) -> List[str]:
    """What follows `torchrun <options>` for a command: `python train.py a` -> `train.py a`,
    `python -m pkg a` -> `-m pkg a`, anything else -> `--no-python cmd a`."""
    command = list(command)
    if _PYTHON.match(os.path.basename(command[0])):
        rest = command[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return ["-m", *rest[1:]]
        if rest and not rest[0].startswith("-"):
            return rest
        raise ValueError(f"command: torchrun runs `python SCRIPT ...` or `python -m MODULE ...`, got "
                         f"{shlex.join(command)!r}; put python's own options in the script")
    return ["--no-python", *command]


def container_prefix(vendor: str, container: Optional[str]) -> List[str]:
    if not container:
        return []
    return ["apptainer", "exec", "--rocm" if vendor == "amd" else "--nv", container]


def slurm_script(command: Sequence[str], *, nodes: int, gpus_per_node: int, vendor: str,
                 partition: Optional[str] = None, time: Optional[str] = None, account: Optional[str] = None,
                 job_name: str = "gpuparity", container: Optional[str] = None, preflight: bool = True,
                 platform: Optional[Dict[str, Any]] = None, arch: Optional[str] = None,
                 cpus_per_task: Optional[int] = None, generated_by: str = "") -> str:
    """The sbatch script as text. Raises ValueError naming the bad argument."""
    if not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes: expected an integer >= 1, got {nodes!r}")
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node: expected an integer >= 1, got {gpus_per_node!r}")
    if vendor not in VENDORS:
        raise ValueError(f"vendor: expected amd or nvidia, got {vendor!r}")
    if cpus_per_task is not None and (not isinstance(cpus_per_task, int) or cpus_per_task < 1):
        raise ValueError(f"cpus_per_task: expected an integer >= 1, got {cpus_per_task!r}")
    for what, value in (("partition", partition), ("account", account), ("job_name", job_name)):
        _check_name(what, value)
    if time is not None and not _TIME.match(time):
        raise ValueError(f"time: expected a SLURM time such as 30, 04:00:00 or 1-12:00:00, got {time!r}")
    command = [c for c in command]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError("command: expected the command to run after --, e.g. -- python train.py")
    if container and ("'" in container or "\n" in container):
        raise ValueError(f"container: expected a path to a .sif image, got {container!r}")

    settings, undecided, source = recommended_environment(vendor, gpus_per_node, platform=platform, arch=arch)
    wrap = container_prefix(vendor, container)
    total = nodes * gpus_per_node
    shape = "one GPU" if total == 1 else ("one node" if nodes == 1 else f"{nodes} nodes")

    lines = ["#!/bin/bash",
             f"# {job_name}: {total} {vendor.upper()} GPU(s) on {shape}, written by gpuparity "
             f"({generated_by or 'gpuparity template slurm'}).",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={gpus_per_node}"]
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    if time:
        lines.append(f"#SBATCH --time={time}")
    lines += ["#SBATCH --output=%x-%j.out", "", "set -euo pipefail", ""]

    lines.append(f"# Recommended environment ({source}).")
    if vendor == "amd":
        lines.append("unset HSA_OVERRIDE_GFX_VERSION  # runs kernels built for another GPU: wrong answers or crashes")
    for setting in settings:
        lines.append(f"{setting.shell()}  # {setting.source}: {_one_line(setting.why)}")
    if undecided:
        lines.append("# May apply; the arguments cannot decide (pass --platform FILE from "
                     "`gpuparity env --json` on a compute node):")
        for setting in undecided:
            lines.append(f"# {setting.shell()}  # {setting.source}: {_one_line(setting.why)}")
    lines.append('export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # NCCL/RCCL say why a collective failed')
    lines.append("")

    if nodes > 1:
        lines += ["# Rendezvous: the first node of the job hosts it.",
                  # sed reads every line: `head -n 1` would end the pipe early, and with pipefail
                  # scontrol's SIGPIPE would end the job.
                  'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
                  "export MASTER_ADDR",
                  "export MASTER_PORT=$((29500 + SLURM_JOB_ID % 10000))",
                  ""]

    if preflight:
        doctor = shlex.join(wrap + ["gpuparity", "doctor", "--quick"])
        lines += [
            "# Pre-flight: gpuparity doctor --quick on every GPU of every node; any failure ends the job here.",
            f"export GPUS_PER_NODE={gpus_per_node}",
            'export PREFLIGHT_DIR="${SLURM_SUBMIT_DIR:-$PWD}/gpuparity-preflight-${SLURM_JOB_ID}"',
            'mkdir -p "$PREFLIGHT_DIR"',
            "preflight() {",
            "    local host gpu status=0",
            "    host=$(hostname -s)",
            '    for gpu in $(seq 0 $((GPUS_PER_NODE - 1))); do',
            f'        if ! {doctor} --device "cuda:${{gpu}}" --json "${{PREFLIGHT_DIR}}/${{host}}-gpu${{gpu}}.json" \\',
            '                > "${PREFLIGHT_DIR}/${host}-gpu${gpu}.log" 2>&1; then',
            '            echo "gpuparity pre-flight FAILED on ${host} GPU ${gpu}: see ${PREFLIGHT_DIR}/${host}-gpu${gpu}.log" >&2',
            "            status=1",
            "        fi",
            "    done",
            '    return "$status"',
            "}",
            "export -f preflight",
            'if ! srun --ntasks-per-node=1 bash -c preflight; then',
            '    echo "gpuparity pre-flight failed: job stopped before the real work (reports in $PREFLIGHT_DIR)" >&2',
            "    exit 1",
            "fi",
            ""]

    lines.append("# The job.")
    if total == 1:
        groups = [["srun", "--ntasks=1"], wrap, command]
    elif nodes == 1:
        groups = [["srun", "--ntasks=1"], wrap,
                  ["torchrun", "--standalone", f"--nproc-per-node={gpus_per_node}"], torchrun_target(command)]
    else:
        groups = [["srun", "--ntasks-per-node=1"], wrap,
                  ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpus_per_node}"],
                  ["--rdzv-id=$SLURM_JOB_ID", "--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT"],
                  torchrun_target(command)]
    lines.append(_join_shell([g for g in groups if g]))
    return "\n".join(lines) + "\n"


def _one_line(text: str, limit: int = 140) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _quote(word: str) -> str:
    # The rendezvous words keep their $VARIABLES for the shell, in double quotes.
    if word.startswith("--rdzv-") and "$" in word:
        return f'"{word}"'
    return shlex.quote(word)


def _join_shell(groups: Sequence[Sequence[str]]) -> str:
    """One shell command from groups of words: one line if short, else one group per line."""
    rendered = [" ".join(_quote(w) for w in group) for group in groups]
    text = " ".join(rendered)
    return text if len(text) <= 100 else " \\\n    ".join(rendered)
