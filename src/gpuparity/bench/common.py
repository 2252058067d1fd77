"""Timing, memory and result files shared by every benchmark. Times are medians of
triton.testing.do_bench on a GPU (CUDA events), or of a wall clock on the CPU."""
from __future__ import annotations

import dataclasses
import datetime
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import platform
from ..checks.results import clip
from .names import DTYPE_NAMES, GRAPH, MODES


@dataclasses.dataclass
class BenchRow:
    bench: str                 # "attention", "norm", "rope"
    shape: str                 # a label, e.g. "bert (32,12,512,64)"
    backend: str
    dtype: str
    mode: str                  # "fwd" or "fwd+bwd"
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    time_ms: Optional[float] = None
    tflops: Optional[float] = None
    gbps: Optional[float] = None
    peak_mem_bytes: Optional[int] = None
    status: str = "ok"         # ok | skip | error
    reason: str = ""


@dataclasses.dataclass
class BenchResult:
    """What a bench returns: its rows and the run's metadata (platform, ceilings, summary);
    report/bench_table.py renders it, the JSON file is `{**meta, "rows": rows}`."""
    bench: str                 # "attention", "norm", "rope": which table shows it
    rows: List[BenchRow]
    meta: Dict[str, Any]
    backends: List[str]        # the columns, in the order asked for
    title: str                 # what was run, e.g. "RMSNorm / LayerNorm, bf16, cpu"

    @property
    def failed(self) -> bool:
        """A peer raised (a skip is not a failure): the command exits 1."""
        return any(row.status == "error" for row in self.rows)

    def as_dict(self) -> Dict[str, Any]:
        return {**self.meta, "rows": [dataclasses.asdict(row) for row in self.rows]}


DTYPES = dict(zip(DTYPE_NAMES, (torch.bfloat16, torch.float16, torch.float32)))


def time_ms(fn: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of fn() in milliseconds."""
    if torch.cuda.is_available():
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    samples = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while time.perf_counter() < deadline or len(samples) < 3:
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _host_counts(calls: Optional[int], rounds: Optional[int]) -> Tuple[int, int]:
    """(calls, rounds) of a host timing: 20 / 7 where a GPU is present, else 3 / 1; each >= 1."""
    cuda = torch.cuda.is_available()
    calls = (20 if cuda else 3) if calls is None else calls
    rounds = (7 if cuda else 1) if rounds is None else rounds
    if calls < 1:
        raise ValueError(f"calls: expected at least 1, got {calls}")
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    return calls, rounds


def host_time_ms(fn: Callable[[], Any], *, calls: Optional[int] = None, rounds: Optional[int] = None) -> float:
    """Host (CPU) time to issue one fn() in ms: the median over `rounds` rounds of `calls`
    back-to-back calls on the host clock with no synchronize between them (one synchronize
    before and after each round). Few enough calls that a GPU's launch queue never fills (a
    full queue would make the host wait for the device, and this would read device time); the
    median of rounds, because one round on a shared host varies by 2x (measured on an H100
    host: 330-580 us per round for one call). calls / rounds: 20 / 7 where a GPU is present,
    else 3 / 1 (on the CPU, where fn runs to completion, this is its wall time)."""
    cuda = torch.cuda.is_available()
    calls, rounds = _host_counts(calls, rounds)
    per_round = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - start) * 1e3 / calls)
        if cuda:
            torch.cuda.synchronize()   # drain the queue: the next round starts idle
    return statistics.median(per_round)


def interleaved_host_ms(fns: Dict[str, Callable[[], Any]], *, calls: Optional[int] = None,
                        rounds: Optional[int] = None) -> Dict[str, float]:
    """host_time_ms of several functions (e.g. one eager step per backend), their rounds taken in
    turn (round 1 of each, then round 2 of each, ...): a shared host's speed drifts by more than
    backends differ over the seconds sequential rounds take (measured on an H100 host: one
    backend's eager step moved 0.387 -> 0.510 ms between two runs minutes apart), and taken in
    turn every backend sees the same drift. The median round per function; a function that
    raises is left out of the result (its other rounds are not taken)."""
    calls, rounds = _host_counts(calls, rounds)
    per_round: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if name not in per_round:
                continue
            try:
                per_round[name].append(host_time_ms(fn, calls=calls, rounds=1))
            except Exception:  # noqa: BLE001 - its device timing already ran; no host column then
                del per_round[name]
    return {name: statistics.median(times) for name, times in per_round.items()}


def split_mode(mode: str):
    """("fwd+bwd", True) for "fwd+bwd:graph": the mode, and whether it runs as a CUDA graph."""
    return (mode[:-len(GRAPH)], True) if mode.endswith(GRAPH) else (mode, False)


def graphed(step: Callable[[], Any]) -> Callable[[], None]:
    """`step` captured once in a CUDA graph; the returned function replays it. This times the
    kernels without the per-call host work (Python, autograd, launches), as a training loop
    under torch.cuda.graphs or torch.compile(mode="reduce-overhead") runs them. Raises when
    there is no GPU or `step` cannot be captured."""
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA graphs need a GPU")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles, allocator) off the capture
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def graph_unavailable(row: "BenchRow", graph: bool, device: torch.device) -> bool:
    """Mark a CUDA-graph row that cannot run on `device` as a SKIP with the reason; True if so."""
    if graph and device.type != "cuda":
        row.status, row.reason = "skip", "CUDA graphs need a GPU"
        return True
    return False


def record_failure(row: "BenchRow", exc: Exception, graph: bool = False) -> None:
    """A peer that raised is an "error" row with the reason; one that only cannot be captured in a
    CUDA graph is a "skip" (a gap in that column, not a failure of the run)."""
    text = str(exc).strip()
    row.status = "skip" if graph else "error"
    row.reason = ("cannot be captured in a CUDA graph: " if graph else "") + \
        f"{type(exc).__name__}: {clip(text.splitlines()[0], 200) if text else ''}"


def peak_memory_bytes(fn: Callable[[], Any]) -> Optional[int]:
    """Peak memory allocated during fn() beyond what was allocated before (GPU only)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - before)


