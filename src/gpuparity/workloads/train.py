"""The training loop shared by the workloads: seeded model and data (made on the CPU, so every
machine starts from the same weights and sees the same batches), one metrics row per step, an
evaluation at the end, and a JSON-able run record. `run(..., isolate=True)` trains in a fresh
process, so a GPU crash becomes a result with the last lines of stderr.
"""
from __future__ import annotations

import datetime
import math
import statistics
import time
from typing import Any, Callable, Dict, Optional

import torch

from .. import platform

SCHEMA_VERSION = 1
WORKLOADS = ("aam", "cnn")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_TIMEOUT_S = 1800.0

Progress = Callable[[int, int, Dict[str, float]], None]


def make_workload(name: str, *, size: str, seed: int = 0, attn: Optional[str] = None,
                  overrides: Optional[Dict[str, Any]] = None):
    if name == "aam":
        from .aam import AamWorkload
        return AamWorkload(size=size, seed=seed, attn=attn or "auto", overrides=overrides)
    if name == "cnn":
        from .cnn import CnnWorkload
        return CnnWorkload(size=size, seed=seed, attn=attn, overrides=overrides)
    raise ValueError(f"workload: expected one of {list(WORKLOADS)}, got {name!r}")


def default_size(device: str) -> str:
    return "small" if str(device).startswith("cpu") else "full"


def _to(batch: Dict[str, torch.Tensor], device) -> Dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def evaluate(workload, model: torch.nn.Module, device, dtype: torch.dtype) -> Dict[str, float]:
    """Mean metrics over the workload's evaluation batches (no gradient, eval mode)."""
    model.eval()
    totals: Dict[str, float] = {}
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        for index in range(workload.eval_batches):
            _, metrics = workload.step(model, _to(workload.eval_batch(index), device))
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value
    model.train()
    return {k: v / workload.eval_batches for k, v in totals.items()}


def train(workload, *, steps: int, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
          progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Train `workload` for `steps` steps; returns {"status", "error", "metrics": [...], "final": {...}}."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = workload.model().to(device)      # built on the CPU (seeded), then moved
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.lr, weight_decay=0.01)
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 and device.type == "cuda" else None
    rows = []
    status, error = "ok", ""
    model.train()
    for step in range(steps):
        batch = _to(workload.batch(step), device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss, metrics = workload.step(model, batch)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        metrics = {"step": step, **metrics, "time_ms": (time.perf_counter() - start) * 1e3}
        rows.append(metrics)
        if progress is not None:
            progress(step + 1, steps, metrics)
        if not math.isfinite(metrics["loss"]):
            status, error = "diverged", f"the loss became {metrics['loss']} at step {step}"
            break
    final = evaluate(workload, model, device, dtype) if status == "ok" else {}
    return {"status": status, "error": error, "metrics": rows, "final": final}


def run(name: str, *, attn: Optional[str] = None, steps: Optional[int] = None, device: str = "cpu",
        dtype: str = "float32", seed: int = 0, size: Optional[str] = None,
        overrides: Optional[Dict[str, Any]] = None, isolate: Optional[bool] = None,
        timeout: float = DEFAULT_TIMEOUT_S, progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Train a workload and return its run record (what `workload run --out` writes).

    size: "full" (user story 1's shape; the default on a GPU) or "small" (the default on the CPU).
    isolate: train in a fresh process (default: True for cnn, the crash scenario, else False).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of float32, bfloat16, float16, got {dtype!r}")
    size = size or default_size(device)
    workload = make_workload(name, size=size, seed=seed, attn=attn, overrides=overrides)  # validates early
    steps = workload.default_steps if steps is None else int(steps)
    if steps < 1:
        raise ValueError(f"steps: expected at least 1, got {steps}")
    isolate = (name == "cnn") if isolate is None else isolate
    record: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "kind": "gpuparity-workload-run", "workload": name,
        # aam's attention backend as asked: "auto" (dispatch picks per call) when none was named
        "attn": (attn or "auto") if name == "aam" else None, "device": str(device), "dtype": str(DTYPES[dtype]).replace("torch.", ""),
        "seed": seed, "size": size, "steps": steps, "config": workload.config(),
        "metric_names": list(workload.metrics), "isolated": bool(isolate),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    started = time.perf_counter()
    if isolate:
        from ..isolate import call_isolated
        outcome = call_isolated("gpuparity.workloads.train:run_json",
                                {"name": name, "attn": attn, "steps": steps, "device": str(device), "dtype": dtype,
                                 "seed": seed, "size": size, "overrides": overrides}, timeout=timeout)
        if outcome.ok:
            result = {k: outcome.value[k] for k in ("status", "error", "metrics", "final")}
        else:
            result = {"status": outcome.status, "error": outcome.error, "metrics": [], "final": {},
                      "stderr_tail": outcome.stderr_tail, "returncode": outcome.returncode}
    else:
        try:
            result = train(workload, steps=steps, device=device, dtype=DTYPES[dtype], seed=seed, progress=progress)
        except Exception as exc:  # noqa: BLE001 - a failing run is a result too
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "metrics": [], "final": {}}
    record.update(result)
    record["time_s"] = time.perf_counter() - started
    times = [row["time_ms"] for row in record["metrics"][1:]] or [row["time_ms"] for row in record["metrics"]]
    record["step_time_ms_median"] = statistics.median(times) if times else None
    record["platform"] = platform.collect()
    return record


def run_json(**kwargs) -> Dict[str, Any]:
    """The body of an isolated run (called in the child process)."""
    workload = make_workload(kwargs["name"], size=kwargs["size"], seed=kwargs["seed"], attn=kwargs["attn"],
                             overrides=kwargs.get("overrides"))
    return train(workload, steps=kwargs["steps"], device=kwargs["device"], dtype=DTYPES[kwargs["dtype"]],
                 seed=kwargs["seed"])
