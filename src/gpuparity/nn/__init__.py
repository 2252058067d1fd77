"""Drop-in modules with torch.nn's state_dicts, backed by gpuparity's verified ops. Swapping
them into an existing model is gpuparity.patch(model) (src/gpuparity/patching.py, a layer above)."""
from __future__ import annotations

from .attention import MultiheadAttention
from .norms import LayerNorm, RMSNorm

__all__ = ["MultiheadAttention", "RMSNorm", "LayerNorm"]
