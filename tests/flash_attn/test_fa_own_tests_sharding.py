"""benchmarks/scripts/fa_own_tests.py's parallel run: the sharding key keeps the cases that share
Triton kernels together, shards cover every case once and balance by count, --jobs is spread over
the files, the merge gives every selected case an outcome (a crashed shard loses only its own
cases), and an end-to-end run on a synthetic test file with a crashing case."""
from __future__ import annotations

import json
import os
import random
import sys
import tarfile
import textwrap

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "scripts")
sys.path.insert(0, os.path.abspath(SCRIPTS))
import fa_own_tests as driver  # noqa: E402


def test_kernel_key_drops_only_shapes():
    key = driver.kernel_key
    a = key("t.py::test_out[97-64]", {"seqlen_q": "97", "seqlen_k": "128", "swap_sq_sk": "False", "d": "64",
                                     "dtype": "torch.float16", "causal": "True"})
    b = key("t.py::test_out[1025-64]", {"seqlen_q": "1025", "seqlen_k": "7", "swap_sq_sk": "True", "d": "64",
                                       "dtype": "torch.float16", "causal": "True"})
    assert a == b == "t.py::test_out[causal=True,d=64,dtype=torch.float16]"
    assert key("t.py::test_out[x]", {"d": "128", "dtype": "torch.float16", "causal": "True"}) != a
    assert key("t.py::test_out[x]", {"d": "64", "dtype": "torch.bfloat16", "causal": "True"}) != a
    assert key("t.py::test_other[x]", {"d": "64", "dtype": "torch.float16", "causal": "True"}) != a
    assert key("t.py::test_plain", {}) == "t.py::test_plain[]"


@pytest.mark.parametrize("seed", range(8))
def test_shards_cover_once_keep_groups_and_balance(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([1, 1, 2, 3, 7]) for _ in range(rng.randint(1, 30))]
    keys = [f"g{g}" for g, n in enumerate(sizes) for _ in range(n)]
    rng.shuffle(keys)
    ids = [f"case{i}" for i in range(len(keys))]
    n = rng.randint(1, 12)
    shards = driver.shard_cases(ids, keys, n)
    assert len(shards) == min(n, len(sizes)) and all(shards)
    assert sorted(c for s in shards for c in s) == sorted(ids)               # each case once
    key_of = dict(zip(ids, keys))
    owner = {}
    for k, shard in enumerate(shards):
        assert shard == sorted(shard, key=ids.index)                         # the input order kept
        for c in shard:
            assert owner.setdefault(key_of[c], k) == k                       # a group never split
    loads = [len(s) for s in shards]
    assert max(loads) - min(loads) <= max(sizes)                             # greedy: within one group
    assert shards == driver.shard_cases(ids, keys, n)                        # deterministic


def test_shards_balance_equal_groups_exactly():
    ids = [f"c{i}" for i in range(12)]
    shards = driver.shard_cases(ids, [f"k{i % 6}" for i in range(12)], 3)
    assert [len(s) for s in shards] == [4, 4, 4]
    with pytest.raises(ValueError, match="n: expected >= 1"):
        driver.shard_cases(ids, ids, 0)
    with pytest.raises(ValueError, match="12 node ids but 1 keys"):
        driver.shard_cases(ids, ["k"], 2)


def test_allocate_jobs_spreads_by_count():
    cases = {"ce": 16, "rot": 8, "ln": 32, "fa": 216, "empty": 0}
    groups = {"ce": 16, "rot": 2, "ln": 30, "fa": 150, "empty": 0}
    got = driver.allocate_jobs(cases, groups, 12)
    assert sum(got.values()) == 12 and got["empty"] == 0
    assert min(got[p] for p in ("ce", "rot", "ln")) >= 1 and got["fa"] == max(got.values())
    assert got == {"ce": 1, "rot": 1, "ln": 2, "fa": 8, "empty": 0}     # 16, 8, 16, 27 cases a shard
    assert driver.allocate_jobs(cases, groups, 2) == {"ce": 1, "rot": 1, "ln": 1, "fa": 1, "empty": 0}
    assert driver.allocate_jobs({"a": 5}, {"a": 2}, 12) == {"a": 2}          # no more shards than groups
    with pytest.raises(ValueError, match="jobs: expected >= 1"):
        driver.allocate_jobs(cases, groups, 0)


def _shard(index, cases, tests, *, rc=0, killed=False, started=True, exitstatus=0):
    results = None if tests is None else {"tests": tests, "exitstatus": exitstatus, "collect_errors": []}
    return {"index": index, "cases": cases, "groups": len(cases), "rc": rc, "killed_past_budget": killed,
            "wall_s": 1.0, "started": started, "log": f"shard_{index}.log", "results": results}