def measure_ceilings() -> Dict[str, float]:
    """The two ceilings of docs/targets.md, measured now: copy bandwidth and bf16 matmul rate."""
    if not torch.cuda.is_available():
        return {}
    n = 1 << 28  # 512 MiB of bf16 each way
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    size = 8192
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    mm_ms = time_ms(lambda: a @ b)
    del src, dst, a, b
    torch.cuda.empty_cache()
    return {"copy_tbps": 2 * n * 2 / copy_ms / 1e9, "bf16_matmul_tflops": 2 * size ** 3 / mm_ms / 1e9}


# --------------------------------------------------------------------------- estimates and interruptions
# Rough costs for the estimate a bench reports before it starts (the CLI says it up front):
# on a CPU a call costs its FLOPs at CPU_FLOPS (bf16 attention on a shared 2-core machine:
# 0.5-3 GFLOP/s measured, more on an idle one), and a timed CPU measurement makes about
# CPU_CALLS calls (a warm-up, at least 3 timed, the host-time round); on a GPU each measurement
# is do_bench's warm-up and repetitions, about GPU_MEASURE_S. A torch.compile peer (flex,
# compile) adds COMPILE_S per shape and mode.
CPU_FLOPS = 1e9
CPU_CALLS = 9
GPU_MEASURE_S = 0.4
COMPILE_S = 20.0


def estimate_seconds(device: str, calls_flops: float, rep_ms: float = 100.0) -> float:
    """Rough seconds of one measurement whose call does `calls_flops` FLOPs (0: unknown)."""
    if not str(device).startswith("cpu"):
        return GPU_MEASURE_S + rep_ms / 1e3
    return CPU_CALLS * calls_flops / CPU_FLOPS + rep_ms / 1e3


def finished_rows(rows: Sequence["BenchRow"]) -> List["BenchRow"]:
    """The rows that finished: a row made but not yet timed when a run was stopped is left out."""
    return [row for row in rows if row.status != "ok" or row.time_ms is not None]


def attach_partial(exc: BaseException, result: "BenchResult") -> None:
    """An interrupted bench (SIGINT, or SIGTERM through the CLI): `result`, the rows that
    finished, marked partial in its metadata, rides on the exception the bench re-raises
    (exc.partial_result) for the caller to render and write."""
    result.meta["partial"] = True
    result.meta["interrupted"] = getattr(exc, "signal_name", "SIGINT")
    exc.partial_result = result


def metadata(command: str) -> Dict[str, Any]:
    """schema_version, date, the command line that reproduces the run, and the platform."""
    report = platform.current()
    return {
        "schema_version": 1,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "platform": report,
        "machine": platform.summary_line(report),
    }



# ----------------------------------------------------------------------------- GB/s benches (norm, rope)


def timed(fn: Callable[[], object], rep_ms: float, graph: bool = False) -> float:
    """Median ms of fn(); graph=True captures fn in a CUDA graph and times its replays."""
    if graph:
        fn = graphed(fn)
    fn()  # compile / autotune / first-launch work stays out of the timing
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time_ms(fn, warmup_ms=max(10.0, rep_ms / 4), rep_ms=rep_ms)


