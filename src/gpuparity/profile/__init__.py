"""Memory and kernel profiles: MemoryProfiler (peak and current memory per named phase),
find_batch_size (the largest batch that fits), KernelProfiler (top kernels over N steps) and
compare_profiles (two machines side by side). In a training script, `gpuparity.profile.phase(name)`
and `gpuparity.profile.step()` reach whichever profiler `gpuparity profile ...` runs the script
under, and do nothing otherwise."""
from __future__ import annotations

from .compare import compare_profiles
from .kernels import KernelProfiler, step
from .memory import MemoryProfiler, PhaseRecord, find_batch_size, format_table, phase

__all__ = ["MemoryProfiler", "PhaseRecord", "find_batch_size", "format_table", "phase", "KernelProfiler", "step",
           "compare_profiles"]
