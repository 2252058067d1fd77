"""What every op contract builds on: `OpSpec` (what the battery needs to know about one op: its
cases, how to make seeded inputs, how to call an implementation through the op's public
signature, and which outputs must be zero), `Case`, and `Family` (a regime the battery
generates cases for; the engine that draws them is checks/families.py)."""
from __future__ import annotations

import dataclasses
import sys
import inspect
import numbers
import random
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import caches
from ..registry import Problem
from ..validation import describe


LEVELS = ("quick", "default", "full")


@dataclasses.dataclass(frozen=True)
class Case:
    """One battery case. `level` is the lowest level that runs it (quick < default < full)."""
    name: str
    params: Dict[str, Any]
    level: str = "default"
    kind: Optional[str] = None     # the probe kind it exercises (None: the op's default kind)

    def at(self, level: str) -> bool:
        return LEVELS.index(self.level) <= LEVELS.index(level)


def randn(gen: torch.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    """Seeded standard normal values on the CPU in float64 (rounded to the dtype later)."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


class OpSpec:
    """Subclasses fill in the op. Inputs are made on the CPU from a seed so every machine
    checks exactly the same numbers; floating inputs are rounded to the dtype under test and
    the float64 reference sees those rounded values."""
    op: str = ""
    signature: str = ""                    # the public signature, for docs and --impl errors
    grad_inputs: Tuple[str, ...] = ()     # inputs whose gradients are checked
    reference_fn: Callable = None
    baseline_backend: str = "composition"  # the trusted composition in the registry
    queue_first: bool = False              # its checks start before other ops' (the largest float64 references)
    # speed priors per device family ("cuda", "cpu"): backend names fastest first, or
    # {"default": [...], "large": [...]}; what they mean and where they came from: priors.py
    priors: Dict[str, Any] = {}

    # A contract module names its battery's cases CASES, its regime families FAMILIES and the
    # builder of a case with the op's default params _case(name, level, **params): the three
    # methods below read them there (a spec whose cases live elsewhere overrides them).
    def _contract(self):
        return sys.modules[type(self).__module__]

    def cases(self) -> List[Case]:
        return self._contract().CASES

    def families(self) -> list:
        """The op's regime families (checks/families.py): cases generated per level and seed."""
        return getattr(self._contract(), "FAMILIES", [])

    def make_case(self, name: str, level: str = "default", **overrides) -> Case:
        """A case with the op's default params and `overrides` (families build their members so)."""
        return self._contract()._case(name, level, **overrides)

    def normalize(self, params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """`params` with its coupled values kept consistent after a family draw or a shrink step
        changed some of them (None: not a valid case)."""
        return dict(params)

    # keywords only some cases pass (window, softcap, alibi_slopes): an implementation without
    # one gets those cases as SKIP (checks/signature.py lacking_keywords; checks/plan.py decides it up front)
    optional_keywords: Tuple[str, ...] = ()

    def keywords_needed(self, params: Dict[str, Any]) -> Tuple[str, ...]:
        """The optional keywords (optional_keywords) the call of a case with `params` passes."""
        return ()

    def repro_reference(self) -> Callable:
        """The float64 reference a standalone repro copies (called with the arguments the
        reference got in the check)."""
        return self.reference_fn

    def work(self, params: Dict[str, Any]) -> Optional[int]:
        """Elements of the largest intermediate the float64 referee materialises for `params`
        (sized families: what decides whether a long case fits memory and the level's budget)."""
        return None

    def reference_bytes(self, params: Dict[str, Any]) -> Optional[int]:
        """Host bytes the float64 referee needs for `params`, where it computes in blocks and so
        needs less than work() elements of intermediates (None: 48 bytes per work element)."""
        return None

    def error_terms(self, inputs: Dict[str, Any], params: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
        """Per output name: what raises its tolerance floor (tolerance.error_floor's reduction=,
        the terms each element sums, and logit_peak=, the largest logit exponentiated). inputs:
        the case's float64 inputs, "orig_dtype" the dtype under test, and "grad_out" the
        output's gradient where the check has drawn one."""
        return {}

    def dtypes(self, device: torch.device, level: str = "default") -> List[torch.dtype]:
        """fp16 on the CPU only at --full: torch's CPU half kernels are emulated and not where
        anyone trains (seen: CPU fp16 layer_norm weight grads ~5% off on offset rows)."""
        if device.type == "cpu" and level != "full":
            return [torch.float32, torch.bfloat16]
        return [torch.float32, torch.bfloat16, torch.float16]

    def make_inputs(self, params: Dict[str, Any], gen: torch.Generator) -> Dict[str, Any]:
        """Float64 CPU tensors (and other arguments); the runner casts floating ones."""
        raise NotImplementedError

    def call(self, fn: Callable, inputs: Dict[str, Any], params: Dict[str, Any]):
        """Call fn with the op's public signature, applying any view the case asks for."""
        raise NotImplementedError

    def zero_masks(self, inputs: Dict[str, Any], params: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        """Per output name ("out", "grad_<input>"): elements that must be exactly zero."""
        return {}

    def valid_masks(self, inputs: Dict[str, Any], params: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        return {}

    def precision(self, dtype: torch.dtype, device: torch.device) -> Optional[str]:
        return None

    def problem(self, params: Dict[str, Any], dtype: torch.dtype, device: torch.device) -> Problem:
        return Problem(self.op, device, dtype, self.kind(params))

    def kind(self, params: Dict[str, Any]) -> str:
        return "default"

    def timing_params(self) -> Optional[Dict[str, Any]]:
        """A representative mid-size case for ranking verified backends by speed."""
        return None

    def large_timing_params(self) -> Optional[Dict[str, Any]]:
        """A training-size case that ranks the backends for calls `is_large` says are large, on a
        GPU (where a small case measures launch and host time, not the kernel: a backend that
        wins there can lose by 2x on long sequences). None: one timing ranks every call."""
        return None

    def is_large(self, problem: Problem) -> bool:
        """Whether the large timing case ranks the backends for `problem`."""
        return False

    def cast_inputs(self, inputs: Dict[str, Any], dtype: torch.dtype, device) -> Dict[str, Any]:
        """Floating tensors -> dtype on device, except those named in `keep_float64`."""
        out = {}
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor):
                if value.is_floating_point() and name not in self.keep_dtype:
                    value = value.to(dtype)
                value = value.to(device)
            out[name] = value
        return out

    keep_dtype: Sequence[str] = ()


def tf32_precision(dtype: torch.dtype, device: torch.device, allowed: bool) -> Optional[str]:
    if dtype == torch.float32 and device.type == "cuda" and allowed:
        return "tf32"
    return None


# --------------------------------------------------------------------------- regime families
# Cases of a family are named "<family>.<label>"; explore's fresh draws "<family>.draw<N>".
SEPARATOR = "."
DRAW = "draw"


@dataclasses.dataclass(frozen=True)
class Family:
    """A regime: `members` (label -> params overrides, first `anchors` always run), an optional
    `draw(rng)` making fresh members for --explore, and `sized`: members carry a work size
    (`work(params)`) and all run where the level's budget and memory allow, else SKIP."""
    name: str
    members: Tuple[Tuple[str, Dict[str, Any]], ...]  # (label, params overrides)
    anchors: int = 1
    draw: Optional[Callable[[random.Random], Tuple[str, Dict[str, Any]]]] = None
    sized: bool = False
    level: str = "default"          # lowest level that runs it
    # check --impl at the default level runs member i in the level's i-th dtype (in turn), not in
    # each: a regime of lengths, whose every dtype still meets some member (checks/plan.py)
    dtypes_in_turn: bool = False

    def case(self, make: Callable[..., "Case"], label: str, overrides: Dict[str, Any]) -> "Case":
        return make(f"{self.name}{SEPARATOR}{label}", "default", **overrides)


def family(name: str, members: Sequence[Tuple[str, Dict[str, Any]]], anchors: int = 1, **kwargs) -> Family:
    return Family(name, tuple((label, dict(params)) for label, params in members), anchors, **kwargs)


@dataclasses.dataclass(frozen=True)
class Covering:
    """An op's argument space as dimensions (name, values): the battery's `cover` family is a
    seeded covering array over them (checks/covering.py; every pair of values of every two
    dimensions in some case at the default level, every triple at --level full). `params` maps
    a row (dimension -> value) to the case's params overrides; `allowed` rules out impossible
    or too costly combinations (asked about partial rows: True while its dimensions are unset).
    The dtype is not a dimension: every case runs in each of the level's dtypes. `groups`:
    (dimension names, strength) of dimensions that interact inside kernels, covered at that
    strength at the default level too (mixed strength, checks/covering.py). `dtype_pairs`: at
    the default level a row runs in the dtypes covering.split_choices gives it (every value of
    every dimension meets every dtype in some row: about one dtype a row), not in each."""
    dimensions: Tuple[Tuple[str, Tuple[Any, ...]], ...]
    params: Callable[[Dict[str, Any]], Dict[str, Any]]
    allowed: Callable[[Dict[str, Any]], bool] = (lambda row: True)
    seed: int = 0
    groups: Tuple[Tuple[Tuple[str, ...], int], ...] = ()
    dtype_pairs: bool = False


# Sizes relative to a tile (covering arrays' size dimensions): a multiple, one more, one less, half a tile more.
TILES = (16, 32, 64, 128)
TILE_OFFSETS = ("multiple", "one_more", "one_less", "half_more")


def tile_size(tile: int, offset: str, multiple: int = 1) -> int:
    """`multiple` tiles of `tile`, moved by `offset` (TILE_OFFSETS)."""
    moved = {"multiple": 0, "one_more": 1, "one_less": -1, "half_more": tile // 2}[offset]
    return max(1, tile * multiple + moved)


def named_view(value: str) -> Dict[str, str]:
    """A covering row's "<input>_<view kind>" value as a case's views ({} for "contiguous")."""
    if value == "contiguous":
        return {}
    name, kind = value.rsplit("_", 1)
    return {name: kind}


VIEW_KINDS = ("offset", "sliced", "transposed", "expanded")


def view_members(names: Sequence[str], kinds: Sequence[str] = VIEW_KINDS,
                 base: Optional[Dict[str, Any]] = None) -> List[Tuple[str, Dict[str, Any]]]:
    """One member per (input, layout): each input alone in each unusual layout."""
    return [(f"{name}_{kind}", {**(base or {}), "views": {name: kind}}) for name in names for kind in kinds]


# --------------------------------------------------------------------------- argument checks shared by contracts
INDEX_DTYPES = (torch.int32, torch.int64)


LARGE_NORM = 1 << 22  # elements from which a norm or swiglu call is "large" (ranked by the training-size timing)


def check_softcap(softcap) -> Optional[float]:
    """`softcap` as a float > 0, or None when absent or 0 (FlashAttention's "off")."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap: expected None or a real number > 0, got {describe(softcap)}")
    value = float(softcap)
    if value == 0.0:
        return None
    if not (value > 0.0 and value != float("inf")):
        raise ValueError(f"softcap: expected a finite number > 0 (scores become softcap * tanh(scores / softcap)), "
                         f"got {softcap!r}")
    return value


# Checks of tensor values (each one host sync) already passed: key -> (weakrefs to the tensors,
# their _versions, the check's result). A model passes the same cu_seqlens / offsets to every
# layer, so only the first call of a step pays the sync; an in-place change bumps _version and
# is checked again; the weakrefs rule out new tensors that reuse freed ones' ids.
_VALUES_CHECKED: Dict[tuple, tuple] = caches.register("contracts.base.values_checked", {})
_VALUES_CHECKED_MAX = 256


def checked_once(tensors: Sequence[Optional[torch.Tensor]], extra: tuple, check: Callable[[], Any]) -> Any:
    """check()'s result, computed once per (tensors as objects and versions, extra); check
    raises on bad values, and a raise is never remembered."""
    key = tuple(id(t) for t in tensors) + tuple(extra)
    versions = tuple(None if t is None else t._version for t in tensors)
    seen = _VALUES_CHECKED.get(key)
    if seen is not None and seen[1] == versions and all(
            (ref is None and t is None) or (ref is not None and ref() is t) for ref, t in zip(seen[0], tensors)):
        return seen[2]
    result = check()
    if len(_VALUES_CHECKED) >= _VALUES_CHECKED_MAX:
        _VALUES_CHECKED.clear()
    _VALUES_CHECKED[key] = (tuple(None if t is None else weakref.ref(t) for t in tensors), versions, result)
    return result


def capturing(device: torch.device) -> bool:
    """True while a CUDA graph is captured or torch.compile/export traces: the checks that read
    device values are skipped then (the torch.library op runs them when it runs)."""
    return torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def takes(fn, name: str) -> bool:
    """Whether fn accepts keyword `name` (or **kwargs); True when Python cannot tell. A contract
    passes an optional argument (window, softcap, alibi_slopes) only to implementations that take it."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind_partial(**{name: None})
    except TypeError:
        return False
    return True
