"""Fleet health check: the same checks on every GPU of a job at once through torch.distributed
(NCCL on CUDA, RCCL through the nccl backend on ROCm, gloo on CPU), every step bounded in time
so that a hang becomes a TIMEOUT result instead of a stuck job.

Run one process per GPU (`torchrun --nproc-per-node N -m gpuparity fleet`, or `srun`): every
rank runs the quick battery and a matmul and a memory bandwidth probe on its own device, then
the ranks check all_reduce, all_gather, reduce_scatter, broadcast and all_to_all with inputs
whose sums are exact (a count of wrong elements, as nccl-tests reports) and measure algbw and
busbw. Results travel through the rendezvous store (not through a collective, which could
hang); rank 0 builds the report and every rank exits with the same code.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

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
    """nccl-tests' bus bandwidth factor: busbw = algbw * factor (PERFORMANCE.md of nccl-tests)."""
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


# --------------------------------------------------------------------------- launch environment
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


# --------------------------------------------------------------------------- exact inputs
def value_range(dtype: str, world_size: int) -> int:
    """k such that inputs in [-k, k] summed over world_size ranks stay exact integers: bf16 holds
    every integer up to 256, fp32 up to 2**24."""
    limit = 256 if dtype == "bfloat16" else 1 << 24
    return max(1, min(8, limit // max(1, world_size)))


def pattern(rank, index, k: int):
    """The value rank `rank` puts at element `index`: an integer in [-k, k]. Works on ints and on
    int64 tensors. Rank and element both move it (step 2 is coprime with the odd period), so data
    from the wrong rank or the wrong offset is wrong."""
    return (index + 2 * rank) % (2 * k + 1) - k


def _torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _element_size(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2}[dtype]


def plan_counts(collective: str, nbytes: int, dtype: str, world_size: int) -> Tuple[int, int]:
    """(elements per rank chunk, bytes of the operation as nccl-tests counts them)."""
    esize = _element_size(dtype)
    total = max(1, nbytes // esize)
    if collective in ("all_reduce", "broadcast"):
        return total, total * esize
    chunk = max(1, total // world_size)
    return chunk, chunk * world_size * esize


# --------------------------------------------------------------------------- probes
def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _elapsed_s(fn: Callable[[], Any], iters: int, device) -> float:
    """Seconds per call of fn, timed with CUDA events on a GPU, a wall clock on the CPU."""
    import torch
    if device.type == "cuda":
        # The events must be recorded on the stream that runs fn: the probe process's current
        # device is cuda:0 unless set, and events on another GPU's stream time nothing.
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(iters):
                fn()
            end.record(stream)
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / iters
    begin = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - begin) / iters


def probe_matmul(device: str = "cpu", size: Optional[int] = None, dtype: Optional[str] = None,
                 iters: Optional[int] = None, seed: int = 0) -> Dict[str, Any]:
    """Matmul throughput (TFLOP/s on random data) and an exact check: matrices of -1/0/1 give
    integer products that fp32 accumulation holds exactly, compared on sampled rows against a
    float64 product on the CPU."""
    import torch
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    size = size or (8192 if on_gpu else 256)
    dtype = dtype or ("bfloat16" if on_gpu else "float32")
    iters = iters or (20 if on_gpu else 5)
    tdtype = _torch_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=gen).to(dev, tdtype)
    b = torch.randn(size, size, generator=gen).to(dev, tdtype)
    for _ in range(3):
        torch.matmul(a, b)
    _sync(dev)
    seconds = _elapsed_s(lambda: torch.matmul(a, b), iters, dev)
    del a, b
    ints_a = torch.randint(-1, 2, (size, size), generator=gen, dtype=torch.int8)
    ints_b = torch.randint(-1, 2, (size, size), generator=gen, dtype=torch.int8)
    product = torch.matmul(ints_a.to(dev, tdtype), ints_b.to(dev, tdtype))
    rows = sorted({0, size // 3, (2 * size) // 3, size - 1})
    reference = ints_a[rows].double() @ ints_b.double()
    got = product[rows].cpu()
    wrong = int((got != reference.to(tdtype)).sum())
    return {"tflops": 2.0 * size ** 3 / seconds / 1e12, "time_ms": seconds * 1e3, "size": size,
            "dtype": dtype, "iters": iters, "wrong": wrong, "checked": len(rows) * size}


def probe_copy(device: str = "cpu", nbytes: Optional[int] = None, iters: Optional[int] = None) -> Dict[str, Any]:
    """Device memory bandwidth of a copy (GB/s counting bytes read + written) and an exact check
    of the copied data."""
    import torch
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    nbytes = nbytes or (256 * MIB if on_gpu else 8 * MIB)
    iters = iters or (20 if on_gpu else 5)
    count = nbytes // 4
    src = torch.arange(count, device=dev, dtype=torch.int32).view(torch.float32)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(dev)
    seconds = _elapsed_s(lambda: dst.copy_(src), iters, dev)
    wrong = int((dst.view(torch.int32) != src.view(torch.int32)).sum())
    return {"gbps": 2.0 * count * 4 / seconds / 1e9, "time_ms": seconds * 1e3, "bytes": count * 4,
            "iters": iters, "wrong": wrong, "checked": count}


def run_probes(device: str = "cpu") -> Dict[str, Any]:
    """Both probes; the entry point of the crash-isolated probe process on a GPU."""
    import torch
    out: Dict[str, Any] = {}
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))  # this process may start on cuda:0
    for name, fn in (("matmul", probe_matmul), ("copy", probe_copy)):
        try:
            value = fn(device)
            value["status"] = "FAIL" if value["wrong"] else "PASS"
            value["reason"] = f"{value['wrong']} of {value['checked']} checked elements wrong" if value["wrong"] else ""
        except Exception as exc:  # noqa: BLE001 - a failed probe is a result
            value = {"status": "ERROR", "reason": f"{type(exc).__name__}: {exc}"[:300]}
        out[name] = value
    return out


def battery_summary(level: str, device: str, timeout: Optional[float] = None) -> Dict[str, Any]:
    """The quick battery on this rank's device, reduced to counts and the failing checks. SKIP
    (with the reason) when the battery cannot be imported."""
    try:
        from .checks.battery import run_battery
        from .checks.results import tally
    except Exception as exc:  # noqa: BLE001 - the battery is optional for the fleet
        return {"status": "SKIP", "reason": f"the battery is not available: {type(exc).__name__}: {exc}"[:300]}
    run = run_battery(level=level, device=device)
    bad = [r for r in run.results if r.status.bad]
    statuses = [r.status.value for r in run.results]
    status = worst_status(statuses) if bad else ("PASS" if "PASS" in statuses else "SKIP")
    return {"status": status, "counts": tally(run.results), "duration_s": run.duration_s,
            "failing": [r.key for r in bad][:200],
            "reason": "; ".join(f"{r.key}: {r.status.value}" for r in bad[:5]) + (" ..." if len(bad) > 5 else "")}


# --------------------------------------------------------------------------- the watchdog
class _Timeout(Exception):
    pass


class Watchdog(threading.Thread):
    """Watches the step the main thread is in; when one overruns its budget by more than the
    grace, calls on_stuck(step, elapsed) from this thread (the main thread may be stuck in C)."""

    def __init__(self, on_stuck: Callable[[str, float], None], grace_s: float):
        super().__init__(name="gpuparity-fleet-watchdog", daemon=True)
        self._on_stuck = on_stuck
        self._grace = grace_s
        self._lock = threading.Lock()
        self._step: Optional[Tuple[str, float, float]] = None
        self._stop_event = threading.Event()

    class _Step:
        def __init__(self, dog: "Watchdog", name: str, budget: float):
            self.dog, self.name, self.budget = dog, name, budget

        def __enter__(self):
            with self.dog._lock:
                self.dog._step = (self.name, time.monotonic(), self.budget)
            return self

        def __exit__(self, *exc):
            with self.dog._lock:
                self.dog._step = None
            return False

    def step(self, name: str, budget_s: float) -> "_Step":
        return Watchdog._Step(self, name, budget_s)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(0.1):
            with self._lock:
                step = self._step
            if step is None:
                continue
            name, started, budget = step
            elapsed = time.monotonic() - started
            if elapsed > budget + self._grace:
                self._stop_event.set()
                self._on_stuck(name, elapsed)
                return


def wait_all(works: Sequence[Any], device, timeout_s: float) -> None:
    """Wait for collective work handles (and, on a GPU, for the device) with a deadline.

    The waiting happens in a helper thread, because not every backend's Work answers
    is_completed() (gloo's reduce_scatter does not) and work.wait() has no portable deadline.
    Raises _Timeout when the deadline passes; the helper thread is abandoned."""
    import torch
    done = threading.Event()
    box: Dict[str, BaseException] = {}

    def waiter() -> None:
        try:
            for work in works:
                if work is not None:
                    work.wait()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=waiter, name="gpuparity-fleet-wait", daemon=True).start()
    if not done.wait(timeout_s):
        raise _Timeout(f"no completion within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]


# --------------------------------------------------------------------------- one rank
def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class _RankRun:
    """One rank of the fleet check: local checks, barrier, collectives, result exchange."""

    def __init__(self, config: FleetConfig, env: LaunchEnv,
                 on_report: Optional[Callable[[Dict[str, Any]], None]], environ):
        import torch
        self.config = config
        self.env = env
        self.on_report = on_report
        self.environ = environ
        self.rank, self.world = env.rank, env.world_size
        self.prefix = f"gpuparity/fleet/{env.run_tag}/"
        self.grace = max(2.0, 0.25 * config.timeout_s)
        self.gather_wait = config.timeout_s + 2 * self.grace + 5.0
        self.pg_timeout = 3 * config.timeout_s + self.gather_wait + 120.0
        self.store = None
        self.dirty = False            # a collective was abandoned: no clean shutdown possible
        self._lock = threading.Lock()
        self._finishing = False
        self._code: Optional[int] = None
        self.device, self.backend = self._device_and_backend(torch)
        kind = "gpu" if self.device.type == "cuda" else "cpu"
        self.sizes = tuple(config.sizes) if config.sizes is not None else DEFAULT_SIZES[kind]
        warmup, iters = DEFAULT_ITERS[kind]
        self.warmup = config.warmup if config.warmup is not None else warmup
        self.iters = config.iters if config.iters is not None else iters
        self.result: Dict[str, Any] = {
            "rank": self.rank, "local_rank": env.local_rank, "world_size": self.world,
            "host": _hostname(), "device": str(self.device), "device_name": self._device_name(torch),
            "backend": self.backend, "status": "PASS", "reason": "", "stuck_step": None,
            "battery": {"status": "SKIP", "reason": "not run (--no-battery)"},
            "probes": {}, "collectives": [], "collective_phase": "not reached", "sent_wrong": 0,
            "started": _now(), "duration_s": None, "platform": None,
        }
        self.t0 = time.monotonic()
        self.watchdog = Watchdog(self._on_stuck, self.grace)

    # ----- setup
    def _device_and_backend(self, torch):
        backend = self.config.backend
        if backend != "gloo" and torch.cuda.is_available():
            count = torch.cuda.device_count()
            if self.env.local_rank < count:
                index = self.env.local_rank
            elif count == 1:
                index = 0  # srun --gpus-per-task / CUDA_VISIBLE_DEVICES: each task sees its one GPU
            else:
                raise ValueError(f"LOCAL_RANK: {self.env.local_rank} but only {count} GPUs are visible; "
                                 f"run at most {count} processes per node")
            torch.cuda.set_device(index)
            return torch.device("cuda", index), "nccl"
        if backend == "nccl":
            raise ValueError("backend: nccl needs a CUDA or ROCm GPU, and torch sees none; use gloo")
        return torch.device("cpu"), "gloo"

    def _device_name(self, torch) -> str:
        if self.device.type == "cuda":
            try:
                return torch.cuda.get_device_name(self.device)
            except Exception:  # noqa: BLE001
                return "unknown GPU"
        from .platform import _cpu_model
        return f"CPU ({_cpu_model()})"

    def _connect(self) -> None:
        import torch.distributed as dist
        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this torch build")
        timeout = datetime.timedelta(seconds=self.pg_timeout)
        if self.world == 1:
            store = dist.HashStore()
        else:
            if self.env.master_addr:
                os.environ.setdefault("MASTER_ADDR", self.env.master_addr)
            if self.env.master_port:
                os.environ.setdefault("MASTER_PORT", str(self.env.master_port))
            store, _, _ = next(dist.rendezvous("env://", self.rank, self.world, timeout=timeout))
        dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world, timeout=timeout)
        self.store = store

    # ----- small store helpers (the store, not a collective: a hung peer cannot block them)
    def _key(self, name: str) -> str:
        return self.prefix + name

    def _has(self, name: str) -> bool:
        return bool(self.store.check([self._key(name)]))

    def _set(self, name: str, value: Any) -> None:
        self.store.set(self._key(name), json.dumps(value, default=str))

    def _get(self, name: str) -> Any:
        return json.loads(self.store.get(self._key(name)))

    def _count(self, name: str, add: int = 0) -> int:
        return int(self.store.add(self._key(name), add))

    # ----- the run
    def run(self) -> int:
        with self._lock:
            self.result["platform"] = _platform_report()
        try:
            self._connect()
        except Exception as exc:  # noqa: BLE001 - no store: this rank can only speak for itself
            self._mark("ERROR", f"rendezvous / process group failed: {type(exc).__name__}: {exc}"[:400])
            report = summarize({self.rank: self._snapshot()}, self.world, self.config,
                               missing_reason="no result: rendezvous failed on rank {rank}".format(rank=self.rank))
            if self.rank == 0 and self.on_report:
                self.on_report(report)
            return 1
        self.watchdog.start()
        self._set(f"hello/{self.rank}", {"host": self.result["host"], "device": self.result["device"],
                                         "device_name": self.result["device_name"],
                                         "local_rank": self.env.local_rank})
        self._local_phase()
        ready, missing, why = self._barrier()
        if ready:
            self._collective_phase()
        else:
            with self._lock:
                self.result["collective_phase"] = f"skipped: {why}"
        code = self._finish()
        self.watchdog.stop()
        if self.dirty:
            _hard_exit(code)
        try:
            import torch.distributed as dist
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - shutting down; the verdict is already out
            pass
        return code

    def _mark(self, status: str, reason: str) -> None:
        with self._lock:
            self.result["status"] = worst_status([self.result["status"], status])
            if reason and status not in _GOOD:
                self.result["reason"] = (self.result["reason"] + "; " if self.result["reason"] else "") + reason

    def _snapshot(self) -> Dict[str, Any]:
        with self._lock:
            snap = json.loads(json.dumps(self.result, default=str))
        snap["duration_s"] = round(time.monotonic() - self.t0, 3)
        return snap

    # ----- local checks
    def _local_phase(self) -> None:
        config = self.config
        if _plant_rank(self.environ, PLANT_HANG_ENV) == self.rank and _plant_step(self.environ) == "local":
            with self.watchdog.step("local checks (planted hang)", config.timeout_s):
                _sleep_forever()
        if config.battery:
            with self.watchdog.step("battery", config.battery_timeout_s):
                try:
                    summary = battery_summary(config.level, str(self.device))
                except Exception as exc:  # noqa: BLE001
                    summary = {"status": "ERROR", "reason": f"{type(exc).__name__}: {exc}"[:300]}
            with self._lock:
                self.result["battery"] = summary
            self._mark(summary["status"], f"battery: {summary.get('reason', '')}")
        if config.probes:
            budget = max(config.timeout_s, 120.0)
            with self.watchdog.step("probes", budget):
                probes = self._probes(budget)
            with self._lock:
                self.result["probes"] = probes
            for name, value in probes.items():
                self._mark(value["status"], f"{name} probe: {value.get('reason', '')}")

    def _probes(self, budget: float) -> Dict[str, Any]:
        if self.device.type != "cuda":
            return run_probes(str(self.device))
        # On a GPU the probes run in a fresh process, so a crashing device is a result.
        from .checks.isolate import call_isolated
        outcome = call_isolated("gpuparity.fleet:run_probes", {"device": str(self.device)}, timeout=budget)
        if outcome.ok:
            return outcome.value
        status = {"timeout": "TIMEOUT", "crash": "CRASH"}.get(outcome.status, "ERROR")
        reason = f"{outcome.error} {outcome.stderr_tail[-300:]}".strip()
        return {"matmul": {"status": status, "reason": reason}, "copy": {"status": status, "reason": reason}}

    # ----- the barrier before the collectives
    def _barrier(self) -> Tuple[bool, List[int], str]:
        """Wait until every rank finished its local checks. Ranks that finished without being
        ready (stuck, their watchdog reported) or a deadline abort the collectives for all."""
        self._set(f"ready/{self.rank}", 1)
        arrived = self._count("ready_count", 1)
        wait = self.config.timeout_s + (self.config.battery_timeout_s if self.config.battery else 0) + \
            (max(self.config.timeout_s, 120.0) if self.config.probes else 0)
        deadline = time.monotonic() + wait
        while True:
            if arrived >= self.world:
                return True, [], ""
            if self._has("abort"):
                reason = self._get("abort")
                return False, [], reason
            if self._count("results_count") > 0 or time.monotonic() > deadline:
                missing = [r for r in range(self.world) if not self._has(f"ready/{r}")]
                if missing:
                    reason = (f"rank(s) {_ranks(missing)} did not finish their local checks "
                              f"{'in time' if time.monotonic() > deadline else '(stuck)'}")
                    self._set("abort", reason)
                    return False, missing, reason
            time.sleep(0.05)
            arrived = self._count("ready_count")

    # ----- collectives
    def _collective_phase(self) -> None:
        with self._lock:
            self.result["collective_phase"] = "running"
        plant_wrong = _plant_rank(self.environ, PLANT_WRONG_ENV) == self.rank
        plant_hang = _plant_rank(self.environ, PLANT_HANG_ENV) == self.rank and _plant_step(self.environ) == "collective"
        items = [(c, d, s) for d in self.config.dtypes for c in self.config.collectives for s in self.sizes]
        abandoned: Optional[str] = None
        for index, (collective, dtype, nbytes) in enumerate(items):
            if abandoned:
                entry = {"collective": collective, "dtype": dtype, "requested_bytes": nbytes, "status": "SKIP",
                         "reason": f"not run: {abandoned}"}
            else:
                if plant_hang and index == 0:
                    with self.watchdog.step(f"{collective} {dtype} {format_size(nbytes)} (planted hang)",
                                            self.config.timeout_s):
                        _sleep_forever()
                entry = self._one(collective, dtype, nbytes, plant_wrong and collective == "all_reduce")
                if entry["status"] in ("TIMEOUT", "ERROR") and entry.get("abandon"):
                    abandoned = (f"{collective} {dtype} {format_size(nbytes)} {entry['status'].lower()}: "
                                 "the process group cannot be trusted after that")
                    self.dirty = True
                entry.pop("abandon", None)
            with self._lock:
                self.result["collectives"].append(entry)
            self._mark(entry["status"], "")
        with self._lock:
            self.result["collective_phase"] = "abandoned" if abandoned else "done"
            entries = list(self.result["collectives"])
        self._mark("PASS", "")
        reason = collective_reason(entries)
        if reason:
            self._mark(worst_status([e["status"] for e in entries]), reason)

    def _one(self, collective: str, dtype: str, nbytes: int, corrupt: bool) -> Dict[str, Any]:
        import torch
        import torch.distributed as dist
        n, rank, dev = self.world, self.rank, self.device
        tdtype = _torch_dtype(dtype)
        k = value_range(dtype, n)
        count, op_bytes = plan_counts(collective, nbytes, dtype, n)
        entry: Dict[str, Any] = {"collective": collective, "dtype": dtype, "requested_bytes": nbytes,
                                 "bytes": op_bytes, "count": count, "status": "PASS", "wrong": 0, "reason": ""}
        label = f"{collective} {dtype} {format_size(op_bytes)}"

        def values(r, start, length):
            index = torch.arange(start, start + length, device=dev, dtype=torch.int64)
            return pattern(r, index, k)

        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        if collective == "all_reduce":
            send = values(rank, 0, count).to(tdtype)
            expected = sum(values(r, 0, count) for r in range(n)).to(tdtype)
            recv = send
            if corrupt:
                send[: max(1, count // 2)] += 1  # test hook: this rank's contribution is wrong
            entry["sent_wrong"] = int((send != values(rank, 0, count).to(tdtype)).sum())

            def launch():
                return dist.all_reduce(send, async_op=True)
        elif collective == "broadcast":
            send = values(0, 0, count).to(tdtype) if rank == 0 else torch.full((count,), k + 1, dtype=tdtype, device=dev)
            expected = values(0, 0, count).to(tdtype)
            recv = send

            def launch():
                return dist.broadcast(send, 0, async_op=True)
        elif collective == "all_gather":
            send = values(rank, 0, count).to(tdtype)
            recv = torch.full((n * count,), k + 1, dtype=tdtype, device=dev)
            expected = torch.cat([values(r, 0, count) for r in range(n)]).to(tdtype)

            def launch():
                return all_gather(recv, send, async_op=True)
        elif collective == "reduce_scatter":
            send = values(rank, 0, n * count).to(tdtype)
            recv = torch.full((count,), k + 1, dtype=tdtype, device=dev)
            expected = sum(values(r, rank * count, count) for r in range(n)).to(tdtype)

            def launch():
                return reduce_scatter(recv, send, async_op=True)
        else:  # all_to_all: chunk d of every rank goes to rank d
            send = values(rank, 0, n * count).to(tdtype)
            recv = torch.full((n * count,), k + 1, dtype=tdtype, device=dev)
            expected = torch.cat([values(r, rank * count, count) for r in range(n)]).to(tdtype)

            def launch():
                return dist.all_to_all_single(recv, send, async_op=True)

        # 1. the checked call on fresh inputs
        try:
            with self.watchdog.step(f"{label}: check", self.config.timeout_s):
                wait_all([launch()], dev, self.config.timeout_s)
        except _Timeout as exc:
            entry.update(status="TIMEOUT", reason=f"{exc} (a peer is stuck or gone)", abandon=True)
            return entry
        except Exception as exc:  # noqa: BLE001 - an unsupported op on this backend, a broken link
            entry.update(status="ERROR", reason=f"{type(exc).__name__}: {exc}"[:300], abandon=True)
            return entry
        mismatch = recv != expected
        entry["wrong"] = int(mismatch.sum())
        if collective == "all_gather" and entry["wrong"]:
            entry["wrong_by_source"] = [int(x) for x in mismatch.view(n, count).sum(dim=1).tolist()]
        if entry["wrong"] or entry.get("sent_wrong"):
            entry["status"] = "FAIL"
            entry["reason"] = f"{entry['wrong']} of {recv.numel()} elements wrong"
            if entry.get("sent_wrong"):
                entry["reason"] += f"; this rank's own contribution had {entry['sent_wrong']} wrong elements"
        # 2. warmup and timed calls (values no longer matter)
        try:
            with self.watchdog.step(f"{label}: timing", self.config.timeout_s):
                if self.warmup:
                    wait_all([launch() for _ in range(self.warmup)], dev, self.config.timeout_s)
                seconds = self._timed(launch)
        except _Timeout as exc:
            entry.update(status="TIMEOUT", reason=f"timing: {exc} (a peer is stuck or gone)", abandon=True)
            return entry
        except Exception as exc:  # noqa: BLE001
            entry.update(status="ERROR", reason=f"timing: {type(exc).__name__}: {exc}"[:300], abandon=True)
            return entry
        entry["time_us"] = seconds * 1e6
        entry["algbw_gbps"] = op_bytes / seconds / 1e9 if seconds > 0 else None
        entry["busbw_gbps"] = entry["algbw_gbps"] * busbw_factor(collective, n) if entry["algbw_gbps"] is not None else None
        return entry

    def _timed(self, launch: Callable[[], Any]) -> float:
        import torch
        dev = self.device
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            works = [launch() for _ in range(self.iters)]
            # NCCL runs on its own stream: wait() (non-blocking for the CPU) orders the current
            # stream after it, so that the end event measures the collectives.
            for work in works:
                work.wait()
            end.record()
            wait_all(works, dev, self.config.timeout_s)
            return start.elapsed_time(end) / 1e3 / self.iters
        begin = time.perf_counter()
        wait_all([launch() for _ in range(self.iters)], dev, self.config.timeout_s)
        return (time.perf_counter() - begin) / self.iters

    # ----- the end
    def _on_stuck(self, step: str, elapsed: float) -> None:
        """Watchdog thread: the main thread is stuck in `step`. Report it, take part in the
        verdict from this thread, and end the process (the stuck thread cannot be joined)."""
        with self._lock:
            self.result["stuck_step"] = step
        self._mark("TIMEOUT", f"stuck for {elapsed:.0f} s in {step}")
        self.dirty = True
        code = self._finish()
        _hard_exit(code)

    def _finish(self) -> int:
        with self._lock:
            if self._finishing:
                return self._code if self._code is not None else 1
            self._finishing = True
        own = self._snapshot()
        code = 1
        try:
            self._set(f"result/{self.rank}", own)
            self._count("results_count", 1)
            code = self._gather_and_report(own) if self.rank == 0 else self._await_verdict(own)
        except Exception:  # noqa: BLE001 - the store went away (rank 0 died): we cannot confirm health
            code = 1 if own["status"] not in _GOOD or self.rank != 0 else code
        self._code = code
        return code

    def _gather_and_report(self, own: Dict[str, Any]) -> int:
        results: Dict[int, Dict[str, Any]] = {0: own}
        deadline = time.monotonic() + self.gather_wait
        while len(results) < self.world and time.monotonic() < deadline:
            for r in range(1, self.world):
                if r not in results and self._has(f"result/{r}"):
                    results[r] = self._get(f"result/{r}")
            if len(results) < self.world:
                time.sleep(0.1)
        hellos = {}
        for r in range(self.world):
            if r not in results and self._has(f"hello/{r}"):
                hellos[r] = self._get(f"hello/{r}")
        report = summarize(results, self.world, self.config, hellos=hellos,
                           missing_reason=f"no result within {self.gather_wait:.0f} s of rank 0 finishing: "
                                          "the rank hung or died",
                           launcher=self.env.launcher, sizes=self.sizes, iters=(self.warmup, self.iters))
        code = report["summary"]["exit_code"]
        if self.on_report:
            try:
                self.on_report(report)
            finally:
                _flush()
        self._set("verdict", code)
        # Wait (briefly) until the ranks read the verdict: under a bare srun rank 0 hosts the store.
        alive = len(results) - 1
        ack_deadline = time.monotonic() + 10.0
        while self._count("ack") < alive and time.monotonic() < ack_deadline:
            time.sleep(0.05)
        return code

    def _await_verdict(self, own: Dict[str, Any]) -> int:
        deadline = time.monotonic() + self.gather_wait + 60.0
        while time.monotonic() < deadline:
            if self._has("verdict"):
                code = int(self._get("verdict"))
                self._count("ack", 1)
                return code
            time.sleep(0.1)
        return 1


def collective_reason(entries: Sequence[Dict[str, Any]]) -> str:
    """One sentence per failing collective instead of one per size: which status, how many of
    its sizes, and the first failure's own words."""
    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for entry in entries:
        if entry["status"] not in _GOOD:
            groups.setdefault((entry["collective"], entry["status"]), []).append(entry)
    parts = []
    for (name, status), bad in groups.items():
        total = sum(1 for e in entries if e["collective"] == name)
        first = bad[0]
        parts.append(f"{name} {status} at {len(bad)} of {total} sizes/dtypes (first: {first['dtype']} "
                     f"{format_size(first.get('bytes') or first['requested_bytes'])}: {first.get('reason', '')})")
    return "; ".join(parts)


def _plant_rank(environ, name: str) -> Optional[int]:
    value = (environ if environ is not None else os.environ).get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: expected a rank number, got {value!r}") from None


def _plant_step(environ) -> str:
    value = (environ if environ is not None else os.environ).get(PLANT_HANG_STEP_ENV) or "collective"
    if value not in ("collective", "local"):
        raise ValueError(f"{PLANT_HANG_STEP_ENV}: expected collective or local, got {value!r}")
    return value


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _hostname() -> str:
    import socket
    return socket.gethostname()


def _platform_report() -> Dict[str, Any]:
    from . import platform
    return platform.collect()


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _hard_exit(code: int) -> None:
    """End the process now: with a collective still in flight (or a stuck thread) a normal
    interpreter shutdown can hang in the backend's destructors."""
    _flush()
    os._exit(code)


# --------------------------------------------------------------------------- the fleet report
def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(results: Dict[int, Dict[str, Any]], world_size: int, config: FleetConfig, *,
              hellos: Optional[Dict[int, Dict[str, Any]]] = None, missing_reason: str = "no result",
              launcher: str = "", sizes: Sequence[int] = (), iters: Tuple[int, int] = (0, 0)) -> Dict[str, Any]:
    """The fleet report from every rank's result (missing ranks become TIMEOUT): per-rank status,
    throughput against the fleet median, per-collective aggregates, suspects and the exit code."""
    hellos = hellos or {}
    ranks: List[Dict[str, Any]] = []
    for r in range(world_size):
        if r in results:
            ranks.append(dict(results[r]))
        else:
            hello = hellos.get(r, {})
            ranks.append({"rank": r, "host": hello.get("host", "unknown"), "local_rank": hello.get("local_rank"),
                          "device": hello.get("device"), "device_name": hello.get("device_name"),
                          "status": "TIMEOUT", "reason": missing_reason, "missing": True,
                          "battery": {"status": "SKIP", "reason": "no result"}, "probes": {}, "collectives": []})

    # Throughput against the fleet median.
    medians: Dict[str, Optional[float]] = {}
    for probe, metric in (("matmul", "tflops"), ("copy", "gbps")):
        values = [row["probes"][probe][metric] for row in ranks
                  if isinstance(row.get("probes", {}).get(probe), dict) and row["probes"][probe].get(metric)]
        medians[f"{probe}_{metric}"] = _median(values)
        for row in ranks:
            value = row.get("probes", {}).get(probe, {}).get(metric) if isinstance(row.get("probes"), dict) else None
            median = medians[f"{probe}_{metric}"]
            if value and median:
                row["probes"][probe]["fraction_of_median"] = value / median
                row["probes"][probe]["slow"] = value < config.outlier_fraction * median

    slow = [row["rank"] for row in ranks
            if any(isinstance(p, dict) and p.get("slow") for p in row.get("probes", {}).values())]

    # Battery failures every rank shares are the software stack, not a node.
    failing_sets = [set(row["battery"].get("failing", [])) for row in ranks
                    if row.get("battery", {}).get("status") not in (None, "SKIP") and "failing" in row["battery"]]
    fleet_wide = sorted(set.intersection(*failing_sets)) if len(failing_sets) >= 2 else []

    # Per collective, dtype and size: the aggregate over ranks.
    groups: Dict[Tuple[str, str, int], List[Dict[str, Any]]] = {}
    for row in ranks:
        for entry in row.get("collectives", []):
            groups.setdefault((entry["collective"], entry["dtype"], entry["requested_bytes"]), []).append(entry)
    collectives = []
    for (name, dtype, requested), entries in groups.items():
        times = [e["time_us"] for e in entries if e.get("time_us")]
        op_bytes = next((e["bytes"] for e in entries if e.get("bytes")), None)
        time_us = statistics.mean(times) if times else None
        algbw = op_bytes / (time_us / 1e6) / 1e9 if time_us and op_bytes else None
        collectives.append({
            "collective": name, "dtype": dtype, "bytes": op_bytes or requested, "requested_bytes": requested,
            "status": worst_status([e["status"] for e in entries]),
            "wrong": sum(e.get("wrong", 0) or 0 for e in entries),
            "ranks_wrong": [row["rank"] for row in ranks for e in row.get("collectives", [])
                            if e is not None and e["collective"] == name and e["dtype"] == dtype
                            and e["requested_bytes"] == requested and e.get("wrong")],
            "time_us": time_us, "algbw_gbps": algbw,
            "busbw_gbps": algbw * busbw_factor(name, world_size) if algbw is not None else None,
            "ranks_reported": len(entries),
        })

    # Who to blame: ranks that hung or vanished, ranks whose own checks failed (unless every rank
    # fails the same way), ranks that sent wrong data. With none of those, every failing rank.
    bad = [row for row in ranks if row["status"] not in _GOOD]
    suspects = set()
    for row in ranks:
        if row.get("missing") or row.get("stuck_step"):
            suspects.add(row["rank"])
        if any(e.get("sent_wrong") for e in row.get("collectives", [])):
            suspects.add(row["rank"])
        probes = row.get("probes", {})
        if any(isinstance(p, dict) and p.get("status") not in _GOOD for p in probes.values()):
            suspects.add(row["rank"])
        battery = row.get("battery", {})
        if battery.get("status") not in (None, "PASS", "SKIP"):
            own = set(battery.get("failing", [])) - set(fleet_wide)
            if own or not battery.get("failing"):
                suspects.add(row["rank"])
    if slow and config.fail_slow:
        suspects.update(slow)
    if bad and not suspects:
        suspects = {row["rank"] for row in bad}
    suspects_sorted = sorted(suspects)
    hosts = sorted({ranks[r].get("host", "unknown") for r in suspects_sorted})
    exit_code = 1 if bad or (slow and config.fail_slow) else 0

    first = next((row for row in ranks if row.get("platform")), {})
    platform_report = first.get("platform") or {}
    try:
        from .platform import fingerprint_key, summary_line
        fingerprint, machine = fingerprint_key(platform_report), summary_line(platform_report)
    except Exception:  # noqa: BLE001
        fingerprint, machine = None, None
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "date": _now(),
        "world_size": world_size,
        "launcher": launcher,
        "backend": first.get("backend"),
        "platform_fingerprint": fingerprint,
        "machine": machine,
        "config": {**config.to_dict(), "sizes_used": list(sizes), "warmup_iters": iters[0], "timed_iters": iters[1]},
        "summary": {
            "status": "HEALTHY" if exit_code == 0 else "UNHEALTHY",
            "exit_code": exit_code,
            "hosts": sorted({row.get("host", "unknown") for row in ranks}),
            "failing_ranks": [row["rank"] for row in bad],
            "suspect_ranks": suspects_sorted,
            "suspect_hosts": hosts,
            "slow_ranks": slow,
            "fleet_wide_battery_failures": fleet_wide,
            "medians": medians,
            "outlier_fraction": config.outlier_fraction,
        },
        "collectives": collectives,
        "ranks": ranks,
    }


def run(config: Optional[FleetConfig] = None, *, on_report: Optional[Callable[[Dict[str, Any]], None]] = None,
        environ=None) -> int:
    """Run this process's rank of the fleet check; returns the exit code every rank agrees on.

    `on_report(report)` is called on rank 0 only, with the fleet report, before any rank exits.
    When a collective had to be abandoned (a peer hung) or this rank's main thread is stuck, the
    process ends here through os._exit with that code: a process with a collective in flight
    cannot shut down cleanly.
    """
    config = (config or FleetConfig()).validate()
    env = launch_env(environ)
    return _RankRun(config, env, on_report, environ).run()
