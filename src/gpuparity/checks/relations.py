"""Equivalence relations: two calls of one implementation that must agree, with no float64 referee.

Attention on a batch equals attention on each item alone; permuting the keys (with their mask
columns) changes nothing; a scale folded into q (by a power of two, exact in every dtype) is the
same call; GQA equals its KV heads repeated; the causal flag equals its band as a bool mask;
contiguous copies equal the views; keys appended and masked out leave every output unchanged.
The norms: rows are independent (a batch against its rows in two calls), a permutation of the
features of x, weight and bias permutes the output. Rotary: each sequence alone with its offset
folded into the cos/sin table; heads are independent. Varlen: the packed call against each
sequence alone. Decode: a paged cache against the same keys contiguous; the batch against its
items. Cross entropy: the rows in two calls, rows permuted, a constant added to each row's
logits, rows appended with target ignore_index, 'sum'/'mean' against 'none' reduced. Every op: contiguous copies against the views. The second side of each lives in
relation_defs.py.

Each relation is checked forward and backward: autograd maps the second side's gradients back
onto the first call's arguments (the second side is built from them with differentiable
slices, permutations and exact scalings), so the gradient of each argument must agree too.

The bar is the 2x rule of the tolerance policy with the baseline composition in the referee's
place: the implementation's disagreement between the two sides must be within
max(2 x the composition's disagreement under the same relation, the output's floor). A bug that
is right on the float64 cases at a size but wrong on the other side of a relation (a path only
B = 1 takes, a kernel that assumes key padding is a suffix, one that reads a view's strides
wrong) is caught here.

In the battery: a relation check is a case named `relation.<relation>.<case>` (the relation on
that case's inputs, e.g. `relation.batch_items.cover.12`), its params the case's plus
"relation". At the default level each relation runs on RELATION_CASES cases it holds for, drawn
by the seed from the op's covering arrays (its listed cases and families where it has none), in
one dtype (seeded), on every implementation checked except the baseline itself; --level full
draws more; quick none. GPUPARITY_RELATION_CASES=N sets the count per relation (0: none).
`--case relation.batch_items.cover.12` reruns one; a failure is shrunk like any check and its
repro runs both sides (write_repro)."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import random
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import tolerance
from ..contracts import get_spec
from ..contracts.base import Case
from . import relation_defs as defs
from .results import Comparison, Status

PREFIX = "relation."
# cases per relation drawn for the battery: (level, deep) -> count; deep: one op, one
# implementation (check --impl, check --backend X), else the doctor and every backend of an op
RELATION_CASES = {("default", True): 2, ("default", False): 1, ("full", True): 6, ("full", False): 3}
COUNT_ENV = "GPUPARITY_RELATION_CASES"
# a relation's cases at the default level: at most this many elements of the op's largest
# intermediate (spec.work), so the relations cost about what a few listed cases do
DEFAULT_WORK = 1 << 22


@dataclasses.dataclass(frozen=True)
class Relation:
    """`applies(params)`: whether it holds for a case; `side(fn, args, kwargs, gen)`: the second
    side (relation_defs), its output mapped onto the first call's."""
    name: str
    applies: Callable[[Dict[str, Any]], bool]
    side: Callable
    doc: str = ""
    # the params of the second call where it is of another kind than the first (a mask added, a
    # paged cache made contiguous): a backend that cannot take that call SKIPs the relation
    second: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None


def _positional(p) -> bool:
    """Arguments whose meaning depends on key positions (a relation moving keys does not hold)."""
    return bool(p.get("causal") or p.get("window") is not None or p.get("alibi") or "causal" in p.get("mask", ""))


def _has_views(default_layout: str):
    """A case whose call gets a non-contiguous tensor (an odd storage offset alone is contiguous)."""
    return lambda p: (any(kind != "offset" for kind in (p.get("views") or {}).values())
                      or p.get("layout", default_layout) != default_layout)


def _lengths(p, key):
    return list(p.get(key) or [])


def _with_mask(kind: str):
    def second(p):
        kinds = [k for k in p["mask"].split("+") if k != "none"]
        return {**p, "mask": "+".join(kinds + [kind] if kind not in kinds else kinds)}
    return second


