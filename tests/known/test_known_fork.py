"""Known-issue probes forked from one fork server give the verdicts and details the old path (a
fresh interpreter per probe) gives; an entry marked "probe_isolation": "spawn" keeps the old path."""
import os
import textwrap

import pytest

from gpuparity import isolate
from gpuparity.known import engine, evaluate, load_issues
from gpuparity.known.engine import validate_issue

pytestmark = pytest.mark.skipif(not isolate.fork_available(), reason="needs os.fork (POSIX)")


def _comparable(results):
    """Each result as a dict, less what differs from run to run (times, how the process started,
    and stderr, where import-time warnings go to the fork server's log rather than the probe's)."""
    rows = []
    for result in results:
        row = result.to_dict()
        if row["probe_outcome"]:
            row["probe_outcome"] = {key: value for key, value in row["probe_outcome"].items()
                                    if key not in ("duration_s", "runner", "stderr_tail")}
        rows.append(row)
    return rows


def test_the_cpu_probes_give_the_same_results_forked_and_spawned():
    spawned = evaluate(device="cpu", probe_isolation="spawn")
    forked = evaluate(device="cpu", probe_isolation="fork")
    probed = [r for r in forked if r.probe_outcome]
    assert len(probed) >= 3
    assert {r.probe_outcome["runner"] for r in probed} == {"fork"}
    assert {r.probe_outcome["runner"] for r in spawned if r.probe_outcome} == {"spawn"}
    assert _comparable(forked) == _comparable(spawned)


@pytest.fixture
def runner_probes(tmp_path, monkeypatch):
    (tmp_path / "runner_known_probes.py").write_text(textwrap.dedent("""
        import os
        STARTED_AS = os.getppid()

        def which(device):
            # a spawned probe imported this module itself; a forked one inherited the zygote's import
            return {"failed": False, "detail": "forked" if STARTED_AS != os.getppid() else "spawned"}
    """))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(engine, "PROBE_MODULE", "runner_known_probes")


def _entry(issue_id, **extra):
    base = {issue["id"]: issue for issue in load_issues()}["SDPA-FULLMASK-NAN"]
    return {**base, "id": issue_id, "probe": "which", "probe_needs_gpu": False, **extra}


def test_an_entry_marked_spawn_starts_fresh_beside_forked_ones(runner_probes):
    forked, spawned = evaluate(issues=[_entry("A"), _entry("B", probe_isolation="spawn")], device="cpu")
    assert (forked.probe_outcome["runner"], forked.probe_outcome["detail"]) == ("fork", "forked")
    assert (spawned.probe_outcome["runner"], spawned.probe_outcome["detail"]) == ("spawn", "spawned")


def test_probe_isolation_is_validated():
    with pytest.raises(ValueError, match=r"known issue 'X': probe_isolation must be one of \('fork', 'spawn'\), "
                                         r"got 'thread'"):
        validate_issue(_entry("X", probe_isolation="thread"))
    with pytest.raises(ValueError, match="probe_isolation: expected one of"):
        evaluate(probes=True, device="cpu", probe_isolation="forked")
    with pytest.raises(ValueError, match="probe_workers: expected an integer >= 1, got 0"):
        evaluate(probes=True, device="cpu", probe_workers=0)


def test_the_entries_about_process_start_keep_a_fresh_process():
    """The audit in docs/known-issues.md ("How probes run"): these measure what a process starts with."""
    marked = {issue["id"] for issue in load_issues() if issue.get("probe_isolation") == "spawn"}
    assert marked == {"TF32-DEFAULTS", "DET-CUBLAS-WS"}
