"""The collectives each rank runs: exact integer inputs whose sums every dtype holds, one
collective checked element by element and then timed, and the per-rank reason for failures."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

from .config import _GOOD, busbw_factor, format_size
from .watchdog import Watchdog, _Timeout, wait_all


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


def check_collective(collective: str, dtype: str, nbytes: int, corrupt: bool, *, rank: int, world: int, device,
                     watchdog: Watchdog, timeout_s: float, warmup: int, iters: int) -> Dict[str, Any]:
    """One collective at one dtype and size: a checked call on exact inputs (wrong elements
    counted), then `warmup` and `iters` timed calls for algbw and busbw. Every wait has a
    deadline; `abandon` in the entry says the process group cannot be used after it."""
    import torch
    import torch.distributed as dist
    n, dev = world, device
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
        with watchdog.step(f"{label}: check", timeout_s):
            wait_all([launch()], dev, timeout_s)
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
        with watchdog.step(f"{label}: timing", timeout_s):
            if warmup:
                wait_all([launch() for _ in range(warmup)], dev, timeout_s)
            seconds = _timed(launch, dev, iters, timeout_s)
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


def _timed(launch: Callable[[], Any], dev, iters: int, timeout_s: float) -> float:
    """Seconds per call of `iters` back-to-back launches: CUDA events on a GPU, a wall clock on the CPU."""
    import torch
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        works = [launch() for _ in range(iters)]
        # NCCL runs on its own stream: wait() (non-blocking for the CPU) orders the current
        # stream after it, so that the end event measures the collectives.
        for work in works:
            work.wait()
        end.record()
        wait_all(works, dev, timeout_s)
        return start.elapsed_time(end) / 1e3 / iters
    begin = time.perf_counter()
    wait_all([launch() for _ in range(iters)], dev, timeout_s)
    return (time.perf_counter() - begin) / iters


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
