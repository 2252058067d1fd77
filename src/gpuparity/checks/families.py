"""Regime families: battery cases generated, not only listed.

A backend bug hides in a regime (sizes at a tile remainder, rows whose logsumexp underflows,
an all-True mask, one input with an odd storage offset), so each op's contract (contracts/)
names families of cases, each a pool of members aimed at one regime. Every level above quick runs every family:
its anchors (the regime's canonical members) and a seeded sample of the rest; --level full
samples more; --explore SECONDS keeps drawing (fresh members included) where errors came
closest to the bound. Members too large for this machine or the level's budget are reported
as SKIP with why (sized families), never dropped in silence.

Generic transforms any spec gets through params: "views" gives one input an unusual layout
(apply_views), "values" one input a hostile value regime (apply_values)."""
from __future__ import annotations

import os
import random
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import caches
from ..contracts.base import DRAW, LEVELS, SEPARATOR, VIEW_KINDS, Case, Family

# How many extra (non-anchor) members each level samples per family.
SAMPLES = {"quick": 0, "default": 1, "full": 4}

# Work budget of a sized family's member (the largest intermediate the float64 referee
# materialises, in elements: B*H*Sq*Sk for attention) at each level, for ALL the checks that
# run it (implementations x dtypes): one implementation (check --impl) gets long cases the
# doctor, with every backend of the op, leaves to --full. The referee runs on the host.
WORK_BUDGET = {("default", "cpu"): 2 ** 26, ("default", "cuda"): 2 ** 28,
               ("full", "cpu"): 2 ** 28, ("full", "cuda"): 2 ** 32}
REFERENCE_BYTES_PER_ELEMENT = 8 * 6   # float64, forward + backward intermediates of the referee


def _rng(*parts) -> random.Random:
    return random.Random(zlib.crc32("/".join(str(p) for p in parts).encode()))


def select(spec, level: str, seed: int, deep: bool = True,
           fits: Optional[Callable[["Case"], Optional[str]]] = None) -> Tuple[List["Case"], List[Tuple["Case", str]]]:
    """(the family members `level` runs for `spec`, sized members that cannot run here with why).

    deep (one op, one implementation: check --impl, check --backend X): each family's anchors
    and a seeded sample (one at the default level, four at full); every sized member that
    `fits`. Not deep (the doctor, a check of every backend): at the default level one seeded
    member per family (an anchor where it has some) and one of the cheapest sized members that
    fit, so the run stays near the listed cases' time; --level full as deep. The members of a
    sized family of a higher level come back as not runnable, with that reason."""
    if level == "quick":
        return [], []
    wide = level == "default" and not deep
    chosen: List["Case"] = []
    skipped: List[Tuple["Case", str]] = []
    for fam in all_families(spec, level):
        members = [fam.case(spec.make_case, label, params) for label, params in fam.members]
        if LEVELS.index(fam.level) > LEVELS.index(level):
            if fam.sized:   # its members are said not to run, with why, rather than left out
                skipped += [(case, f"its family ({fam.name}) runs at --level {fam.level} or under --explore, "
                                   f"where memory and that level's budget allow") for case in members]
            continue
        rng = _rng(seed, spec.op, fam.name, level)
        if fam.sized:
            reasons = {case.name: fits(case) if fits else None for case in members}
            skipped += [(case, reasons[case.name]) for case in members if reasons[case.name]]
            fitting = [case for case in members if not reasons[case.name]]
            if wide and fitting:
                least = min(spec.work(case.params) or 0 for case in fitting)
                fitting = [rng.choice([case for case in fitting if (spec.work(case.params) or 0) <= 2 * least])]
            chosen += fitting
        elif wide:
            chosen.append(rng.choice(members[:fam.anchors] or members))
        else:
            rest = members[fam.anchors:]
            chosen += members[:fam.anchors] + rng.sample(rest, min(len(rest), SAMPLES.get(level, 1)))
    return chosen, skipped