def test_merge_gives_every_case_an_outcome_and_a_crash_loses_only_its_shard():
    ids = [f"f.py::t[{i}]" for i in range(10)]
    collect = {"selected": ids, "sampling": {"f.py::t": {"cases": 40, "covering": 4, "selected": 10}},
               "collect_errors": [], "deselected_internals": [{"test": "f.py::u", "cases": 3, "reason": "C++"}]}
    ok = {"outcome": "passed", "duration_s": 0.1}
    shards = [
        _shard("f.0", ids[0:3], {ids[0]: ok, ids[1]: {"outcome": "failed", "message": "E"},
                                 ids[2]: {"outcome": "not_run_budget", "reason": "budget"}}, rc=1, exitstatus=1),
        # crashed at ids[4] (its setup recorded, no outcome), ids[5] never reached
        _shard("f.1", ids[3:6], {ids[3]: ok, ids[4]: {"outcome": None}}, rc=-11, exitstatus=None),
        # killed at the deadline while running ids[7]; ids[8] not reached
        _shard("f.2", ids[6:9], {ids[6]: ok, ids[7]: {"outcome": None}}, rc=-9, killed=True, exitstatus=None),
        _shard("f.3", ids[9:], None, rc=None, started=False),
    ]
    rec = driver.merge_file("f.py", collect, shards)
    outcome = {n: t["outcome"] for n, t in rec["tests"].items()}
    assert list(rec["tests"]) == ids
    assert outcome == {ids[0]: "passed", ids[1]: "failed", ids[2]: "not_run_budget", ids[3]: "passed",
                       ids[4]: "lost_shard", ids[5]: "lost_shard", ids[6]: "passed", ids[7]: "lost_shard",
                       ids[8]: "not_run_budget", ids[9]: "not_run_budget"}
    assert "crashed (rc -11" in rec["tests"][ids[5]]["reason"] and rec["tests"][ids[5]]["shard"] == "f.1"
    assert "killed past the deadline while running it" in rec["tests"][ids[7]]["reason"]
    assert rec["rc"] == 1 and rec["killed_past_budget"] and len(rec["shards"]) == 4
    rec["totals"] = driver.totals(rec)
    t = rec["totals"]
    assert (t["passed"], t["failed"], t["not_run_budget"], t["lost_shard"], t["selected"], t["cases"],
            t["deselected_internals"]) == (3, 1, 3, 3, 10, 40, 3)
    text = driver.summary_md({"commit": "c", "budget_s": 1, "seed": 0, "max_cases_per_test": 16, "collect_only": False,
                              "jobs": 4, "files": [rec]})
    assert "## Lost with their shard" in text and f"`{ids[4]}` (shard f.1)" in text
    assert "| f.3 | 1 | 1 | not started | 1.0 | shard_f.3.log |" in text


@pytest.mark.slow
def test_end_to_end_two_shards_one_crashing(tmp_path, capsys):
    """--jobs 2 on a synthetic file in the place of test_cross_entropy.py: the dtype groups go to
    two shards; bf16 with seqlen 2 ends its process, which loses bf16's cases only."""
    folder = tmp_path / "fa" / "tests" / "losses"
    folder.mkdir(parents=True)
    (folder / "test_cross_entropy.py").write_text(textwrap.dedent("""
        import os
        import pytest

        @pytest.mark.parametrize("dtype", ["fp16", "bf16"])
        @pytest.mark.parametrize("seqlen", [1, 2, 3])
        def test_ce(seqlen, dtype):
            if dtype == "bf16" and seqlen == 2:
                os._exit(3)
        """))
    out = tmp_path / "out"
    assert driver.main(["--tests", str(tmp_path / "fa"), "--out", str(out), "--files", "losses/test_cross_entropy.py",
                        "--jobs", "2", "--budget-s", "300"]) == 0
    printed = capsys.readouterr().out
    assert "tests/losses/test_cross_entropy.py: 6 cases selected (of 6), 2 kernel groups, 2 shards of [3, 3] cases" in printed
    assert sorted(os.listdir(out)) == ["junit.xml", "logs.tar.gz", "results.json", "summary.md"]
    [rec] = json.loads((out / "results.json").read_text())["files"]
    outcome = {n.split("[")[1].rstrip("]"): t["outcome"] for n, t in rec["tests"].items()}
    assert {outcome[f"{s}-fp16"] for s in (1, 2, 3)} == {"passed"}
    assert outcome["2-bf16"] == "lost_shard"
    assert {outcome["1-bf16"], outcome["3-bf16"]} <= {"passed", "lost_shard"}
    assert sorted(s["rc"] for s in rec["shards"]) == [0, 3]
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = {os.path.basename(n) for n in tar.getnames()}
    assert {"collect_test_cross_entropy.log", "shard_test_cross_entropy.0.log", "shard_test_cross_entropy.1.log"} <= names
