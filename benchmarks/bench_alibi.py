"""ALiBi inside the Triton attention kernels against the same call without a bias: device time of
forward + backward (CUDA-graph replays, bench.common's graphed and time_ms, as `gpuparity bench
attention --graph`), bf16, FlashAttention's (B, S, H, D) layout, slopes per head. The variants of
each shape alternate in rounds within one process (a clock or thermal drift then hits both); the
median over rounds is reported, with the ratio alibi / none (issue 32's target: <= 1.10 at llm-4k
and bert). --composed adds the composition gpuparity.flash_attn used before (an fp32 (B, H, Sq, Sk)
bias read as an additive mask by the same kernels) on the shapes where that bias fits in 2 GiB.
One JSON line per shape, then a table. Needs a CUDA GPU.

    PYTHONPATH=src python3 benchmarks/bench_alibi.py [--rounds 5] [--composed] [--json F]
"""
import argparse
import json
import statistics

import torch

from gpuparity.backends.triton_attention import triton_attention
from gpuparity.bench.common import graphed, time_ms

# (name, B, H, S, D, causal): issue 32's llm-4k and bert, and FlashAttention-typical training sizes
SHAPES = [("llm-4k", 4, 16, 4096, 64, True), ("bert", 32, 12, 512, 64, False),
          ("s1k-d64", 4, 16, 1024, 64, False), ("s2k-d128-causal", 2, 16, 2048, 128, True),
          ("s4k-d128", 2, 16, 4096, 128, False)]
COMPOSED_MAX_BYTES = 2 << 30


def slopes_for(heads: int) -> torch.Tensor:
    """ALiBi's geometric slopes 2^(-8 i / H) (the paper's, for a power-of-two head count)."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)], dtype=torch.float32)


def composed_bias(slopes: torch.Tensor, batch: int, q_len: int, k_len: int, causal: bool) -> torch.Tensor:
    i = torch.arange(q_len, device="cuda").view(q_len, 1)
    j = torch.arange(k_len, device="cuda").view(1, k_len)
    bias = -slopes.view(1, -1, 1, 1) * (i + k_len - q_len - j).abs().float()
    if causal:
        bias = bias.masked_fill(j > i + k_len - q_len, float("-inf"))
    return bias.expand(batch, -1, -1, -1)


def step_fn(q, k, v, dout, **kwargs):
    def step():
        out = triton_attention(q, k, v, **kwargs)
        return torch.autograd.grad(out, (q, k, v), dout)
    return step


def measure(name, batch, heads, seq, head_dim, causal, rounds, composed):
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(batch, seq, heads, head_dim, generator=gen).to("cuda", torch.bfloat16).transpose(1, 2)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    slopes = slopes_for(heads).cuda()
    variants = {"none": step_fn(q, k, v, dout, is_causal=causal),
                "alibi": step_fn(q, k, v, dout, is_causal=causal, alibi_slopes=slopes)}
    if composed and batch * heads * seq * seq * 4 <= COMPOSED_MAX_BYTES:
        # Sq = Sk: the bias's bottom-right causal is is_causal's top-left
        variants["composed"] = step_fn(q, k, v, dout, attn_mask=composed_bias(slopes, batch, seq, seq, causal))
    replays = {variant: graphed(fn) for variant, fn in variants.items()}
    times = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant, replay in replays.items():
            times[variant].append(time_ms(replay))
    row = {"shape": name, "B": batch, "H": heads, "S": seq, "D": head_dim, "causal": causal, "rounds": rounds}
    for variant, samples in times.items():
        row[f"{variant}_ms"] = round(statistics.median(samples), 4)
        row[f"{variant}_spread"] = round((max(samples) - min(samples)) / statistics.median(samples), 3)
    row["alibi_vs_none"] = round(row["alibi_ms"] / row["none_ms"], 3)
    if "composed_ms" in row:
        row["composed_vs_none"] = round(row["composed_ms"] / row["none_ms"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--composed", action="store_true", help="also time the composed fp32 bias")
    parser.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    wanted = args.shapes.split(",")
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "triton": __import__("triton").__version__}), flush=True)
    rows = []
    for shape in SHAPES:
        if shape[0] in wanted:
            rows.append(measure(*shape, args.rounds, args.composed))
            print(json.dumps(rows[-1]), flush=True)
    print("| shape | B | H | S | D | causal | none ms | alibi ms | alibi / none | composed / none |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['B']} | {r['H']} | {r['S']} | {r['D']} | {r['causal']} | {r['none_ms']:.3f} | "
              f"{r['alibi_ms']:.3f} | {r['alibi_vs_none']:.3f} | {r.get('composed_vs_none', '-')} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            for r in rows:
                handle.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
