"""What the fleet check runs (FleetConfig, sizes, dtypes, collectives) and the small rules every
part shares: status severity, byte sizes, nccl-tests' bus bandwidth factor."""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Optional, Sequence

SCHEMA_VERSION = 1
KIND = "gpuparity.fleet"

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
DTYPES = ("float32", "bfloat16")
DTYPE_ALIASES = {"fp32": "float32", "float32": "float32", "float": "float32",
                 "bf16": "bfloat16", "bfloat16": "bfloat16"}

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# nccl-tests style sweeps (-b 8 -e 256M, here by factors of 8 to keep a check quick).
DEFAULT_SIZES = {
    "gpu": (8, 64, 512, 4 * KIB, 32 * KIB, 256 * KIB, 2 * MIB, 16 * MIB, 128 * MIB, 256 * MIB),
    "cpu": (8, 64, 512, 4 * KIB, 32 * KIB, 256 * KIB, 1 * MIB),
}
# (warmup, timed) iterations per size: nccl-tests uses 5 / 20.
DEFAULT_ITERS = {"gpu": (5, 20), "cpu": (1, 3)}
OUTLIER_FRACTION = 0.9

# Test-only hooks, so CI can prove that a wrong answer and a hang are caught. Never set them on
# a real job: they make the named rank misbehave on purpose.
PLANT_WRONG_ENV = "GPUPARITY_FLEET_PLANT_WRONG_RANK"   # that rank corrupts its all_reduce contribution
PLANT_HANG_ENV = "GPUPARITY_FLEET_PLANT_HANG_RANK"     # that rank sleeps forever before its first collective
PLANT_HANG_STEP_ENV = "GPUPARITY_FLEET_PLANT_HANG_STEP"  # "collective" (default) or "local": hang in the local checks

_GOOD = ("PASS", "SKIP")
_SEVERITY = ("CRASH", "TIMEOUT", "ERROR", "FAIL", "PASS", "SKIP")


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw * factor (nccl-tests' performance notes; docs/targets.md)."""
    n = world_size
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"collective: expected one of {', '.join(COLLECTIVES)}, got {collective!r}")


def worst_status(statuses: Sequence[str]) -> str:
    """The worst status of a group (CRASH > TIMEOUT > ERROR > FAIL > PASS > SKIP)."""
    present = set(statuses)
    for status in _SEVERITY:
        if status in present:
            return status
    return "SKIP"


def parse_size(text: str) -> int:
    """'8', '4K', '1M', '256MiB', '1G' -> bytes (binary units, as nccl-tests)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(i?[bB])?\s*", str(text))
    if not match:
        raise ValueError(f"size: expected bytes such as 8, 4K, 1M or 256MiB, got {text!r}")
    value = int(match.group(1)) * {"": 1, "k": KIB, "m": MIB, "g": GIB}[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"size: expected at least 1 byte, got {text!r}")
    return value


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


@dataclasses.dataclass
class FleetConfig:
    """What every rank runs. Every rank must get the same config (torchrun passes the same argv)."""
    sizes: Optional[Sequence[int]] = None          # bytes per operation (nccl-tests meaning); None: per device
    dtypes: Sequence[str] = DTYPES
    collectives: Sequence[str] = COLLECTIVES
    timeout_s: float = 60.0                        # per collective wait, barrier and result gathering
    battery: bool = True
    level: str = "quick"
    battery_timeout_s: float = 900.0
    probes: bool = True
    warmup: Optional[int] = None
    iters: Optional[int] = None
    backend: str = "auto"                          # auto | nccl | gloo
    outlier_fraction: float = OUTLIER_FRACTION
    fail_slow: bool = False                        # slow ranks (outliers) make the exit code 1

    def validate(self) -> "FleetConfig":
        self.dtypes = tuple(self.dtypes)
        self.collectives = tuple(self.collectives)
        for dtype in self.dtypes:
            if dtype not in DTYPES:
                raise ValueError(f"dtypes: expected some of {', '.join(DTYPES)}, got {dtype!r}")
        for name in self.collectives:
            if name not in COLLECTIVES:
                raise ValueError(f"collectives: expected some of {', '.join(COLLECTIVES)}, got {name!r}")
        if not self.timeout_s or self.timeout_s <= 0:
            raise ValueError(f"timeout: expected seconds > 0, got {self.timeout_s!r}")
        if self.battery_timeout_s <= 0:
            raise ValueError(f"battery_timeout: expected seconds > 0, got {self.battery_timeout_s!r}")
        if self.level not in ("quick", "default", "full"):
            raise ValueError(f"level: expected quick, default or full, got {self.level!r}")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"backend: expected auto, nccl or gloo, got {self.backend!r}")
        if not 0 < self.outlier_fraction <= 1:
            raise ValueError(f"outlier_fraction: expected a fraction in (0, 1], got {self.outlier_fraction!r}")
        for name in ("warmup", "iters"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < (0 if name == "warmup" else 1)):
                raise ValueError(f"{name}: expected an integer >= {0 if name == 'warmup' else 1}, got {value!r}")
        if self.sizes is not None:
            self.sizes = tuple(int(s) for s in self.sizes)
            if not self.sizes or any(s < 1 for s in self.sizes):
                raise ValueError(f"sizes: expected byte counts >= 1, got {list(self.sizes)!r}")
        return self

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["sizes"] = list(self.sizes) if self.sizes is not None else None
        data["dtypes"], data["collectives"] = list(self.dtypes), list(self.collectives)
        return data
