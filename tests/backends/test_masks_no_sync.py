"""The SDPA backends' mask preparation reads no tensor value on the host: a device-to-host sync
per call (and per layer inside a compiled graph's custom op) is what `bool(tensor)` costs on a GPU."""
from __future__ import annotations

import pytest
import torch

from gpuparity.backends import masks


@pytest.mark.parametrize("kind", ["key_padding", "bool", "additive", "window"])
def test_sdpa_arguments_read_no_values_and_empty_rows_still_zero(kind):
    torch.manual_seed(0)
    q = torch.randn(2, 2, 5, 8)
    k = torch.randn(2, 2, 6, 8)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1] = True                                   # item 1: every key is padding -> empty rows
    args = dict(key_padding_mask=kpm)
    if kind == "bool":
        args = dict(attn_mask=~kpm.view(2, 1, 1, 6).expand(2, 1, 5, 6))
    elif kind == "additive":
        args = dict(attn_mask=torch.zeros(2, 1, 5, 6).masked_fill(kpm.view(2, 1, 1, 6), float("-inf")))
    elif kind == "window":
        args = dict(key_padding_mask=kpm, window=(1, 0))
    with pytest.MonkeyPatch.context() as patch:
        for name in ("__bool__", "item", "tolist", "__int__", "__float__"):
            patch.setattr(torch.Tensor, name, lambda self, *a: (_ for _ in ()).throw(
                AssertionError("a tensor value was read on the host")))
        mask, causal, empty = masks.sdpa_arguments(q, k, is_causal=False, **args)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask, is_causal=causal)
    out = masks.zero_empty_rows(out, empty)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))          # the empty item is exactly zero
    assert out[0].abs().sum() > 0                                   # the other is untouched
    want = torch.nn.functional.scaled_dot_product_attention(q[:1], k[:1], k[:1], attn_mask=mask[:1])
    torch.testing.assert_close(out[0], want[0])
