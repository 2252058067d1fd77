"""Wall time of the known-issue probes, each in a fresh interpreter (probe_isolation="spawn", the old
path) against forked from one fork server (probe_isolation="fork") with several worker counts,
interleaved over rounds; and whether the verdicts and details agree.

    PYTHONPATH=src python benchmarks/known_probes_fork.py --device cuda --rounds 2 --workers 4 8 --out DIR

Writes DIR/known-probes-fork.json (every run: mode, workers, wall seconds, per-entry status, detail,
runner, seconds) and prints a summary (also DIR/known-probes-fork.txt)."""
from __future__ import annotations

import argparse
import json
import os
import time

from gpuparity import platform as platform_mod
from gpuparity.known import evaluate


def run(mode: str, workers: int, device: str, timeout: float) -> dict:
    start = time.monotonic()
    results = evaluate(probes=True, device=device, probe_isolation=mode, probe_workers=workers, timeout=timeout)
    wall = time.monotonic() - start
    probed = {r.id: {"status": r.status, "detail": r.probe_outcome.get("detail"),
                     "runner": r.probe_outcome.get("runner"), "seconds": r.probe_outcome.get("duration_s")}
              for r in results if r.probe_outcome}
    return {"mode": mode, "workers": workers, "wall_s": round(wall, 2), "probes": probed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    platform_mod.current()   # collected once, outside the timings
    runs, lines = [], []
    for round_index in range(args.rounds):
        for mode, workers in [("spawn", args.workers[0])] + [("fork", w) for w in args.workers]:
            record = run(mode, workers, args.device, args.timeout)
            record["round"] = round_index
            runs.append(record)
            runners = sorted({p["runner"].split(" (")[0] + (" (fallback)" if " (" in p["runner"] else "")
                              for p in record["probes"].values()})
            lines.append(f"round {round_index} {mode:5s} workers {workers}: {record['wall_s']:6.2f} s, "
                         f"{len(record['probes'])} probes, runners {runners}")
            print(lines[-1], flush=True)
            save(args.out, args.device, runs, lines)   # kept if a time limit ends the rest
    baseline = runs[0]["probes"]
    for record in runs[1:]:
        differ = sorted(i for i in set(baseline) | set(record["probes"])
                        if (baseline.get(i) or {}).get("status") != (record["probes"].get(i) or {}).get("status"))
        lines.append(f"round {record['round']} {record['mode']} w{record['workers']}: status differs from round 0 "
                     f"spawn for {differ or 'none'}")
    fallbacks = sorted({p["runner"] for r in runs for p in r["probes"].values() if p["runner"].startswith("spawn (")})
    lines += [f"fallback: {why}" for why in fallbacks]
    save(args.out, args.device, runs, lines)
    print("\n".join(lines[len(runs):]))


def save(out: str, device: str, runs: list, lines: list) -> None:
    with open(os.path.join(out, "known-probes-fork.json"), "w") as handle:
        json.dump({"device": device, "runs": runs}, handle, indent=1)
    with open(os.path.join(out, "known-probes-fork.txt"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
