"""Covering arrays: few rows in which every t values of every t dimensions appear together.

An op's argument space is a list of dimensions, each a few values (a size at a tile boundary, a
mask form, one input's layout, a value regime...). Bugs that need two ordinary conditions at
once (a long key length and a custom scale; GQA and a strided V) hide from a battery that
varies one factor at a time; a strength-2 covering array has every pair of values of every two
dimensions in at least one row, in a few dozen rows where the full product has millions.

`build` is a greedy row-at-a-time builder (AETG/IPOG's density rule): each new row starts from
a t-tuple not covered yet and fills the other dimensions, one at a time in a seeded order, with
the value that covers the most uncovered t-tuples, among a few candidate rows; `allowed`
prunes impossible combinations (it is asked about partial rows: it must answer True while the
dimensions it needs are unset). A t-tuple no allowed row can hold is reported by `impossible`
rather than left silently uncovered. Deterministic for a seed.

Mixed strength: `groups` names sets of dimensions that interact inside kernels (the key length
against the tiles, the mask or window form, Sq against Sk) with a higher strength each, e.g.
`groups=((("sk_tile", "sk_offset", "mask"), 3),)`: every triple of values of every three
dimensions of the group appears in a row, every pair overall; a few dozen rows more than the
pairwise array instead of the hundreds of a strength-3 array over everything."""
from __future__ import annotations

import itertools
import random
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

Dimensions = Sequence[Tuple[str, Sequence[Any]]]
Row = Dict[str, Any]
Allowed = Callable[[Row], bool]
TTuple = Tuple[Tuple[int, ...], Tuple[int, ...]]   # (dimension indices, value indices)
Groups = Sequence[Tuple[Sequence[str], int]]         # (dimension names, strength among them)

CANDIDATES = 8


def _check(dimensions: Dimensions, strength: int) -> None:
    names = [name for name, _ in dimensions]
    if len(set(names)) != len(names):
        raise ValueError(f"dimensions: names must differ, got {names}")
    if any(len(values) == 0 for _, values in dimensions):
        raise ValueError("dimensions: every dimension needs at least one value")
    if not 1 <= strength <= len(dimensions):
        raise ValueError(f"strength: expected 1..{len(dimensions)} (the number of dimensions), got {strength}")


def interactions(dimensions: Dimensions, strength: int, groups: Groups = ()) -> List[Tuple[int, ...]]:
    """The sets of dimensions (as sorted indices) whose values must appear together: every
    `strength` of them, and every t of each group's dimensions (t its strength); a set inside a
    larger one is left out (covering the larger covers it)."""
    _check(dimensions, strength)
    index = {name: d for d, (name, _) in enumerate(dimensions)}
    combos = set(itertools.combinations(range(len(dimensions)), strength))
    for names, t in groups:
        unknown = [name for name in names if name not in index]
        if unknown:
            raise ValueError(f"groups: unknown dimension(s) {unknown}, expected some of {list(index)}")
        if not 1 <= t <= len(names):
            raise ValueError(f"groups: strength of {tuple(names)} must be 1..{len(names)}, got {t}")
        combos.update(itertools.combinations(sorted(index[name] for name in names), t))
    return sorted(c for c in combos if not any(len(o) > len(c) and set(c) <= set(o) for o in combos))


def _partial(dimensions: Dimensions, dims: Sequence[int], values: Sequence[int]) -> Row:
    return {dimensions[d][0]: dimensions[d][1][v] for d, v in zip(dims, values)}


def tuples(dimensions: Dimensions, strength: int, allowed: Optional[Allowed] = None,
           groups: Groups = ()) -> List[TTuple]:
    """Every t-tuple of values (of `interactions`) the constraints do not rule out on their own."""
    out = []
    for dims in interactions(dimensions, strength, groups):
        for values in itertools.product(*(range(len(dimensions[d][1])) for d in dims)):
            if allowed is None or allowed(_partial(dimensions, dims, values)):
                out.append((dims, values))
    return out


def build(dimensions: Dimensions, strength: int = 2, seed: int = 0,
          allowed: Optional[Allowed] = None, candidates: int = CANDIDATES, groups: Groups = ()) -> List[Row]:
    """Rows (dimension name -> value) covering every allowed t-tuple of values (and every
    tuple of each group at its strength)."""
    combos = interactions(dimensions, strength, groups)
    allowed = allowed or (lambda row: True)
    rng = random.Random(seed)
    n = len(dimensions)
    pending = tuples(dimensions, strength, allowed, groups)
    rng.shuffle(pending)
    uncovered: Set[TTuple] = set(pending)
    combos_of = {d: [c for c in combos if d in c] for d in range(n)}
    rows: List[Row] = []
    cursor = 0
    while uncovered:
        while pending[cursor] not in uncovered:
            cursor += 1
        start = pending[cursor]
        best, best_gain = None, 0
        for _ in range(candidates):
            row = _fill(dimensions, start, uncovered, combos_of, allowed, rng)
            if row is None:
                continue
            gain = len(_covered(row, combos, uncovered))
            if gain > best_gain:
                best, best_gain = row, gain
        if best is None:
            uncovered.discard(start)     # no allowed row holds it (impossible() reports it)
            continue
        uncovered -= _covered(best, combos, uncovered)
        rows.append({dimensions[d][0]: dimensions[d][1][v] for d, v in sorted(best.items())})
    return rows


