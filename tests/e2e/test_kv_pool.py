"""A shared KV pool (``AscendStoreConnector`` over Mooncake Store): real ``vllm-ascend serve`` instances and one
pool started with ``vllm-ascend kv-pool``, all on 127.0.0.1. Instance B serves a prompt A computed from the pool
(vLLM's external prefix-cache hits) with A's tokens; a P/D pair whose prefill composes the P/D connector and the
pool through vLLM's ``MultiConnector`` hands the prompt to decode and to the pool at once; 200 requests leave no
block held; with the pool killed mid-run every request is still served (computed locally), in bounded time.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .pd import Instance, completion, free_port, free_port_block, metric, running, start_proxy, start_serve

BLOCK = 16
MAX_TOKENS = 6


def _prompt(length: int, salt: int) -> list[int]:
    rng = random.Random(salt)
    return [rng.randrange(5, 500) for _ in range(length)]


def _start_pool(log: Path) -> tuple[subprocess.Popen, str]:
    """``vllm-ascend kv-pool`` as users start it; returns once it printed its address."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm_ascend.core.cli",
                "kv-pool",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--metrics-port",
                str(free_port()),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while f"kv-pool master at 127.0.0.1:{port}" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"kv-pool did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)
    return proc, f"127.0.0.1:{port}"


def _store(master: str, role: str = "kv_both") -> dict:
    return {
        "kv_connector": "AscendStoreConnector",
        "kv_role": role,
        "kv_connector_extra_config": {
            "master": master,
            "global_segment_size": 32 << 20,
            "local_buffer_size": 16 << 20,
            "op_timeout_s": 3,
        },
    }


def _pooled(model: Path, log: Path, master: str) -> Instance:
    return start_serve(model, log, kv_transfer={**_store(master), "kv_load_failure_policy": "recompute"})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3: Path):
    logs = tmp_path_factory.mktemp("kv-pool")
    pool, master = _start_pool(logs / "pool.log")
    try:
        a, b = _pooled(tiny_qwen3, logs / "a.log", master), _pooled(tiny_qwen3, logs / "b.log", master)
        prefill = start_serve(
            tiny_qwen3,
            logs / "prefill.log",
            kv_transfer={
                "kv_connector": "MultiConnector",
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {
                    "connectors": [
                        {
                            "kv_connector": "MooncakeConnectorV1",
                            "kv_role": "kv_producer",
                            "kv_port": free_port_block(4),
                        },
                        _store(master),
                    ]
                },
            },
        )
        decode = start_serve(
            tiny_qwen3,
            logs / "decode.log",
            kv_transfer={
                "kv_connector": "MooncakeConnectorV1",
                "kv_role": "kv_consumer",
                "kv_port": free_port_block(4),
            },
        )
        with running(a, b, prefill, decode):
            with running(start_proxy([prefill], [decode], logs / "proxy.log")) as (proxy,):
                yield {
                    "a": a,
                    "b": b,
                    "prefill": prefill,
                    "decode": decode,
                    "proxy": proxy,
                    "pool": pool,
                    "master": master,
                }
    finally:
        if pool.poll() is None:
            os.killpg(pool.pid, signal.SIGTERM)
            pool.wait(timeout=30)


def _hits(inst: Instance) -> float:
    return metric(inst.base, "vllm:external_prefix_cache_hits_total")


def _tokens(inst: Instance, prompt: list[int]) -> list[int]:
    body = completion(inst.base, prompt, MAX_TOKENS, return_token_ids=True)
    return body["choices"][0]["token_ids"]


