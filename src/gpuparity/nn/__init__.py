"""Drop-in modules with torch.nn's state_dicts, backed by gpuparity's verified ops."""
from __future__ import annotations

from .patch import patch

__all__ = ["patch"]
