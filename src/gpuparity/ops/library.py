"""gpuparity's ops as torch.library ops, for torch.compile(fullgraph=True) and torch.export: how
one is defined from its op's declared signature (`define`) and chooses its backend (below), and
`gpuparity::attention`, with a fake (meta) implementation and a registered autograd formula that
calls its backward op `::attention_backward`. The other ops' are defined beside their public
functions, each in its op's own module, so that a process loads only the ops it uses:
ops/library_norms.py (`::rms_norm`, `::layer_norm`), ops/library_rotary.py (`::apply_rotary`,
`::apply_rotary_pair`), ops/library_varlen.py, ops/library_ce.py, ops/swiglu.py, ops/residual_norm.py.

The public functions take this path only while torch.compile or torch.export traces them; eager
calls go straight to the backend (a custom op's dispatch costs host time on every call).

While tracing, the backend is chosen when the graph is traced (`traced_backend`: the verified
dispatcher's answer for the call's Problem, which depends only on shapes, dtypes, devices and
flags, all of which the graph's guards pin), not inside an op body at every call. Under dynamic
shapes a feature computed from a size is symbolic: the choice is then left to the opaque op's
body, made on the real sizes when the graph runs (`_deferred`). Else:
- a backend without its own kernels (a torch composition, torch's rms_norm, sdpa) is traced
  inline: inductor fuses it with its neighbours (for a norm or rotary that beats a separate
  kernel), and autograd differentiates it;
- a Triton backend becomes a `torch.library.triton_op` (`gpuparity::<op>_kernels`, torch >= 2.6)
  whose body inductor traces with its launches wrapped by `torch.library.wrap_triton`: the
  kernels are called from inductor's generated code (CUDA graphs, `mode="reduce-overhead"`,
  capture them), with no Python of ours per call;
- otherwise (torch < 2.6, the Triton interpreter, whose kernels wrap_triton cannot trace,
  dynamic shapes, which the kernels' launch plans cannot key on) the opaque `custom_op`
  `gpuparity::<op>` as before: its body runs the chosen backend when the graph runs.

Backward: a backend that declares `forward_saving`/`backward_from` (the Triton kernels) runs its
own fused backward from what its forward saved. Any other backend served through the opaque op
recomputes its forward under autograd inside the backward op and differentiates that: the
gradient of exactly the forward it served. The backward serves with the backend the forward
used for the same call signature (`_SERVED`).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import caches
from ..backends import triton_common
from ..registry import Backend, Problem
from . import dropout, kernel_analysis, select
from ..contracts.attention import ATTENTION, ATTENTION_BACKWARD, attention_extras, attention_problem
from ..contracts.signature import Signature

__all__ = ["attention", "define", "traced_backend"]

# (problem, backend asked for) -> the backend the forward served it with. Bounded: problems
# carry sequence lengths.
_SERVED: Dict[tuple, Backend] = caches.register("ops.library.served", {})
_SERVED_MAX = 4096


def _serve(problem: Problem, backend: str) -> Backend:
    chosen = dropout.resolve(problem, backend)
    if _SERVED.get((problem, backend)) is not chosen:
        if len(_SERVED) >= _SERVED_MAX:
            _SERVED.clear()
        _SERVED[(problem, backend)] = chosen
    return chosen


def _served(problem: Problem, backend: str) -> Backend:
    return _SERVED.get((problem, backend)) or dropout.resolve(problem, backend)


@contextlib.contextmanager
def _autograd_inside_op():
    """A custom op's body runs with autograd's dispatch keys excluded; recomputing a forward to
    differentiate it needs them back for that span."""
    keys = torch._C.DispatchKey
    exclude = (torch._C._dispatch_tls_local_exclude_set()
               .remove(keys.AutogradFunctionality).remove(keys.ADInplaceOrView))
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def _recomputed_grads(forward: Callable[..., Tensor], inputs: Sequence[Optional[Tensor]],
                      wanted: Sequence[bool], grad_out: Tensor) -> List[Optional[Tensor]]:
    """Gradients of forward(*inputs) for the inputs marked wanted (None elsewhere)."""
    with _autograd_inside_op():
        leaves = [None if t is None else t.detach().requires_grad_(bool(w)) for t, w in zip(inputs, wanted)]
        out = forward(*leaves)
        targets = [leaf for leaf, w in zip(leaves, wanted) if w and leaf is not None]
        grads = iter(torch.autograd.grad(out, targets, grad_out, allow_unused=True) if targets else ())
    result = []
    for leaf, w in zip(leaves, wanted):
        if w and leaf is not None:
            grad = next(grads)
            result.append(torch.zeros_like(leaf) if grad is None else grad)
        else:
            result.append(None)
    return result


def _like(out: Tensor, template: Tensor) -> Tensor:
    """`out` with the strides the fake implementation promises (empty_like(template)'s)."""
    if out.stride() == template.stride():
        return out
    fitted = torch.empty_like(template)
    fitted.copy_(out)
    return fitted


def _nothing(like: Tensor) -> Tensor:
    """An output slot with no value (custom ops return no Optional[Tensor]); a new tensor each
    time, since an op's outputs may not alias each other."""
    return like.new_empty(0, dtype=torch.float32)


# ----------------------------------------------------------------------------- traced routing
# torch.library.triton_op and wrap_triton (torch >= 2.6): inductor traces such an op's body and
# calls the Triton kernels it launches from its own generated code.
TRITON_OP = hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")


def _symbolic(value) -> bool:
    """Whether a Problem's feature value is symbolic: under dynamic shapes (torch.compile(dynamic=True),
    or any size dynamo marked dynamic after a recompile) a feature computed from a size, such as
    "head_dim" or "large" (numel >= 4M), is a SymInt / SymBool. Inside dynamo such a value passes
    isinstance(v, int) and int() / bool() leave it symbolic; has_static_value is what dynamo folds
    to a constant."""
    from torch.fx.experimental.symbolic_shapes import has_static_value
    if isinstance(value, tuple):
        return any(_symbolic(v) for v in value)
    if isinstance(value, (bool, int, float, torch.SymBool, torch.SymInt, torch.SymFloat)):
        return not has_static_value(value)
    return False


class _Chosen:
    """Backends chosen while tracing, as attributes "<op>/<name>": dynamo reads a class attribute
    when it meets it (a dict it would have read once, before _choose added to it)."""


def _choose(op: str, device: torch.device, dtype: torch.dtype, kind: str, features: tuple, backend: str) -> str:
    """The name of the verified dispatcher's backend for this Problem. dynamo calls it while it
    traces (below) and keeps the answer as a constant of the graph: no lookup per call. Any mode
    of the tracer (fake tensors) is set aside, so a first-call verification runs for real."""
    from torch.utils._python_dispatch import _disable_current_modes
    problem = Problem(op, device, dtype, kind, features)
    with _disable_current_modes():
        # select.resolve_waiting: a graph waits for the verdict rather than bake a baseline in
        chosen = (dropout.resolve if problem.feature("dropout") is not None else select.resolve_waiting)(problem, backend)
    setattr(_Chosen, f"{op}/{chosen.name}", chosen)
    return chosen.name


# torch._dynamo.assume_constant_result's whole effect, without importing torch._dynamo with
# gpuparity (it costs import time; dynamo reads the attribute when it meets the call).
_choose._dynamo_marked_constant = True


def _refuse_deferred(*args, **kwargs):
    raise RuntimeError("gpuparity.ops.library: a backend deferred to run time (symbolic sizes) was called while "
                       "tracing; the traced path must route it through its custom op, whose body chooses the backend")


# (op, backend asked for) -> its deferred stand-in, one object per pair (apply_rotary_pair compares them)
_DEFERRED: Dict[tuple, Backend] = caches.register("ops.library.deferred", {})


def _deferred(op: str, backend: str) -> Backend:
    """A stand-in that routes a traced call through the opaque custom op with `backend` as asked
    ("auto" or a name): the op's body chooses when the graph runs, on the real sizes. Its
    forward_saving is set (never called) so every traced path takes the op, not an inline
    composition; its name is what the op body resolves."""
    key = (op, backend)
    if key not in _DEFERRED:
        _DEFERRED[key] = Backend(name=backend, op=op, fn=_refuse_deferred, description="chosen when the op runs",
                                 forward_saving=_refuse_deferred, backward_from=_refuse_deferred, jit=True)
    return _DEFERRED[key]


def deferred(chosen: Backend) -> bool:
    """Whether traced_backend deferred the choice to the op's body (symbolic features)."""
    return chosen.fn is _refuse_deferred


def traced_backend(problem: Problem, backend: str) -> Backend:
    """The backend that serves `problem` in a graph being traced, chosen now (see _choose), or,
    when a feature is symbolic (dynamic shapes), a stand-in that defers the choice to the custom
    op's body when it runs (`_deferred`): a choice made from one size's features would be wrong
    for the others the graph serves, and specialising every size to make it would recompile the
    graph for each one."""
    if _symbolic(problem.features):
        return _deferred(problem.op, backend)
    name = _choose(problem.op, problem.device, problem.dtype, problem.kind, problem.features, backend)
    return getattr(_Chosen, f"{problem.op}/{name}")


def _static(*tensors: Optional[Tensor]) -> bool:
    """Whether every size of these tensors is a constant of the traced graph (see _symbolic)."""
    return not any(_symbolic(size) for t in tensors if t is not None for size in t.shape)


# GPUPARITY_COMPILED_KERNELS: "opaque" (default) or "twin". Inductor compiles a twin's kernels itself
# from their source, in its own Triton cache (torch._inductor.codegen.wrapper
# define_user_defined_triton_kernel); the opaque op's body launches them as an eager call does, from
# the Triton cache the eager calls and the checks filled (nothing for inductor to compile; Python per call).
# Opaque is the default since the H100 measurement of the first compiled steps (issue 43, record
# benchmarks/records/h100/first-steps-2026-12-06.md): with the first-call workers warmed, the first 3
# compiled steps took 1.14x the unpatched model's (twin: 1.34x); the steps after them ran 26.3 ms against
# the twin's 25.6 ms there (unpatched 29.5 ms), so a long run whose compile is amortised may set "twin".
COMPILED_KERNELS, COMPILED_KERNEL_MODES = "GPUPARITY_COMPILED_KERNELS", ("opaque", "twin")
compiled_kernels = functools.partial(select.env_mode, COMPILED_KERNELS, COMPILED_KERNEL_MODES)


def _kernels_traceable(*tensors: Optional[Tensor]) -> bool:
    """Whether the triton_op twin serves this traced call: torch has triton_op, the kernels are
    compiled ones (the interpreter's cannot be wrapped), the shapes are static (launch plans key
    on sizes), GPUPARITY_COMPILED_KERNELS is "twin" (not the default); else the opaque op. (Inductor passes a
    Python float to a user kernel as fp64: the kernels cast their float arguments to fp32.)"""
    return TRITON_OP and compiled_kernels() == "twin" and not triton_common.interpreting() and _static(*tensors)


def _twin(name: str, fn: Callable, schema: Optional[str] = None):
    """`fn` (a custom op's body) registered again as the triton_op gpuparity::<name>_kernels,
    its launches wrapped by wrap_triton while inductor traces it. None without triton_op."""
    if not TRITON_OP:
        return None

    @functools.wraps(fn)
    def body(*args, **kwargs):
        kernel_analysis.install()       # torch's per-call-site IR analysis of each kernel, once
        with triton_common.traced_launches():
            return fn(*args, **kwargs)

    return torch.library.triton_op(f"gpuparity::{name}_kernels", body, mutates_args=(), schema=schema)


_SCHEMA_TYPES = {"Tensor": Tensor, "SymInt": int, "SymInt[]": List[int], "float": float, "bool": bool, "str": str,
                 "ScalarType": torch.dtype, "bool[]": List[bool]}


def _python_signature(signature: Signature) -> inspect.Signature:
    """The library op's arguments as a Python signature with the annotations torch reads a
    schema from (torch.library.infer_schema gives back `signature.schema()`)."""
    params = []
    for a in signature.library_order():
        optional = a.type.endswith("?")
        annotation = _SCHEMA_TYPES[a.type.rstrip("?")]
        params.append(inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        annotation=Optional[annotation] if optional else annotation,
                                        default=a.default if (a.appended and not a.required)
                                        else inspect.Parameter.empty))
    outputs = (Tensor,) * len(signature.outputs)
    return inspect.Signature(params, return_annotation=outputs[0] if len(outputs) == 1 else Tuple[outputs])


