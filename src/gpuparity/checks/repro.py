"""A standalone repro of one failing check, ready for an upstream bug report: a script that
imports only torch and the failing implementation (the user's --impl module, or gpuparity's
backend when that is what failed), loads the exact tensors the implementation received
(saved beside it, layouts included: strides, storage offset, stride-0 expansions), computes the
float64 reference inline (its source copied into the script), prints the relative and max
absolute error of the output and each gradient against the bound the check allowed, and
exits 1 while the failure reproduces (0 once fixed).

`capture_calls` records the calls during a check (execute.run_case); `write` runs in the
worker that ran the check (the tensors live there). `write_relation_repro` is the same for a
relation's failure (checks/relations.py): both sides of the relation, no float64 referee."""
from __future__ import annotations

import dis
import functools
import inspect
import os
import textwrap
from typing import Any, Callable, Dict, List, Optional

import torch

# What the inlined reference may use from its module's globals besides its helpers.
_PRELUDE = ("import math\nfrom typing import Any, Dict, List, Optional, Sequence, Tuple, Union\n\n"
            "import torch\nimport torch.nn.functional as F\n")


class CallRecorder:
    """Wraps a function; remembers the arguments of its last call. `snapshot`: also their saved
    form (`_encode`: on the CPU), taken before the call: the tensors as they went in, even where
    the call then writes into them, and writable after a call that broke the process's GPU
    context (a sticky device error: no tensor can be copied off the GPU after it)."""

    def __init__(self, fn: Callable, snapshot: bool = False):
        self.fn = fn
        self.args: tuple = ()
        self.kwargs: Dict[str, Any] = {}
        self.saved: Optional[tuple] = None

        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            self.args, self.kwargs = args, kwargs
            if snapshot:
                self.saved = (_encode(list(args)), _encode(dict(kwargs)))
            return fn(*args, **kwargs)
        self.wrapped = recorded

    def encoded(self) -> tuple:
        """(args, kwargs) as saved: the snapshot where taken, else the arguments now."""
        return self.saved or (_encode(list(self.args)), _encode(dict(self.kwargs)))


def _tensor_spec(t: torch.Tensor) -> Dict[str, Any]:
    """A tensor as its whole storage plus the view on it (size, stride, offset), so the script
    rebuilds exactly the layout the implementation received."""
    base = torch.empty(0, dtype=t.dtype).set_(t.detach().cpu().untyped_storage()) if t.device.type == "cpu" else \
        torch.empty(0, dtype=t.dtype, device=t.device).set_(t.detach().untyped_storage()).cpu()
    return {"__tensor__": True, "base": base.clone(), "size": list(t.shape), "stride": list(t.stride()),
            "offset": int(t.storage_offset()), "requires_grad": bool(t.requires_grad)}


def _encode(value):
    if isinstance(value, torch.Tensor):
        return _tensor_spec(value)
    if isinstance(value, (list, tuple)):
        encoded = [_encode(v) for v in value]
        return encoded if isinstance(value, list) else {"__tuple__": encoded}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).replace("torch.", "")}
    return value


def _reference_source(fn: Callable) -> str:
    """fn's source with every module-level function it calls (recursively), so the script
    defines the float64 reference without importing gpuparity."""
    seen: Dict[str, str] = {}
    order: List[str] = []

    def visit(func):
        func = inspect.unwrap(func)
        name = func.__name__
        if name in seen:
            return
        seen[name] = textwrap.dedent(inspect.getsource(func))
        for ref in _globals_used(func.__code__):
            target = func.__globals__.get(ref)
            if inspect.isfunction(target) and not target.__module__.startswith(("torch", "typing")):
                visit(target)
        order.append(name)

    visit(fn)
    source = "\n\n".join(seen[name] for name in order)
    # decorators (@staticmethod) and module-qualified calls of the helpers copied above
    lines = [line for line in source.splitlines() if not line.strip().startswith("@staticmethod")]
    return "\n".join(lines).replace("reference.", "")


