"""A real ``vllm-ascend serve`` process on 127.0.0.1 for the server tests: start, wait healthy, stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 240

#: The test servers' engine core is forked from the API server instead of spawned (``vllm serve`` picks spawn
#: unless ``VLLM_WORKER_MULTIPROC_METHOD`` is set): one interpreter start and vLLM import (about 20 s of CPU)
#: less per server, tensor-parallel workers included. ``test_runner_server`` keeps the spawned default that
#: users get.
FORKED_ENGINE_CORE = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_json(url: str, body: dict | None = None, raw: bytes | None = None) -> tuple[int, dict]:
    """POST ``body`` (or ``raw``) as JSON, GET without either; return (status, decoded JSON)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@contextmanager
def served(
    model_dir: Path, serve_args: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run ``vllm-ascend serve model_dir --device reference --host 127.0.0.1 --port <free> *serve_args`` in its
    own process group (``env`` over this process's and :data:`FORKED_ENGINE_CORE`); yield its base URL once
    ``/health`` answers 200 (failing the test with the log's tail if it exits or takes longer than
    :data:`STARTUP_TIMEOUT_S`); SIGTERM the group afterwards."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        **FORKED_ENGINE_CORE,
        **(env or {}),
    }
    argv = [
        sys.executable, "-m", "vllm_ascend.core.cli", "serve", str(model_dir), "--device", "reference",
        "--host", "127.0.0.1", "--port", str(port), *serve_args,
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"server did not become healthy in {STARTUP_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")
        time.sleep(1)
    try:
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
