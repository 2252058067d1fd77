"""Probes of a 2-process all_reduce (NCCL/RCCL on GPUs, gloo on the CPU) with a deadline: a hang
or a wrong sum confirms the entry."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Sequence

import torch

from .base import finding, first_line, inconclusive, probe


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _all_reduce_worker(rank: int, world: int, port: int, device_type: str, sizes: Sequence[int], queue) -> None:
    import datetime
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if device_type == "cuda" else "gloo"
    try:
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        dev = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        report = []
        expected = world * (world + 1) / 2
        for size in sizes:
            tensor = torch.full((max(1, size // 4),), float(rank + 1), device=dev)
            if device_type == "cuda":
                torch.cuda.synchronize(dev)
            start = time.monotonic()
            dist.all_reduce(tensor)
            if device_type == "cuda":
                torch.cuda.synchronize(dev)
            seconds = time.monotonic() - start
            wrong = int((tensor != expected).sum())
            report.append({"bytes": size, "seconds": seconds, "wrong": wrong})
        dist.destroy_process_group()
        queue.put({"rank": rank, "report": report})
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        queue.put({"rank": rank, "error": first_line(exc)})


def _all_reduce(dev: torch.device, sizes: Sequence[int], deadline_s: float = 45.0) -> Dict[str, Any]:
    import multiprocessing
    if dev.type == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            return inconclusive("needs at least two GPUs visible to this process")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    workers = [context.Process(target=_all_reduce_worker, args=(rank, 2, port, dev.type, list(sizes), queue),
                               daemon=True) for rank in range(2)]
    for worker in workers:
        worker.start()
    answers: Dict[int, Dict[str, Any]] = {}
    end = time.monotonic() + deadline_s
    while len(answers) < 2 and time.monotonic() < end:
        try:
            answer = queue.get(timeout=max(0.1, min(1.0, end - time.monotonic())))
            answers[answer["rank"]] = answer
        except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the deadline
            if not any(worker.is_alive() for worker in workers) and queue.empty():
                break
    for worker in workers:
        worker.join(timeout=1)
        if worker.is_alive():
            worker.kill()
    backend = "NCCL/RCCL" if dev.type == "cuda" else "gloo"
    if len(answers) < 2:
        missing = sorted(set(range(2)) - set(answers))
        return finding(True, f"2-process {backend} all_reduce did not finish within {deadline_s:g} s "
                             f"(rank {', '.join(map(str, missing))} silent: a hang)")
    errors = [f"rank {rank}: {answer['error']}" for rank, answer in sorted(answers.items()) if "error" in answer]
    if errors:
        return finding(True, f"2-process {backend} all_reduce failed: {'; '.join(errors)}")
    rows = answers[0]["report"]
    wrong = sum(row["wrong"] for answer in answers.values() for row in answer["report"])
    slowest = max(rows, key=lambda row: row["seconds"])
    sizes_text = ", ".join(dict.fromkeys(_bytes(row["bytes"]) for row in rows))   # each size once
    return finding(wrong > 0, f"2-process {backend} all_reduce over {sizes_text}: {wrong} wrong elements; "
                              f"slowest {slowest['seconds'] * 1e3:.1f} ms at {_bytes(slowest['bytes'])}",
                   sizes=[row["bytes"] for row in rows], seconds=[row["seconds"] for row in rows], wrong=wrong)


def _bytes(count: int) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} B"


@probe
def all_reduce_timed(dev: torch.device) -> Dict[str, Any]:
    """A 2-process all_reduce of 4 MiB with a deadline: a hang or wrong sum confirms the issue."""
    return _all_reduce(dev, [4 * 2 ** 20])


@probe
def all_reduce_size_sweep(dev: torch.device) -> Dict[str, Any]:
    """A 2-process all_reduce from 8 B to 4 MiB (the failures start at 512 KiB)."""
    return _all_reduce(dev, [8, 1024, 64 * 1024, 512 * 1024, 2 ** 20, 4 * 2 ** 20])


@probe
def all_reduce_small_repeated(dev: torch.device) -> Dict[str, Any]:
    """A 2-process all_reduce of small messages (1 KiB to 384 KiB, under the 512 KiB MSCCL range),
    each size 25 times: any wrong element confirms (ROCm/rccl#1960: MSCCL data corruption on gfx950)."""
    return _all_reduce(dev, [1024, 8 * 1024, 64 * 1024, 384 * 1024] * 25)


def unreduced_tail_finding(outputs: Dict[int, torch.Tensor], inputs: Dict[int, torch.Tensor]) -> Dict[str, Any]:
    """Decide NVIDIA/nccl#1950: an AVG all_reduce over one rank must return its input unchanged
    (up to one rounding of x / 1); confirmed when any element differs, with the count of wrong
    trailing elements per size."""
    wrong = {}
    for count, out in outputs.items():
        expected = inputs[count].detach().cpu().float()
        got = out.detach().cpu().float()
        bad = (got != expected) & ~(torch.isnan(got) & torch.isnan(expected))
        if bad.any():
            wrong[count] = {"wrong": int(bad.sum()), "first": int(bad.nonzero()[0, 0])}
    sizes = ", ".join(str(count) for count in outputs)
    if wrong:
        count, worst = max(wrong.items(), key=lambda item: item[1]["wrong"])
        return finding(True, f"1-rank AVG all_reduce changed its input: {worst['wrong']} of {count} bf16 elements "
                             f"wrong from index {worst['first']} ({len(wrong)} of {len(outputs)} sizes affected)",
                       wrong=wrong)
    return finding(False, f"1-rank AVG all_reduce returned its input unchanged for {len(outputs)} sizes ({sizes} "
                          f"bf16 elements)", wrong={})


@probe(gpu=True)
def all_reduce_one_rank_avg(dev: torch.device) -> Dict[str, Any]:
    """AVG all_reduce in a 1-rank NCCL/RCCL group on bf16 tensors whose length is not a multiple of
    the block count: the input must come back unchanged (NVIDIA/nccl#1950, pytorch/pytorch#168092:
    the last elements are left unreduced)."""
    import datetime
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_nccl_available():
        return inconclusive("torch.distributed has no NCCL/RCCL backend in this build")
    torch.cuda.set_device(dev)
    store = dist.TCPStore("127.0.0.1", _free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    try:
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    except (RuntimeError, ValueError) as exc:
        return inconclusive(f"a 1-rank NCCL group could not start: {first_line(exc)}")
    inputs, outputs = {}, {}
    try:
        for count in (1000, 4099, 65543, 1048583):
            inputs[count] = torch.randn(count, generator=torch.Generator().manual_seed(count)).to(dev, torch.bfloat16)
            tensor = inputs[count].clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
            outputs[count] = tensor
        torch.cuda.synchronize(dev)
    finally:
        dist.destroy_process_group()
    return unreduced_tail_finding(outputs, inputs)
