"""At exit the background threads of checks/selection (the refinement, `prepare`'s) are stopped
and joined before the interpreter finalizes: a daemon thread stopped inside torch's C++ aborts
the process ("terminate called without an active exception", exit -6, seen on an H100 when a
first-steps run ended with the background timing queued)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import threading, time, torch
    from gpuparity.checks import selection

    def busy():   # torch work until the exit's stop, as the background's checks do between cases
        while not selection._STOP.is_set():
            torch.ones(256).sum()
            time.sleep(0.001)

    threads = [selection._start_thread(busy, "gpuparity-busy"),
               selection._start_thread(selection._refine_loop, "gpuparity-refine")]   # waiting for work
    time.sleep(0.2)
    assert all(t.is_alive() for t in threads)
    started = time.monotonic()
    selection.shutdown()
    print("alive after shutdown:", [t.name for t in threads if t.is_alive()],
          "joined in %.1f s" % (time.monotonic() - started))
""")


def test_shutdown_stops_and_joins_the_background_threads():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("alive after shutdown: []"), line
    assert float(line.split("joined in ")[1].split()[0]) < selection_join_s(), line


def selection_join_s() -> float:
    from gpuparity.checks import selection
    return selection.EXIT_JOIN_S


FORK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from gpuparity.checks import selection
    pool = selection._pool("verify")   # a kept worker: the exit's shutdown() ends those
    assert pool.wait_ready(120)
    pid = os.fork()
    if pid == 0:       # a user's fork that exits through atexit (gpuparity's exit handlers run)
        sys.exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.5)
    print("worker alive after the fork's exit:", pool.proc.poll() is None)
    pool.close()
""")


def test_a_forked_child_exiting_leaves_the_parents_workers_alone():
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "worker alive after the fork's exit: True", proc.stdout
