"""Test support shared by every package's tests and the cross-package tests: a script in a fresh interpreter.

vLLM picks its platform and loads plugins once per process, so tests that must see that start (or that
start an engine) run a script in a new interpreter. The script reports by printing ``RESULT <json>``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["OUTPUT_TAIL_CHARS", "RESULT_PREFIX", "free_loopback_port", "run_vllm_script"]

RESULT_PREFIX = "RESULT "
#: How much of the end of a failed script's output an assertion message carries.
OUTPUT_TAIL_CHARS = 6000


def run_vllm_script(
    script: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 300
) -> tuple[Any, str]:
    """Run ``python -c script *args`` (``env``: the whole environment, default this process's).

    Returns the JSON of the last ``RESULT <json>`` line on stdout (``None`` when there is none, so report
    an object or a list, not a bare ``null``) and everything printed (stdout, then stderr). A non-zero exit
    fails with the tail of that output.
    """
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"exit code {proc.returncode}:\n{output[-OUTPUT_TAIL_CHARS:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    result = json.loads(lines[-1][len(RESULT_PREFIX) :]) if lines else None
    return result, output


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a test's ``torch.distributed`` rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
