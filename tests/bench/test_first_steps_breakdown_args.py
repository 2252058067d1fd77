"""benchmarks/first_steps_breakdown.py's A/B options: --define names a patched variant with its
environment, a variant named nowhere is refused before any run, and torch's compile_times table
is read in both of its layouts (torch 2.11: aligned columns, 2.13: commas)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "first_steps_breakdown.py"


@pytest.fixture(scope="module")
def breakdown():
    spec = importlib.util.spec_from_file_location("first_steps_breakdown", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_define_gives_a_patched_variant_its_environment(breakdown):
    args = breakdown.parse_args(["--define", "warm-opaque:GPUPARITY_WORKER_WARM=1,GPUPARITY_COMPILED_KERNELS=opaque"])
    assert breakdown.definitions(args) == {
        "patched": {}, "warm-opaque": {"GPUPARITY_WORKER_WARM": "1", "GPUPARITY_COMPILED_KERNELS": "opaque"}}


@pytest.mark.parametrize("bad", ["unpatched:A=1", "x", "x:A", "x:=1"])
def test_a_malformed_definition_is_refused(breakdown, bad):
    with pytest.raises(SystemExit):
        breakdown.definitions(breakdown.parse_args(["--define", bad]))


def test_an_undefined_variant_is_refused_before_any_run(breakdown):
    with pytest.raises(SystemExit, match="opaque"):
        breakdown.main(["--variants", "unpatched,opaque"])


def test_compile_phases_reads_both_table_layouts(breakdown):
    old = ("TorchDynamo compilation metrics:\nFunction      Runtimes (s)\n-----  -----\n"
           "_compile.compile_inner     30.8425\nasync_compile.wait    3.2440, 4.8592\nget_fake_value  0.5\n")
    new = "TorchDynamo compilation metrics:\nFunction, Runtimes (s)\n_compile.compile_inner, 52.3531\n" \
          "async_compile.wait, 19.1137, 38.8424\nget_fake_value, 0.8448\n"
    assert breakdown.compile_phases(old) == ["  compile: _compile.compile_inner 30.8425",
                                             "  compile: async_compile.wait 3.2440 4.8592"]
    assert breakdown.compile_phases(new) == ["  compile: _compile.compile_inner 52.3531",
                                             "  compile: async_compile.wait 19.1137 38.8424"]
