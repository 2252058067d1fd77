"""report/fleet_table.py and report/known_table.py's terminal views: which ranks, collectives and
known issues a user sees, and the verdict line."""
from __future__ import annotations

from rich.console import Console

from gpuparity.known.engine import CONFIRMED, DOES_NOT_APPLY, MAY_APPLY, KnownIssueResult
from gpuparity.report import fleet_table, known_table


def _record(render, *args, **kwargs) -> str:
    console = Console(record=True, width=240)
    render(console, *args, **kwargs)
    return console.export_text()


def _fleet(healthy: bool):
    ranks = [{"rank": r, "host": "node-a", "local_rank": r, "device_name": "H100", "status": "PASS",
              "battery": {"status": "PASS", "counts": {"PASS": 5, "SKIP": 1}},
              "probes": {"matmul": {"tflops": 700.0, "status": "PASS", "fraction_of_median": 1.0}}} for r in (0, 1)]
    if not healthy:
        ranks[1].update(status="FAIL", reason="matmul wrong on rank 1", collective_phase="skipped: rank 1 failed")
    collectives = [{"collective": "all_reduce", "dtype": "bf16", "status": "PASS" if healthy else "FAIL",
                    "bytes": size, "wrong": 0 if healthy else 3, "time_us": 10.0, "algbw_gbps": 100.0,
                    "busbw_gbps": 150.0} for size in (1024, 1 << 20)]
    summary = {"hosts": ["node-a"], "suspect_ranks": [] if healthy else [1], "exit_code": 0 if healthy else 1,
               "failing_ranks": [] if healthy else [1], "suspect_hosts": [] if healthy else ["node-a"],
               "slow_ranks": [], "outlier_fraction": 0.8}
    return {"world_size": 2, "backend": "nccl", "summary": summary, "ranks": ranks, "collectives": collectives}


def test_healthy_fleet_has_a_row_per_rank_and_collectives_at_the_largest_size():
    text = _record(fleet_table.render_fleet, _fleet(True))
    assert "Fleet: 2 rank(s) on 1 host(s), backend nccl" in text
    assert "0: H100" in text and "1: H100" in text and "PASS 5/5" in text and "700.0 TFLOP/s (100%)" in text
    assert "all_reduce" in text and ".." in text  # the size span of the grouped rows
    assert "HEALTHY: every rank passed" in text


def test_unhealthy_fleet_flags_the_suspect_rank_and_the_wrong_elements():
    text = _record(fleet_table.render_fleet, _fleet(False))
    assert "SUSPECT" in text and "matmul wrong on rank 1" in text
    line = next(line for line in text.splitlines() if "all_reduce" in line)
    assert "FAIL" in line and " 6 " in line  # wrong elements summed over sizes
    assert "Collectives skipped: rank 1 failed" in text
    assert "UNHEALTHY: failing ranks [1]; suspect ranks [1] on host(s) node-a" in text
    every = _record(fleet_table.render_fleet, _fleet(False), all_sizes=True)
    assert "Collectives, every size" in every


def _issue(issue_id, status, **extra):
    return KnownIssueResult(id=issue_id, title=f"title of {issue_id}", status=status, why=[f"why {issue_id}"],
                            remedy=f"fix {issue_id}", remedy_env={"FOO": "1"}, sources=[], **extra)


def test_known_issue_table_hides_what_does_not_apply_unless_asked():
    results = [_issue("confirmed-one", CONFIRMED), _issue("maybe-one", MAY_APPLY),
               _issue("absent-one", DOES_NOT_APPLY)]
    text = _record(lambda console: known_table.render(results, console, recommended={"FOO": "1", "BAR": None}))
    assert "3 known issues: 1 confirmed, 1 may apply, 0 ruled out, 1 does not apply" in text
    assert "confirmed-one" in text and "maybe-one" in text and "why confirmed-one" in text and "env: FOO=1" in text
    assert "does not apply (1): absent-one" in text and "why absent-one" not in text
    assert "recommended environment: FOO=1 unset BAR" in text
    every = _record(lambda console: known_table.render(results, console, show_all=True))
    assert "why absent-one" in every


def test_doctor_known_issue_part_takes_stored_dicts_and_shows_only_the_relevant():
    stored = [dict(vars(_issue("maybe-one", MAY_APPLY))), dict(vars(_issue("absent-one", DOES_NOT_APPLY)))]
    text = _record(known_table.render_known_table, stored, only_relevant=True)
    assert "maybe-one" in text and "absent-one" not in text
    assert known_table.counts_line(known_table.as_results(stored)).startswith("2 known issues: ")
