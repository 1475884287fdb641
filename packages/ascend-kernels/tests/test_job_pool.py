"""The compile workers' pool: started from any caller (workers are ``python -m`` processes that never
import the caller's ``__main__``), a job's error is its payload's outcome, a dead worker loses only
the payload it ran."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_ascend.kernels import _job_pool

NO_GUARD = r"""
import json
from vllm_ascend.kernels import _job_pool

outcomes = _job_pool.run_jobs("os.path:basename", ["/a/b", "/c/d", "/e/f"], 2)
print(json.dumps([o.value for o in outcomes]))
"""


def test_the_pool_starts_from_a_script_without_a_main_guard(tmp_path):
    """A script calling the pool at top level runs once: the workers never import it."""
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == ['["b", "d", "f"]']
    assert proc.stderr == ""


def test_job_errors_and_dead_workers_are_outcomes():
    """A job's exception is its payload's one-line error; a worker killed by a signal loses only the
    payload it ran (with its exit status and fault-handler stack); a wrong job name is refused at once."""
    errors = _job_pool.run_jobs("json:loads", ["1", "[2, 3]", "x"], 2)
    assert [o.value for o in errors[:2]] == [1, [2, 3]] and all(o.ok for o in errors[:2])
    assert errors[2].error.startswith("JSONDecodeError: Expecting value") and "Traceback" in errors[2].detail
    dead = _job_pool.run_jobs("signal:raise_signal", [6], 1)[0]
    assert (dead.lost, dead.exit, dead.ok) == (True, -6, False)
    assert "Fatal Python error: Aborted" in dead.detail
    with pytest.raises(_job_pool.JobPoolError, match=r"job='os.path:nope': 'nope' is not a function"):
        _job_pool.run_jobs("os.path:nope", ["x"], 1)
    with pytest.raises(_job_pool.JobPoolError, match=r"workers=0 must be a positive int"):
        _job_pool.run_jobs("os.path:basename", ["x"], 0)
