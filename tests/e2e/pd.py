"""Prefill/decode instances for the disaggregation e2e tests: real ``vllm-ascend serve`` processes and the
real ``vllm-ascend pd-proxy``, on 127.0.0.1, started and stopped by the tests.
"""

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
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .serving import FORKED_ENGINE_CORE

STARTUP_TIMEOUT_S = 300

#: instances started and not yet stopped: a failing test's report shows their logs' tails (conftest)
LIVE: list[Instance] = []


#: ports handed out by this process: an instance binds its ports only once it started, so a later pick
#: must not land on an earlier one's (a decode's handshake block overlapping its prefill's)
_HANDED: set[int] = set()


def free_port() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED:
            _HANDED.add(port)
            return port
    raise RuntimeError("no free port outside those already handed out")


def free_port_block(count: int) -> int:
    """A base port with ``count`` free ports after it (handshake sockets take ``kv_port + rank``)."""
    for _ in range(50):
        base = free_port()
        if base + count >= 65535 or _HANDED.intersection(range(base + 1, base + count)):
            continue
        try:
            with ExitStack() as stack:
                for p in range(base, base + count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
            _HANDED.update(range(base, base + count))
            return base
        except OSError:
            continue
    raise RuntimeError("no block of free ports")


def post(url: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return err.code, {"raw": raw.decode(errors="replace")}


def get_text(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def metric(base: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples on an instance's ``/metrics`` (those with ``labels``, if given)."""
    total, found = 0.0, False
    for line in get_text(f"{base}/metrics").splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            if any(f'{key}="{value}"' not in line for key, value in labels.items()):
                continue
            total += float(line.rsplit(" ", 1)[1])
            found = True
    if not found:
        raise KeyError(f"{name} not in {base}/metrics")
    return total


@dataclass
class Instance:
    """A started server: its base URL, process and log."""

    base: str
    proc: subprocess.Popen
    log: Path
    kv_port: int = 0
    argv: list[str] = field(default_factory=list)

    def log_tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self in LIVE:
            LIVE.remove(self)
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _env(extra_env: dict[str, str] | None, forked: bool = True) -> dict[str, str]:
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "VLLM_ASCEND_DEVICE": "reference",
        "TOKENIZERS_PARALLELISM": "false",
        **(FORKED_ENGINE_CORE if forked else {}),
    }
    env.update(extra_env or {})
    return env


def start_serve(
    model: Path,
    log: Path,
    *,
    kv_transfer: dict[str, Any] | None = None,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Instance:
    """``vllm-ascend serve`` of ``model`` on a free port (not waited for: see :func:`wait_healthy`).

    An instance with a KV connector keeps vLLM's spawned engine core and workers, as users run it: Mooncake's
    engine then starts in a fresh interpreter, not in a fork of one that already runs threads."""
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm_ascend.core.cli", "serve", str(model), "--device", "reference",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--block-size", "16",
        "--max-model-len", "256", "--kv-cache-memory-bytes", str(64 << 20), "--served-model-name", "tiny",
        "--max-num-batched-tokens", "64", "--enable-prompt-tokens-details", *args,
    ]  # fmt: skip
    if kv_transfer is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            env=_env(env, forked=kv_transfer is None),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    inst = Instance(f"http://127.0.0.1:{port}", proc, log, int((kv_transfer or {}).get("kv_port", 0)), argv)
    LIVE.append(inst)
    return inst


def start_proxy(prefill: Sequence[Instance], decode: Sequence[Instance], log: Path, *extra: str) -> Instance:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm_ascend.core.cli",
        "pd-proxy",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    for p in prefill:
        argv += ["--prefill", p.base]
    for d in decode:
        argv += ["--decode", d.base]
    argv += list(extra)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=_env(None), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    inst = Instance(f"http://127.0.0.1:{port}", proc, log, 0, argv)
    LIVE.append(inst)
    return inst


def wait_healthy(*instances: Instance, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    for inst in instances:
        while True:
            if inst.proc.poll() is not None:
                raise RuntimeError(f"{inst.argv[:6]} exited with {inst.proc.returncode}:\n{inst.log_tail()}")
            try:
                with urllib.request.urlopen(f"{inst.base}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                inst.stop(signal.SIGKILL)
                raise RuntimeError(f"{inst.base} not healthy in {timeout:g}s:\n{inst.log_tail()}")
            time.sleep(0.5)


@contextmanager
def running(*instances: Instance) -> Iterator[tuple[Instance, ...]]:
    """Wait for ``instances`` to be healthy; stop them all on exit."""
    try:
        wait_healthy(*instances)
        yield instances
    finally:
        for inst in instances:
            inst.stop()


def completion(base: str, prompt: list[int], max_tokens: int, **sampling: Any) -> dict[str, Any]:
    status, body = post(
        f"{base}/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, **sampling},
    )
    assert status == 200, body
    return body


def remote_prefill(prefill: Instance, prompt: list[int], **sampling: Any) -> dict[str, Any]:
    """What the proxy does first: prefill only, asking for remote decode; returns the transfer params."""
    body = completion(prefill.base, prompt, 1, kv_transfer_params={"do_remote_decode": True}, **sampling)
    params = body.get("kv_transfer_params")
    assert params and params.get("do_remote_prefill"), body
    return params
