"""isolate.ForkServer: calls forked from one process that imported torch once give the Outcomes
call_isolated gives (ok / error / crash / timeout), leak no state from one call to the next, end
with stop_children(), and fall back to call_isolated, saying so, where fork cannot serve."""
import os
import signal
import statistics
import textwrap
import threading
import time

import pytest

from gpuparity import isolate

pytestmark = pytest.mark.skipif(not isolate.fork_available(), reason="needs os.fork (POSIX)")

TARGETS = textwrap.dedent("""
    import atexit, os, signal, subprocess, sys, time
    import torch

    MARK_DIR = os.environ.get("FORK_TEST_MARK_DIR", "")

    def _mark_exit():   # a child that ran the zygote's atexit handlers leaves a file named after it
        if MARK_DIR:
            open(os.path.join(MARK_DIR, f"atexit-{os.getpid()}"), "w").close()
    atexit.register(_mark_exit)

    def segfault():
        os.kill(os.getpid(), signal.SIGSEGV)

    def hang(pid_file):
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(pid_file, "w") as handle:
            handle.write(f"{os.getpid()} {helper.pid}")
        time.sleep(300)

    def fails():
        raise ValueError("a bug in the target")

    def noisy():
        print("junk on stdout\\nGPUPARITY-RESULT-ish but not the marker")
        sys.stderr.write("a warning on stderr\\n")
        return {"answer": 42}

    def exits(code):
        sys.exit(code)

    def pid(n=0):
        return {"pid": os.getpid(), "n": n}

    def change_state():
        os.environ["FORK_TEST_LEAK"] = "1"
        torch.set_default_dtype(torch.float64)
        torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
        torch.manual_seed(1234)
        return state()

    def state():
        return {"env": os.environ.get("FORK_TEST_LEAK"), "dtype": str(torch.get_default_dtype()),
                "cudnn_tf32": torch.backends.cudnn.allow_tf32, "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
                "first_random": float(torch.rand(1)), "cuda_initialized": torch.cuda.is_initialized()}

    def env(name):
        return os.environ.get(name)

    def guard():
        from gpuparity.isolate import gpu_runtime_started
        return gpu_runtime_started()
""")

FAKE_CUDA = textwrap.dedent("""
    import torch
    torch.cuda.is_initialized = lambda: True   # as if a preload module had initialised CUDA
""")


@pytest.fixture
def targets(tmp_path, monkeypatch):
    (tmp_path / "fork_targets.py").write_text(TARGETS)
    (tmp_path / "fork_fake_cuda.py").write_text(FAKE_CUDA)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("FORK_TEST_MARK_DIR", str(marks))
    return tmp_path


@pytest.fixture
def server(targets):
    with isolate.ForkServer(preload=["fork_targets"]) as running:
        yield running


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return True


