"""Whether a user's callable can take the calls the battery makes for an op: a function with
the wrong parameters is bad input (one message, exit 2), not an ERROR in every check."""
from __future__ import annotations

import inspect
from typing import Callable, List, Optional, Set, Tuple

import torch

from ..contracts import get_spec

CallShape = Tuple[int, Tuple[str, ...]]  # (positional arguments, keyword names)


def call_shapes(op: str) -> Set[CallShape]:
    """Every distinct shape of call the op's spec makes over all its cases (recorded by calling
    spec.call with a stand-in; the inputs are a few small CPU tensors per case)."""
    spec = get_spec(op)
    shapes: Set[CallShape] = set()

    def record(*args, **kwargs):
        shapes.add((len(args), tuple(sorted(kwargs))))

    for case in spec.cases():
        spec.call(record, spec.make_inputs(case.params, torch.Generator().manual_seed(0)), case.params)
    return shapes


def describe(shape: CallShape) -> str:
    positional, keywords = shape
    return "fn(" + ", ".join([f"arg{i}" for i in range(positional)] + [f"{k}=..." for k in keywords]) + ")"


def signature_mismatch(fn: Callable, op: str, name: str = "the implementation") -> Optional[str]:
    """Why `fn` cannot be called as the battery calls it for `op`, or None (also when Python
    cannot tell its signature, as for some builtins: the checks will say)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    problems: List[str] = []
    optional = set(getattr(get_spec(op), "optional_keywords", ()))   # their cases SKIP without them
    for shape in sorted(call_shapes(op)):
        positional, keywords = shape
        keywords = tuple(k for k in keywords if k not in optional)
        try:
            signature.bind(*([None] * positional), **{k: None for k in keywords})
        except TypeError as exc:
            problems.append(f"the call {describe(shape)}: {exc}")
    if not problems:
        return None
    return f"{name} has the signature {signature}, which cannot take " + "; ".join(problems)
