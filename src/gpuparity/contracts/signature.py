"""An op's signature, declared once in its contract (`Signature`: its `Arg`s and outputs), and
what is derived from it: the public function's parameters, the torch.library schema string
(`schema()`), the arguments of the library op's body, fake and autograd setup as one named
tuple (`library_args()`), the arguments a backend receives (`backend_params()`: what the
monitor binds a captured call by), and the `fn(...)` line the battery's `--signature` prints.

The library op's argument order: the declared order of its arguments, then `backend`, then the
arguments `appended` after it (those added after the op's first schema, each with its default,
so graphs exported with an older schema still load). Nothing here imports torch: `gpuparity check --help`
reads op names without it."""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Dict, Optional, Tuple


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()   # an argument without a default


@dataclasses.dataclass(frozen=True)
class Arg:
    """One argument. `type` is its torch.library schema type ("Tensor", "Tensor?", "SymInt[]",
    "float?", "bool", "str", "ScalarType?", ...). `default`: the public function's (REQUIRED:
    none). `keyword`: keyword-only in the public function. `grad`: a tensor whose gradient the
    op returns. `public` / `library` / `backend`: whether the public function, the torch.library
    op and a backend's `fn` take it (`backend` on the public function is the dispatcher's, no
    backend's). `appended`: in the library schema after `backend` (with its default, if it has one)."""
    name: str
    type: str
    default: Any = REQUIRED
    keyword: bool = False
    grad: bool = False
    public: bool = True
    library: bool = True
    backend: bool = True
    appended: bool = False

    @property
    def tensor(self) -> bool:
        return self.type.startswith("Tensor")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def _schema_default(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float, str)):
        return repr(value)
    raise ValueError(f"default: a schema default must be None, a bool, a number or a str, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Signature:
    """An op's declared signature. `op`: the public name (gpuparity.<op>) and the torch.library
    op's (gpuparity::<library_op>, the same unless given). `outputs`: the library op's outputs
    ((name, type) pairs; "Tensor" each, unless the op declares otherwise). public=False: a
    library op with no public function (a backward op the autograd formulas call): none of its
    arguments is a public one."""
    op: str
    args: Tuple[Arg, ...]
    outputs: Tuple[str, ...] = ("out",)
    library_op: Optional[str] = None
    public: bool = True

    def __post_init__(self):
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"args: names repeat in {self.op}'s signature: {names}")
        order = self.library_order()
        trailing = []      # the schema's defaults: the appended arguments that have one, at its end
        for a in reversed(order):
            if not (a.appended and not a.required):
                break
            trailing.insert(0, a.default)
        object.__setattr__(self, "_library_tuple", collections.namedtuple(
            f"{self.library_name}_args", [a.name for a in order], defaults=trailing))

    # ------------------------------------------------------------------ views of the arguments
    @property
    def library_name(self) -> str:
        return self.library_op or self.op

    def public_args(self) -> Tuple[Arg, ...]:
        return tuple(a for a in self.args if a.public) if self.public else ()

    def names(self) -> Tuple[str, ...]:
        """The public function's parameter names, in order."""
        return tuple(a.name for a in self.public_args())

    def backend_args(self) -> Tuple[Arg, ...]:
        """What a backend's fn takes, in the public order (no `backend`)."""
        return tuple(a for a in self.public_args() if a.backend and a.name != "backend")

    def backend_params(self) -> Tuple[Tuple[str, Any], ...]:
        """(name, default) of a backend's arguments: how a captured backend call binds."""
        return tuple((a.name, a.default) for a in self.backend_args())

    def positional(self) -> Tuple[str, ...]:
        """The public function's positional parameters."""
        return tuple(a.name for a in self.public_args() if not a.keyword)

    def tensors(self) -> Tuple[str, ...]:
        """The public tensor arguments whose gradients the op returns."""
        return tuple(a.name for a in self.public_args() if a.grad)

    def library_order(self) -> Tuple[Arg, ...]:
        ours = [a for a in self.args if a.library]
        backend = [a for a in ours if a.name == "backend"]
        return (tuple(a for a in ours if not a.appended and a.name != "backend") + tuple(backend)
                + tuple(a for a in ours if a.appended))

    def library_args(self, args: tuple, kwargs: Optional[Dict[str, Any]] = None):
        """The library op's arguments (as its body, fake or setup gets them) as a named tuple."""
        return self._library_tuple(*args, **(kwargs or {}))

    # ------------------------------------------------------------------ derived text
    def schema(self) -> str:
        """The torch.library schema: "(Tensor x, SymInt[] normalized_shape, ...) -> (Tensor, Tensor)"."""
        params = []
        for a in self.library_order():
            text = f"{a.type} {a.name}"
            if a.appended and not a.required:
                text += "=" + _schema_default(a.default)
            params.append(text)
        outputs = ["Tensor"] * len(self.outputs)
        returns = outputs[0] if len(outputs) == 1 else "(" + ", ".join(outputs) + ")"
        return "(" + ", ".join(params) + ") -> " + returns

    def call_line(self, keywords: Optional[Tuple[str, ...]] = None) -> str:
        """The backend call convention as `fn(x, normalized_shape, weight=None, eps=None)`, the
        line `gpuparity check --signature` prints; `keywords`: the keyword-only ones to show
        (default: all of them)."""
        parts, star = [], False
        for a in self.backend_args():
            if a.keyword:
                if keywords is not None and a.name not in keywords:
                    continue
                if not star:
                    parts.append("*")
                    star = True
            parts.append(a.name if a.required else f"{a.name}={a.default!r}")
        return "fn(" + ", ".join(parts) + ")"

    def bind(self, args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """A backend call's arguments by name, defaults filled in (extra keywords kept)."""
        bound: Dict[str, Any] = {}
        params = self.backend_params()
        for (name, _), value in zip(params, args):
            bound[name] = value
        for name, default in params[len(args):]:
            bound[name] = kwargs.get(name, default)
        for name, value in kwargs.items():
            bound.setdefault(name, value)
        return bound


__all__ = ["Arg", "Signature", "REQUIRED"]