def define(signature: Signature, body: Callable, fake: Callable, backward: Optional[Callable] = None,
           setup: Optional[Callable] = None, twin: bool = True):
    """The torch.library op gpuparity::<op> of a declared signature (its schema generated by
    `signature.schema()`) and its triton_op twin (`_twin`; None without triton_op): `body(a)` and
    `fake(a)` get the op's arguments as one named tuple (`signature.library_args`). With
    `backward`: `setup(ctx, a, output, kernels)` saves what it needs, and `backward(ctx, *grads)`
    returns {argument name: its gradient}, put in the schema's order here. twin=False: no triton_op."""
    name, schema = signature.library_name, signature.schema()

    def run(*args, **kwargs):
        return body(signature.library_args(args, kwargs))

    run.__name__ = run.__qualname__ = f"_{name}_body"
    run.__doc__ = body.__doc__
    run.__signature__ = _python_signature(signature)   # triton_op infers its schema from it
    op = torch.library.custom_op(f"gpuparity::{name}", run, mutates_args=(), schema=schema)
    op.register_fake(lambda *args, **kwargs: fake(signature.library_args(args, kwargs)))
    twin = _twin(name, run, schema) if twin else None
    if backward is not None:
        order = [a.name for a in signature.library_order()]

        def ordered(ctx, *grads):
            given = backward(ctx, *grads)
            return tuple(given.get(n) for n in order)

        for kernels, registered in enumerate((op, twin)):
            if registered is not None:
                registered.register_autograd(ordered, setup_context=functools.partial(
                    lambda ctx, inputs, output, kernels: setup(ctx, signature.library_args(inputs), output, kernels),
                    kernels=bool(kernels)))
    return op, twin