def _globals_used(code) -> List[str]:
    """Global names a code object (and the functions nested in it) loads: helpers it calls,
    not attributes such as torch.matmul."""
    names = [ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
    for const in code.co_consts:
        if inspect.iscode(const):
            names += _globals_used(const)
    return names


# gpuparity's SDPA backends pick one of torch's kernels: their repro calls that kernel directly,
# with the arguments the backend gave it (execute.run_case records them)
SDPA_KERNELS = {"sdpa_math": "MATH", "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
                "sdpa_cudnn": "CUDNN_ATTENTION"}
TORCH_WRAPPERS = "gpuparity.backends.torch_ops"   # thin wrappers of one torch call: copied in


def _impl_import(impl: Optional[str], op: str, backend: str, fn: Optional[Callable] = None) -> str:
    if not impl and backend in SDPA_KERNELS:
        return ("import torch.nn.functional as F\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n\n\n"
                "def impl(*args, **kwargs):\n"
                f"    # the call gpuparity's {backend} made: torch's SDPA pinned to one kernel\n"
                f"    with sdpa_kernel([SDPBackend.{SDPA_KERNELS[backend]}]):\n"
                "        return F.scaled_dot_product_attention(*args, **kwargs)\n")
    if not impl and fn is not None and getattr(fn, "__module__", "") == TORCH_WRAPPERS:
        return f"{_reference_source(fn)}\n\n\nimpl = {fn.__name__}  # gpuparity's {backend!r} backend: this torch call\n"
    if impl:
        module_part, _, attr = impl.rpartition(":")
        if module_part.endswith(".py") or os.sep in module_part:
            path = os.path.abspath(module_part)
            return (f"import importlib.util\n"
                    f"_spec = importlib.util.spec_from_file_location('impl_under_test', {path!r})\n"
                    f"_module = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_module)\n"
                    f"impl = _module.{attr}\n")
        return f"import importlib\nimpl = importlib.import_module({module_part!r}).{attr}\n"
    # gpuparity's own backend (its kernel, or its wrapper of the torch call it names)
    return f"from gpuparity.dispatch import get\nimpl = get({op!r}, {backend!r}).fn  # backend {backend!r}\n"


def write(path_stem: str, *, op: str, backend: str, impl: Optional[str], case: str, dtype: str, device: str,
          seed: int, impl_call: CallRecorder, ref_call: CallRecorder, reference_fn: Callable,
          grad_out: Optional[torch.Tensor], bounds: Dict[str, float], reason: str,
          impl_fn: Optional[Callable] = None) -> str:
    """Write `<path_stem>.py` and `<path_stem>.pt`; returns the script's path."""
    (impl_args, impl_kwargs), (ref_args, ref_kwargs) = impl_call.encoded(), ref_call.encoded()
    data = {"impl_args": impl_args, "impl_kwargs": impl_kwargs, "ref_args": ref_args, "ref_kwargs": ref_kwargs,
            "grad_out": None if grad_out is None else grad_out.detach().cpu(), "bounds": bounds,
            "device": device, "dtype": dtype}
    os.makedirs(os.path.dirname(os.path.abspath(path_stem)), exist_ok=True)
    torch.save(data, path_stem + ".pt")
    reference_name = inspect.unwrap(reference_fn).__name__
    script = _SCRIPT.format(
        op=op, backend=impl or backend, case=case, dtype=dtype, device=device, seed=seed,
        reason=textwrap.shorten(reason, 300), prelude=_PRELUDE, impl_import=_impl_import(impl, op, backend, impl_fn),
        reference_source=_reference_source(reference_fn), reference_name=reference_name,
        data_file=os.path.basename(path_stem) + ".pt")
    with open(path_stem + ".py", "w", encoding="utf-8") as handle:
        handle.write(script)
    return path_stem + ".py"


_SCRIPT = '''#!/usr/bin/env python3
"""Repro: {op} on {backend} ({dtype}, {device}) fails against a float64 reference.

Found by gpuparity's check (case {case}, seed {seed}), shrunk to the smallest case that still
fails: {reason}

The inputs are the exact tensors the implementation received (layouts included), saved in
{data_file} beside this script. The float64 reference is defined below. Prints the relative
L2 error and max abs error of the output and of each gradient, with the bound the check
allowed; exits 1 while it fails. REPRO_DEVICE=cpu|cuda:N overrides the device."""
import os
import sys

{prelude}
{impl_import}

# ---- the float64 reference (its source copied in: this script needs only torch and the implementation)
{reference_source}


# ---- inputs
HERE = os.path.dirname(os.path.abspath(__file__))
SAVED = torch.load(os.path.join(HERE, {data_file!r}), weights_only=False)
DEVICE = os.environ.get("REPRO_DEVICE", SAVED["device"])


def build(value, device, dtype=None, leaves=None):
    """Saved arguments back to tensors: each one a view (size, stride, offset) of its storage."""
    if isinstance(value, dict) and value.get("__tensor__"):
        base = value["base"].to(device)
        if dtype is not None and base.is_floating_point():
            base = base.to(dtype)
        wants_grad = value["requires_grad"] and leaves is not None
        if wants_grad:
            base.requires_grad_(True)
        view = base.as_strided(value["size"], value["stride"], value["offset"])
        if wants_grad:
            leaves.append(view)
        return view
    if isinstance(value, dict) and "__tuple__" in value:
        return tuple(build(v, device, dtype, leaves) for v in value["__tuple__"])
    if isinstance(value, dict) and "__dtype__" in value:
        return getattr(torch, value["__dtype__"])
    if isinstance(value, list):
        return [build(v, device, dtype, leaves) for v in value]
    if isinstance(value, dict):
        return {{k: build(v, device, dtype, leaves) for k, v in value.items()}}
    return value


def run(fn, args, kwargs, device, dtype=None):
    leaves = []
    args = build(args, device, dtype, leaves)
    kwargs = build(kwargs, device, dtype, leaves)
    out = fn(*args, **kwargs)
    results = {{"out": out}}
    if leaves and SAVED["grad_out"] is not None and out.requires_grad:
        grads = torch.autograd.grad(out, leaves, SAVED["grad_out"].to(out.device, out.dtype).reshape(out.shape),
                                    allow_unused=True)
        for number, grad in enumerate(grads):
            results[f"grad_{{number}}"] = grad
    return results


def compare(name, got, ref, allowed):
    if got is None:
        print(f"{{name}}: no gradient (None) where the reference has one")
        return False
    got = got.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    finite = torch.isfinite(ref)
    bad = finite & ~torch.isfinite(got)
    if bad.any():
        print(f"{{name}}: {{int(bad.sum())}} NaN/Inf values where the reference is finite, first at "
              f"{{bad.nonzero()[0].tolist()}}")
        return False
    diff = (got - ref).masked_fill(~finite, 0)
    norm = torch.linalg.vector_norm(ref.masked_fill(~finite, 0)).item()
    err = torch.linalg.vector_norm(diff).item() / norm if norm else torch.linalg.vector_norm(diff).item()
    worst = int(diff.abs().argmax()) if diff.numel() else 0
    index = list(torch.unravel_index(torch.tensor(worst), diff.shape)) if diff.numel() else []
    where = [int(i) for i in index]
    ok = allowed is None or err <= allowed
    print(f"{{name}}: relative L2 error {{err:.3g}} (allowed {{allowed if allowed is None else format(allowed, '.3g')}}), "
          f"max abs error {{diff.abs().max().item() if diff.numel() else 0.0:.3g}} at {{where}}  "
          f"{{'ok' if ok else 'FAIL'}}")
    return ok


def main():
    print(f"torch {{torch.__version__}}, device {{DEVICE}}, dtype {{SAVED['dtype']}}")
    got = run(impl, SAVED["impl_args"], SAVED["impl_kwargs"], DEVICE)
    ref = run({reference_name}, SAVED["ref_args"], SAVED["ref_kwargs"], "cpu", torch.float64)
    names = {{"out": "out"}}
    grad_names = [n for n in SAVED["bounds"] if n.startswith("grad_")]
    for number, name in enumerate(grad_names):
        names[f"grad_{{number}}"] = name
    failed = False
    for key, ref_value in ref.items():
        if ref_value is None:
            continue
        name = names.get(key, key)
        if not compare(name, got.get(key), ref_value, SAVED["bounds"].get(name)):
            failed = True
    print("FAILS: the implementation disagrees with float64 beyond the bound" if failed else
          "passes: within the bound")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''


# --------------------------------------------------------------------------- a relation's standalone repro
def write_relation_repro(repro: Dict[str, Any], *, op: str, rel, call: tuple, dtype: torch.dtype, device,
                         seed: int, bounds: Dict[str, float], reason: str) -> str:
    """`<stem>.py` and `<stem>.pt`: the first call's exact arguments (layouts included) and a
    script that runs both sides of the relation `rel` (checks/relations.py) on the implementation (the second side's source
    copied in) and exits 1 while they disagree beyond the bounds the check allowed."""
    stem = repro["stem"]
    args, kwargs = call
    data = {"args": _encode(list(args)), "kwargs": _encode(dict(kwargs)),
            "names": [name for name in bounds if name != "out"], "bounds": bounds, "device": str(device),
            "dtype": str(dtype).replace("torch.", ""), "grad_seed": seed + 1, "side_seed": seed + 2}
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    torch.save(data, stem + ".pt")
    script = _RELATION_REPRO.format(op=op, backend=repro.get("impl") or repro.get("backend", ""), case=repro.get("case", ""),
                           relation=rel.name, doc=rel.doc, dtype=data["dtype"], seed=seed,
                           reason=textwrap.shorten(reason or "", 300),
                           impl_import=_relation_impl_import(repro, op),
                           side_source=_reference_source(rel.side), side_name=rel.side.__name__,
                           data_file=os.path.basename(stem) + ".pt")
    with open(stem + ".py", "w", encoding="utf-8") as handle:
        handle.write(script)
    return stem + ".py"


def _relation_impl_import(repro: Dict[str, Any], op: str) -> str:
    """The implementation as _impl_import has it, but gpuparity's SDPA backends as themselves:
    the relation's two sides call the op's signature, not torch's SDPA."""
    backend = repro.get("backend", "")
    if not repro.get("impl") and backend in SDPA_KERNELS:
        return f"from gpuparity.dispatch import get\nimpl = get({op!r}, {backend!r}).fn  # backend {backend!r}\n"
    return _impl_import(repro.get("impl"), op, backend)


_RELATION_REPRO = '''#!/usr/bin/env python3
"""Repro: {op} on {backend} ({dtype}) breaks the relation {relation}: {doc}.

Found by gpuparity's check (case {case}, seed {seed}), shrunk to the smallest case that still
fails: {reason}

Two calls of the implementation that must agree, with no float64 referee: the first is the call
the check made (its exact tensors, layouts included, saved in {data_file} beside this script),
the second the same computation written another way ({side_name}, copied below), its output
and gradients mapped back onto the first call's. Prints how far apart they are against the
bound the check allowed (2x what a plain composition's two sides differ, or the dtype's
floor); exits 1 while they disagree. REPRO_DEVICE=cpu|cuda:N overrides the device."""
import os
import sys

import torch
import torch.nn.functional as F

{impl_import}


class NotApplicable(Exception):
    pass


# ---- the second side of the relation (its source copied in)
{side_source}


# ---- inputs
HERE = os.path.dirname(os.path.abspath(__file__))
SAVED = torch.load(os.path.join(HERE, {data_file!r}), weights_only=False)
DEVICE = os.environ.get("REPRO_DEVICE", SAVED["device"])


def build(value, leaves):
    """Saved arguments back to tensors: each one a view (size, stride, offset) of its storage."""
    if isinstance(value, dict) and value.get("__tensor__"):
        base = value["base"].to(DEVICE)
        if value["requires_grad"]:
            base.requires_grad_(True)
        view = base.as_strided(value["size"], value["stride"], value["offset"])
        if value["requires_grad"]:
            leaves.append(view)
        return view
    if isinstance(value, dict) and "__tuple__" in value:
        return tuple(build(v, leaves) for v in value["__tuple__"])
    if isinstance(value, dict) and "__dtype__" in value:
        return getattr(torch, value["__dtype__"])
    if isinstance(value, list):
        return [build(v, leaves) for v in value]
    if isinstance(value, dict):
        return {{k: build(v, leaves) for k, v in value.items()}}
    return value


def side(second):
    leaves = []
    args, kwargs = build(SAVED["args"], leaves), build(SAVED["kwargs"], leaves)
    if second:
        out = {side_name}(impl, args, kwargs, torch.Generator().manual_seed(SAVED["side_seed"]))
    else:
        out = impl(*args, **kwargs)
    found = {{"out": out.detach()}}
    if leaves:
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(SAVED["grad_seed"]),
                               dtype=torch.float64).to(out.device, out.dtype)
        grads = (torch.autograd.grad(out, leaves, grad_out, allow_unused=True) if out.requires_grad
                 else [None] * len(leaves))
        for name, leaf, grad in zip(SAVED["names"], leaves, grads):
            found[name] = torch.zeros_like(leaf) if grad is None else grad
    return found


