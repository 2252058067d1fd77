"""On a GPU the known-issue probes run a few at a time; the ones that took longest here last time
start first, so the run does not end waiting for a long probe started last (on an H100 the two
torch.compile probes took 16.5 s each, the others 3-11 s, and came near the end of the base)."""
from __future__ import annotations

from gpuparity.known import engine


def item(probe):
    return ({"id": probe.upper(), "probe": probe}, object())


def test_longest_first_puts_unknown_then_slowest_first():
    runnable = [item("a"), item("b"), item("c"), item("d")]
    ordered = engine.longest_first(runnable, {"a": 3.0, "b": 16.5, "d": 5.0})
    assert [i[0]["probe"] for i in ordered] == ["c", "b", "d", "a"]
    assert [i[0]["probe"] for i in engine.longest_first(runnable, {})] == ["a", "b", "c", "d"]   # base order kept


def test_probe_times_round_trip_and_merge(tmp_path):
    path = str(tmp_path / "sub" / "probe-times.json")
    assert engine.load_probe_times(path) == {}
    engine.save_probe_times(path, {"a": 3.0004, "b": 16.5})
    engine.save_probe_times(path, {"a": 2.0})
    assert engine.load_probe_times(path) == {"a": 2.0, "b": 16.5}
    (tmp_path / "bad.json").write_text("not json")
    assert engine.load_probe_times(str(tmp_path / "bad.json")) == {}


def test_the_times_file_is_per_platform(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    one = engine.probe_times_path({"vendor": "nvidia", "torch": {"version": "2.11.0"}})
    two = engine.probe_times_path({"vendor": "nvidia", "torch": {"version": "2.13.0"}})
    assert one != two and one.startswith(str(tmp_path))
