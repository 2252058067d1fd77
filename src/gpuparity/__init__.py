"""gpuparity: the same answers, fast, on CUDA, ROCm and CPU; and where and why they differ."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
