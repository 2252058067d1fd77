"""transformers' kernel hub, as gpuparity plugs into it: the `kernels` package's mapping API
(`use_kernel_mapping`, `kernelize`) with repositories that load gpuparity's layers from this
process, never from the network. `kernels` is imported only here, and only when a model holds a
hub-decorated function (transformers >= 5.25 with `kernels` installed) or a user asks for the mapping.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn

from .. import caches

# kernels' own device names (torch calls a ROCm GPU "cuda"; kernels tells them apart)
DEVICES = ("cuda", "rocm", "cpu")


class LocalLayer:
    """A repository in the sense of the `kernels` package (an object with `load()` returning a
    layer class) whose layer is built in this process: no download, no files, no revision.

    `name` is transformers' kernel name the layer serves (e.g. "rotary_pos_emb"), `key` tells
    layers built for different arguments apart (kernels memoizes layers per repository)."""

    def __init__(self, name: str, key: str, build: Callable[[], type]):
        self.name, self.key, self._build = name, key, build
        self.layer_name = name

    def load(self) -> type:
        return self._build()

    def __eq__(self, other):
        return isinstance(other, LocalLayer) and (self.name, self.key) == (other.name, other.key)

    def __hash__(self):
        return hash((LocalLayer, self.name, self.key))

    def __str__(self) -> str:
        return f"gpuparity (layer `{self.name}`, {self.key})"


# a hub-decorated function's generated class -> the plain function it calls
_ORIGINALS = caches.register("integrations.hub.originals", {})


def hub_function_original(function) -> Optional[Callable]:
    """The plain function under transformers' kernel-hub decoration, or `function` itself when it
    is a plain function; None when it is neither (not a form gpuparity has read).

    `kernels.use_kernel_forward_from_hub` turns a function into an instance of a generated
    nn.Module class (it carries `kernel_layer_name`) whose forward calls the function it closes over."""
    if not isinstance(function, nn.Module):
        return function if callable(function) else None
    cls = type(function)
    if cls in _ORIGINALS:
        return _ORIGINALS[cls]
    forward = cls.__dict__.get("forward")
    if getattr(cls, "kernel_layer_name", None) is None or getattr(forward, "__closure__", None) is None:
        return None
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__))
    original = cells.get("func")
    original = original.cell_contents if original is not None else None
    _ORIGINALS[cls] = original if callable(original) and not isinstance(original, nn.Module) else None
    return _ORIGINALS[cls]


def kernel_funcs(module: nn.Module) -> dict:
    """The per-instance hub functions `kernels.use_kernelized_func` attached to `module` (its
    `_kernel_funcs`, name -> the function's private module), empty for older transformers."""
    found = module.__dict__.get("_kernel_funcs")
    return found if isinstance(found, dict) else {}


def kernel_device(module: nn.Module) -> str:
    """kernels' device name for where `module`'s parameters live (the CPU when it has none)."""
    param = next(module.parameters(), None)
    if param is None or param.device.type != "cuda":
        return "cpu" if param is None else param.device.type
    return "rocm" if torch.version.hip else "cuda"


def kernelize_with(target: nn.Module, repository: LocalLayer, device: str) -> None:
    """Serve `target` (a hub-decorated layer or function module) with `repository`'s layer through
    kernels' own API: the mapping holds this repository only, so nothing else is looked up (no
    network) and no other layer of the model changes."""
    import kernels   # noqa: PLC0415 - optional; only models that hold hub functions reach here

    mapping = {repository.name: {dev: repository for dev in DEVICES}}
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels.kernelize(target, mode=kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE,
                          device=device, use_fallback=False)
