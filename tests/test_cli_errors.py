"""``vllm-ascend`` commands answer a user's mistake with one line naming the command and the option or file
(status 2), never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "off"}
    return subprocess.run(
        [sys.executable, "-m", "vllm_ascend.core.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("demo", "--max-tokens", "0"),
            "vllm-ascend demo: --max-tokens=0 is invalid; allowed: a positive integer",
        ),
        (
            ("warmup", "--cache-dir", "/proc/no-such-dir/cache", "--vocab-size", "8", "--device", "cpu"),
            "vllm-ascend warmup: [Errno 2] No such file or directory: '/proc/no-such-dir'",
        ),
        (
            ("serve", "/no/such/model", "--device", "reference"),
            "vllm-ascend serve: model '/no/such/model' does not exist; give a model directory or a Hugging Face "
            "model id",
        ),
    ],
    ids=["demo-max-tokens", "warmup-cache-dir", "serve-missing-model"],
)
def test_mistakes_are_one_line(args, line):
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == line


def test_serve_refuses_a_file_as_the_model(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    proc = cli("serve", str(weights))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"vllm-ascend serve: model {str(weights)!r} is not a directory; give a model directory or a Hugging Face "
        "model id"
    )