def gone(pids, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def wait_for(path, within: float = 60.0) -> str:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_a_segfault_is_a_crash_with_the_signal_named(server):
    outcome = server.call("fork_targets:segfault", {}, timeout=60)
    assert (outcome.status, outcome.runner, outcome.returncode) == ("crash", "fork", -signal.SIGSEGV)
    assert outcome.error == "the process killed by SIGSEGV before answering"
    assert "Segmentation fault" in outcome.stderr_tail   # faulthandler's banner, as in a spawned child


def test_a_hang_is_a_timeout_and_its_process_group_is_gone(server, tmp_path):
    pid_file = tmp_path / "hang.pid"
    outcome = server.call("fork_targets:hang", {"pid_file": str(pid_file)}, timeout=3)
    assert (outcome.status, outcome.runner) == ("timeout", "fork")
    assert outcome.error == "no answer within 3 s (hang?)"
    child, helper = map(int, pid_file.read_text().split())
    assert gone([child, helper])


def test_an_exception_is_an_error(server):
    outcome = server.call("fork_targets:fails", {}, timeout=60)
    assert (outcome.status, outcome.runner) == ("error", "fork")
    assert outcome.error == "ValueError: a bug in the target"


def test_junk_on_stdout_does_not_hide_the_value(server):
    outcome = server.call("fork_targets:noisy", {}, timeout=60)
    assert (outcome.status, outcome.value, outcome.runner) == ("ok", {"answer": 42}, "fork")
    assert outcome.stderr_tail.endswith("a warning on stderr")


def test_children_run_no_atexit_handlers_and_exit_codes_are_kept(server, targets):
    outcome = server.call("fork_targets:pid", {}, timeout=60)
    assert outcome.status == "ok" and outcome.value["pid"] != server.info["pid"]
    exited = server.call("fork_targets:exits", {"code": 3}, timeout=60)
    assert (exited.status, exited.returncode) == ("crash", 3)
    assert exited.error == "the process exited with status 3 before answering"
    assert os.listdir(targets / "marks") == []


def test_state_set_by_one_call_does_not_leak_into_the_next(server):
    fresh = server.call("fork_targets:state", {}, timeout=60).value
    changed = server.call("fork_targets:change_state", {}, timeout=60).value
    assert changed["env"] == "1" and changed["dtype"] == "torch.float64"
    assert (changed["cudnn_tf32"], changed["matmul_tf32"]) != (fresh["cudnn_tf32"], fresh["matmul_tf32"])
    after = server.call("fork_targets:state", {}, timeout=60).value
    assert after == fresh
    assert after["env"] is None and after["dtype"] == "torch.float32" and after["cuda_initialized"] is False


def test_the_callers_environment_reaches_the_child_and_import_time_variables_spawn(server):
    plain = server.call("fork_targets:env", {"name": "GPUPARITY_FORK_TEST"}, timeout=60, env={"GPUPARITY_FORK_TEST": "7"})
    assert (plain.value, plain.runner) == ("7", "fork")
    read_at_import = server.call("fork_targets:env", {"name": "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"}, timeout=60,
                                 env={"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"})
    assert read_at_import.value == "1"
    assert read_at_import.runner == ("spawn (fork server unavailable: the call changes "
                                     "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE, read at import)")


def test_the_zygote_has_not_started_cuda(server):
    outcome = server.call("fork_targets:guard", {}, timeout=60)
    assert (outcome.status, outcome.value) == ("ok", "")


def test_a_zygote_with_cuda_initialised_refuses_to_fork_and_calls_spawn(targets):
    with isolate.ForkServer(preload=["fork_targets", "fork_fake_cuda"]) as server:
        outcome = server.call("fork_targets:pid", {"n": 1}, timeout=60)
        assert (outcome.status, outcome.value["n"]) == ("ok", 1)
        assert outcome.runner == "spawn (fork server unavailable: torch.cuda is initialised in the fork server)"
        assert server.call("fork_targets:pid", {}, timeout=60).runner.startswith("spawn (")


def test_concurrent_calls_from_four_threads(server):
    results = {}

    def worker(index):
        results[index] = [server.call("fork_targets:pid", {"n": index * 10 + k}, timeout=60) for k in range(3)]
    threads = [threading.Thread(target=worker, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(results) == [0, 1, 2, 3]
    for index, outcomes in results.items():
        assert [(o.status, o.runner, o.value["n"]) for o in outcomes] == [("ok", "fork", index * 10 + k)
                                                                         for k in range(3)]
    assert len({o.value["pid"] for outcomes in results.values() for o in outcomes}) == 12


def test_stop_children_ends_the_zygote_and_its_children(server, tmp_path):
    pid_file = tmp_path / "hang.pid"
    answer = {}
    thread = threading.Thread(target=lambda: answer.setdefault(
        "outcome", server.call("fork_targets:hang", {"pid_file": str(pid_file)}, timeout=120)))
    thread.start()
    child, helper = map(int, wait_for(pid_file).split())
    zygote = server.info["pid"]
    time.sleep(0.3)   # the zygote's "started" word reaches the client
    try:
        isolate.stop_children()
        assert gone([zygote, child, helper])
        thread.join(30)
        assert answer["outcome"].status == "error" and "interrupted" in answer["outcome"].error
    finally:
        isolate.allow_children()


def test_without_fork_calls_spawn_and_say_so(targets, monkeypatch):
    monkeypatch.setattr(isolate, "fork_available", lambda: False)
    with isolate.ForkServer(preload=["fork_targets"]) as server:
        outcome = server.call("fork_targets:noisy", {}, timeout=60)
    assert (outcome.status, outcome.value) == ("ok", {"answer": 42})
    assert outcome.runner == "spawn (fork server unavailable: os.fork is not available on this system)"


def test_a_dead_zygote_is_noticed_and_calls_spawn(server):
    assert server.call("fork_targets:pid", {}, timeout=60).runner == "fork"
    os.kill(server.info["pid"], signal.SIGKILL)
    assert gone([server.info["pid"]])
    outcome = server.call("fork_targets:segfault", {}, timeout=60)
    assert outcome.status == "crash" and "SIGSEGV" in outcome.error
    assert outcome.runner == "spawn (fork server unavailable: the zygote killed by SIGKILL)"


def test_a_preload_that_fails_to_import_falls_back(targets):
    with isolate.ForkServer(preload=["no_such_module_for_fork_tests"]) as server:
        outcome = server.call("fork_targets:pid", {"n": 2}, timeout=60)
    assert (outcome.status, outcome.value["n"]) == ("ok", 2)
    assert outcome.runner.startswith("spawn (fork server unavailable: preloading failed: ModuleNotFoundError")


def test_overhead_of_a_trivial_call(server):
    """Fork is what makes the server worth having: a trivial call costs far less than a spawn."""
    def median(call):
        times = []
        for _ in range(5):
            start = time.monotonic()
            assert call("fork_targets:pid", {}, timeout=60).status == "ok"
            times.append(time.monotonic() - start)
        return statistics.median(times)
    server.call("fork_targets:pid", {}, timeout=60)
    forked, spawned = median(server.call), median(isolate.call_isolated)
    assert forked < spawned / 5, (forked, spawned)


class _FakeDriver:
    """A CUDA driver library as ctypes would open it: cuDeviceGetCount answers `rc`."""
    def __init__(self, rc):
        self.rc, self.opened = rc, []

    def open(self, path, mode=0):
        self.opened.append((path, mode))
        driver = self

        class Lib:
            def cuDeviceGetCount(self, _count):
                return driver.rc
        return Lib()


@pytest.mark.parametrize("rc, refused", [(3, False), (0, True)])
def test_a_loaded_driver_refuses_the_fork_only_once_initialised(monkeypatch, rc, refused):
    """torch 2.11's CUDA build maps libcuda.so at import (the H100 test machine): that alone sent
    every probe back to spawn. The driver is asked instead: CUDA_ERROR_NOT_INITIALIZED (3) is safe to
    fork, success means cuInit ran."""
    import ctypes
    from gpuparity import isolate
    fake = _FakeDriver(rc)
    monkeypatch.setattr(isolate, "_loaded_libcuda", lambda: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04")
    monkeypatch.setattr(ctypes, "CDLL", fake.open)
    reason = isolate.gpu_runtime_started()
    assert bool(reason) is refused, reason
    assert fake.opened and fake.opened[0][0].endswith("libcuda.so.580.159.04")
    if hasattr(os, "RTLD_NOLOAD"):
        assert fake.opened[0][1] & os.RTLD_NOLOAD     # never loads a driver that is not there


def test_no_driver_loaded_is_safe_and_an_unaskable_one_is_not(monkeypatch):
    import ctypes
    from gpuparity import isolate
    monkeypatch.setattr(isolate, "_loaded_libcuda", lambda: None)
    assert isolate.gpu_runtime_started() == ""

    def refuse(*_args, **_kwargs):
        raise OSError("cannot open")
    monkeypatch.setattr(isolate, "_loaded_libcuda", lambda: "/opt/libcuda.so.1")
    monkeypatch.setattr(ctypes, "CDLL", refuse)
    assert "could not be asked" in isolate.gpu_runtime_started()
