"""Padding invariance (`gpuparity model`): a model that honours its padding mask gives the same
outputs and gradients at the real tokens whatever sits at the padded positions. The check runs
the model twice on the device, once on its inputs and once with the values and token ids at the
padded positions replaced, and names the first module whose own output (or own backward) at
the real tokens moves: one that ignores its mask. It finds what a float64 comparison cannot,
a mask ignored in every dtype (the float64 run of the same wrong code agrees with itself).

What "padded" means comes from the inputs: a (batch, tokens) bool tensor (or a 0/1 one whose name
says mask) that has both values and whose shape leads another input (input_ids, hidden states). The value every row
holds marks the real tokens (a row can be all real, never all padding); under the name
`attention_mask` 1 is a real token, as in transformers.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import tolerance
from ..model_inputs import flatten_tensors
from . import store
from .record import probe_weights, record_in_memory


@dataclasses.dataclass
class Padding:
    path: str                  # where the mask sits in the inputs: "attention_mask", "args[1]"
    valid: torch.Tensor        # (batch, tokens) bool on the CPU: True at the real tokens
    valid_value: int           # the mask's value at the real tokens
    why: str                   # how the convention was decided, in words

    @property
    def shape(self) -> Tuple[int, int]:
        return tuple(self.valid.shape)


@dataclasses.dataclass
class PaddingRow:
    """One module call whose output (or own backward) at the real tokens moved."""
    direction: str             # "forward" | "backward"
    key: str
    module: str
    type: str
    own: bool                  # its inputs at the real tokens did not move: the move is its own
    tensor: str
    change: float              # largest relative change of one sequence's real tokens
    allowed: float

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PaddingCheck:
    checked: bool
    why: str                               # what was checked, or why nothing was
    mask: Optional[str] = None
    padded: int = 0                        # padded positions in the batch
    perturbed: List[str] = dataclasses.field(default_factory=list)
    rows: List[PaddingRow] = dataclasses.field(default_factory=list)
    culprit_forward: Optional[PaddingRow] = None
    culprit_backward: Optional[PaddingRow] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.culprit_forward is None and self.culprit_backward is None

    def to_dict(self) -> Dict[str, Any]:
        return {"checked": self.checked, "why": self.why, "mask": self.mask, "padded": self.padded,
                "perturbed": self.perturbed, "passed": self.passed, "rows": [r.to_dict() for r in self.rows],
                "culprit_forward": self.culprit_forward.to_dict() if self.culprit_forward else None,
                "culprit_backward": self.culprit_backward.to_dict() if self.culprit_backward else None,
                "notes": self.notes}


# --------------------------------------------------------------------------- the inputs
def _named(inputs, path: str = "") -> List[Tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in the inputs: "x", "args[1]", "attention_mask"."""
    if isinstance(inputs, torch.Tensor):
        return [(path or "input", inputs)]
    if isinstance(inputs, (list, tuple)):
        return [item for i, v in enumerate(inputs) for item in _named(v, f"{path or 'args'}[{i}]")]
    if isinstance(inputs, dict):
        return [item for k, v in inputs.items() for item in _named(v, f"{path}.{k}" if path else str(k))]
    return []


def _replaced(inputs, new: Dict[str, torch.Tensor], path: str = ""):
    """The inputs with the tensors at the paths in `new` swapped (containers rebuilt, nothing mutated)."""
    if isinstance(inputs, torch.Tensor):
        return new.get(path or "input", inputs)
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_replaced(v, new, f"{path or 'args'}[{i}]") for i, v in enumerate(inputs))
    if isinstance(inputs, dict):
        return {k: _replaced(v, new, f"{path}.{k}" if path else str(k)) for k, v in inputs.items()}
    return inputs


def _is_binary(tensor: torch.Tensor) -> bool:
    if tensor.dtype == torch.bool:
        return True
    if tensor.is_floating_point() or tensor.is_complex():
        return False
    return bool(((tensor == 0) | (tensor == 1)).all())


def find_padding(inputs) -> Tuple[Optional[Padding], str]:
    """The padding mask among the inputs, or None and why there is none."""
    named = _named(inputs)
    leading = [(p, tuple(t.shape[:2])) for p, t in named if t.dim() >= 2]
    candidates = []
    for path, tensor in named:
        if tensor.dim() != 2 or not _is_binary(tensor):
            continue
        if tensor.dtype != torch.bool and "mask" not in path.rsplit(".", 1)[-1].lower():
            continue   # 0/1 integers are a mask only by name: token_type_ids hold 0 and 1 too
        if not any(other != path and shape == tuple(tensor.shape) for other, shape in leading):
            continue   # a mask of what? no other input has (batch, tokens) in front
        candidates.append((path, tensor))
    if not candidates:
        return None, ("no padding mask among the inputs (a (batch, tokens) bool tensor, or 0/1 one named *mask*, "
                      "in front of another input's shape)")
    candidates.sort(key=lambda c: "mask" not in c[0].rsplit(".", 1)[-1].lower())  # named masks first
    path, tensor = candidates[0]
    mask = tensor.detach().to("cpu").to(torch.int64)
    every_row = [v for v in (0, 1) if bool((mask == v).any(dim=1).all())]
    if not bool((mask == 0).any()) or not bool((mask == 1).any()):
        return None, f"the padding mask {path} marks no padded position in this batch"
    if path.rsplit(".", 1)[-1] == "attention_mask":
        valid_value, why = 1, "1 marks a real token (transformers' attention_mask)"
    elif len(every_row) == 1:
        valid_value = every_row[0]
        why = f"{bool(valid_value) if tensor.dtype == torch.bool else valid_value} marks a real token (every sequence has one)"
    else:
        return None, (f"cannot tell which value of {path} marks padding (both occur in every sequence); name it "
                      "attention_mask (1 = a real token) to check padding invariance")
    return Padding(path, mask == valid_value, valid_value, why), ""


