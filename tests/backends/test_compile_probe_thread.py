"""The `compile` backend's availability probe (a torch.compile of a tiny function) never traces in
the caller's process from a background thread: torch.fx patches torch.nn.Module.__call__ for the
whole process while it traces, and a model running on the main thread meanwhile failed mid-step
("module is not installed as a submodule", on an H100 with the monitor's benchmark)."""
from __future__ import annotations

import threading

import torch

from gpuparity import isolate
from gpuparity.backends import compiled


def test_the_probe_from_a_background_thread_runs_in_a_process_of_its_own(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_VERDICTS", {})
    traced_here = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: traced_here.append(threading.current_thread().name)
                        or real_compile(*a, **k))
    asked = []
    real_isolated = isolate.call_isolated

    def isolated(target, kwargs=None, **options):
        asked.append(target)
        return real_isolated(target, kwargs, **options)
    monkeypatch.setattr(isolate, "call_isolated", isolated)
    found = []
    thread = threading.Thread(target=lambda: found.append(compiled.compile_unavailable_reason("cpu")))
    thread.start()
    thread.join(300)
    assert asked == ["gpuparity.backends.compiled:probe_in_child"]
    assert traced_here == []                                   # nothing compiled in this process
    assert len(found) == 1 and (found[0] is None or found[0].startswith("compile:"))
    assert compiled.compile_unavailable_reason("cpu") == found[0]   # the child's verdict is kept
    assert traced_here == []                                         # and not probed again here


def test_a_probe_process_that_does_not_answer_leaves_no_verdict(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_VERDICTS", {})
    monkeypatch.setattr(isolate, "call_isolated", lambda *a, **k: isolate.Outcome("crash", error="killed"))
    found = []
    thread = threading.Thread(target=lambda: found.append(compiled.compile_unavailable_reason("cpu")))
    thread.start()
    thread.join(60)
    assert "probe's own process ended: crash" in found[0]
    assert "cpu" not in compiled._VERDICTS                     # asked again next time