_CONTIGUOUS = "contiguous copies equal the views"

RELATIONS: Dict[str, Tuple[Relation, ...]] = {
    "attention": (
        Relation("batch_items", lambda p: p["B"] >= 2, defs.attention_batch_items, "the batch equals each item alone"),
        Relation("key_permutation", lambda p: not _positional(p), defs.attention_key_permutation,
                 "keys, values and their mask columns permuted together"),
        Relation("scale_fold", lambda p: not p.get("alibi"), defs.attention_scale_fold, "q / 4 with 4x the scale"),
        Relation("gqa_repeat", lambda p: p["H"] != p["Hkv"] and not p.get("alibi"), defs.attention_gqa_repeat,
                 "GQA equals its KV heads repeated"),
        Relation("causal_band", lambda p: bool(p.get("causal")) and p["mask"] in ("none", "key_padding+causal")
                 and p.get("window") is None and not p.get("alibi"), defs.attention_causal_band,
                 "is_causal equals its band as a bool mask", lambda p: {**_with_mask("bool")(p), "causal": False}),
        Relation("contiguous_copy", lambda p: _has_views("bhsd")(p) and not p.get("alibi"), defs.contiguous_copy,
                 _CONTIGUOUS),
        Relation("padding_appended", lambda p: not p.get("alibi") and p.get("window") is None,
                 defs.attention_padding_appended, "keys appended and masked out change nothing",
                 _with_mask("key_padding")),
    ),
    "rms_norm": (
        Relation("rows_split", lambda p: len(p["shape"]) > p["norm_dims"] and p["shape"][0] >= 2, defs.norm_rows_split,
                 "the rows in two calls equal one call"),
        Relation("features_permuted", lambda p: True, defs.norm_features_permuted,
                 "features permuted in x and weight permute the output"),
        Relation("contiguous_copy", _has_views("contiguous"), defs.contiguous_copy, _CONTIGUOUS),
    ),
    "rotary": (
        Relation("items_offsets_folded", lambda p: p["B"] >= 2 or bool(p.get("varlen")) or p["offsets"] not in (0, [0]),
                 defs.rotary_items_offsets_folded, "each sequence alone with its offset folded into cos/sin"),
        Relation("heads_permuted", lambda p: p["H"] >= 2, defs.rotary_heads_permuted,
                 "heads permuted permute the output"),
        Relation("contiguous_copy", _has_views("bshd"), defs.contiguous_copy, _CONTIGUOUS),
    ),
    "attention_varlen": (
        Relation("sequences_alone", lambda p: sum(1 for n in _lengths(p, "q_lens") if n) >= 2,
                 defs.varlen_sequences_alone, "the packed call equals each sequence alone"),
        Relation("contiguous_copy", _has_views("packed"), defs.contiguous_copy, _CONTIGUOUS),
    ),
    "attention_decode": (
        Relation("paged_gathered", lambda p: p.get("page") is not None, defs.decode_paged_gathered,
                 "a paged cache equals the same keys contiguous", lambda p: {**p, "page": None}),
        Relation("batch_items", lambda p: p["B"] >= 2, defs.decode_batch_items, "the batch equals each item alone"),
        Relation("contiguous_copy", _has_views("bhsd"), defs.contiguous_copy, _CONTIGUOUS),
    ),
    "cross_entropy": (
        Relation("rows_split", lambda p: p["n"] >= 2, defs.ce_rows_split,
                 "the rows in two calls equal one call (means weighted by their rows not ignored)"),
        Relation("rows_permuted", lambda p: p["n"] >= 2, defs.ce_rows_permuted,
                 "rows permuted with their targets permute the output"),
        Relation("logit_shift", lambda p: True, defs.ce_logit_shift,
                 "a constant added to each row's logits changes nothing"),
        Relation("ignored_rows_appended", lambda p: True, defs.ce_ignored_rows_appended,
                 "rows appended with target ignore_index change nothing"),
        Relation("reduced_from_none", lambda p: p.get("reduction", "mean") != "none", defs.ce_reduced_from_none,
                 "'sum' and 'mean' equal reduction='none' summed (over the rows not ignored)",
                 lambda p: {**p, "reduction": "none"}),
        Relation("contiguous_copy", _has_views("contiguous"), defs.contiguous_copy, _CONTIGUOUS),
    ),
}
RELATIONS["layer_norm"] = tuple(dataclasses.replace(r, doc=r.doc.replace("x and weight", "x, weight and bias"))
                                for r in RELATIONS["rms_norm"])


