"""Small CLI behaviours: a closed pipe is not a failure, template slurm asks for its command,
counts read as English."""
from __future__ import annotations

import subprocess
import sys

from gpuparity import cli
from gpuparity.checks.battery import verdicts_from_results
from gpuparity.checks.results import CheckResult, Status


def test_a_closed_pipe_exits_0():
    # head closes the pipe after one line; with pipefail the shell reports gpuparity's own code
    proc = subprocess.run(["bash", "-c", "set -o pipefail; " + sys.executable +
                           " -m gpuparity known-issues --no-probes | head -1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_template_slurm_without_command_names_it(capsys):
    assert cli.main(["template", "slurm", "--nodes", "1", "--gpus-per-node", "1", "--vendor", "amd"]) == 2
    err = capsys.readouterr().err
    usage = err.split("gpuparity template slurm: error:")[0]
    assert usage.startswith("usage:") and "-- COMMAND" in usage
    assert "the job's command is required after --" in err


def test_one_check_is_singular():
    result = CheckResult("rms_norm", "torch", "rows_17", "float32", "cpu", Status.PASS)
    reasons = [v["reason"] for v in verdicts_from_results([result]).values()]
    assert reasons == ["passed 1 check"]