def perturb(inputs, padding: Padding, seed: int = 0) -> Tuple[Any, List[str]]:
    """The inputs with new values at the padded positions of every (batch, tokens, ...) input but the
    mask (and labels): floating values drawn like the real ones, token ids taken from the real tokens."""
    generator = torch.Generator().manual_seed(seed + 7919)
    pad = ~padding.valid
    new: Dict[str, torch.Tensor] = {}
    for path, tensor in _named(inputs):
        if (path == padding.path or "label" in path.lower() or tensor.dim() < 2
                or tuple(tensor.shape[:2]) != padding.shape or tensor.dtype == torch.bool):
            continue
        with torch.no_grad():
            cpu = tensor.detach().to("cpu")
            real = cpu[padding.valid]
            changed = cpu.clone()
            count = int(pad.sum())
            if cpu.is_floating_point():
                real64 = real.double()
                spread = float(real64.std()) if real64.numel() > 1 else 1.0
                fresh = torch.randn((count, *cpu.shape[2:]), generator=generator, dtype=torch.float64)
                changed[pad] = (fresh * (spread or 1.0) + float(real64.mean())).to(cpu.dtype)
            elif not cpu.is_complex():
                # ids the model knows: those of real tokens, so an embedding lookup stays in range
                pick = torch.randint(0, real.shape[0], (count,), generator=generator)
                changed[pad] = real[pick]
            else:
                continue
        if not torch.equal(changed, cpu):
            new[path] = changed.to(tensor.device).requires_grad_(tensor.requires_grad)
    return _replaced(inputs, new), sorted(new)


# --------------------------------------------------------------------------- comparing two runs
def _token_axis(shape: Sequence[int], padding: Padding) -> Optional[int]:
    """The axis of a (batch, ...) tensor that runs over the tokens: 1 if it has the length, else
    the first later one that has it ((batch, heads, tokens, dim)); None if none does."""
    batch, tokens = padding.shape
    if len(shape) < 2 or shape[0] != batch:
        return None
    if shape[1] == tokens:
        return 1
    return next((axis for axis in range(2, len(shape)) if shape[axis] == tokens), None)


def _real_parts(tensor: torch.Tensor, padding: Padding) -> List[torch.Tensor]:
    """Per sequence, the tensor's values at its real tokens (a (batch, ...) tensor without a token
    axis: the sequence's row; not led by the batch: the whole tensor)."""
    batch = padding.shape[0]
    if tensor.dim() == 0 or tensor.shape[0] != batch:
        return [tensor]
    axis = _token_axis(tuple(tensor.shape), padding)
    if axis is None:
        return [tensor[b] for b in range(batch)]
    return [tensor[b].index_select(axis - 1, padding.valid[b].nonzero().flatten()) for b in range(batch)]


def change(a: torch.Tensor, b: torch.Tensor, padding: Padding, whole: bool = False) -> float:
    """How far b moved from a at the real tokens: the largest relative L2 change of one sequence
    (inf for another shape, 1 for integers that differ); whole: over all of it (a weight's gradient)."""
    if a.shape != b.shape:
        return math.inf
    if whole:
        return tolerance.relative_error(b, a) if a.is_floating_point() else float(not torch.equal(a, b))
    if not a.is_floating_point():
        return 0.0 if all(torch.equal(x, y) for x, y in zip(_real_parts(a, padding), _real_parts(b, padding))) else 1.0
    return max((tolerance.relative_error(y, x) for x, y in zip(_real_parts(a, padding), _real_parts(b, padding))),
               default=0.0)


def masked_probe_loss(padding: Padding) -> Callable:
    """The default loss (fixed random projection of the outputs) over the real tokens only: padded
    outputs must not reach the gradients either. Outputs not led by the batch are left out (their
    tokens cannot be told apart)."""
    def loss_fn(output):
        total = None
        for tensor in flatten_tensors(output):
            if not tensor.is_floating_point() or not tensor.requires_grad or tensor.dim() == 0:
                continue
            if tensor.shape[0] != padding.shape[0]:
                continue
            weights = probe_weights(tuple(tensor.shape)).to(tensor.device)
            axis = _token_axis(tuple(tensor.shape), padding)
            if axis is not None:
                keep = padding.valid.to(tensor.device, weights.dtype)
                view = [1] * tensor.dim()
                view[0], view[axis] = keep.shape
                weights = weights * keep.reshape(view)
            term = (tensor.float() * weights).sum() / math.sqrt(max(tensor.numel(), 1))
            total = term if total is None else total + term
        return total
    return loss_fn