def main():
    print(f"torch {{torch.__version__}}, device {{DEVICE}}, dtype {{SAVED['dtype']}}")
    first, second = side(False), side(True)
    failed = False
    for name, a in first.items():
        a, b = a.detach().cpu().double(), second[name].detach().cpu().double()
        finite = torch.isfinite(a)
        if not torch.equal(finite, torch.isfinite(b)):
            print(f"{{name}}: NaN/Inf in different places on the two sides  FAIL")
            failed = True
            continue
        diff = (a - b).masked_fill(~finite, 0)
        norm = torch.linalg.vector_norm(b.masked_fill(~finite, 0)).item()
        if not bool(a.masked_fill(~finite, 0).any()):   # an exactly zero side: judge the other's RMS
            norm = 0.0
        err = torch.linalg.vector_norm(diff).item() / (norm or max(diff.numel(), 1) ** 0.5)
        allowed = SAVED["bounds"].get(name)
        ok = allowed is None or err <= allowed
        failed |= not ok
        print(f"{{name}}: the two sides differ by {{err:.3g}} (relative L2; allowed {{allowed:.3g}}), "
              f"max abs {{diff.abs().max().item() if diff.numel() else 0.0:.3g}}  {{'ok' if ok else 'FAIL'}}")
    print("FAILS: the two sides of {relation} disagree beyond the bound" if failed else "passes: within the bound")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''
