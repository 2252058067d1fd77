"""Reference training workloads for parity between machines: `aam` (user story 1's sequence
transformer with padded, masked attention) and `cnn` (user story 2's conv-net crash scenario),
with seeded synthetic data, a shared training loop and a run-to-run comparison."""
from __future__ import annotations

from .compare import RunComparison, compare_runs, load_run
from .train import WORKLOADS, run

__all__ = ["run", "compare_runs", "load_run", "RunComparison", "WORKLOADS"]