def _allowed(meta: Dict[str, Any]) -> float:
    # A model that honours its mask computes the real tokens from the real tokens alone: usually
    # bit for bit the same. One rounding floor of the dtype (tolerance.FLOOR) leaves room for a
    # kernel that reorders a sum; attending to padding moves outputs by tens of percent.
    name = meta.get("dtype")
    return tolerance.floor_for(store.dtype_from_name(name)) if name else 0.0


def _moved(keys: Sequence[str], first: store.Trace, second: store.Trace, padding: Padding
           ) -> Optional[Tuple[str, float, float]]:
    """The worst of `keys` (by change / allowed) if it moved beyond what is allowed."""
    worst = None
    for key in keys:
        if not (first.has(key) and second.has(key)):
            continue
        meta = first.tensor_meta[key]
        # a weight's gradient sums over every token (the padded ones contribute exact zeros)
        whole = ":param." in key
        moved, allowed = change(first.tensor(key), second.tensor(key), padding, whole), _allowed(meta)
        ratio = math.inf if allowed == 0 and moved > 0 else (moved / allowed if allowed else 0.0)
        if moved > allowed and (worst is None or ratio > worst[3]):
            worst = (key, moved, allowed, ratio)
    return worst[:3] if worst else None


def _vjp_keys(call: Dict[str, Any]) -> List[str]:
    own = call.get("own_backward") or {}
    return list(own.get("inputs", {}).values()) + list(own.get("params", {}).values())


def check_padding(model: torch.nn.Module, inputs, *, grads: bool = True, include: Optional[Sequence[str]] = None,
                  seed: int = 0) -> PaddingCheck:
    """Run `model` on its inputs and on the inputs changed at the padded positions; name the first
    module whose own output (forward) or own backward at the real tokens moves."""
    padding, why = find_padding(inputs)
    if padding is None:
        return PaddingCheck(False, why)
    changed, perturbed = perturb(inputs, padding, seed)
    if not perturbed:
        return PaddingCheck(False, f"no input but the mask {padding.path} has values at the padded positions",
                            mask=padding.path)
    loss_fn = masked_probe_loss(padding)
    runs = []
    for these in (inputs, changed):
        meta, tensors = record_in_memory(model, these, grads=grads, include=include, seed=seed, loss_fn=loss_fn)
        runs.append(store.MemoryTrace("padding", meta, tensors))
    first, second = runs
    result = PaddingCheck(True, f"{padding.path}: {padding.why}; changed at {int((~padding.valid).sum())} padded "
                                f"positions: {', '.join(perturbed)}",
                          mask=padding.path, padded=int((~padding.valid).sum()), perturbed=perturbed)
    keys_a = [c["key"] for c in first.calls]
    keys_b = [c["key"] for c in second.calls]
    if keys_a != keys_b:
        result.notes.append("the model called different modules when the padded positions changed; "
                            "only the calls both runs made are compared")
    other = set(keys_b)
    calls = [c for c in first.calls if c["key"] in other]
    for call in calls:                      # post-order: a module's sub-calls come before it
        inputs_moved = _moved(call["input_tensors"], first, second, padding)
        out = _moved(call["output_tensors"], first, second, padding)
        if out is not None:
            result.rows.append(PaddingRow("forward", call["key"], call["module"], call["type"], inputs_moved is None,
                                          *out))
        if not grads or inputs_moved is not None:
            continue
        grads_in = _moved([f"grad:{k}" for k in call["output_tensors"]], first, second, padding)
        own = _moved(_vjp_keys(call), first, second, padding)
        if own is not None:
            result.rows.append(PaddingRow("backward", call["key"], call["module"], call["type"], grads_in is None,
                                          *own))
    result.culprit_forward = _first_own(result.rows, "forward", calls)
    # a backward that moves because its forward did is no finding of its own
    result.culprit_backward = None if result.culprit_forward else _first_own(result.rows, "backward", calls)
    return result


def _first_own(rows: List[PaddingRow], direction: str, calls: List[Dict[str, Any]]) -> Optional[PaddingRow]:
    """The first call (in the order that direction runs) whose own result moved and none of whose
    sub-calls' own results did: a parent that only passes its sub-call's move on is not named."""
    own = {r.key: r for r in rows if r.direction == direction and r.own}
    parents = {c["key"]: c.get("parent") for c in calls}
    covered = set()
    for key in own:
        parent = parents.get(key)
        while parent is not None:
            covered.add(parent)
            parent = parents.get(parent)
    order = [c["key"] for c in sorted(calls, key=lambda c: c["seq_start"], reverse=direction == "backward")]
    return next((own[k] for k in order if k in own and k not in covered), None)
