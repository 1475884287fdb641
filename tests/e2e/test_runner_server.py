"""vLLM's OpenAI server started by ``vllm-ascend serve --device reference`` answers on 127.0.0.1.

The server's token budget (``--max-num-batched-tokens 128``) chunks any longer prompt's prefill.
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
from concurrent.futures import ThreadPoolExecutor

import pytest

STARTUP_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: dict | None = None, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="module")
def server(tiny_qwen3, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
    argv = [
        sys.executable, "-m", "vllm_ascend.core.cli", "serve", str(tiny_qwen3), "--device", "reference",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--block-size", "16",
        "--max-model-len", "256", "--kv-cache-memory-bytes", str(64 << 20), "--served-model-name", "tiny",
        "--max-num-batched-tokens", "128",
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
    yield base, log
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_completions_and_chat(server, qwen3_prompts, qwen3_hf):
    base, log = server
    status, body = _request(
        f"{base}/v1/completions",
        {"model": "tiny", "prompt": qwen3_prompts[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
         "return_token_ids": True},
    )  # fmt: skip
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["token_ids"] == qwen3_hf.token_ids[0]
    assert body["usage"]["completion_tokens"] == 12

    status, body = _request(
        f"{base}/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "the quick ascend kernel"}],
         "max_tokens": 8, "temperature": 0, "ignore_eos": True},
    )  # fmt: skip
    assert status == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 8
    assert "vllm_ascend.runner.worker" in log.read_text()  # our worker logged its KV cache size


def test_malformed_requests_get_4xx_and_server_survives(server):
    base, _ = server
    status, body = _request(f"{base}/v1/completions", raw=b"{not json")
    assert 400 <= status < 500, (status, body)
    status, body = _request(f"{base}/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": -3})
    assert 400 <= status < 500, (status, body)
    status, body = _request(f"{base}/v1/chat/completions", {"model": "tiny", "messages": "not a list"})
    assert 400 <= status < 500, (status, body)
    status, body = _request(f"{base}/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 2})
    assert status == 200, body


def test_seeded_requests_with_chunked_prompts_are_reproducible_and_server_survives(server, tiny_qwen3):
    """Issue 14, finding 1: a seeded request whose prompt is chunked killed the engine (CPU generators
    have no Philox offset for vLLM's rewind)."""
    import random

    from transformers import AutoTokenizer

    base, _ = server
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    vocab = sorted(set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids))
    rng = random.Random(0)
    prompts = [rng.sample(vocab, 240) for _ in range(4)]  # each prefilled in two chunks or more

    def complete(prompt_and_seed):
        prompt, seed = prompt_and_seed
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": seed,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        return _request(f"{base}/v1/completions", body)

    jobs = list(zip(prompts, (1, 2, 3, 4), strict=True))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        rounds = [list(pool.map(complete, jobs)) for _ in range(2)]
    for status, body in rounds[0] + rounds[1]:
        assert status == 200, body
    token_ids = [[body["choices"][0]["token_ids"] for _, body in answers] for answers in rounds]
    assert token_ids[0] == token_ids[1]
    assert all(len(ids) == 8 for ids in token_ids[0])
    assert len({tuple(ids) for ids in token_ids[0]}) == len(jobs)
    status, _ = _request(f"{base}/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 2})
    assert status == 200