def _op(name: str, kernels: bool):
    return getattr(torch.ops.gpuparity, f"{name}_kernels" if kernels else name)


# ----------------------------------------------------------------------------- attention
def _attention_problem(q, k, v, attn_mask, key_padding_mask, is_causal, scale, mask_grad, window, softcap,
                       dropout_p=0.0) -> Problem:
    return attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                             is_causal=is_causal, scale=scale, mask_requires_grad=mask_grad,
                             window=None if window is None else tuple(window), softcap=softcap, dropout_p=dropout_p)


def _attention_extras(problem: Problem, seed: Optional[Tensor]):
    """The backend's keyword arguments beyond the masks; the seed (a CPU int64 scalar drawn in
    the traced graph: reading it is no device sync) only with dropout."""
    extras = attention_extras(problem)
    if "dropout_p" in extras:
        if seed is None:
            raise ValueError("seed: gpuparity::attention with dropout_p > 0 needs a seed tensor, got None")
        extras["seed"] = int(seed)
    return extras


def _attention_body(a) -> Tuple[Tensor, Tensor]:
    """(out, lse): lse (B, H, Sq) float32 is what a split backend's backward reads (zeros else).
    dropout_p > 0 needs `seed`, an int64 scalar tensor (the backward gets the same one)."""
    q = a.q
    problem = _attention_problem(q, a.k, a.v, a.attn_mask, a.key_padding_mask, a.is_causal, a.scale, a.mask_grad,
                                 a.window, a.softcap, a.dropout_p)
    chosen = _serve(problem, a.backend)
    extras = _attention_extras(problem, a.seed)
    if chosen.forward_saving is not None:
        out, (lse,) = chosen.forward_saving(q, a.k, a.v, a.attn_mask, a.key_padding_mask, a.is_causal, a.scale,
                                            **extras)
    else:
        out = chosen.fn(q, a.k, a.v, attn_mask=a.attn_mask, key_padding_mask=a.key_padding_mask,
                        is_causal=a.is_causal, scale=a.scale, **extras)
        lse = q.new_zeros(q.shape[:3], dtype=torch.float32)
    return _like(out, q), lse