def relations_of(op: str) -> Tuple[Relation, ...]:
    return RELATIONS.get(op, ())


def relation(name: str, op: str = "attention") -> Relation:
    for item in relations_of(op):
        if item.name == name:
            return item
    raise ValueError(f"relation: expected one of {', '.join(r.name for r in relations_of(op)) or 'none'} "
                     f"for {op}, got {name!r}")


def applicable(rel: Relation, params: Dict[str, Any]) -> bool:
    try:
        return bool(rel.applies(params))
    except (KeyError, TypeError):
        return False


# --------------------------------------------------------------------------- the battery's cases
def case_name(rel: str, base: str) -> str:
    return f"{PREFIX}{rel}.{base}"


def as_case(spec, rel: Relation, base: Case) -> Case:
    return Case(case_name(rel.name, base.name), {**base.params, "relation": rel.name}, base.level, base.kind)


def lookup(spec, name: str) -> Optional[Case]:
    """A case by name: a relation check (lookup_case), else families.lookup's (a listed case, a
    family member, an explore draw)."""
    from .families import lookup as lookup_member
    return lookup_case(spec, name) if name.startswith(PREFIX) else lookup_member(spec, name)


def lookup_case(spec, name: str) -> Optional[Case]:
    """`relation.<relation>.<case>` as a Case (None: no such relation or case, or it does not hold)."""
    from .families import lookup
    rest = name[len(PREFIX):]
    rel_name, _, base_name = rest.partition(".")
    rel = next((r for r in relations_of(spec.op) if r.name == rel_name), None)
    base = lookup(spec, base_name) if rel is not None and base_name and not base_name.startswith(PREFIX) else None
    if base is None or not applicable(rel, base.params):
        return None
    return as_case(spec, rel, base)


def count(level: str, deep: bool) -> int:
    raw = os.environ.get(COUNT_ENV)
    if raw is not None and raw.strip():
        try:
            wanted = int(raw)
        except ValueError:
            raise ValueError(f"{COUNT_ENV}: expected a whole number of cases per relation, got {raw!r}") from None
        if wanted < 0:
            raise ValueError(f"{COUNT_ENV}: expected 0 or more cases per relation, got {wanted}")
        return wanted if level != "quick" else 0
    return RELATION_CASES.get((level, deep), 0)


def battery_cases(spec, level: str, seed: int, cases: Sequence[Case], deep: bool) -> List[Case]:
    """The relation checks of a run: each relation of the op on `count` of `cases` it holds
    for, drawn by the seed: the covering array's rows where the op has one, else any."""
    from .families import FULL_SUFFIX, cover_family
    rels = relations_of(spec.op)
    wanted = count(level, deep)
    if not rels or wanted <= 0:
        return []
    # every row of the main array (not only those the level runs as float64 checks; not the
    # arrays of optional features, window, softcap and ALiBi, which an --impl without those
    # keywords SKIPs)
    array = cover_family(spec, "cover" + (FULL_SUFFIX if level == "full" else ""))
    pool = ([array.case(spec.make_case, label, params) for label, params in array.members] if array is not None
            else list(cases))
    if level != "full":
        pool = [case for case in pool if (spec.work(case.params) or 0) <= DEFAULT_WORK]
    chosen = []
    for rel in rels:
        holding = [case for case in pool if applicable(rel, case.params)]
        rng = random.Random(zlib.crc32(f"{seed}/{spec.op}/{rel.name}/{level}".encode()))
        for base in rng.sample(holding, min(wanted, len(holding))):
            chosen.append(as_case(spec, rel, base))
    return chosen


