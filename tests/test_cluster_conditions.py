"""Where users run gpuparity on clusters: caches that cannot be written or are damaged, jobs
ended by SIGTERM (SLURM's time limit) or SIGINT, devices that are not there, errors raised by the
user's own code."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

import gpuparity
from gpuparity import dispatch
from gpuparity.checks import selection, verdicts
from gpuparity.cli import main


def _cannot_write(folder) -> bool:
    """chmod does not bind root: find out by trying."""
    try:
        with open(os.path.join(folder, ".write-test"), "w"):
            pass
    except OSError:
        return True
    os.remove(os.path.join(folder, ".write-test"))
    return False


def _canned_probe(op, dtype, kind, device, names=None):
    """check_op's answer without running the battery (seconds on the CPU): torch's backend passes (the
    others would compile on first use), the rest do not."""
    from gpuparity.checks.verdicts import verdict_dtype
    return {f"{op}|{b.name}|{verdict_dtype(op, dtype, device)}|{kind}": {"passed": b.name == "torch", "reason": "", "time_ms": 1.0}
            for b in dispatch.backends(op) if names is None or b.name in names}


def _rms_norm_in(cache, monkeypatch, caplog):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(cache))
    monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "0")
    monkeypatch.setattr(selection, "check_op", _canned_probe)
    # the compile backend's own probe compiles a function (seconds) and keeps its answer in the cache too
    from gpuparity.backends import compiled
    monkeypatch.setitem(compiled._VERDICTS, "cpu", "compile: not probed in this test")
    monkeypatch.setattr("gpuparity.cachedir._WARNED", set(), raising=False)
    verdicts.clear_cache()
    x, w = torch.randn(4, 64), torch.randn(64)
    try:
        with caplog.at_level(logging.WARNING, logger="gpuparity"):
            out = gpuparity.rms_norm(x, (64,), w)
            dispatch.forget()
            again = gpuparity.rms_norm(x, (64,), w)   # decided again: the verdicts stayed in memory
    finally:
        verdicts.clear_cache()
    assert torch.allclose(out, torch.nn.functional.rms_norm(x, (64,), w), atol=1e-5) and torch.equal(out, again)
    said = [r.getMessage() for r in caplog.records if "cannot write the cache" in r.getMessage()]
    assert len(said) == 1, said   # once, not per call
    assert "GPUPARITY_CACHE_DIR" in said[0]


# ------------------------------------------------------------------ 3. unwritable cache directory

def test_library_works_uncached_when_the_cache_dir_is_read_only(tmp_path, monkeypatch, caplog):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if not _cannot_write(folder):
            pytest.skip("this user can write a 0o555 folder (root): no read-only path to test with")
        _rms_norm_in(folder / "cache", monkeypatch, caplog)
        _rms_norm_in(folder, monkeypatch, caplog)
    finally:
        folder.chmod(0o755)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_library_works_uncached_when_the_cache_dir_is_a_folder_nobody_can_write(monkeypatch, caplog):
    # /proc/self exists and takes no new files, root included (the 0o555 test above skips as root)
    assert _cannot_write("/proc/self")
    _rms_norm_in("/proc/self", monkeypatch, caplog)


def test_library_works_uncached_when_the_cache_dir_cannot_be_made(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    _rms_norm_in(blocker / "cache", monkeypatch, caplog)


def test_doctor_still_reports_why_the_cache_was_not_written(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(OSError):
        verdicts.store_verdicts(torch.device("cpu"), {}, strict=True)
    verdicts.clear_cache()


# ------------------------------------------------------------------ 6. a damaged probe cache

DAMAGED = {"truncated": lambda text: text[: len(text) // 2],
           "wrong shape": lambda text: json.dumps({"verdicts": ["rms_norm|torch|float32|default"]}),
           "wrong entries": lambda text: json.dumps({"verdicts": {"rms_norm": 3}})}


def _damaged_cache(tmp_path, monkeypatch, how):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("gpuparity.cachedir._WARNED", set(), raising=False)
    verdicts.clear_cache()
    stored = _canned_probe("rms_norm", torch.float32, "default", torch.device("cpu"))
    path = verdicts.store_verdicts(torch.device("cpu"), stored)
    verdicts.clear_cache()
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(DAMAGED[how](text))
    return path


@pytest.mark.parametrize("how", sorted(DAMAGED))
def test_a_damaged_cache_is_named_with_how_to_clear_it(tmp_path, monkeypatch, capsys, caplog, how):
    path = _damaged_cache(tmp_path, monkeypatch, how)
    assert main(["cache", "show"]) == 2
    err = capsys.readouterr().err
    assert path in err and "gpuparity cache clear" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    # the library probes again and says so once, naming the file
    with caplog.at_level(logging.WARNING, logger="gpuparity"):
        assert verdicts.load(path) == {}
        verdicts.clear_cache()
        assert verdicts.load(path) == {}
    verdicts.clear_cache()
    said = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(said) == 1 and path in said[0] and "gpuparity cache clear" in said[0]
    assert main(["cache", "clear"]) == 0 and main(["cache", "show"]) == 0


# ------------------------------------------------------------------ 5. a device that is not there

SPEC = "import torch\n\ndef factory(device='cpu', dtype=torch.float32):\n" \
       "    return torch.nn.Linear(4, 4).to(device, dtype), (torch.randn(2, 4).to(device, dtype),)\n"


def _device_commands(tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "trace.json").write_text("{}")
    return [["model", f"{spec}:factory"], ["trace", "record", f"{spec}:factory", "--out", str(tmp_path / "t")],
            ["trace", "replay", str(trace)], ["compile-check", f"{spec}:factory"], ["check", "--op", "softmax"],
            ["doctor", "--quick"], ["workload", "run", "aam", "--out", str(tmp_path / "r.json")],
            ["bench", "norm"], ["known-issues"], ["profile", "memory", "--", "python", str(spec)]]


@pytest.mark.parametrize("device", ["cuda:99", "tpu"] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_every_command_refuses_a_missing_device_in_one_line(tmp_path, capsys, device):
    for command in _device_commands(tmp_path):
        at = command.index("--") if "--" in command else len(command)   # before profile's script
        assert main(command[:at] + ["--device", device] + command[at:]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, (command, err)
        assert err.startswith(f"gpuparity {command[0]}: error: device: ") and device.split(":")[0] in err, err


# ------------------------------------------------------------------ 9. skip reasons in the table

def test_the_terminal_table_says_why_checks_were_skipped():
    from rich.console import Console

    from gpuparity.checks.results import CheckResult, Status
    from gpuparity.report.html import render_doctor_html
    from gpuparity.report.terminal import render_results
    impl = "impl:mine.py:attn"
    results = [CheckResult("attention", impl, f"case_{i}", "float32", "cpu", Status.PASS) for i in range(3)]
    results += [CheckResult("attention", impl, "sliding_window", "float32", "cpu", Status.SKIP,
                            reason="attn: takes no window argument, which this case needs"),
                CheckResult("attention", impl, "softcap_30", "float32", "cpu", Status.SKIP,
                            reason="attn: takes no softcap argument, which this case needs [x]")]
    con = Console(record=True, width=400, color_system=None)
    render_results(con, results)
    text = con.export_text()
    assert "2 skipped" in text and "takes no window argument" in text and "takes no softcap argument" in text
    assert "needs [x]" in text   # escaped, not taken for markup


# ------------------------------------------------------------------ 8. trace compare --plot, its hint

TRACED = "import torch\n\nclass Scale(torch.nn.Module):\n    def __init__(self, by):\n" \
         "        super().__init__()\n        self.by = by\n\n    def forward(self, x):\n        return x * self.by\n\n" \
         "def factory(device='cpu', dtype=torch.float32, by=1.0):\n    torch.manual_seed(0)\n" \
         "    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale(by)).eval()\n" \
         "    return model.to(device, dtype), (torch.randn(2, 4).to(device, dtype),)\n"


def test_trace_compare_plots_into_a_new_folder_and_names_the_traces_to_replay(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    spec = tmp_path / "traced.py"
    spec.write_text(TRACED)
    a, b = tmp_path / "run a", tmp_path / "run_b"
    assert main(["trace", "record", f"{spec}:factory", "--out", str(a), "--device", "cpu", "--no-grads"]) == 0
    assert main(["trace", "record", f"{spec}:factory", "--out", str(b), "--device", "cpu", "--no-grads",
                 "--factory-arg", "by=1.5"]) == 0
    capsys.readouterr()
    plot = tmp_path / "missing" / "dir" / "p.png"
    assert main(["trace", "compare", str(a), str(b), "--plot", str(plot)]) == 1
    out = " ".join(capsys.readouterr().out.split())   # rich may wrap the hint
    assert plot.is_file()
    assert f"gpuparity trace replay '{a}'" in out and f"gpuparity trace replay {b}" in out


# ------------------------------------------------------------------ 7. errors raised by the user's code

RAISING = "import torch\n\nclass Boom(torch.nn.Module):\n    def forward(self, x):\n" \
          "        raise RuntimeError('forward exploded')\n\n" \
          "def broken(device='cpu', dtype=torch.float32):\n    raise KeyError('no such weights')\n\n" \
          "def factory(device='cpu', dtype=torch.float32):\n" \
          "    return torch.nn.Sequential(torch.nn.Linear(4, 4), Boom()).to(device), (torch.randn(2, 4).to(device),)\n\n" \
          "def mismatch(device='cpu', dtype=torch.float32):\n" \
          "    return torch.nn.Linear(4, 4).to(device), (torch.randn(2, 5).to(device),)\n"


@pytest.mark.parametrize("factory, raised, where", [
    ("broken", "KeyError: 'no such weights'", "raising.py:8, in broken"),
    ("factory", "RuntimeError: forward exploded", "raising.py:5, in forward"),
    ("mismatch", "RuntimeError: mat1 and mat2 shapes cannot be multiplied", "linear.py:")])   # no line of theirs
def test_an_error_in_the_users_code_is_one_line_with_its_type_and_place(tmp_path, capsys, factory, raised, where):
    spec = tmp_path / "raising.py"
    spec.write_text(RAISING)
    for command in (["model", f"{spec}:{factory}"], ["trace", "record", f"{spec}:{factory}", "--out", str(tmp_path / "t")]):
        assert main(command + ["--device", "cpu"]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"your code raised {raised}" in err and where in err, err


def test_an_error_raised_inside_gpuparity_keeps_its_traceback():
    from gpuparity.commands._common import user_code_location
    with pytest.raises(ValueError) as raised:
        gpuparity.rms_norm(torch.zeros(2, 3), (4,))
    assert user_code_location(raised.value) is None


# ------------------------------------------------------------------ 4. SIGTERM and SIGINT

SLOW_CHECKS = '''"""Test only: every check of the battery takes 0.3 s longer (a slow run to interrupt)."""
import importlib.abc
import importlib.util
import sys
import time


class _SlowChecks(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "gpuparity.checks.execute":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            real = module.run_case

            def slow(*args, **kwargs):
                time.sleep(0.3)
                return real(*args, **kwargs)
            module.run_case = slow
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _SlowChecks())
'''


def _children(pid):
    kids = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                kids.update(int(p) for p in handle.read().split())
        except OSError:
            pass
    return kids


def _alive(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has ended
    except OSError:
        return False


def _interrupt(tmp_path, command, signum):
    """Run `command` in a real process, send `signum` once checks have finished (progress on
    stderr), and return (exit code, stderr, the worker pids seen before the signal)."""
    import signal
    import time
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_CHECKS)
    env = {**os.environ, "GPUPARITY_PROGRESS_S": "0.2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))}
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gpuparity", *command], stdout=subprocess.DEVNULL,
                                stderr=err, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if any(line.split(": ")[1][:1] not in ("0", "") for line in err_path.read_text().splitlines()
                   if line.startswith(("check: ", "doctor: ")) and ": " in line):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before it could be interrupted:\n" + err_path.read_text()
        workers = _children(proc.pid)
        assert workers, "no worker process to check"
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for _ in range(50):
        if not any(_alive(pid) for pid in workers):
            break
        time.sleep(0.1)
    return code, err_path.read_text(), [pid for pid in workers if _alive(pid)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the worker processes")
def test_check_killed_by_sigint_writes_its_json_and_leaves_no_worker(tmp_path):
    import signal
    out = tmp_path / "check.json"
    code, err, survivors = _interrupt(tmp_path, ["check", "--op", "softmax", "--backend", "torch", "--device", "cpu",
                                                 "--dtype", "float32", "--json", str(out)], signal.SIGINT)
    assert code == 130, err
    assert not survivors, f"worker processes outlived the run: {survivors}"
    data = json.loads(out.read_text())
    assert data["partial"] is True and data["interrupted"] == "SIGINT" and data["exit_code"] == 130
    assert data["results"] and data["tally"]["PASS"] >= 1
    assert "Traceback" not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the worker processes")
def test_doctor_killed_by_sigterm_writes_every_report_and_leaves_no_worker(tmp_path):
    import signal
    out, page = tmp_path / "doctor.json", tmp_path / "doctor.html"
    code, err, survivors = _interrupt(tmp_path, ["doctor", "--quick", "--ops", "softmax", "--backends", "torch",
                                                 "--no-probes", "--device", "cpu", "--json", str(out),
                                                 "--html", str(page)], signal.SIGTERM)
    assert code == 143, err
    assert not survivors, f"worker processes outlived the run: {survivors}"
    data = json.loads(out.read_text())
    assert data["partial"] is True and data["interrupted"] == "SIGTERM" and data["exit_code"] == 143
    assert data["battery"]["results"]
    assert "interrupted by SIGTERM" in page.read_text()
    assert "Traceback" not in err


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    """SIGKILL leaves the parent no chance to clean up: the child notices by itself."""
    import time
    script = ("import subprocess, sys, time\n"
              "from gpuparity.isolate import child_env, spawn\n"
              "child = spawn([sys.executable, '-c', 'from gpuparity.isolate import die_with_parent; "
              "die_with_parent(); print(1, flush=True); import time; time.sleep(120)'], env=child_env(), "
              "stdout=subprocess.PIPE, text=True)\n"
              "child.stdout.readline()\nprint(child.pid, flush=True)\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
    for _ in range(100):
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)
