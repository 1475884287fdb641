"""vLLM's OpenAI server started by ``vllm-ascend serve --device reference`` answers on 127.0.0.1.

The server's token budget (``--max-num-batched-tokens 128``) chunks any longer prompt's prefill.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from .serving import request_json as _request
from .serving import served


@pytest.fixture(scope="module")
def server(tiny_qwen3, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = [
        "--dtype", "float32", "--block-size", "16", "--max-model-len", "256",
        "--kv-cache-memory-bytes", str(64 << 20), "--served-model-name", "tiny", "--max-num-batched-tokens", "128",
        "--enable-sleep-mode", "--additional-config", json.dumps({"rl_config": {"enabled": True}}),
    ]  # fmt: skip
    # the engine core spawned, as ``vllm serve`` starts it for users (the other server tests fork it)
    with served(tiny_qwen3, args, log, env={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}) as base:
        yield base, log


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


def test_rl_routes_sleep_and_wake_the_engine_then_it_serves_the_same_tokens(server, qwen3_prompts, qwen3_hf):
    """``rl_config.enabled`` serves vLLM's RL routes (no ``VLLM_SERVER_DEV_MODE`` in the environment): a rollout
    engine is put to sleep and woken over HTTP, weights first, then the KV cache."""
    base, log = server
    assert "VLLM_SERVER_DEV_MODE" not in os.environ
    assert _request(f"{base}/sleep?level=1", {}) == (200, {"status": "sleeping", "level": 1})
    assert _request(f"{base}/is_sleeping") == (200, {"is_sleeping": True})
    assert _request(f"{base}/wake_up?tags=weights", {}) == (200, {"status": "sleeping", "tags": ["weights"]})
    assert _request(f"{base}/wake_up?tags=kv_cache", {}) == (200, {"status": "awake", "tags": ["kv_cache"]})
    assert _request(f"{base}/is_sleeping") == (200, {"is_sleeping": False})
    status, body = _request(
        f"{base}/v1/completions",
        {"model": "tiny", "prompt": qwen3_prompts[1], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
         "return_token_ids": True},
    )  # fmt: skip
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == qwen3_hf.token_ids[1]
    assert "Sleep level 1 released" in log.read_text()  # the runner's sleep-mode backend on the pool


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
