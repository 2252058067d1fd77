"""`gpuparity known-issues`: rendering, --platform, --json, and exit codes."""
import json

import pytest

from gpuparity.cli import main


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    # Rich wraps to the terminal; a wide one keeps the words these tests look for on one line.
    monkeypatch.setenv("COLUMNS", "220")


def test_platform_file_is_judged_by_rules_and_written_as_json(platform_file, tmp_path, capsys):
    out = tmp_path / "sub" / "known.json"
    assert main(["known-issues", "--platform", platform_file("mi300a_rocm62"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SDPA-MASK-ROCM" in printed and "may apply" in printed and "rules only" in printed
    document = json.loads(out.read_text())
    assert document["schema_version"] == 1
    assert document["platform"]["torch"]["version"] == "2.5.1+rocm6.2"
    assert document["probes_ran"] is False
    assert document["fingerprint"]
    by_id = {r["id"]: r for r in document["results"]}
    assert by_id["SDPA-MASK-ROCM"]["status"] == "may apply"
    assert by_id["SDPA-MASK-ROCM"]["why"][-1] == "aotriton 0.7 < 0.8.2"
    assert all(r["probe_outcome"] is None for r in document["results"])
    assert sum(document["counts"].values()) == len(document["results"])


def test_confirmed_and_may_apply_come_first_and_all_shows_the_rest(platform_file, capsys):
    assert main(["known-issues", "--platform", platform_file("rdna2_gfx1030_rocm62")]) == 0
    printed = capsys.readouterr().out
    assert "RDNA-MTYPE-CRASH" in printed and "amdgpu.vm_fragment_size=9" in printed
    assert printed.index("RDNA-MTYPE-CRASH") < printed.index("does not apply (")
    assert "--all shows why" in printed
    assert main(["known-issues", "--platform", platform_file("rdna2_gfx1030_rocm62"), "--all"]) == 0
    printed = capsys.readouterr().out
    assert "not a CUDA build" in printed


def test_recommended_environment_is_printed(platform_file, capsys):
    assert main(["known-issues", "--platform", platform_file("rtx5090x2_cuda")]) == 0
    assert "NCCL_P2P_DISABLE=1" in capsys.readouterr().out


def test_this_machine_without_probes(capsys):
    assert main(["known-issues", "--no-probes"]) == 0
    assert "this machine:" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    (json.dumps({"vendor": "amd"}), "has no schema_version"),
    (json.dumps([1, 2]), "has no schema_version"),
    (json.dumps({"schema_version": 99}), "schema_version 99"),
])
def test_bad_platform_files_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "env.json"
    path.write_text(content)
    assert main(["known-issues", "--platform", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_platform_file_and_bad_options_exit_2(tmp_path, capsys):
    # a missing input file is caught while the arguments are parsed
    assert main(["known-issues", "--platform", str(tmp_path / "nope.json")]) == 2
    assert "argument --platform:" in capsys.readouterr().err
    assert main(["known-issues", "--no-probes", "--timeout", "0"]) == 2
    assert main(["known-issues", "--device", "gpu:7"]) == 2
    err = capsys.readouterr().err   # the argument named, and what it got
    assert "device" in err and "'gpu:7'" in err


def test_json_to_stdout(platform_file, capsys):
    assert main(["known-issues", "--platform", platform_file("b200_cuda"), "--json", "-"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {r["id"]: r["status"] for r in document["results"]}["SDPA-CUDNN-GQA-B200"] == "may apply"
