"""FlashAttention 2.8's Python API on gpuparity: `import gpuparity.flash_attn as flash_attn` in
place of `import flash_attn`, or `gpuparity.flash_attn.install()` so that third-party code's own
`import flash_attn` / `from flash_attn.flash_attn_interface import ...` / `from
flash_attn.bert_padding import ...` gets this module, and its submodules `flash_attn.layers.rotary`,
`flash_attn.ops.triton.rotary`, `flash_attn.ops.triton.cross_entropy`,
`flash_attn.ops.triton.layer_norm` and `flash_attn.losses.cross_entropy` gpuparity's. FlashAttention's CUDA-extension modules
(`modules.mha`, `modules.mlp`, `ops.fused_dense`, `ops.activations`, `ops.layer_norm`,
`ops.rms_norm`) raise ImportError naming gpuparity's equivalent. docs/attention.md ("FlashAttention's API")
maps every argument and says what is fused and what is composed."""
from __future__ import annotations

import importlib.util
import logging
import sys

from . import bert_padding, flash_attn_interface
from .flash_attn_interface import (FlashAttnArgumentError, backends, flash_attn_func, flash_attn_kvpacked_func,
                                   flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                   flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                                   flash_attn_with_kvcache)

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
           "install", "uninstall", "FlashAttnArgumentError", "backends", "bert_padding", "flash_attn_interface"]

# the FlashAttention release whose Python API this module follows
__version__ = "2.8.4"

logger = logging.getLogger(__name__)
# the submodules install() registers as flash_attn.<path> (packages before their modules)
SUBMODULES = ("flash_attn_interface", "bert_padding", "layers", "layers.rotary", "ops", "ops.triton",
              "ops.triton.rotary", "ops.triton.cross_entropy", "ops.triton.layer_norm", "losses",
              "losses.cross_entropy", "modules")
_NAMES = ("flash_attn",) + tuple(f"flash_attn.{path}" for path in SUBMODULES)


def _ours(name: str) -> object:
    if name == "flash_attn":
        return sys.modules[__name__]
    return importlib.import_module(f"{__name__}.{name[len('flash_attn.'):]}")


def install(force: bool = False) -> None:
    """Register this module in sys.modules as `flash_attn`, and its submodules as
    `flash_attn.<path>` (SUBMODULES: flash_attn_interface, bert_padding, layers.rotary,
    ops.triton.rotary, ops.triton.cross_entropy, losses.cross_entropy and their packages), so that
    code importing FlashAttention gets gpuparity's. Refuses
    (RuntimeError) when a real flash_attn is installed or already imported, unless force=True.
    Imports done before install() keep what they imported. Undo with uninstall()."""
    if not isinstance(force, bool):
        raise TypeError(f"force: expected a bool, got {type(force).__name__} {force!r}")
    present = sys.modules.get("flash_attn")
    if present is sys.modules[__name__]:
        return
    real = present is not None
    if not real:
        try:
            real = importlib.util.find_spec("flash_attn") is not None
        except (ImportError, ValueError):
            real = False
    if real and not force:
        raise RuntimeError("gpuparity.flash_attn.install(): a real flash_attn is installed "
                           f"({getattr(present, '__file__', None) or 'found on sys.path'}); installing would shadow "
                           "it. Use `import gpuparity.flash_attn as flash_attn` in your own code, or pass "
                           "force=True to replace it for this process.")
    if real:
        logger.warning("gpuparity.flash_attn.install(force=True): shadowing the installed flash_attn")
    for name in _NAMES:
        sys.modules[name] = _ours(name)


def uninstall() -> None:
    """Remove what install() registered (a real flash_attn is imported afresh on its next import)."""
    for name in _NAMES:
        if name in sys.modules and sys.modules[name] is _ours(name):
            del sys.modules[name]