# --------------------------------------------------------------------------- covering arrays
# The covering-array families of an op whose contract declares COVERING[op] (contracts/base.Covering,
# or a dict of them by family name): "cover" (every pair of values, the default level) and
# "cover3" (every triple, --level full, in place of "cover"); likewise "<name>" and "<name>3" for
# each further array; members named by row number ("cover.12"), every one an anchor.
FULL_SUFFIX = "3"
_COVER_CACHE: Dict[tuple, Any] = caches.register("checks.families.cover", {})


def covering_declarations(spec) -> Dict[str, Any]:
    """The op's covering arrays by family name ({} without any)."""
    declared = getattr(spec._contract(), "COVERING", {}).get(spec.op)
    if declared is None:
        return {}
    return dict(declared) if isinstance(declared, dict) else {"cover": declared}


def covering_declaration(spec):
    """The op's main array ("cover"), or None."""
    return covering_declarations(spec).get("cover")


def _array_of(spec, name: str):
    """(declaration, strength) of the array family `name`, or (None, 0)."""
    declared = covering_declarations(spec)
    if name in declared:
        return declared[name], 2
    if name.endswith(FULL_SUFFIX) and name[:-len(FULL_SUFFIX)] in declared:
        return declared[name[:-len(FULL_SUFFIX)]], 3
    return None, 0


def cover_family(spec, name: str) -> Optional[Family]:
    """The op's covering-array family `name` ("cover", "cover3", ...), or None without a declaration."""
    key = (spec.op, name)
    if key not in _COVER_CACHE:
        declared, strength = _array_of(spec, name)
        fam = None
        if declared is not None:
            from .covering import build
            rows = build(declared.dimensions, strength, declared.seed, declared.allowed, groups=declared.groups)
            members = tuple((str(number), declared.params(row)) for number, row in enumerate(rows))
            fam = Family(name, members, anchors=len(members), level="default" if strength == 2 else "full")
        _COVER_CACHE[key] = fam
    return _COVER_CACHE[key]


def cover_dtypes(spec, name: str, dtypes: Sequence[Any]) -> Optional[Dict[str, List[Any]]]:
    """Where the array `name` is declared with dtype_pairs: its rows' labels -> the `dtypes` each
    runs in at the default level (covering.split_choices over the rows); else None (each row in
    every dtype)."""
    declared, strength = _array_of(spec, name)
    if declared is None or strength != 2 or not declared.dtype_pairs or not dtypes:
        return None
    key = (spec.op, name, "dtypes", len(dtypes))
    if key not in _COVER_CACHE:
        from .covering import build, split_choices
        rows = build(declared.dimensions, strength, declared.seed, declared.allowed, groups=declared.groups)
        _COVER_CACHE[key] = split_choices(rows, declared.dimensions, len(dtypes))
    return {str(number): [dtypes[c] for c in picks] for number, picks in enumerate(_COVER_CACHE[key])}


def all_families(spec, level: Optional[str] = "default") -> list:
    """The op's families at `level`: its contract's, and its covering arrays (pairs at the
    default level, triples at --level full; none at quick). level None: the pairwise ones."""
    if level == "quick":
        return list(spec.families())
    suffix = FULL_SUFFIX if level == "full" else ""
    arrays = [cover_family(spec, name + suffix) for name in covering_declarations(spec)]
    return list(spec.families()) + [fam for fam in arrays if fam is not None]


def pool(spec) -> Dict[str, Case]:
    """Every enumerated member of every family of `spec` (the pairwise covering array's
    included), by case name."""
    return {case.name: case for fam in all_families(spec)
            for case in (fam.case(spec.make_case, label, params) for label, params in fam.members)}


