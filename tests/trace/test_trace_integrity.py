"""A damaged, incomplete or mismatched trace is bad input (exit 2, naming the file and the problem),
never a numerical divergence; traces recorded before checksums still load, marked unchecked."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from trace_models import factory

from gpuparity import cli
from gpuparity.trace import TraceCorrupt, compare, load, replay
from gpuparity.trace.store import META_FILE, TENSOR_FILE

SPEC = os.path.join(os.path.dirname(__file__), "trace_models.py") + ":factory"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("integrity") / "good")
    assert cli.main(["trace", "record", SPEC, "--out", path, "--device", "cpu"]) == 0
    return path


@pytest.fixture
def copy(good, tmp_path):
    path = str(tmp_path / "copy")
    shutil.copytree(good, path)
    return path


def _refused(argv, capsys, *needles):
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err
    for needle in needles:
        assert needle in captured.err, (needle, captured.err)
    # never a numerical verdict on a damaged trace
    assert "identical" not in captured.out and "DIVERGES" not in captured.out
    return captured.err


def _both_commands(good, bad, capsys, *needles):
    _refused(["trace", "compare", good, bad], capsys, *needles)
    _refused(["trace", "replay", bad, "--device", "cpu"], capsys, *needles)


def test_record_writes_sizes_and_checksums(good):
    meta = json.load(open(os.path.join(good, META_FILE)))
    integrity = meta["integrity"]
    assert integrity["tensor_file_bytes"] == os.path.getsize(os.path.join(good, TENSOR_FILE))
    # every tensor stored once: a call's output that is a tensor recorded before is an alias of it
    assert set(integrity["tensors"]) == {m.get("alias_of", k) for k, m in meta["tensors"].items()}
    assert load(good).integrity.startswith("verified")


def _truncate_tensor_file(trace_dir: str) -> str:
    """Cut the trace's tensor file to half its size, as an interrupted copy leaves it; its path."""
    tensor_path = os.path.join(trace_dir, TENSOR_FILE)
    with open(tensor_path, "r+b") as handle:
        handle.truncate(os.path.getsize(tensor_path) // 2)
    return tensor_path


def test_truncated_tensor_file(good, copy, capsys):
    tensor_path = _truncate_tensor_file(copy)
    _both_commands(good, copy, capsys, tensor_path, "truncated")


def test_truncated_tensor_file_of_an_old_trace_is_still_refused(good, copy, capsys):
    # without recorded sizes, safetensors' own check must still turn into a usage error
    meta_path = os.path.join(copy, META_FILE)
    meta = json.load(open(meta_path))
    del meta["integrity"]
    json.dump(meta, open(meta_path, "w"))
    tensor_path = _truncate_tensor_file(copy)
    _both_commands(good, copy, capsys, tensor_path, "cannot be read")


def test_garbage_trace_json(good, copy, capsys):
    meta_path = os.path.join(copy, META_FILE)
    open(meta_path, "w").write("garbage{")
    _both_commands(good, copy, capsys, meta_path, "not valid JSON")


def test_missing_tensor_file(good, copy, capsys):
    os.remove(os.path.join(copy, TENSOR_FILE))
    _both_commands(good, copy, capsys, os.path.join(copy, TENSOR_FILE), "is missing")


def test_checksum_mismatch_of_one_tensor(good, copy, capsys):
    tensor_path = os.path.join(copy, TENSOR_FILE)
    with open(tensor_path, "r+b") as handle:  # same size, one byte of the last tensor's data changed
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0x5A]))
    _both_commands(good, copy, capsys, tensor_path, "fails its checksum")
    with pytest.raises(TraceCorrupt, match="fails its checksum"):
        load(copy)


def test_traces_of_different_models_are_refused(good, tmp_path, capsys):
    other = str(tmp_path / "other")
    assert cli.main(["trace", "record", SPEC, "--out", other, "--device", "cpu",
                     "--factory-arg", "weights_seed=9"]) == 0
    capsys.readouterr()
    _refused(["trace", "compare", good, other], capsys, good, other, "different weights")


def test_old_traces_without_checksums_load_unchecked(good, copy):
    meta_path = os.path.join(copy, META_FILE)
    meta = json.load(open(meta_path))
    del meta["integrity"]
    json.dump(meta, open(meta_path, "w"))
    assert load(copy).integrity.startswith("unchecked")
    result = compare(good, copy)
    assert result.passed
    assert any("B: integrity unchecked" in note for note in result.notes)


class _Raising(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("no kernel for this here")


def _raising_factory(device="cpu", dtype=torch.float32, **options):
    model, inputs = factory(device, dtype)
    model.blocks[2].act = _Raising()  # no parameters: the weights still match the recording
    return model, inputs


def test_replay_lists_every_backward_row_compare_lists(good):
    """A call whose forward raises here still gets a backward row (skipped, with why), so replay's
    backward table lists the same calls as compare's."""
    compared = compare(good, good)
    replayed = replay(good, _raising_factory, device="cpu", referee=False)
    assert [r.key for r in replayed.backward] == [r.key for r in compared.backward]
    skipped = {r.key: r.reason for r in replayed.backward if r.status == "skipped"}
    assert "blocks.2.act" in skipped and "forward replay raised" in skipped["blocks.2.act"]
