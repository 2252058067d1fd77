"""Compare two traces of the same model and inputs, module by module, and name the first
module whose own computation diverges, forward and backward.

The rule (docs/diverging-runs.md): every recorded tensor of B is compared with A's by
relative L2 error (gpuparity.tolerance). A module's output may carry the error it inherited: it
passes when err <= max(2 * inherited, floor), where `inherited` is the sum of its inputs'
errors (to first order, the error of a product of them) or, if larger, the largest error
computed inside it before its output (its children's outputs), and `floor` is the tolerance
floor of the coarser dtype of the two tensors (fp32 on a GPU with TF32 enabled counts as TF32:
the float16 floor). Code a container runs between its children (a residual add, a pooling
written inline) is checked the same way, as the container's "own code".
Every call's output is its own key in both traces (trace schema 2), also when it is its child's
tensor, so a module that returns a new tensor in one run and its child's in the other is judged
on its own step; a call that passes a tensor recorded before on unchanged in both runs computed
nothing of its own and is never blamed.

Backward: each call's own vector-Jacobian product (gradients for its inputs and parameters,
recorded from its output gradients, taken together as one relative error) against
max(4 * (error of the output gradients it received + forward inherited error), 2 * floor): the
backward multiplies the two, so their errors add, and its reductions (bias and LayerNorm
gradients) amplify rounding: a bf16 LayerNorm backward measured ~3x its inherited error, while
a broken kernel's error is O(0.1-1).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .. import platform as _platform
from .. import tolerance
from . import store
from .store import TraceMismatch

SCHEMA_VERSION = 1


@dataclasses.dataclass
class Row:
    """One module call (or the inline code of one), one direction."""
    index: int
    direction: str                 # "forward" | "backward"
    key: str                       # the call ("blocks.0.attn", "blocks.0.attn#1")
    module: str
    type: str
    depth: int
    leaf: bool
    what: str                      # "output" | "own code" | "own backward"
    tensor: str = ""               # the tensor that decided the row (its worst)
    err: Optional[float] = None    # relative L2 error of B against A
    inherited: float = 0.0
    allowed: Optional[float] = None
    max_abs: Optional[float] = None
    worst_index: Optional[List[int]] = None
    passed: bool = True
    reason: str = ""
    grad_out_err: Optional[float] = None   # backward: error of the output gradient it received

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TraceComparison:
    a: Dict[str, Any]
    b: Dict[str, Any]
    identity: Dict[str, str]
    forward: List[Row]
    backward: List[Row]
    notes: List[str]

    @property
    def first_forward(self) -> Optional[Row]:
        return next((r for r in self.forward if not r.passed), None)

    @property
    def first_backward(self) -> Optional[Row]:
        return next((r for r in self.backward if not r.passed), None)

    @property
    def passed(self) -> bool:
        return self.first_forward is None and self.first_backward is None

    def to_dict(self) -> Dict[str, Any]:
        first_f, first_b = self.first_forward, self.first_backward
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "gpuparity-trace-comparison",
            "platform": _platform.current(),
            "a": self.a, "b": self.b, "identity": self.identity, "passed": self.passed,
            "first_forward": first_f.to_dict() if first_f else None,
            "first_backward": first_b.to_dict() if first_b else None,
            "forward": [r.to_dict() for r in self.forward],
            "backward": [r.to_dict() for r in self.backward],
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- tolerance
def _tf32(report: Dict[str, Any]) -> bool:
    numerics = report.get("numerics") if isinstance(report.get("numerics"), dict) else {}
    return (numerics.get("matmul_allow_tf32") is True or numerics.get("cudnn_allow_tf32") is True
            or numerics.get("float32_matmul_precision") in ("high", "medium"))


def tensor_floor(meta: Dict[str, Any], report: Dict[str, Any]) -> float:
    """The tolerance floor of one recorded tensor: its dtype's, or TF32's for fp32 on a GPU
    that may use TF32 (same 10-bit mantissa as float16, so float16's floor)."""
    try:
        dtype = store.dtype_from_name(meta["dtype"])
    except ValueError:
        return 0.0
    floor = tolerance.floor_for(dtype)
    if dtype == torch.float32 and not str(meta.get("device", "cpu")).startswith("cpu") and _tf32(report):
        floor = max(floor, tolerance.floor_for(torch.float16))
    return floor


BACKWARD_FACTOR = 4.0       # calibrated: see the module docstring
BACKWARD_FLOOR_FACTOR = 2.0


def allowed_error(inherited: float, floor: float, backward: bool = False) -> float:
    if backward:
        return max(BACKWARD_FACTOR * inherited, BACKWARD_FLOOR_FACTOR * floor)
    return max(tolerance.BASELINE_FACTOR * inherited, floor)


def _indices(meta: Dict[str, Any]) -> Optional[np.ndarray]:
    if not meta.get("sampled"):
        return None
    return store.sample_indices(meta["shape"], int(meta["sampled"])).numpy()


def aligned(ta: torch.Tensor, ma: Dict[str, Any], tb: torch.Tensor, mb: Dict[str, Any]
            ) -> Tuple[torch.Tensor, torch.Tensor, Optional[np.ndarray]]:
    """Both tensors over the same elements: full tensors, or the common sample (flat indices
    returned so the worst element can be named in the full shape)."""
    ia, ib = _indices(ma), _indices(mb)
    if ia is None and ib is None:
        return ta, tb, None
    if ia is None:
        return ta.reshape(-1)[torch.from_numpy(ib)], tb, ib
    if ib is None:
        return ta, tb.reshape(-1)[torch.from_numpy(ia)], ia
    common, pa, pb = np.intersect1d(ia, ib, return_indices=True)
    return ta[torch.from_numpy(pa)], tb[torch.from_numpy(pb)], common


def tensor_error(name: str, ta: torch.Tensor, ma: Dict[str, Any], tb: torch.Tensor, mb: Dict[str, Any]
                 ) -> Dict[str, Any]:
    """{"err", "max_abs", "worst_index", "reason"} of B against A (err = inf when not comparable)."""
    if list(ma["shape"]) != list(mb["shape"]):
        return {"err": math.inf, "reason": f"{name}: shape {tuple(mb['shape'])} in B, {tuple(ma['shape'])} in A"}
    ta, tb, flat_index = aligned(ta, ma, tb, mb)
    if not (ta.is_floating_point() and tb.is_floating_point()):
        differ = ta.to(torch.int64) != tb.to(torch.int64)
        count = int(differ.sum())
        if count == 0:
            return {"err": 0.0, "max_abs": 0.0, "diff_norm": 0.0, "ref_norm": 1.0}
        return {"err": count / max(differ.numel(), 1), "diff_norm": float(count), "ref_norm": float(differ.numel()),
                "reason": f"{name}: {count} of {differ.numel()} values differ"}
    a64, b64 = ta.to(torch.float64), tb.to(torch.float64)
    finite_a, finite_b = torch.isfinite(a64), torch.isfinite(b64)
    both_same_nonfinite = ~finite_a & ~finite_b & ((a64 == b64) | (torch.isnan(a64) & torch.isnan(b64)))
    a_only = ~finite_a & finite_b
    if a_only.any():
        return {"err": math.inf, "reason": f"{name}: A has {int(a_only.sum())} NaN/Inf values where B is finite"}
    result = tolerance.judge(name, tb, ta, None, torch.float32, valid=~both_same_nonfinite)
    if result.err is None:  # NaN/Inf in B where A is finite
        return {"err": math.inf, "reason": result.reason.replace("the reference", "A"),
                "worst_index": _full_index(result.worst_index, flat_index, ma["shape"])}
    ref_norm = float(torch.linalg.vector_norm(a64.masked_fill(both_same_nonfinite, 0.0)))
    return {"err": result.err, "max_abs": result.max_abs, "ref_norm": ref_norm,
            "diff_norm": result.err * ref_norm if ref_norm > 0 else result.err,
            "worst_index": _full_index(result.worst_index, flat_index, ma["shape"])}


def combined_error(results: List[Dict[str, Any]]) -> float:
    """Relative L2 error over several tensors taken together: sqrt(sum ||diff||^2 / sum ||ref||^2).
    Used for a call's own backward, where one of its gradients can be pure rounding noise
    around zero (a bias whose gradient cancels exactly) and alone would give a huge relative
    error."""
    if any(not math.isfinite(r["err"]) for r in results):
        return math.inf
    diff = math.sqrt(sum(r.get("diff_norm", 0.0) ** 2 for r in results))
    ref = math.sqrt(sum(r.get("ref_norm", 0.0) ** 2 for r in results))
    return diff / ref if ref > 0 else diff


def _full_index(index, flat_index, shape) -> Optional[List[int]]:
    if index is None or flat_index is None or not index:
        return index
    flat = int(flat_index[index[0]])
    return [int(i) for i in np.unravel_index(flat, tuple(shape))] if len(shape) else []


# --------------------------------------------------------------------------- the walk
class _Pair:
    def __init__(self, a: store.Trace, b: store.Trace):
        self.a, self.b = a, b
        self.errors: Dict[str, Dict[str, Any]] = {}
        self.missing: List[str] = []

    def error(self, key: str) -> Optional[Dict[str, Any]]:
        """B vs A for one tensor key, cached; None when B lacks it."""
        if key in self.errors:
            return self.errors[key]
        # B of trace schema 1 keyed a call's output that is its child's tensor by the child only
        b_key = key if self.b.has(key) else self.a.tensor_meta[key].get("alias_of")
        if b_key is None or not self.b.has(b_key):
            self.missing.append(key)
            self.errors[key] = None
            return None
        ma, mb = self.a.tensor_meta[key], self.b.tensor_meta[b_key]
        result = tensor_error(key, self.a.tensor(key), ma, self.b.tensor(b_key), mb)
        result["floor"] = max(tensor_floor(ma, self.a.meta.get("platform", {})),
                              tensor_floor(mb, self.b.meta.get("platform", {})))
        self.errors[key] = result
        return result

    def err(self, key: str) -> float:
        result = self.error(key)
        return 0.0 if result is None else result["err"]


def _check(pair: _Pair, row: Row, tensors: List[str], inherited: float, combine: bool = False) -> Row:
    """Fill a row from its tensors: each judged alone, the worst (by err / allowed) deciding,
    or, with `combine`, all of them as one (see combined_error)."""
    row.inherited = inherited
    results = [(key, pair.error(key)) for key in tensors]
    results = [(key, r) for key, r in results if r is not None]
    if not results:
        row.reason = "not in B"
        return row
    if combine:
        key, worst = max(results, key=lambda kr: kr[1].get("diff_norm", math.inf) if math.isfinite(kr[1]["err"])
                         else math.inf)
        err = combined_error([r for _, r in results])
        floor = max(r["floor"] for _, r in results)
        candidates = [(key, dict(worst, err=err, floor=floor))]
    else:
        candidates = results
    worst_ratio = -1.0
    for key, result in candidates:
        allowed = allowed_error(inherited, result["floor"], backward=row.direction == "backward")
        err = result["err"]
        ratio = math.inf if not math.isfinite(err) else (err / allowed if allowed > 0 else (0.0 if err == 0 else math.inf))
        if ratio > worst_ratio:
            worst_ratio = ratio
            row.tensor, row.err, row.allowed = key, err, allowed
            row.max_abs, row.worst_index = result.get("max_abs"), result.get("worst_index")
            row.reason = result.get("reason", "")
    row.passed = worst_ratio <= 1.0
    if not row.passed and not row.reason:
        row.reason = (f"{row.tensor}: relative error {row.err:.3g} > allowed {row.allowed:.3g} "
                      f"(inherited {inherited:.3g}); max abs error {row.max_abs:.3g} at {row.worst_index}")
    return row


def _passes_on(a: store.Trace, b: store.Trace, row: Row, tensors: List[str]) -> Row:
    """A call whose outputs are, in both runs, tensors recorded before (its child's output or its
    own input, passed on unchanged) computed nothing of its own: never blamed, whatever it carries."""
    if row.passed or row.what != "output":
        return row
    same = [a.tensor_meta[k].get("alias_of") for k in tensors]
    if all(same) and all(b.has(k) and b.tensor_meta[k].get("alias_of") == s for k, s in zip(tensors, same)):
        row.passed = True
        row.reason = f"passes {same[0]} on unchanged in both runs (that tensor's error, not its own)"
    return row


def _summary(trace: store.Trace) -> Dict[str, Any]:
    report = trace.meta.get("platform", {})
    return {"path": trace.path, "device": trace.device, "dtype": trace.dtype, "spec": trace.meta.get("spec"),
            "factory_args": trace.meta.get("factory_args"), "created": trace.meta.get("created"),
            "integrity": trace.integrity,
            "machine": _platform.summary_line(report) if isinstance(report, dict) else "unknown",
            "fingerprint": _platform.fingerprint_key(report) if isinstance(report, dict) else None}


def check_identity(a: store.Trace, b: store.Trace) -> Dict[str, str]:
    """Refuse traces of different models or inputs (raises TraceMismatch)."""
    try:
        weights = store.match_fingerprints("weights", a.meta["weights"], b.meta["weights"])
        inputs = store.match_fingerprints("inputs", a.meta["inputs"], b.meta["inputs"])
    except TraceMismatch as exc:
        raise TraceMismatch(f"refusing to compare {a.path} with {b.path}: {exc}") from None
    return {"weights": weights, "inputs": inputs}


def compare(a, b) -> TraceComparison:
    """Compare trace B with trace A (paths or loaded traces). A is the reference run."""
    a, b = store.load(a), store.load(b)
    identity = check_identity(a, b)
    pair = _Pair(a, b)
    notes: List[str] = []
    if a.meta.get("loss") != b.meta.get("loss"):
        notes.append("the traces were differentiated through different losses; backward rows are not comparable")
    calls = a.calls
    by_key = {c["key"]: c for c in calls}
    b_keys = {c["key"] for c in b.calls}
    missing_calls = [c["key"] for c in calls if c["key"] not in b_keys]
    if missing_calls:
        notes.append(f"{len(missing_calls)} module calls of A are not in B (first: {missing_calls[0]}); "
                     "were they recorded with different --include patterns?")

    forward_keys = sorted((m["seq"], k) for k, m in a.tensor_meta.items() if "seq" in m)
    seqs = [s for s, _ in forward_keys]

    def span_error(start: int, stop: int, inputs: List[str]) -> float:
        """Error a tensor may inherit: the sum of its call's input errors (first-order error of a
        product of its inputs), or the largest error computed inside the call before it."""
        lo, hi = bisect.bisect_left(seqs, start), bisect.bisect_left(seqs, stop)
        inside = max((pair.err(k) for _, k in forward_keys[lo:hi] if k not in inputs), default=0.0)
        return max(sum(pair.err(k) for k in inputs), inside)

    # Forward: call outputs at the time they were produced, inline tensors at first sight.
    events: List[Tuple[int, Row, List[str], float]] = []
    for call in calls:
        own = [k for k in call.get("output_tensors", []) if a.tensor_meta[k].get("owner") == call["key"]
               and a.tensor_meta[k].get("origin") == "output"]
        tensors = own or call.get("output_tensors", [])
        if not tensors:
            continue
        inherited = span_error(call["seq_start"], call["seq_end"], list(call.get("input_tensors", [])))
        seq = min(a.tensor_meta[k]["seq"] for k in tensors)
        row = Row(0, "forward", call["key"], call["module"], call["type"], call["depth"], call["leaf"], "output")
        events.append((seq, row, tensors, inherited))
    for key, meta in a.tensor_meta.items():
        if meta.get("origin") != "inline":
            continue
        owner = by_key.get(meta.get("owner"))
        if owner is None:
            inherited = span_error(-1, meta["seq"], [])
            row = Row(0, "forward", "(outside recorded modules)", "", "", 0, False, "own code")
        else:
            inherited = span_error(owner["seq_start"], meta["seq"], list(owner.get("input_tensors", [])))
            row = Row(0, "forward", owner["key"], owner["module"], owner["type"], owner["depth"], owner["leaf"],
                      "own code")
        events.append((meta["seq"], row, [key], inherited))
    events.sort(key=lambda e: e[0])
    forward = []
    for index, (_, row, tensors, inherited) in enumerate(events):
        row.index = index
        forward.append(_passes_on(a, b, _check(pair, row, tensors, inherited), tensors))

    # Backward: each call's own vector-Jacobian product, children before parents (reverse start).
    backward = []
    b_calls = {c["key"]: c for c in b.calls}
    for call in sorted(calls, key=lambda c: -c["seq_start"]):
        own = call.get("own_backward")
        other = b_calls.get(call["key"], {}).get("own_backward")
        if not own or not other:
            continue
        tensors = list(own["inputs"].values()) + list(own["params"].values())
        grad_out = [f"grad:{k}" for k in call.get("output_tensors", []) if a.has(f"grad:{k}")]
        grad_out_err = sum(pair.err(k) for k in grad_out)
        forward_err = span_error(call["seq_start"], call["seq_end"], list(call.get("input_tensors", [])))
        row = Row(len(backward), "backward", call["key"], call["module"], call["type"], call["depth"], call["leaf"],
                  "own backward", grad_out_err=grad_out_err)
        # The backward multiplies output gradients by functions of the forward inputs: errors add.
        backward.append(_check(pair, row, tensors, grad_out_err + forward_err, combine=True))

    old = [side for side, trace in (("A", a), ("B", b)) if int(trace.meta.get("schema_version", 0)) < 2]
    if old:
        notes.append(f"{' and '.join(old)} recorded by an older gpuparity (trace schema 1), which keyed a call whose "
                     "output is its child's tensor by the child: such a call is not judged on its own step there; "
                     "record again")
    missing = sorted(set(pair.missing))
    if missing and not missing_calls:
        notes.append(f"{len(missing)} tensors of A are not in B (first: {missing[0]})")
    for side, trace in (("A", a), ("B", b)):
        for note in trace.meta.get("notes", []):
            notes.append(f"{side}: {note}")
        if trace.integrity.startswith("unchecked"):
            notes.append(f"{side}: integrity {trace.integrity}")
        if trace.meta.get("sampled_tensors"):
            notes.append(f"{side}: {trace.meta['sampled_tensors']} tensors were sampled "
                         f"(max_elements={trace.meta.get('max_elements')}); errors are over the common sample")
    return TraceComparison(_summary(a), _summary(b), identity, forward, backward, notes)