def _attention_fake(a) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(a.q), a.q.new_empty(a.q.shape[:3], dtype=torch.float32)


def _attention_backward_body(a) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d attn_mask); the mask's gradient is an empty tensor unless mask_grad."""
    q, k, v, mask_grad = a.q, a.k, a.v, a.mask_grad
    problem = _attention_problem(q, k, v, a.attn_mask, a.key_padding_mask, a.is_causal, a.scale, mask_grad, a.window,
                                 a.softcap, a.dropout_p)
    chosen = _served(problem, a.backend)
    extras = _attention_extras(problem, a.seed)
    if chosen.backward_from is not None and not mask_grad:
        dq, dk, dv = chosen.backward_from(a.grad, (a.out, a.lse), q, k, v, a.attn_mask, a.key_padding_mask,
                                          a.is_causal, a.scale, **extras)
        dmask = None
    else:
        def forward(q_, k_, v_, mask_):
            return chosen.fn(q_, k_, v_, attn_mask=mask_, key_padding_mask=a.key_padding_mask, is_causal=a.is_causal,
                             scale=a.scale, **extras)
        dq, dk, dv, dmask = _recomputed_grads(forward, [q, k, v, a.attn_mask], [True, True, True, mask_grad], a.grad)
    return (_like(dq, q), _like(dk, k), _like(dv, v),
            dmask.contiguous() if mask_grad else _nothing(q))