def second_params(op: str, params: Dict[str, Any]) -> Dict[str, Any]:
    """The params of a relation check's second call, as far as its kind goes (what a backend's
    reasons() are asked about)."""
    rel = relation(params["relation"], op)
    return rel.second(params) if rel.second is not None else params


# --------------------------------------------------------------------------- running one
@dataclasses.dataclass
class RelationResult:
    relation: str
    status: Status
    disagreement: Dict[str, float]          # the implementation's, per output
    baseline: Dict[str, float]              # the composition's under the same relation
    allowed: Dict[str, float]
    reason: str = ""
    comparisons: List[Comparison] = dataclasses.field(default_factory=list)


def _argument_names(spec, args: Sequence[Any]) -> List[str]:
    try:
        names = [p.name for p in inspect.signature(spec.reference_fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"arg{i}" for i in range(len(args))]


def record_call(spec, fn: Callable, inputs: Dict[str, Any], params: Dict[str, Any]) -> Tuple[list, dict]:
    """(args, kwargs) of the call the battery makes of `fn` for the case (spec.call with a
    recorder carrying fn's signature, so the optional keywords are passed as to fn)."""
    seen: Dict[str, Any] = {}

    @functools.wraps(fn)
    def record(*args, **kwargs):
        seen.update(args=list(args), kwargs=dict(kwargs))
        return args[0]
    spec.call(record, inputs, params)
    return seen["args"], seen["kwargs"]


def _sides(spec, fn: Callable, rel: Optional[Relation], inputs: Dict[str, Any], params: Dict[str, Any],
           grad_seed: int, side_seed: int, dtype: torch.dtype) -> Tuple[Dict[str, torch.Tensor], Any, tuple]:
    """(first side's outputs, second side's (None without `rel`), the recorded call): "out" and
    "grad_<argument>" for each argument that requires grad; the output's gradient is drawn in
    `dtype` (the dtype under test, whatever precision the inputs are in)."""
    from .families import apply_views
    leaves = {}
    if not params.get("forward_only"):
        for name in spec.grad_inputs:
            value = inputs.get(name)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                leaves[name] = value.detach().clone().requires_grad_(True)
    args, kwargs = record_call(spec, fn, apply_views({**inputs, **leaves}, params.get("views")), params)
    names = _argument_names(spec, args)
    wrt = [(f"grad_{names[i]}", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    wrt += [(f"grad_{name}", a) for name, a in kwargs.items() if isinstance(a, torch.Tensor) and a.requires_grad]
    first = _with_grads(fn(*args, **kwargs), wrt, grad_seed, dtype)
    if rel is None:
        return first, None, (args, kwargs)
    second = rel.side(fn, list(args), dict(kwargs), torch.Generator().manual_seed(side_seed))
    return first, _with_grads(second, wrt, grad_seed, dtype), (args, kwargs)


def _with_grads(out, wrt, grad_seed: int, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"returned {type(out).__name__}, expected a torch.Tensor")
    found = {"out": out.detach()}
    if not wrt:
        return found
    grad_out = _grad_out(out.shape, grad_seed, dtype)
    grads = [None] * len(wrt)
    if out.requires_grad:
        grads = torch.autograd.grad(out, [a for _, a in wrt], grad_out.to(out.device, out.dtype), allow_unused=True,
                                    retain_graph=False)
    for (name, arg), grad in zip(wrt, grads):
        found[name] = torch.zeros_like(arg).detach() if grad is None else grad.detach()
    return found


def _grad_out(shape, grad_seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The output's gradient both sides get: drawn in float64, rounded to `dtype`."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(grad_seed), dtype=torch.float64).to(dtype)


def _disagreement(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], absolute=()) -> Dict[str, float]:
    """Each output's relative difference; for the names in `absolute`, the root mean square of the
    difference (a relative error against a zero reference, tolerance.relative_error); inf where
    the shapes or the non-finite positions differ."""
    found = {}
    for name, value in a.items():
        other = b.get(name)
        if other is None or tuple(other.shape) != tuple(value.shape):
            found[name] = float("inf")
            continue
        value, other = value.detach().cpu().double(), other.detach().cpu().double()
        finite = torch.isfinite(value)
        if not bool(torch.equal(finite, torch.isfinite(other))):
            found[name] = float("inf")
            continue
        value, other = value.masked_fill(~finite, 0), other.masked_fill(~finite, 0)
        if name in absolute:
            found[name] = tolerance.relative_error(value - other, torch.zeros_like(value))
            continue
        if not bool(value.any()):
            # An exactly zero side (a gradient that vanishes, e.g. grad_q of a query that sees one
            # key) is the reference, as a float64 zero is in the battery: the other side's rounding
            # noise is then judged by its root mean square, not as a relative difference of 1.
            value, other = other, value
        found[name] = tolerance.relative_error(value, other)
    return found


def evaluate(op: str, fn: Callable, rel: Relation, params: Dict[str, Any], dtype: torch.dtype,
             device=None, seed: int = 0, baseline_fn: Optional[Callable] = None,
             repro: Optional[Dict[str, Any]] = None) -> RelationResult:
    """One relation on one case on `device`: the implementation's disagreement between the two
    sides against max(2 x the baseline composition's, the output's floor), per output.
    `repro`: as execute.run_case's: also write a standalone repro of the two sides."""
    from ..dispatch import BackendUnavailable, get as get_backend
    from .execute import _round_inputs, make_inputs
    spec = get_spec(op)
    device = torch.device(device or "cpu")
    if not applicable(rel, params):
        return RelationResult(rel.name, Status.SKIP, {}, {}, {}, f"{rel.name} does not hold for this case")
    baseline_fn = baseline_fn or get_backend(op, spec.baseline_backend).fn
    rounded = _round_inputs(make_inputs(spec, params, dtype, torch.Generator().manual_seed(seed)), spec, dtype)
    inputs = spec.cast_inputs(rounded, dtype, device)
    try:
        first, second, call = _sides(spec, fn, rel, inputs, params, seed + 1, seed + 2, dtype)
    except (BackendUnavailable, defs.NotApplicable) as exc:
        return RelationResult(rel.name, Status.SKIP, {}, {}, {}, f"{rel.name}: {exc}")
    except Exception as exc:  # noqa: BLE001 - an implementation that raises on one side is a result
        return RelationResult(rel.name, Status.ERROR, {}, {}, {},
                              f"{rel.name}: raised {type(exc).__name__}: {str(exc)[:300]}")
    got = _disagreement(first, second)
    try:
        base_first, base_second, _ = _sides(spec, baseline_fn, rel, inputs, params, seed + 1, seed + 2, dtype)
        base = _disagreement(base_first, base_second)
    except Exception:  # noqa: BLE001 - without the baseline the floor alone decides
        base_first, base = None, {}
    precision = spec.precision(dtype, device)
    allowed = {name: tolerance.allowed_error(base.get(name), dtype, precision) for name in got}
    if any(not got[name] <= allowed[name] for name in got):
        # Past the plain bar: what a correct computation may err here. The floor's terms (long
        # reductions, large logits, near one-hot rows, layer_norm's means), measured on the
        # float64 inputs as the battery's checks measure them; and the composition's own rounding
        # error on the case (against the float64 referee): a composition that is bitwise
        # unchanged by the relation (keys masked out add exact zeros) says nothing of an
        # ill-conditioned output (grad_q of near one-hot rows), on which two correct
        # computations, each off by that error, differ by up to twice it.
        floor_inputs = {**rounded, "orig_dtype": dtype}
        if len(first) > 1:   # gradients were compared: the floor's gradient terms (near one-hot rows)
            floor_inputs["grad_out"] = _grad_out(first["out"].shape, seed + 1, dtype).to(torch.float64)
        terms = spec.error_terms(floor_inputs, params)
        referee = _referee(spec, rounded, params, dtype, device, seed)
        own = _own_error(base_first, referee)
        # the float64 referee says these outputs are exactly 0 (a gradient that vanishes: every
        # query sees one key): both sides are rounding noise, whose relative difference is ~1;
        # judged by the root mean square of the difference, as the battery judges a side against
        # that 0 (tolerance.relative_error)
        zeros = _exact_zeros(referee).intersection(got)
        got.update(_disagreement({n: first[n] for n in zeros}, {n: second[n] for n in zeros}, absolute=zeros))
        bar = {name: max(base.get(name, 0.0), 2 * own.get(name, 0.0)) if name in base or name in own else None
               for name in got}
        allowed = {name: tolerance.allowed_error(bar[name], dtype, precision, **terms.get(name, {}))
                   for name in got}
    comparisons = [Comparison(name, got[name] <= allowed[name], err=got[name], baseline_err=base.get(name),
                              allowed=allowed[name],
                              reason="" if got[name] <= allowed[name] else
                              f"{name}: the two sides differ by {got[name]:.3g} > allowed {allowed[name]:.3g} "
                              f"(the composition's {base.get(name, float('nan')):.3g})")
                   for name in got]
    failed = [c for c in comparisons if not c.passed]
    reason = f"{rel.name} ({rel.doc}): " + "; ".join(c.reason for c in failed) if failed else ""
    result = RelationResult(rel.name, Status.FAIL if failed else Status.PASS, got, base, allowed, reason, comparisons)
    if repro is not None:
        from .repro import write_relation_repro
        write_relation_repro(repro, op=op, rel=rel, call=call, dtype=dtype, device=device, seed=seed,
                             bounds=allowed, reason=reason)
    return result


def _referee(spec, rounded, params, dtype, device, seed) -> Optional[Dict[str, torch.Tensor]]:
    """The float64 referee's outputs and gradients (spec.reference_fn) on the case's first side,
    as the battery's checks judge against; None where the referee cannot take the call."""
    inputs = {**spec.cast_inputs(rounded, torch.float64, device), "orig_dtype": dtype}
    try:
        referee, _, _ = _sides(spec, spec.reference_fn, None, inputs, params, seed + 1, seed + 2, dtype)
    except Exception:  # noqa: BLE001 - no estimate: the plain bar stands
        return None
    return referee


def _own_error(first, referee) -> Dict[str, float]:
    """The composition's relative error on the case's first side (`first`) against the float64
    referee's (`_referee`), per output ({} without either). Not the composition itself on
    float64 inputs: the attention composition keeps its softmax in fp32 whatever its inputs'
    dtype, so in fp32 that comparison repeated its own rounding and measured ~1e-7 on grad_q of
    near one-hot rows, where it errs 2.6e-3 (tests/checks/test_near_one_hot_floor.py)."""
    if first is None or referee is None:
        return {}
    return {name: value for name, value in _disagreement(first, referee).items() if value == value}


def _exact_zeros(referee) -> set:
    """The names of the referee's outputs that are exactly zero everywhere."""
    return {name for name, value in (referee or {}).items() if not bool(value.any())}


def run_case(op: str, fn: Callable, params: Dict[str, Any], dtype: torch.dtype, device, seed: int,
             baseline_fn: Optional[Callable] = None, repro: Optional[Dict[str, Any]] = None):
    """A relation case of the battery (params["relation"]): (status, comparisons, reason), as
    execute.run_case answers."""
    rel = relation(params["relation"], op)
    result = evaluate(op, fn, rel, params, dtype, device, seed, baseline_fn, repro)
    return result.status, result.comparisons, result.reason


def check(op: str, fn: Callable, rel: Relation, params: Dict[str, Any], dtype: torch.dtype, seed: int = 0,
          baseline_fn: Optional[Callable] = None, device=None) -> RelationResult:
    """One relation on one case (its params as the battery makes them), on the CPU by default."""
    return evaluate(op, fn, rel, params, dtype, device, seed, baseline_fn)


def check_case(op: str, fn: Callable, params: Dict[str, Any], dtype: torch.dtype, seed: int = 0,
               device=None) -> List[RelationResult]:
    """Every relation of the op that holds for the case."""
    return [check(op, fn, rel, params, dtype, seed, device=device) for rel in relations_of(op) if applicable(rel, params)]
