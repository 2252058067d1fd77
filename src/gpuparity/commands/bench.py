"""`gpuparity bench attention|norm|rope ...`: backends side by side. Each bench lives in
gpuparity/bench/<name>.py with add_arguments(parser) and run_cli(args) -> exit code."""
from __future__ import annotations

import importlib

BENCHES = {"attention": "masked attention: every backend, fwd and fwd+bwd, TFLOP/s, peak memory",
           "norm": "RMSNorm / LayerNorm: GB/s against the copy bandwidth",
           "rope": "rotary embeddings: GB/s, three layouts"}


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmark backends side by side (GPU)",
                                   description="Benchmarks every available backend of an op side by side.")
    benches = parser.add_subparsers(dest="bench", metavar="BENCH")
    for name, help_text in BENCHES.items():
        module_name = f"gpuparity.bench.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        sub = benches.add_parser(name, help=help_text)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run_cli)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])
