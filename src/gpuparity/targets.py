""""module:attr" strings, loaded once for everyone: `--impl` (checks/execute.py), the function an
isolated call runs in its child (isolate.py) and a SPEC's factory (trace/spec.py).

A target is `package.module:attr` or `path/to/file.py:attr`; attr may be dotted (`Class.method`).
`load` raises TargetError with `part` naming the step that failed ("form", "file", "import",
"attribute"), so that each caller words the error for its own argument (`--impl`, SPEC)."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import zlib
from typing import Any, Tuple

__all__ = ["TargetError", "is_file_target", "load", "split"]


class TargetError(ValueError):
    """A target that does not load. `part`: "form" (not 'module:attr'), "file" (no such file),
    "import" (the module raised or is not there; the exception is the cause), "attribute"."""

    def __init__(self, message: str, part: str, module: str = "", attr: str = "") -> None:
        super().__init__(message)
        self.part, self.module, self.attr = part, module, attr


def split(target: str) -> Tuple[str, str]:
    """(module part, attr) of `target`; TargetError("form") when either is missing."""
    module_part, _, attr = target.rpartition(":") if isinstance(target, str) else ("", "", "")
    if not module_part or not attr:
        raise TargetError(f"expected 'package.module:attr' or 'path/to/file.py:attr', got {target!r}", "form")
    return module_part, attr


def is_file_target(module_part: str) -> bool:
    return module_part.endswith(".py") or os.sep in module_part


def load(target: str, *, cwd_importable: bool = False) -> Any:
    """The object `target` names. A file is imported as a module of its own, named after its
    absolute path (the same file twice is one module) and kept in sys.modules, so that what it
    defines can be pickled and found again. `cwd_importable` puts the current directory on
    sys.path first, as `python -m` does."""
    module_part, attr = split(target)
    if is_file_target(module_part):
        path = os.path.abspath(module_part)
        if not os.path.exists(path):
            raise TargetError(f"no file {module_part!r}", "file", module_part, attr)
        name = f"gpuparity_target_{zlib.crc32(path.encode())}"
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) != path:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except KeyboardInterrupt:
                sys.modules.pop(name, None)
                raise
            except BaseException as exc:  # noqa: BLE001 - the caller words a broken user file (SystemExit too)
                sys.modules.pop(name, None)
                raise TargetError(f"importing {module_part!r} failed: {type(exc).__name__}: {exc}", "import",
                                  module_part, attr) from exc
    else:
        if cwd_importable and os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_part)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the caller words a broken user module (SystemExit too)
            raise TargetError(f"importing {module_part!r} failed: {type(exc).__name__}: {exc}", "import",
                              module_part, attr) from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{module_part!r} has no attribute {attr!r}", "attribute", module_part, attr)
        obj = getattr(obj, part)
    return obj
