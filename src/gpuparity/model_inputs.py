"""A model's example inputs (one tensor, a list or tuple of them, or a dict of keyword arguments):
how they become a call, and how to transform every tensor in them; compile and trace share these."""
from __future__ import annotations

from typing import Any, Callable, List, Tuple

import torch


def as_call(inputs) -> Tuple[tuple, dict]:
    """(args, kwargs) for model(*args, **kwargs): a dict is keyword arguments, a list or tuple
    positional ones, anything else the one positional argument."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (list, tuple)):
        return tuple(inputs), {}
    return (inputs,), {}


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`value` with fn applied to every tensor inside it (through lists, tuples and dicts; other
    values unchanged), keeping the containers' types."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def flatten_tensors(value: Any, sort_keys: bool = False) -> List[torch.Tensor]:
    """Every tensor inside `value`, depth first; a dict in its insertion order (what a trace's
    identity hashes), or by key with sort_keys (outputs of two runs that may build dicts apart)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v, sort_keys)]
    if isinstance(value, dict):
        keys = sorted(value, key=str) if sort_keys else list(value)
        return [t for k in keys for t in flatten_tensors(value[k], sort_keys)]
    return []