def drawn(spec, fam: Family, number: int) -> "Case":
    """Explore's fresh member number `number` of `fam` (the same for the same number): the
    family's own draw, else one of its members with its sizes moved to other tile boundaries."""
    rng = _rng(spec.op, fam.name, DRAW, number)
    for _ in range(20):
        label, params = fam.draw(rng) if fam.draw is not None else _perturbed(rng, fam)
        case = fam.case(spec.make_case, f"{DRAW}{number}", {**params, "drawn_as": label})
        fixed = spec.normalize(case.params)
        if fixed is not None:
            return type(case)(case.name, fixed, case.level, case.kind)
    return fam.case(spec.make_case, f"{DRAW}{number}", dict(fam.members[0][1]))


PERTURBED = ("Sq", "Sk", "S", "S_max", "n", "c", "vocab", "hidden")


def _boundary_near(rng: random.Random, value: int) -> int:
    tile = rng.choice([16, 32, 64, 128])
    return max(1, tile * max(1, round(value / tile) + rng.choice([-1, 0, 1])) + rng.choice([-1, 0, 1, tile // 2]))


def _perturbed(rng: random.Random, fam: Family) -> Tuple[str, Dict[str, Any]]:
    label, params = rng.choice(fam.members)
    params = dict(params)
    moved = []
    for key in PERTURBED:
        if isinstance(params.get(key), int) and rng.random() < 0.6:
            params[key] = _boundary_near(rng, params[key])
            moved.append(f"{key}{params[key]}")
    shape = params.get("shape")
    if isinstance(shape, (list, tuple)) and shape and rng.random() < 0.8:
        shape = list(shape)
        shape[-1] = _boundary_near(rng, shape[-1])
        params["shape"] = tuple(shape)
        moved.append(f"width{shape[-1]}")
    return f"{label}_{'_'.join(moved) or 'reseeded'}", params


def lookup(spec, name: str) -> Optional[Case]:
    """A listed case, a family member, or an explore draw ("tile.draw17"), by name."""
    listed = {case.name: case for case in spec.cases()}
    if name in listed:
        return listed[name]
    members = pool(spec)
    if name in members:
        return members[name]
    fam_name, _, label = name.partition(SEPARATOR)
    triples = _array_of(spec, fam_name)[1] == 3
    if triples:   # a --level full array, built when named
        found = cover_family(spec, fam_name)
        if found is not None and label in dict(found.members):
            return found.case(spec.make_case, label, dict(found.members)[label])
    if label.startswith(DRAW) and label[len(DRAW):].isdigit():
        for fam in all_families(spec, "full" if triples else "default"):
            # every family explore draws from (its own draw, else a member moved: drawn())
            if fam.name == fam_name and not fam.sized:
                return drawn(spec, fam, int(label[len(DRAW):]))
    return None


def family_of(case_name: str) -> Optional[str]:
    name, sep, _ = case_name.partition(SEPARATOR)
    return name if sep else None


# --------------------------------------------------------------------------- budget and memory
def host_available_bytes() -> Optional[int]:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_total_bytes(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    try:
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    except Exception:  # noqa: BLE001 - no answer: the host budget alone decides
        return None


def not_runnable(work: int, level: str, device: torch.device, checks: int, itemsize: int = 4,
                 reference_bytes: Optional[int] = None) -> Optional[str]:
    """Why a sized member of `work` elements does not run here at `level` (None: it runs).
    `checks`: how many checks run it (implementations x dtypes), who share the level's budget.
    reference_bytes: what the float64 referee needs on the host, where the spec knows it (a
    referee in blocks of rows needs one block, not `work` elements of intermediates)."""
    referee = work * REFERENCE_BYTES_PER_ELEMENT if reference_bytes is None else reference_bytes
    # on a CPU the implementation and the baseline run on the host too, each materialising up
    # to `work` elements (the composition does), a few copies in the dtype under test
    need = referee + (work * itemsize * 6 if device.type == "cpu" else 0)
    free = host_available_bytes()
    if free is not None and need > free // 2:
        return (f"needs ~{need / 2 ** 30:.1f} GiB of host memory (the float64 referee "
                f"{referee / 2 ** 30:.1f} GiB; {work:,} elements per intermediate); "
                f"{free / 2 ** 30:.1f} GiB is available here, of which a case may take half")
    total = device_total_bytes(device)
    if total is not None and work * itemsize * 6 > total * 0.8:
        return (f"needs ~{work * itemsize * 6 / 2 ** 30:.1f} GiB on {device}, which has {total / 2 ** 30:.1f} GiB")
    budget_level = "full" if level not in WORK_BUDGET and level != "default" else level
    budget = WORK_BUDGET.get((budget_level, device.type), WORK_BUDGET[("full", device.type)])
    if work * max(1, checks) > budget:
        where = ("--level full or --explore run it where memory allows" if budget_level == "default"
                 else "it is past this level's budget on this device")
        return (f"{work:,} elements per intermediate x {checks} checks is over the {level} level's budget of "
                f"{budget:,} on {device.type}; {where}")
    return None


# --------------------------------------------------------------------------- generic transforms
def apply_values(inputs: Dict[str, Any], regimes: Optional[Dict[str, Any]], dtype: torch.dtype,
                 gen: torch.Generator) -> Dict[str, Any]:
    """Hostile values for named float64 inputs (before rounding to `dtype`):
    {"x": "denormal_mix"}: a quarter of the elements made subnormal (in fp32 and bf16; fp16
    flushes them to 0 when rounded); {"x": {"peak": P, "max_frac": F}}: scaled so that its
    largest magnitude is min(P, F * the dtype's max) (values near the dtype's max where the op's
    math allows); {"x": "constant_rows"}: every row (last dim) one value."""
    if not regimes:
        return inputs
    out = dict(inputs)
    for name, regime in regimes.items():
        value = out.get(name)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        if regime == "denormal_mix":
            pick = torch.rand(value.shape, generator=gen) < 0.25
            value = torch.where(pick, value * 1e-39, value)
        elif regime == "constant_rows":
            value = value[..., :1].expand_as(value).clone()
        elif isinstance(regime, dict) and "peak" in regime:
            target = min(float(regime["peak"]), float(regime.get("max_frac", 1.0)) * torch.finfo(dtype).max)
            value = value * (target / value.abs().max().clamp_min(1e-300))
        out[name] = value
    return out


def apply_views(inputs: Dict[str, Any], views: Optional[Dict[str, str]]) -> Dict[str, Any]:
    """Give named inputs an unusual layout with the same values (differentiable, so gradients
    reach the leaves): "offset": an odd storage offset (3 elements into its buffer); "sliced":
    every other element of a wider last dim (non-unit stride); "transposed": stored with two
    dims swapped (dims 1 and 2 of a 4-D tensor, else the last two); "expanded": item 0 of dim 0 expanded (stride 0; the others' values
    become item 0's, for the reference too)."""
    if not views:
        return inputs
    out = dict(inputs)
    for name, kind in views.items():
        value = out.get(name)
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        if kind == "offset":
            padded = torch.cat([value.new_zeros(3), value.reshape(-1)])
            value = padded[3:].view(value.shape)
        elif kind == "sliced":
            value = torch.stack([value, torch.zeros_like(value)], dim=-1)[..., 0]
        elif kind == "transposed" and value.dim() >= 2:
            # (B, H, S, D) stored as (B, S, H, D), as a fused projection leaves it; 2-D: column-major
            dims = (1, 2) if value.dim() == 4 else (-2, -1)
            value = value.transpose(*dims).contiguous().transpose(*dims)
        elif kind == "expanded" and value.shape[0] > 1:
            value = value[:1].expand(value.shape)
        elif kind not in VIEW_KINDS:
            raise ValueError(f"views: {name}={kind!r}, expected one of {VIEW_KINDS}")
        out[name] = value
    return out
