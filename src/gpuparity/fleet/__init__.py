"""Fleet health check: the same checks on every GPU of a job at once through torch.distributed,
every step bounded in time so that a hang becomes a TIMEOUT result instead of a stuck job."""
# The parts: config (FleetConfig and the shared rules), launch (torchrun / SLURM environment),
# local (each rank's probes and battery), collectives (exact inputs, checked and timed), watchdog
# (bounded waits), rank (one rank's state machine and `run`), summary (the fleet report).
# Other modules, commands and tests import these names from gpuparity.fleet.
from .collectives import _torch_dtype, check_collective, collective_reason, pattern, plan_counts, value_range
from .config import (COLLECTIVES, DEFAULT_ITERS, DEFAULT_SIZES, DTYPE_ALIASES, DTYPES, GIB, KIB, KIND, MIB,
                     OUTLIER_FRACTION, PLANT_HANG_ENV, PLANT_HANG_STEP_ENV, PLANT_WRONG_ENV, SCHEMA_VERSION,
                     FleetConfig, busbw_factor, format_size, parse_size, worst_status)
from .launch import LaunchEnv, first_slurm_host, launch_env
from .local import battery_summary, probe_copy, probe_matmul, run_probes
from .rank import run
from .summary import summarize
from .watchdog import Watchdog, _Timeout, wait_all

__all__ = [
    "COLLECTIVES", "DEFAULT_ITERS", "DEFAULT_SIZES", "DTYPE_ALIASES", "DTYPES", "GIB", "KIB", "KIND", "MIB",
    "OUTLIER_FRACTION", "PLANT_HANG_ENV", "PLANT_HANG_STEP_ENV", "PLANT_WRONG_ENV", "SCHEMA_VERSION",
    "FleetConfig", "LaunchEnv", "Watchdog", "_Timeout", "_torch_dtype", "battery_summary", "busbw_factor",
    "check_collective", "collective_reason", "first_slurm_host", "format_size", "launch_env", "parse_size", "pattern",
    "plan_counts", "probe_copy", "probe_matmul", "run", "run_probes", "summarize", "value_range", "wait_all", "worst_status",
]
