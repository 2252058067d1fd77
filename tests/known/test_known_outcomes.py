"""`doctor --quick` lets a probe outcome kept on this very platform stand instead of probing again
(src/gpuparity/known/outcomes.py): on the H100 the probes ran 29.6 s past a warm --quick's 12.5 s
battery. A kept outcome stands only while the entry, the probes' source and the platform are
unchanged, it is decisive and at most 7 days old; the default doctor always probes."""
from __future__ import annotations

import copy

import pytest

from gpuparity import doctor
from gpuparity.known import engine, load_issues, outcomes

PROBE_MODULE = engine.PROBE_MODULE


def kept(verdict="confirmed", code="c1", at=1000.0):
    return outcomes.entry({"verdict": verdict, "detail": "d", "runner": "fork", "duration_s": 3.0}, code, now=at)


@pytest.mark.parametrize("stored, code, now, stands", [
    (kept(), "c1", 1000.0 + 60, True),
    (kept(verdict="ruled out"), "c1", 1000.0 + 60, True),
    (kept(verdict="may apply"), "c1", 1000.0 + 60, False),      # inconclusive: probe again
    (kept(), "c2", 1000.0 + 60, False),                          # entry or probe source edited
    (kept(), "c1", 1000.0 + outcomes.MAX_AGE_S + 1, False),      # too old
    (kept(), "c1", 1000.0 - 5, False),                           # from the future: the clock moved
    (None, "c1", 1000.0, False),
])
def test_a_kept_outcome_stands_only_while_nothing_that_decided_it_changed(stored, code, now, stands):
    outcome = outcomes.reusable(stored, code, now=now)
    assert (outcome is not None) is stands
    if stands:
        assert outcome["reused"] is True and outcome["age_s"] == 60.0 and outcome["verdict"] == stored["outcome"]["verdict"]
        assert outcome["probed_at"] == "1970-01-01 00:16:40 UTC"


def test_the_code_key_follows_the_entry_as_written():
    issue = load_issues()[0]
    edited = copy.deepcopy(issue)
    edited["title"] += " (edited)"
    assert outcomes.code_key(issue, PROBE_MODULE) == outcomes.code_key(copy.deepcopy(issue), PROBE_MODULE)
    assert outcomes.code_key(issue, PROBE_MODULE) != outcomes.code_key(edited, PROBE_MODULE)


def test_store_round_trip_merges_and_survives_a_bad_file(tmp_path):
    path = str(tmp_path / "sub" / "probe-outcomes.json")
    assert outcomes.load(path) == {}
    outcomes.save(path, {"A": kept(), "B": kept(verdict="ruled out")})
    outcomes.save(path, {"A": kept(code="c9")})
    loaded = outcomes.load(path)
    assert set(loaded) == {"A", "B"} and loaded["A"]["code"] == "c9"
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert outcomes.load(str(tmp_path / "bad.json")) == {}


ENTRY = "TORCH-CPU-FP16-CE-MEAN"    # a cheap probe that runs on the CPU


def test_evaluate_keeps_decisive_outcomes_and_reuse_skips_the_probe(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    first = {r.id: r for r in engine.evaluate(ids=[ENTRY], device="cpu")}[ENTRY]
    if first.probe_outcome is None or first.probe_outcome["verdict"] not in outcomes.REUSABLE_VERDICTS:
        pytest.skip(f"{ENTRY}'s probe did not decide here: {first.why}")
    assert not first.probe_outcome.get("reused")

    def no_probe(*_args, **_kwargs):
        raise AssertionError("the probe ran although its kept outcome stands")
    monkeypatch.setattr(engine, "run_probe", no_probe)
    again = {r.id: r for r in engine.evaluate(ids=[ENTRY], device="cpu", reuse_outcomes=True)}[ENTRY]
    assert again.status == first.status
    assert again.probe_outcome["reused"] is True and again.probe_outcome["verdict"] == first.probe_outcome["verdict"]
    assert "kept by --quick" in " ".join(again.why)
    # without reuse (the default doctor, `known-issues`), the probe runs
    with pytest.raises(AssertionError, match="kept outcome stands"):
        engine.evaluate(ids=[ENTRY], device="cpu")
    # an edited entry probes again, even with reuse
    edited = [copy.deepcopy(i) for i in load_issues() if i["id"] == ENTRY]
    edited[0]["symptom"] += " (edited)"
    with pytest.raises(AssertionError, match="kept outcome stands"):
        engine.evaluate(ids=[ENTRY], device="cpu", reuse_outcomes=True, issues=edited)


def test_only_quick_doctors_reuse_outcomes(monkeypatch):
    seen = []

    def known_issues(report, device, probes, sink, reuse=False):
        seen.append(reuse)
        sink["results"] = []
    monkeypatch.setattr(doctor, "_known_issues", known_issues)
    for level in ("quick", "default"):
        report = doctor.run_doctor(doctor.DoctorOptions(ops=["softmax"], device="cpu", level=level, fill_cache=False,
                                                        shrink=False, dtypes=["float32"]))
        assert report["probes_reused"] == 0
    assert seen == [True, False]
