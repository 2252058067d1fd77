"""A/B of attention tile configs on one shape: the shipped tile of one kernel and candidates,
alternated over rounds (a single sweep's timings moved by 12% for the same config on a lent H100),
timing the forward (--kernel fwd) or the whole backward (dq or dkdv) with triton.testing.do_bench.
--env NAME=a,b alternates the values of an environment variable the launcher reads instead
(with the shipped tile), e.g. a kernel form's switch; --mask passes the key padding mask at pad 0
too (every key kept), as `gpuparity bench attention` does.

    PYTHONPATH=src python benchmarks/attention_tile_ab.py --kernel dq --tiles 64x64x4x2,128x64x8x2
    PYTHONPATH=src python benchmarks/attention_tile_ab.py --kernel dq --env GPUPARITY_ATTENTION_DQ_SPLIT=0,auto --mask
    PYTHONPATH=src python benchmarks/attention_tile_ab.py --kernel dkdv --dims 2,16,2048,128 --kv-heads 4 --causal \
        --tiles 64x32x4x3 --pads 0.25
    PYTHONPATH=src python benchmarks/attention_tile_ab.py --kernel dq --dims 2,16,2048,128 --kv-heads 4 --causal \
        --layout bshd --env GPUPARITY_ATTENTION_ORDER=launch,auto

Prints each round and the median per (pad, tile); a candidate that fails to compile or launch (e.g. out
of shared memory) is dropped and named; --json writes every timing. GPU only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=("fwd", "dq", "dkdv"), default="dq")
    parser.add_argument("--shape", default="llm-8k", help="a `gpuparity bench attention` suite shape")
    parser.add_argument("--dims", default=None,
                        help="B,H,S,D instead of --shape (e.g. a model's own attention: 2,16,2048,128)")
    parser.add_argument("--kv-heads", type=int, default=None, help="GQA: k and v with this many heads")
    parser.add_argument("--causal", action="store_true", help="causal attention (a decoder's)")
    parser.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd",
                        help="bshd: q, k, v and dout as (B, H, S, D) views of (B, S, H, D) tensors, as a "
                             "transformers model's projections hand them over")
    parser.add_argument("--tiles", default="", help="block_m x block_n x warps x stages, comma-separated")
    parser.add_argument("--env", default=None, help="NAME=v1,v2,...: alternate this variable's values")
    parser.add_argument("--mask", action="store_true",
                        help="pass the key padding mask at pad 0 too (every key kept), as `bench attention` does")
    parser.add_argument("--pads", default="0,0.25")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--family", default="nvidia_sm90")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    tiles = []
    if not args.tiles and not args.env:
        parser.error("expected --tiles or --env")
    if args.env and ("=" not in args.env or not args.env.split("=", 1)[1]):
        parser.error(f"--env: expected NAME=v1,v2, got {args.env!r}")
    for text in filter(None, args.tiles.split(",")):
        fields = text.split("x")
        if len(fields) != 4 or not all(f.isdigit() and int(f) > 0 for f in fields):
            parser.error(f"--tiles: expected block_m x block_n x warps x stages (e.g. 64x64x4x2), got {text!r}")
        tiles.append(tuple(int(f) for f in fields))
    try:
        pads = [float(p) for p in args.pads.split(",")]
    except ValueError:
        parser.error(f"--pads: expected comma-separated fractions, got {args.pads!r}")
    if args.rounds < 1:
        parser.error(f"--rounds: expected at least 1, got {args.rounds}")
    if args.dims is not None:
        fields = args.dims.split(",")
        if len(fields) != 4 or not all(f.isdigit() and int(f) > 0 for f in fields):
            parser.error(f"--dims: expected B,H,S,D (four positive integers), got {args.dims!r}")
        args.dims = tuple(int(f) for f in fields)
        heads = args.dims[1]
        if args.kv_heads is not None and (args.kv_heads < 1 or heads % args.kv_heads):
            parser.error(f"--kv-heads: expected a divisor of H={heads}, got {args.kv_heads}")
    return args, tiles, pads


def main(argv=None) -> int:
    args, tiles, pads = parse(argv)
    import torch
    if not torch.cuda.is_available():
        print("attention_tile_ab: needs a GPU (none visible); nothing measured", file=sys.stderr)
        return 2
    import triton.testing

    from gpuparity.backends import triton_attention as ta
    from gpuparity.bench.attention import SHAPES, make_case
    if args.dims is None and args.shape not in SHAPES:
        print(f"--shape: expected one of {', '.join(SHAPES)}, got {args.shape!r}", file=sys.stderr)
        return 2
    dims = args.dims or SHAPES[args.shape]
    label = "x".join(map(str, dims)) if args.dims else args.shape
    key = (ta.padded_head_dim(dims[3]), 2)
    table = ta.CONFIGS[args.family][args.kernel]
    shipped = table[key]
    configs = {"shipped": (shipped, None), **{"x".join(map(str, t)): (ta.TileConfig(*t), None) for t in tiles}}
    env_name = None
    if args.env:
        env_name, values = args.env.split("=", 1)
        configs = {f"{env_name}={value}": (shipped, value) for value in values.split(",")}
    saved_env = os.environ.get(env_name) if env_name else None
    times, failed = {}, {}
    try:
        for pad in pads:
            case = make_case(label, dims, pad, torch.bfloat16, "cuda", 0)
            q, k, v, dout = case.q, case.k, case.v, case.dout
            if args.kv_heads:
                k, v = k[:, :args.kv_heads].contiguous(), v[:, :args.kv_heads].contiguous()
            if args.layout == "bshd":
                q, k, v, dout = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, dout))
            masks = ta.prepare_masks(q, k, key_padding_mask=case.key_padding_mask if pad or args.mask else None)
            scale = dims[3] ** -0.5
            out, lse = ta.attention_forward(q, k, v, masks, args.causal, scale)

            def step():
                if args.kernel == "fwd":
                    return ta.attention_forward(q, k, v, masks, args.causal, scale)
                return ta.attention_backward(dout, q, k, v, out, lse, masks, args.causal, scale)
            for rnd in range(args.rounds):
                for name, (cfg, value) in configs.items():
                    if name in failed:
                        continue
                    table[key] = cfg
                    if value is not None:
                        os.environ[env_name] = value
                    ta.clear_plans()
                    try:
                        step()
                    except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: drop the candidate
                        failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                        print(f"{args.kernel} {name}: dropped ({failed[name]})", flush=True)
                        continue
                    ms = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
                    times.setdefault(f"pad{pad}:{name}", []).append(ms)
                    print(f"pad {pad} round {rnd} {args.kernel} {name}: {ms:.3f} ms", flush=True)
    finally:
        table[key] = shipped
        if env_name:
            if saved_env is None:
                os.environ.pop(env_name, None)
            else:
                os.environ[env_name] = saved_env
        ta.clear_plans()
    for name, values in times.items():
        ordered = sorted(values)
        print(f"MEDIAN {name}: {ordered[len(ordered) // 2]:.3f} ms {[round(v, 3) for v in values]}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"kernel": args.kernel, "shape": label, "kv_heads": args.kv_heads, "causal": args.causal,
                       "layout": args.layout,
                       "times_ms": times, "dropped": failed}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
