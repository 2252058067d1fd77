"""SPEC strings: how the command line gets a user's model and inputs.

SPEC is `package.module:factory` or `path/to/file.py:factory`. The factory builds the model
and an example input:

    def factory(device="cpu", dtype=torch.float32, **options):
        torch.manual_seed(0)                      # weights made on the CPU, seeded ...
        model = MyModel().eval()
        x = torch.randn(8, 128, 64)
        return model.to(device, dtype), (x.to(device, dtype),)   # ... then moved

It returns `(model, inputs)` or `(model, inputs, loss_fn)`, where `inputs` is one tensor, a
tuple/list of positional arguments, or a dict of keyword arguments, and `loss_fn(output)`
gives the scalar to differentiate (the default is a fixed random projection of the output).
`device`, `dtype` and any `options` (`--factory-arg KEY=VALUE`) are passed only if the factory
accepts them; otherwise gpuparity moves/casts the model and floating inputs itself. gpuparity
seeds torch with `seed` before calling the factory. Weights must be made on the CPU (or loaded
from a file) so that every machine builds the same ones: traces refuse to compare different
weights.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Callable, Dict, Optional, Union

import torch

from .. import targets


@dataclasses.dataclass
class Built:
    model: torch.nn.Module
    inputs: Any
    loss_fn: Optional[Callable] = None


def load_factory(spec: str) -> Callable:
    # As `python -m` does: the current directory is importable.
    try:
        factory = targets.load(spec, cwd_importable=True)
    except targets.TargetError as exc:
        if exc.part == "form":
            raise ValueError(f"SPEC: expected 'package.module:factory' or 'path/to/file.py:factory', got {spec!r}") from None
        if exc.part == "file":
            raise FileNotFoundError(f"SPEC {spec!r}: no file {exc.module!r}") from None
        if exc.part == "attribute":
            raise ValueError(f"SPEC {spec!r}: module {exc.module!r} has no attribute {exc.attr!r}") from None
        cause = exc.__cause__
        if (isinstance(cause, ModuleNotFoundError) and cause.name and exc.module.startswith(cause.name)
                and not targets.is_file_target(exc.module)):
            raise ValueError(f"SPEC {spec!r}: cannot import module {exc.module!r} ({cause})") from cause
        raise cause   # the user's module raised on import: their error, as it was
    if not callable(factory):
        raise TypeError(f"SPEC {spec!r}: {targets.split(spec)[1]!r} is a {type(factory).__name__}, expected a function")
    return factory


def parse_factory_args(items) -> Dict[str, Any]:
    """['attn=sdpa_math', 'layers=2'] -> {'attn': 'sdpa_math', 'layers': 2} (JSON values when they parse)."""
    options: Dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--factory-arg: expected KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _cast_inputs(inputs, device, dtype):
    def one(value):
        if isinstance(value, torch.Tensor):
            if device is not None:
                value = value.to(device)
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(one(v) for v in value)
        if isinstance(value, dict):
            return {k: one(v) for k, v in value.items()}
        return value
    return one(inputs)


def build(factory: Union[str, Callable], *, device="cpu", dtype: Optional[torch.dtype] = None,
          options: Optional[Dict[str, Any]] = None, seed: int = 0) -> Built:
    """Call a factory under the SPEC contract and return the model, inputs and loss_fn."""
    if isinstance(factory, str):
        factory = load_factory(factory)
    options = dict(options or {})
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs: Dict[str, Any] = {}
    if "device" in params or takes_any:
        kwargs["device"] = device
    if dtype is not None and ("dtype" in params or takes_any):
        kwargs["dtype"] = dtype
    unknown = [k for k in options if k not in params and not takes_any]
    if unknown:
        raise ValueError(f"--factory-arg: the factory takes no option {', '.join(unknown)} "
                         f"(it takes: {', '.join(params) or 'nothing'})")
    kwargs.update(options)
    torch.manual_seed(seed)
    result = factory(**kwargs)
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise TypeError(f"factory: expected it to return (model, inputs) or (model, inputs, loss_fn), "
                        f"got {type(result).__name__}")
    model, inputs = result[0], result[1]
    loss_fn = result[2] if len(result) == 3 else None
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"factory: expected a torch.nn.Module first, got {type(model).__name__}")
    cast_device = device if "device" not in kwargs else None
    cast_dtype = dtype if "dtype" not in kwargs else None
    if cast_device is not None:
        model = model.to(cast_device)
    if cast_dtype is not None:
        model = model.to(cast_dtype)
    if cast_device is not None or cast_dtype is not None:
        inputs = _cast_inputs(inputs, cast_device, cast_dtype)
    return Built(model, inputs, loss_fn)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
