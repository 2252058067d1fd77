"""gpuparity's layers for transformers' kernel hub, for users who kernelize a model themselves.

transformers (>= 5.25, with the `kernels` package) marks functions and layers of its models with
kernel names (`@use_kernel_forward_from_hub("rotary_pos_emb")`); `kernels.kernelize` then swaps
them for the layers a mapping names. `kernel_mapping()` is such a mapping, whose layers are built
in this process (no Hub lookup, nothing downloaded):

    from kernels import Mode, kernelize, use_kernel_mapping
    from gpuparity.integrations.kernel_hub import kernel_mapping

    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, mode=Mode.TRAINING, device="cuda")

`gpuparity.patch(model)` goes through the same mapping for the names below where the installed
transformers has the hub, and keeps its own swap for older versions.
"""
from __future__ import annotations

from typing import Dict

from . import hub
from .transformers_rotary import hub_repository

# transformers' kernel name -> what gpuparity serves for it
NAMES = {"rotary_pos_emb": "gpuparity.apply_rotary (families llama, mistral, qwen2, qwen3, gemma, gemma2; "
                           "any other call runs transformers' own function)"}


def kernel_mapping(backend: str = "auto") -> Dict[str, dict]:
    """A mapping for `kernels.use_kernel_mapping` / `kernels.register_kernel_mapping`: each name in
    NAMES on every device kind `kernels` tells apart (cuda, rocm, cpu), served on `backend`."""
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"backend: expected a backend name such as 'auto' or 'triton', got {backend!r}")
    repositories = {"rotary_pos_emb": hub_repository(backend)}
    return {name: {device: repository for device in hub.DEVICES} for name, repository in repositories.items()}
