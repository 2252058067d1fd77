"""Whether a user's callable can take the calls the battery makes for an op: a function with
the wrong parameters is bad input (one message, exit 2), not an ERROR in every check."""
from __future__ import annotations

import ast
import inspect
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch

from ..contracts import get_spec
from ..contracts.base import takes

CallShape = Tuple[int, Tuple[str, ...]]  # (positional arguments, keyword names)


def call_shapes(op: str) -> Set[CallShape]:
    """Every distinct shape of call the op's spec makes over all its cases (recorded by calling
    spec.call with a stand-in; the inputs are a few small CPU tensors per case)."""
    spec = get_spec(op)
    shapes: Set[CallShape] = set()

    def record(*args, **kwargs):
        shapes.add((len(args), tuple(sorted(kwargs))))
        return args[0]  # a tensor for specs that post-process the output (linear_cross_entropy's .to)

    for case in spec.cases():
        spec.call(record, spec.make_inputs(case.params, torch.Generator().manual_seed(0)), case.params)
    return shapes


def _documented_parameters(op: str) -> Tuple[List[str], List[str]]:
    """The positional and the keyword-only parameter names of the signature `--signature` prints
    (the spec's `signature`, such as "fn(q, k, v, *, scale=None)")."""
    function = ast.parse(f"def {get_spec(op).signature}: pass").body[0].args
    return [a.arg for a in function.posonlyargs + function.args], [a.arg for a in function.kwonlyargs]


def describe(shape: CallShape, op: str) -> str:
    """A call shape in the documented parameter names, keywords in the signature's order:
    fn(q, k, v, attn_mask=..., is_causal=...)."""
    positional, keywords = shape
    names, keyword_only = _documented_parameters(op)
    order = {name: i for i, name in enumerate(names + keyword_only)}
    arguments = [names[i] if i < len(names) else f"arg{i}" for i in range(positional)]
    arguments += [f"{k}=..." for k in sorted(keywords, key=lambda k: (order.get(k, len(order)), k))]
    return "fn(" + ", ".join(arguments) + ")"


def signature_mismatch(fn: Callable, op: str, name: str = "the implementation") -> Optional[str]:
    """Why `fn` cannot be called as the battery calls it for `op`, or None (also when Python
    cannot tell its signature, as for some builtins: the checks will say). The message is a few
    lines: the signature needed, fn's own, each distinct TypeError once with a call that raises
    it, and how to fix."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    spec = get_spec(op)
    optional = set(getattr(spec, "optional_keywords", ()))   # their cases SKIP without them
    needed = {(positional, tuple(k for k in keywords if k not in optional))
              for positional, keywords in call_shapes(op)}
    errors: Dict[str, CallShape] = {}   # each TypeError once, with the smallest call that raises it
    for shape in sorted(needed, key=lambda s: (len(s[1]), s)):
        positional, keywords = shape
        try:
            signature.bind(*([None] * positional), **{k: None for k in keywords})
        except TypeError as exc:
            errors.setdefault(str(exc), shape)
    if not errors:
        return None
    lines = [f"{name} cannot be called the way the checks call {op}:",
             f"  needed: {spec.signature}",
             f"  got:    {getattr(fn, '__name__', 'fn')}{signature}"]
    for error, shape in errors.items():
        lines += [f"  error:  {error} (TypeError), calling it as", f"          {describe(shape, op)}"]
    lines += ["  fix:    give it the parameters under 'needed' (same names and order; **kwargs takes any keyword),",
              f"          or wrap it in a function that has them (gpuparity check --op {op} --signature prints them)"]
    return "\n".join(lines)


def lacking_keywords(fn: Callable, op: str) -> List[str]:
    """The op's optional keywords (window, softcap, alibi_slopes: spec.optional_keywords) that
    `fn` does not take: the cases that need one SKIP, decided before any input is built."""
    return [name for name in get_spec(op).optional_keywords if not takes(fn, name)]
