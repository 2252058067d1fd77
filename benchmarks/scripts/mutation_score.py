"""Mutation score of the battery: planted-bug implementations generated per op
(gpuparity.checks.mutants: a trigger over the call's arguments x a fault), each run through the
op's battery at a level; prints killed / effective mutants per op and the time taken.

    python benchmarks/scripts/mutation_score.py --ops rms_norm,layer_norm,rotary,attention,attention_varlen,\\
        attention_decode,residual_norm --seeds 401 --count 20 --level default --role held-out \\
        [--json out.json] [--markdown out.md]

Each mutant is also an --impl target (`gpuparity check --op rms_norm --impl
gpuparity.checks.mutants:<name>`), so a survivor's line reruns the whole battery on it."""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from gpuparity.checks import mutants


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(mutants.OPS))
    parser.add_argument("--seeds", default="101", help="mutant-set seeds, comma separated (held out: not tuned on)")
    parser.add_argument("--count", type=int, default=20, help="mutants drawn per op and seed")
    parser.add_argument("--level", default="default")
    parser.add_argument("--battery-seed", type=int, default=0, help="the battery's --seed")
    parser.add_argument("--witnesses", type=int, default=8, help="witness cases per mutant (effectiveness)")
    parser.add_argument("--role", default="held-out", choices=("tuning", "held-out"),
                        help="what the seeds were to the battery: tuned on, or held out (the markdown says which)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    ops = [op for op in args.ops.split(",") if op]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    report = {"command": " ".join(["python", "benchmarks/scripts/mutation_score.py"] + (argv or sys.argv[1:])),
              "torch": torch.__version__, "python": platform.python_version(), "level": args.level,
              "battery_seed": args.battery_seed, "count": args.count, "seeds": seeds, "role": args.role,
              "generator": {op: "version 1 (frozen at 496617f)" if op in mutants.FROZEN_OPS else
                            "version 2 (frozen at c2beead)" if op in mutants.V2_OPS else
                            "version 3 (frozen at 72c14f9)" for op in ops}, "ops": {}}
    for op in ops:
        started = time.monotonic()
        battery = mutants.BatteryCalls.plan(op, args.level, args.battery_seed)
        plan_s = time.monotonic() - started
        judged = []
        for seed in seeds:
            for m in mutants.sample(op, seed, args.count):
                result = mutants.judge(m, battery, args.witnesses)
                judged.append(result)
                state = ("killed" if result.killed else "SURVIVED") if result.effective else "ineffective"
                print(f"{op} seed {seed} {m.name}: {state} ({result.seconds:.1f} s) {result.detail[:100]}",
                      file=sys.stderr, flush=True)
        summary = mutants.score(judged)
        summary.update(seconds=time.monotonic() - started, plan_seconds=plan_s, checks_in_battery=len(battery.tasks),
                       effective_by_witness=sum(1 for j in judged if j.effective and j.by_witness),
                       mutants_detail=[j.__dict__ for j in judged])
        report["ops"][op] = summary
        eff = summary["effective"]
        print(f"{op}: killed {summary['killed']}/{eff} effective "
              f"({100.0 * summary['killed'] / eff if eff else 0:.0f}%), {summary['ineffective']} ineffective "
              f"of {summary['mutants']}, {summary['seconds']:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1, default=str)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(markdown(report))
    return 0


def markdown(report) -> str:
    seeds = ", ".join(str(seed) for seed in report["seeds"])
    lines = [f"Level {report['level']}, battery seed {report['battery_seed']}, mutant seeds {seeds} "
             f"({report.get('role', 'held-out')}), {report['count']} mutants per op and seed; torch {report['torch']}.",
             "", f"    {report['command']}", "",
             "| op | generator | mutants | effective | killed | score | below the tolerance (ineffective) | time |",
             "|---|---|---|---|---|---|---|---|"]
    for op, s in report["ops"].items():
        pct = f"{100.0 * s['killed'] / s['effective']:.0f}%" if s["effective"] else "-"
        lines.append(f"| {op} | {report.get('generator', {}).get(op, '')} | {s['mutants']} | {s['effective']} | "
                     f"{s['killed']} | {pct} | {s['ineffective']} | {s['seconds']:.0f} s |")
    lines.append("")
    for op, s in report["ops"].items():
        if s["survivors"]:
            lines.append(f"Survivors ({op}): " + ", ".join(f"`{name}`" for name in s["survivors"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
