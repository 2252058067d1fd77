"""A failing sampled call, handed over: its tensors saved beside a standalone script that reruns
the same call on the same device and dtype (under the same SDPA backend when torch's choice was
known) and prints, for the output and each gradient, the NaN/Inf count where the float64
reference is finite and the relative error against it. The script imports torch only, or
gpuparity too when the failing call was one of gpuparity's own backends."""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Optional

import torch

from ..checks.results import Comparison
from .checker import SampledCall

_SDPA_MEMBERS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}

SCRIPT = '''"""Repro written by gpuparity.monitor: {title}
Step {step}, call {index} of {op}; {shapes}; {dtype} on {device}.
Run: python {script_name}   (needs {needs}; exits 1 while the bug is there)"""
import os
import sys

import torch
import torch.nn.functional as F
{extra_import}
HERE = os.path.dirname(os.path.abspath(__file__))
saved = torch.load(os.path.join(HERE, "call.pt"), weights_only=False)
device = sys.argv[1] if len(sys.argv) > 1 else saved["device"]
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit("this repro needs the GPU it was recorded on (" + saved["device"] + ")")
GRAD_NAMES = saved["grad_names"]          # the inputs whose gradients the run produced
ALLOWED = saved["allowed"]                # the tolerance bound per output at the time of the run


def call(args):
{call_body}


def run(dtype, where):
    args, leaves = {{}}, {{}}
    for name, value in saved["args"].items():
        if isinstance(value, torch.Tensor):
            value = value.to(where)
            if value.is_floating_point() and dtype is not None:
                value = value.to(dtype)
            if name in GRAD_NAMES:
                value = value.clone().requires_grad_(True)
                leaves[name] = value
        args[name] = value
    out = call(args)
    grads = {{}}
    if saved["grad_out"] is not None and leaves:
        out.backward(saved["grad_out"].to(where, out.dtype))
        grads = {{"grad_" + name: leaf.grad for name, leaf in leaves.items()}}
    return out.detach(), grads


out, grads = run(None, device)                       # the call as the run made it
{reference_setup}ref_out, ref_grads = run(torch.float64, "cpu")      # float64 on the CPU
bad = False
for name, got in [("out", out)] + sorted(grads.items()):
    ref = (ref_out if name == "out" else ref_grads[name]).double()
    got = got.detach().double().cpu()
    finite = torch.isfinite(ref)
    nonfinite = int((finite & ~torch.isfinite(got)).sum())
    diff = torch.where(finite, got - ref, torch.zeros_like(ref)).nan_to_num(nan=float("inf"))
    err = float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(torch.where(finite, ref, 0)).clamp_min(1e-300))
    limit = ALLOWED.get(name)
    fails = nonfinite > 0 or (limit is not None and err > limit)
    bad |= fails
    print(f"{{name:>12}}: {{nonfinite}} NaN/Inf where float64 is finite, relative L2 error {{err:.3g}}"
          + ("" if limit is None else f" (allowed {{limit:.3g}})") + ("  <-- FAILS" if fails else ""))
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| cudnn",
      torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
      "|", torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu")
sys.exit(1 if bad else 0)
'''


def _call_body(call: SampledCall) -> tuple:
    """(body of call(args), extra import line, reference setup line, what it needs)."""
    name = call.kind.name
    if name.startswith("F."):
        fn = name[2:]
        body = f"    return F.{fn}(**{{k: v for k, v in args.items() if not k.startswith('_')}})"
        sdpa = call.backend.split(" ")[0]
        if fn == "scaled_dot_product_attention" and sdpa in _SDPA_MEMBERS and not call.backend.endswith("(cpu)"):
            body = ("    from torch.nn.attention import SDPBackend, sdpa_kernel\n"
                    f"    backend = [SDPBackend.{_SDPA_MEMBERS[sdpa]}] if args['query'].device.type == 'cuda' "
                    "else [SDPBackend.MATH]\n"
                    "    with sdpa_kernel(backend):   # the backend torch chose in the run\n"
                    "        return F.scaled_dot_product_attention(**args)")
        return body, "", "", "torch"
    # the public gpuparity function it reruns through, with its positional inputs (its declaration's)
    public, positional = call.kind.signature.op, call.kind.signature.positional()
    pos = ", ".join(f"args[{p!r}]" for p in positional)
    body = (f"    options = {{k: v for k, v in args.items() if k not in {positional!r}}}\n"
            f"    backend = BACKEND if args[{positional[0]!r}].dtype != torch.float64 else 'composition'\n"
            f"    return gpuparity.{public}({pos}, backend=backend, **options)")
    return body, f"import gpuparity\nBACKEND = {call.backend!r}\n", "", "torch and gpuparity"


def write(call: SampledCall, comparisons: List[Comparison], directory: Optional[str] = None) -> Dict[str, str]:
    """Save the call and its script under `directory` (a new temporary folder when None);
    returns {"dir", "script", "rerun"}."""
    directory = directory or tempfile.mkdtemp(prefix="gpuparity-monitor-")
    os.makedirs(directory, exist_ok=True)
    args = {name: value.detach().to("cpu") if isinstance(value, torch.Tensor) else value
            for name, value in call.args.items() if not name.startswith("_")}
    allowed = {c.name: c.allowed for c in comparisons if c.allowed is not None}
    torch.save({"op": call.kind.name, "backend": call.backend, "device": call.described["device"],
                "args": args, "grad_out": None if call.grad_out is None else call.grad_out.detach().to("cpu"),
                "grad_names": [n[len("grad_"):] for n in call.grads], "allowed": allowed},
               os.path.join(directory, "call.pt"))
    body, extra_import, reference_setup, needs = _call_body(call)
    shapes = ", ".join(f"{k} {tuple(v)}" for k, v in call.described["shapes"].items())
    title = "; ".join(c.reason for c in comparisons if not c.passed)[:300]
    script = os.path.join(directory, "repro.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(SCRIPT.format(title=title.replace('"""', "'''"), step=call.step, index=call.index,
                                   op=call.kind.name, shapes=shapes, dtype=call.described["dtype"],
                                   device=call.described["device"], script_name="repro.py", needs=needs,
                                   extra_import=extra_import, call_body=body, reference_setup=reference_setup))
    return {"dir": directory, "script": script, "rerun": f"python {script}"}