def _attention_backward_fake(a) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    q = a.q
    dmask = (torch.empty(a.attn_mask.shape, dtype=a.attn_mask.dtype, device=q.device) if a.mask_grad
             else q.new_empty(0, dtype=torch.float32))
    return torch.empty_like(q), torch.empty_like(a.k), torch.empty_like(a.v), dmask


attention_backward_op, attention_backward_kernels_op = define(ATTENTION_BACKWARD, _attention_backward_body,
                                                              _attention_backward_fake)


def _attention_setup(ctx, a, output, kernels):
    ctx.kernels = kernels
    ctx.save_for_backward(a.q, a.k, a.v, output[0], output[1], a.attn_mask, a.key_padding_mask, a.seed)
    ctx.spec = (a.is_causal, a.scale, a.mask_grad, a.backend, a.window, a.softcap, a.dropout_p)


def _attention_backward(ctx, grad, _grad_lse):
    q, k, v, out, lse, attn_mask, key_padding_mask, seed = ctx.saved_tensors
    is_causal, scale, mask_grad, backend, window, softcap, dropout_p = ctx.spec
    dq, dk, dv, dmask = _op("attention_backward", ctx.kernels)(
        grad, q, k, v, out, lse, attn_mask, key_padding_mask, is_causal, scale, mask_grad, backend, window, softcap,
        dropout_p, seed)
    return {"q": dq, "k": dk, "v": dv, "attn_mask": dmask if mask_grad else None}


attention_op, attention_kernels_op = define(ATTENTION, _attention_body, _attention_fake, _attention_backward,
                                            _attention_setup)


def attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, backend, window=None, softcap=None,
              dropout_p: float = 0.0, seed: Optional[Tensor] = None) -> Tensor:
    """A traced gpuparity.attention: sdpa or the composition inline (inductor has its own
    lowering for sdpa), a Triton backend as an op (see the top). With dropout, the op (its body
    reads the seed drawn in the graph)."""
    mask_grad = attn_mask is not None and attn_mask.is_floating_point() and attn_mask.requires_grad
    problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=bool(is_causal), scale=scale, window=window, softcap=softcap,
                                dropout_p=dropout_p)
    chosen = traced_backend(problem, backend)
    if chosen.forward_saving is None and not chosen.jit and problem.feature("dropout") is None:
        return chosen.fn(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=bool(is_causal),
                         scale=scale, **attention_extras(problem))
    kernels = chosen.forward_saving is not None and not mask_grad and _kernels_traceable(q, k, v, attn_mask,
                                                                                         key_padding_mask)
    return _op("attention", kernels)(q, k, v, attn_mask, key_padding_mask, bool(is_causal),
                                     None if scale is None else float(scale), bool(mask_grad), chosen.name,
                                     None if window is None else [int(w) for w in window],
                                     None if softcap is None else float(softcap), float(dropout_p), seed)[0]
