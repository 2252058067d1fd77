"""--explore's rerun line works for every family it draws from: a draw of a family without its
own draw function ("attention_varlen tile.draw2": a member with its sizes moved) is found by
name, as the same case (it used to be unknown: `--case tile.draw2` exited 2)."""
from __future__ import annotations

import pytest

from gpuparity.api import _named_cases
from gpuparity.checks import families
from gpuparity.contracts import get_spec


@pytest.mark.parametrize("op", ["attention", "attention_varlen", "attention_decode", "rms_norm", "rotary"])
def test_every_drawn_member_reruns_by_name(op):
    spec = get_spec(op)
    for fam in spec.families():
        if fam.sized:   # explore never draws fresh members of a sized family
            assert families.lookup(spec, f"{fam.name}.draw2") is None
            continue
        case = families.lookup(spec, f"{fam.name}.draw2")
        assert case is not None, f"{op} {fam.name}.draw2"
        assert case.params == families.drawn(spec, fam, 2).params


def test_named_case_accepts_a_draw_of_a_family_without_draw_function():
    [case] = _named_cases("attention_varlen", ["tile.draw2"], "default")
    assert case.name == "tile.draw2"