def _wait_idle(inst: Instance, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    usage = metric(inst.base, "vllm:kv_cache_usage_perc")
    while usage > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        usage = metric(inst.base, "vllm:kv_cache_usage_perc")
    return usage


def test_b_serves_the_prefix_a_computed_from_the_pool(cluster):
    a, b = cluster["a"], cluster["b"]
    prompt = _prompt(12 * BLOCK + 5, salt=1)
    before_a, before_b = _hits(a), _hits(b)
    computed = _tokens(a, prompt)
    assert _hits(a) == before_a  # nothing in the pool yet: A computed the prompt
    assert _wait_idle(a) == 0  # A's puts are done once its blocks are free again
    served = _tokens(b, prompt)
    assert served == computed
    assert _hits(b) - before_b == 12 * BLOCK  # every full block of the prompt came from the pool
    assert len(set(computed)) > 1


def test_a_shared_prefix_with_a_new_tail_hits_only_the_prefix(cluster):
    a, b = cluster["a"], cluster["b"]
    shared = _prompt(8 * BLOCK, salt=2)
    _tokens(a, shared + _prompt(3 * BLOCK, salt=3))
    assert _wait_idle(a) == 0
    before = _hits(b)
    tail = _prompt(2 * BLOCK + 7, salt=4)
    served = _tokens(b, shared + tail)
    assert _hits(b) - before == 8 * BLOCK  # the tail's blocks are new to the pool
    # the same request again on A, computed there from its own prefix cache: the same tokens
    assert _tokens(a, shared + tail) == served


def test_prefill_composes_pd_and_the_pool_through_multi_connector(cluster):
    """The proxy's request: prefill computes the prompt once, decode pulls it (P/D), and the pool gets it too:
    pooled instance B then loads every full block."""
    a, b, proxy = cluster["a"], cluster["b"], cluster["proxy"]
    prompt = _prompt(9 * BLOCK + 3, salt=5)
    through_pd = _tokens(proxy, prompt)
    assert _wait_idle(cluster["prefill"]) == 0 and _wait_idle(cluster["decode"]) == 0
    before = _hits(b)
    assert _tokens(b, prompt) == through_pd
    assert _hits(b) - before == 9 * BLOCK
    assert _tokens(a, prompt) == through_pd


def test_no_leaked_blocks_after_200_requests(cluster):
    a, b = cluster["a"], cluster["b"]
    prefixes = [_prompt(6 * BLOCK, salt=100 + i) for i in range(10)]
    jobs = [(a if i % 2 else b, prefixes[i % 10] + _prompt(1 + i % 40, salt=1000 + i)) for i in range(200)]

    def one(job: tuple[Instance, list[int]]) -> int:
        inst, prompt = job
        return len(completion(inst.base, prompt, 2)["choices"][0]["text"]) >= 0

    with ThreadPoolExecutor(8) as workers:
        assert all(workers.map(one, jobs))
    assert _hits(a) + _hits(b) > 0
    for inst in (a, b):
        assert _wait_idle(inst) == 0, inst.base
        assert metric(inst.base, "vllm:num_requests_running") == 0


def test_pool_killed_mid_run_still_serves_every_request(cluster):
    """Last in the module: the pool stops for good."""
    a, b = cluster["a"], cluster["b"]
    prompts = [_prompt(10 * BLOCK + i, salt=300 + i) for i in range(6)]
    expected = [_tokens(a, p) for p in prompts]
    assert _wait_idle(a) == 0
    pool = cluster["pool"]
    os.killpg(pool.pid, signal.SIGKILL)  # the command and its mooncake_master
    pool.wait(timeout=30)
    host, port = cluster["master"].split(":")
    deadline = time.monotonic() + 15  # the master dies just after its command (same process group)
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            break
        time.sleep(0.2)
    with pytest.raises(OSError):  # nothing answers at the master's address any more
        socket.create_connection((host, int(port)), timeout=2).close()
    started = time.monotonic()
    with ThreadPoolExecutor(3) as workers:
        got = list(workers.map(lambda p: _tokens(b, p), prompts))
    assert got == expected
    assert time.monotonic() - started < 120  # bounded: pool calls time out, the prompts are computed here
    fresh = _prompt(9 * BLOCK, salt=999)
    assert _tokens(a, fresh) == _tokens(b, fresh)
    for inst in (a, b):
        assert _wait_idle(inst) == 0
