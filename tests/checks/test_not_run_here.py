"""Cases too large for this machine or the level's budget (the sized families: attention's
> 2^31-score member, the norms' `huge` family of > 2^31 elements) are never silently left out:
check at the default level and at --level full, --explore and doctor each report every such case
by name with its reason (memory needed against available, or the level's budget), in the
results and in the terminal report."""
from __future__ import annotations

import io
import os

import pytest
from rich.console import Console

from gpuparity import doctor
from gpuparity.checks import battery, families
from gpuparity.checks.explore import explore
from gpuparity.checks.results import NOT_RUN_HERE, CheckResult, Status, not_run_here
from gpuparity.contracts import get_spec
from gpuparity.report.html import render_doctor_html
from gpuparity.report.terminal import render_doctor, render_results

IMPLS = os.path.join(os.path.dirname(__file__), "planted_impls.py")
ATTENTION_HUGE = "long.sq32832_sk32832_b1_h2"   # > 2^31 scores
NORM_HUGE = ("huge.rows_65536x4096", "huge.over_2pow31")   # a --level full family; > 2^31 elements
SIZED = {ATTENTION_HUGE, *NORM_HUGE}


def _sized_only(_op, case):
    return case.name in SIZED


def _reasons(results):
    """case -> the distinct reasons its checks were skipped for, each with the prefix."""
    found = {}
    for result in results:
        assert result.status == Status.SKIP, f"{result.key} ran ({result.status}); this machine cannot hold it"
        found.setdefault(result.case, set()).add(result.reason)
    return found


def _said_why(reason: str) -> bool:
    return reason.startswith(NOT_RUN_HERE) and any(word in reason for word in ("memory", "budget", "--level full"))


def _rendered(results) -> str:
    out = io.StringIO()
    render_results(Console(file=out, width=120), results)
    return out.getvalue()


@pytest.fixture
def small_host(monkeypatch):
    """A host with 8 GiB free: every sized member here is past memory or budget, on any CI machine."""
    monkeypatch.setattr(families, "host_available_bytes", lambda: 8 * 2 ** 30)


@pytest.mark.parametrize("level", ["default", "full"])
@pytest.mark.parametrize("op,impl,cases", [("attention", "attention_correct", {ATTENTION_HUGE}),
                                           ("layer_norm", "layer_norm_correct", set(NORM_HUGE) - {"huge.rows_65536x4096"})])
def test_check_impl_reports_each_too_large_case_with_its_reason(small_host, op, impl, cases, level):
    run = battery.run_battery([op], level, "cpu", impl=f"{IMPLS}:{impl}", dtypes=["float32"], isolate=False,
                              case_filter=_sized_only)
    reasons = _reasons(run.results)
    assert cases <= set(reasons), f"{op} at {level}: {sorted(cases - set(reasons))} left out in silence"
    assert all(_said_why(reason) for case in cases for reason in reasons[case])
    text = _rendered(run.results)
    for case in cases:   # named in the terminal report, with its reason, not only counted among the skips
        line = next(line for line in text.splitlines() if case in line)
        assert "memory" in line or "budget" in line or "--level full" in line, line


def test_a_full_level_family_is_reported_at_the_default_level():
    """The norms' huge family runs at --level full only: the default level lists its members as
    not run, saying which level runs them (was: absent from the report)."""
    tasks, decided = battery.plan(["rms_norm"], "default", "cpu")   # the doctor's plan: every backend
    assert not any(t.case in NORM_HUGE for t in tasks)
    skipped = {r.case: r.reason for r in decided if r.case in NORM_HUGE and r.reason.startswith(NOT_RUN_HERE)}
    assert set(skipped) == set(NORM_HUGE)
    assert all("--level full" in reason for reason in skipped.values())


def test_doctor_reports_each_too_large_case_by_name(small_host, monkeypatch):
    real = battery.run_battery

    def sized_only(*args, **kwargs):
        return real(*args, **{**kwargs, "case_filter": _sized_only, "isolate": False})

    monkeypatch.setattr(doctor, "run_battery", sized_only)
    for level in ("default", "full"):
        options = doctor.DoctorOptions(ops=["attention", "rms_norm"], probes=False, device="cpu", level=level,
                                       fill_cache=False, shrink=False)
        report = doctor.run_doctor(options)
        results = [CheckResult.from_dict(r) for r in report["battery"]["results"]]
        entries = {(e["op"], e["case"]) for e in not_run_here(results)}
        assert {("attention", ATTENTION_HUGE), ("rms_norm", "huge.over_2pow31")} <= entries, level
        out = io.StringIO()
        render_doctor(Console(file=out, width=120), report)
        page = render_doctor_html(report)
        for text in (out.getvalue(), page):
            assert ATTENTION_HUGE in text and "huge.over_2pow31" in text


def test_explore_tries_a_too_large_case_again_under_full_budget_and_says_why(small_host, monkeypatch):
    """A sized member the level skipped is drawn again by --explore under --level full's
    budget: here it still does not fit (8 GiB free), so it is reported with full's reason where
    that differs from the level's, and not a second time where the reason is the same."""
    spec = get_spec("rms_norm")
    huge = [fam for fam in spec.families() if fam.name == "huge"]
    monkeypatch.setattr(type(spec), "families", lambda self: huge)   # explore draws from this family only
    monkeypatch.setattr(families, "cover_family", lambda spec, name: None)   # (not from the covering array)
    impl = f"{IMPLS}:rms_norm_assumes_contiguous"   # never runs: every case here is too large
    level = battery.run_battery(["rms_norm"], "default", "cpu", impl=impl, dtypes=["float32"], isolate=False,
                                case_filter=_sized_only)
    assert {r.case for r in level.results} == set(NORM_HUGE)
    found = explore(5.0, ["rms_norm"], "cpu", dtypes=["float32"], impl=impl, previous=level.results, isolate=False)
    reasons = _reasons(found)
    assert set(reasons) == set(NORM_HUGE)
    assert all(_said_why(r) and "host memory" in r for case in NORM_HUGE for r in reasons[case])
    again = explore(5.0, ["rms_norm"], "cpu", dtypes=["float32"], impl=impl, previous=level.results + found,
                    isolate=False)
    assert again == []   # the same reason is not reported twice
