"""Job scripts and container definitions that start right: SLURM sbatch scripts with the
platform's recommended environment and a pre-flight check, and Apptainer definitions on the
vendors' official PyTorch images."""
from __future__ import annotations

from .apptainer import apptainer_definition
from .environment import EnvSetting, recommended_environment, target_platform
from .slurm import slurm_script

__all__ = ["slurm_script", "apptainer_definition", "recommended_environment", "target_platform", "EnvSetting"]