def split_choices(rows: Sequence[Row], dimensions: Dimensions, choices: int) -> List[List[int]]:
    """For each row, the choices (0 .. choices - 1: the dtypes a battery runs) it is run in, so
    that every value of every dimension held by some row meets every choice in some row: the
    pairs (value, dtype) of an array with the dtype as one more dimension, on the same rows, with
    about one choice a row instead of each. Greedy, in row order: a row takes the choice that
    meets the most pairs not met yet (ties: the choices in turn); then a value still missing a
    choice gets it on its first row. Deterministic."""
    if choices < 1:
        raise ValueError(f"choices: expected 1 or more, got {choices}")
    names = [name for name, _ in dimensions]
    keys = [[(name, repr(row[name])) for name in names] for row in rows]
    met: Set[Tuple[str, str, int]] = set()
    chosen: List[List[int]] = []
    for number, row_keys in enumerate(keys):
        gains = [sum((name, value, c) not in met for name, value in row_keys) for c in range(choices)]
        best = max(range(choices), key=lambda c: (gains[c], -((c - number) % choices)))
        chosen.append([best])
        met.update((name, value, best) for name, value in row_keys)
    for number, row_keys in enumerate(keys):
        for name, value in row_keys:
            for c in range(choices):
                if (name, value, c) not in met:
                    first = next(i for i, other in enumerate(keys) if (name, value) in other)
                    if c not in chosen[first]:
                        chosen[first] = sorted(chosen[first] + [c])
                    met.update((n, v, c) for n, v in keys[first])
    return chosen


def _covered(row: Dict[int, int], combos: Sequence[Tuple[int, ...]], uncovered: Set[TTuple]) -> Set[TTuple]:
    found = set()
    for dims in combos:
        key = (dims, tuple(row[d] for d in dims))
        if key in uncovered:
            found.add(key)
    return found


def _fill(dimensions: Dimensions, start: TTuple, uncovered: Set[TTuple], combos_of, allowed: Allowed,
          rng: random.Random) -> Optional[Dict[int, int]]:
    """A whole row holding `start`, each other dimension given its most covering allowed value."""
    row = dict(zip(*start))
    if not allowed(_named(dimensions, row)):
        return None
    order = [d for d in range(len(dimensions)) if d not in row]
    rng.shuffle(order)
    for d in order:
        choices = list(range(len(dimensions[d][1])))
        rng.shuffle(choices)
        best, best_gain = None, -1
        for v in choices:
            row[d] = v
            if not allowed(_named(dimensions, row)):
                continue
            gain = 0
            for dims in combos_of[d]:
                if all(e in row for e in dims) and (dims, tuple(row[e] for e in dims)) in uncovered:
                    gain += 1
            if gain > best_gain:
                best, best_gain = v, gain
        if best is None:
            return None
        row[d] = best
    return row


def _named(dimensions: Dimensions, row: Dict[int, int]) -> Row:
    return {dimensions[d][0]: dimensions[d][1][v] for d, v in row.items()}


def missing(rows: Sequence[Row], dimensions: Dimensions, strength: int,
            allowed: Optional[Allowed] = None, groups: Groups = ()) -> List[Row]:
    """The allowed t-tuples (as partial rows) that no row holds: [] for a covering array
    (impossible tuples, which no allowed whole row can hold, are listed too: see impossible)."""
    index = {name: {repr(v): i for i, v in enumerate(values)} for name, values in dimensions}
    have = set()
    for row in rows:
        coded = {d: index[name][repr(row[name])] for d, (name, _) in enumerate(dimensions)}
        for dims in interactions(dimensions, strength, groups):
            have.add((dims, tuple(coded[d] for d in dims)))
    return [_partial(dimensions, dims, values) for dims, values in tuples(dimensions, strength, allowed, groups)
            if (dims, values) not in have]


def impossible(dimensions: Dimensions, strength: int, allowed: Allowed, seed: int = 0,
               groups: Groups = ()) -> List[Row]:
    """The allowed-looking t-tuples that no whole allowed row holds, by exhaustive search of
    the rest (small spaces only: tests)."""
    out = []
    for dims, values in tuples(dimensions, strength, allowed, groups):
        rest = [d for d in range(len(dimensions)) if d not in dims]
        fixed = dict(zip(dims, values))
        if not any(allowed(_named(dimensions, {**fixed, **dict(zip(rest, choice))}))
                   for choice in itertools.product(*(range(len(dimensions[d][1])) for d in rest))):
            out.append(_partial(dimensions, dims, values))
    return out
