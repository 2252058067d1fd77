"""Test-only attention backends with planted bugs, to prove the tools find them. Never
chosen by "auto" (probed=False); used only when named, e.g. `--attn planted_ignore_mask`.

planted_ignore_mask: user story 1's failure, simulated: attention that silently ignores
attn_mask and key_padding_mask (padded keys get attended to).
"""
from __future__ import annotations

from ..contracts.attention import composition
from ..dispatch import Backend, register

PLANTED = ("planted_ignore_mask",)


def ignore_mask(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return composition(q, k, v, attn_mask=None, key_padding_mask=None, is_causal=is_causal, scale=scale)


register(Backend("planted_ignore_mask", "attention", ignore_mask,
                 "TEST ONLY: ignores every mask (user story 1's failure, planted)", probed=False))
