"""One rank of the fleet check as a state machine: connect, local checks, a store barrier, the
collectives, then the result exchange through the rendezvous store and one exit code for all."""
from __future__ import annotations

import datetime
import json
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .collectives import check_collective, collective_reason
from .config import (_GOOD, DEFAULT_ITERS, DEFAULT_SIZES, PLANT_HANG_ENV, PLANT_HANG_STEP_ENV, PLANT_WRONG_ENV,
                     FleetConfig, format_size, worst_status)
from .launch import LaunchEnv, launch_env
from .local import battery_summary, run_probes
from .summary import _now, summarize
from .watchdog import Watchdog, _flush, _hard_exit


class _RankRun:
    """One rank of the fleet check: local checks, barrier, collectives, result exchange.

    Every rank runs the quick battery and a matmul and a memory bandwidth probe on its own
    device (NCCL on CUDA, RCCL through the nccl backend on ROCm, gloo on CPU), then the ranks
    check all_reduce, all_gather, reduce_scatter, broadcast and all_to_all with inputs whose sums
    are exact (a count of wrong elements, as nccl-tests reports) and measure algbw and busbw.
    Results travel through the rendezvous store (not through a collective, which could hang);
    rank 0 builds the report and every rank exits with the same code."""

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
        from ..platform import _cpu_model
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
        from ..isolate import call_isolated
        outcome = call_isolated("gpuparity.fleet.local:run_probes", {"device": str(self.device)}, timeout=budget)
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
                entry = check_collective(collective, dtype, nbytes, plant_wrong and collective == "all_reduce",
                                         rank=self.rank, world=self.world, device=self.device,
                                         watchdog=self.watchdog, timeout_s=self.config.timeout_s,
                                         warmup=self.warmup, iters=self.iters)
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
    from .. import platform
    return platform.collect()


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


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
