"""Where an ahead-of-time compile's time goes, per Triton stage and target, for some of one kernel
module's shipped configs, compiled to a binary (full) or stopped after LLVM IR (ir: what
tests/backends/test_aot.py does for all but each kernel's first config). CPU only, no GPU needed.

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python benchmarks/aot_stage_times.py \\
        gpuparity.backends.triton_attention 0 25 full

Arguments: module, first spec index, number of specs, full|ir. Prints, per target, the number of
compiles and the seconds in each stage (Triton's compilation listener) and in all (wall). Use an
empty TRITON_CACHE_DIR: a cached compile takes no time.
"""
from __future__ import annotations

import collections
import importlib
import os
import sys
import time


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4 or not argv[1].isdigit() or not argv[2].isdigit() or argv[3] not in ("full", "ir"):
        print("usage: aot_stage_times.py MODULE FIRST COUNT full|ir (e.g. gpuparity.backends.triton_attention 0 25 "
              f"full); got {argv}", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    from triton import knobs

    from gpuparity.backends.triton_common import compile_spec
    seconds = collections.defaultdict(lambda: collections.defaultdict(float))
    current = {}

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        stages = seconds[current["target"]]
        stages["init"] += times.ir_initialization / 1e6
        for name, us in times.lowering_stages:
            stages[name] += us / 1e6
    knobs.compilation.listener = listener
    module, first, count, mode = argv[0], int(argv[1]), int(argv[2]), argv[3]
    compiles = collections.Counter()
    for spec in importlib.import_module(module).aot_specs()[first:first + count]:
        for target in spec.targets:
            current["target"] = target
            start = time.time()
            compile_spec(spec, target, binary=mode == "full")
            seconds[target]["wall"] += time.time() - start
            compiles[target] += 1
    for target, stages in seconds.items():
        print(target, compiles[target], {name: round(value, 1) for name, value in stages.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