def time_row(row: "BenchRow", mode: str, device: torch.device, rep_ms: float, forward: Callable[[], object],
             make_step: Callable[[], Callable[[], object]], bytes_fwd: int, bytes_fwd_bwd: int) -> None:
    """Time one GB/s row in its mode: `forward` under no_grad, or the forward+backward step that
    make_step() builds; GB/s from the bytes the mode moves. A CUDA-graph mode off the GPU is a
    skip, a peer that raises is the row's error (see record_failure)."""
    base, graph = split_mode(mode)
    if graph_unavailable(row, graph, device):
        return
    try:
        if base == "fwd":
            with torch.no_grad():
                row.time_ms = timed(forward, rep_ms, graph)
            moved = bytes_fwd
        else:
            row.time_ms = timed(make_step(), rep_ms, graph)
            moved = bytes_fwd_bwd
        row.gbps = moved / row.time_ms / 1e6
    except Exception as exc:  # noqa: BLE001 - one failing peer is a row, not the end
        record_failure(row, exc, graph)


def fresh_compile() -> None:
    """Forget torch.compile's graphs so each shape gets its own static compile (as a user
    compiling one model would), rather than dynamo's dynamic-shape fallback or, past its
    recompile limit, silent eager."""
    import torch._dynamo
    torch._dynamo.reset()


def versions() -> Dict[str, str]:
    out = {"torch": torch.__version__}
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        out["triton"] = "not importable"
    try:
        import liger_kernel  # noqa: F401
        from importlib.metadata import version
        out["liger-kernel"] = version("liger-kernel")
    except Exception:  # noqa: BLE001
        out["liger-kernel"] = "not installed"
    return out


OURS = "triton"


def summarise(rows: List[BenchRow], ours: str = OURS) -> List[Dict[str, object]]:
    """Per (shape, mode): our GB/s, the best peer and the ratio."""
    groups: Dict[Tuple[str, str], List[BenchRow]] = {}
    for row in rows:
        if row.status == "ok" and row.gbps:
            groups.setdefault((row.shape, row.mode), []).append(row)
    out = []
    for (shape, mode), members in groups.items():
        mine = [r for r in members if r.backend == ours]
        peers = [r for r in members if r.backend != ours]
        best = max(peers, key=lambda r: r.gbps) if peers else None
        out.append({"shape": shape, "mode": mode, "ours_gbps": mine[0].gbps if mine else None,
                    "best_peer": best.backend if best else None, "best_peer_gbps": best.gbps if best else None,
                    "ratio": (mine[0].gbps / best.gbps) if (mine and best) else None})
    return out


def gbps_result(bench: str, rows: List[BenchRow], meta: Dict[str, Any], backends: Sequence[str],
                title: str) -> BenchResult:
    """A GB/s bench's result, its metadata completed with the per-(shape, mode) summary."""
    meta["summary"] = summarise(rows)
    return BenchResult(bench, rows, meta, list(backends), title)


def run_gbps(bench: str, run_rows: Callable[[List[BenchRow]], object], meta: Dict[str, Any],
             backends: Sequence[str], title: str) -> BenchResult:
    """gbps_result of the rows run_rows(rows) appends; interrupted, the rows that finished ride on
    the re-raised exception as a partial result (attach_partial)."""
    rows: List[BenchRow] = []
    try:
        run_rows(rows)
    except KeyboardInterrupt as exc:
        attach_partial(exc, gbps_result(bench, finished_rows(rows), meta, backends, title))
        raise
    return gbps_result(bench, rows, meta, backends, title)


CPU_BYTES_PER_S = 5e9   # a rough CPU rate of a norm or rotation, bytes moved per second


def estimate_gbps(case_bytes: Sequence[float], backends: Sequence[str], modes: Sequence[str], device,
                  rep_ms: float) -> Dict[str, Any]:
    """What a GB/s bench will do and roughly how long it takes, before it starts: one
    measurement per case, backend and mode; case_bytes: what each case's forward moves."""
    cpu = str(device).startswith("cpu")
    run_modes = [m for m in modes if not (cpu and m.endswith(GRAPH))]
    seconds = 0.0
    for moved in case_bytes:
        for backend in backends:
            for mode in run_modes:
                calls = CPU_CALLS * moved * (1 if mode.startswith("fwd") and "bwd" not in mode else 2.5)
                seconds += (calls / CPU_BYTES_PER_S + 1.25 * rep_ms / 1e3) if cpu else \
                    estimate_seconds(str(device), 0.0, 1.25 * rep_ms)
                seconds += COMPILE_S if backend == "compile" else 0.0
    return {"shapes": len(case_bytes), "backends": len(backends), "modes": len(modes),
            "measurements": len(case_bytes) * len(backends) * len(modes), "seconds": seconds}


def gbps_metadata(command: str, device: torch.device, ceilings: bool) -> Dict[str, Any]:
    """metadata() plus library versions and, on a GPU when asked, the copy/matmul ceilings."""
    meta = metadata(command)
    meta["versions"] = versions()
    meta["ceilings"] = {} if not ceilings or device.type != "cuda" else measure_ceilings()
    return meta
