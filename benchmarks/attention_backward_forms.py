"""Device time of gpuparity's attention backward in its two forms, one launch (dq and dk/dv
programs side by side) against two (dq, then dk/dv), from CUDA-graph replays (bench.common's
graphed and time_ms, as `gpuparity bench attention --graph`) at bf16 with key
padding (pad 0.25), and the largest difference between their gradients. One JSON line per shape;
where the two kernels' tiles have different warp counts only the two-launch form exists, and
both columns time it. Needs a CUDA GPU. tiles.FUSED_BACKWARD_MAX_ROWS_X_DIM comes from here.

    PYTHONPATH=src python benchmarks/attention_backward_forms.py
"""
import json
import os

import torch

from gpuparity.backends import triton_attention as ta
from gpuparity.bench.attention_measure import key_lengths
from gpuparity.bench.common import graphed, time_ms

SHAPES = [(64, 12, 197, 64), (256, 4, 256, 32), (128, 12, 128, 64), (512, 4, 150, 32), (16, 4, 1024, 32),
          (16, 4, 2048, 32), (8, 4, 4096, 32), (32, 12, 512, 64), (8, 12, 1024, 64), (4, 16, 2048, 64),
          (4, 16, 4096, 64), (2, 16, 1024, 128)]


def main() -> None:
    for batch, heads, seq, head_dim in SHAPES:
        gen = torch.Generator().manual_seed(0)
        q, k, v, dout = (torch.randn(batch, seq, heads, head_dim, generator=gen).to("cuda", torch.bfloat16).transpose(1, 2)
                         for _ in range(4))
        lengths = key_lengths(batch, seq, 0.25, 0).to("cuda")
        masks = ta.prepare_masks(q, k, None, torch.arange(seq, device="cuda")[None, :] >= lengths[:, None])
        scale = head_dim ** -0.5
        out, lse = ta.attention_forward(q, k, v, masks, False, scale)
        row = {"shape": [batch, heads, seq, head_dim]}
        grads = {}
        for form in ("split", "fused"):
            os.environ["GPUPARITY_ATTENTION_BACKWARD"] = form
            ta.clear_plans()

            def backward():
                return ta.attention_backward(dout, q, k, v, out, lse, masks, False, scale)
            grads[form] = backward()
            row[form + "_graph_ms"] = round(time_ms(graphed(backward)), 4)
        row["max_abs_diff"] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(grads["split"], grads["fused"]))
        row["fused_vs_split"] = round(row["fused_graph_ms"] / row["split_graph_ms"], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
