"""Prefill/decode disaggregation over Mooncake, end to end: two ``vllm-ascend serve`` instances on the reference
device (prefill: ``MooncakeConnectorV1`` as ``kv_producer``; decode: ``kv_consumer``) behind
``vllm-ascend pd-proxy``, all on 127.0.0.1.

The oracle is one plain instance: the prefill server itself answering the same request without
``kv_transfer_params``. Checked: greedy and seeded outputs through the proxy equal it for prompts of 1,
block-1, block, block+1 and several blocks (longer than ``--max-num-batched-tokens``, so prefill is chunked);
decode reports the prompt as computed elsewhere; a corrupted transferred block changes the tokens (the
comparison can fail); faults — a failed read (recompute gives the same tokens; the ``fail`` policy fails
only that request), decode never pulling (prefill frees after its timeout), prefill killed before decode
pulled — leave both instances serving; after 200 requests no KV block is held.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .pd import (
    completion,
    free_port_block,
    metric,
    post,
    remote_prefill,
    running,
    start_proxy,
    start_serve,
)

BLOCK = 16
#: 1, block-1, block, block+1 and several blocks (> --max-num-batched-tokens 64: chunked prefill)
LENGTHS = (1, BLOCK - 1, BLOCK, BLOCK + 1, 5 * BLOCK + 3)
MAX_TOKENS = 8
ABORT_TIMEOUT_S = 8
FAULTS = Path(__file__).parent / "pd_faults"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"


def _prompt(length: int, salt: int) -> list[int]:
    return [(7 * i + 13 * salt) % 500 + 3 for i in range(length)]


def _connector(role: str, kv_port: int, **extra) -> dict:
    config = {"kv_connector": "MooncakeConnectorV1", "kv_role": role, "kv_port": kv_port}
    if extra:
        config["kv_connector_extra_config"] = extra
    return config


@pytest.fixture(scope="module")
def cluster(tiny_qwen3, tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd")
    faults = tmp_path_factory.mktemp("pd-faults")
    fault_env = {"PYTHONPATH": str(FAULTS), "PD_FAULTS_DIR": str(faults)}
    prefill = start_serve(
        tiny_qwen3,
        logs / "prefill.log",
        kv_transfer=_connector("kv_producer", free_port_block(4), abort_request_timeout=ABORT_TIMEOUT_S),
    )
    decode = start_serve(
        tiny_qwen3,
        logs / "decode.log",
        kv_transfer={
            **_connector("kv_consumer", free_port_block(4), transfer_timeout=5),
            "kv_load_failure_policy": "recompute",
        },
        env=fault_env,
    )
    strict = start_serve(
        tiny_qwen3,
        logs / "decode-fail.log",
        kv_transfer={
            **_connector("kv_consumer", free_port_block(4), transfer_timeout=5),
            "kv_load_failure_policy": "fail",
        },
        env=fault_env,
    )
    with running(prefill, decode, strict):
        proxy = start_proxy([prefill], [decode], logs / "proxy.log")
        with running(proxy):
            yield {"prefill": prefill, "decode": decode, "strict": strict, "proxy": proxy, "faults": faults}


def _via_proxy(cluster, prompt: list[int], **sampling) -> dict:
    return completion(cluster["proxy"].base, prompt, MAX_TOKENS, **sampling)


def _plain(cluster, prompt: list[int], **sampling) -> dict:
    return completion(cluster["prefill"].base, prompt, MAX_TOKENS, **sampling)


def _tokens(body: dict) -> str:
    return body["choices"][0]["text"]


@pytest.mark.parametrize("length", LENGTHS)
def test_greedy_and_seeded_through_the_proxy_equal_one_instance(cluster, length):
    prompt = _prompt(length, salt=length)
    for sampling in ({}, {"temperature": 0.8, "seed": 1234}):
        disaggregated = _via_proxy(cluster, prompt, **sampling)
        plain = _plain(cluster, prompt, **sampling)
        assert _tokens(disaggregated) == _tokens(plain), (length, sampling)
        assert disaggregated["usage"]["completion_tokens"] == MAX_TOKENS


def test_outputs_differ_between_prompts(cluster):
    """Diversity guard: the tiny model's outputs depend on the prompt, so equal outputs above mean something."""
    texts = {_tokens(_plain(cluster, _prompt(5 * BLOCK + 3, salt=s))) for s in range(4)}
    assert len(texts) >= 3, texts


def test_decode_reports_the_prompt_as_computed_elsewhere(cluster):
    decode = cluster["decode"]
    prompt = _prompt(3 * BLOCK + 5, salt=101)
    params = remote_prefill(cluster["prefill"], prompt)
    assert params["remote_tp_size"] == 1 and len(params["remote_block_ids"]) == 4
    before = metric(decode.base, EXTERNAL_HITS)
    body = completion(decode.base, prompt, MAX_TOKENS, kv_transfer_params=params)
    assert metric(decode.base, EXTERNAL_HITS) - before == len(prompt)
    # vLLM passes prefill's own prefix-cache hits on as the request's cached tokens (none: a fresh prompt)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert _tokens(body) == _tokens(_plain(cluster, prompt))


def test_a_corrupted_block_changes_the_tokens(cluster):
    prompt = _prompt(4 * BLOCK, salt=202)
    plain = _tokens(_plain(cluster, prompt))
    (cluster["faults"] / "corrupt").touch()
    params = remote_prefill(cluster["prefill"], prompt)
    corrupted = completion(cluster["decode"].base, prompt, MAX_TOKENS, kv_transfer_params=params)
    assert not (cluster["faults"] / "corrupt").exists(), "the transfer did not run"
    assert _tokens(corrupted) != plain


def test_a_failed_read_is_recomputed_to_the_same_tokens(cluster):
    prompt = _prompt(4 * BLOCK + 2, salt=303)
    (cluster["faults"] / "fail").touch()
    params = remote_prefill(cluster["prefill"], prompt)
    body = completion(cluster["decode"].base, prompt, MAX_TOKENS, kv_transfer_params=params)
    assert not (cluster["faults"] / "fail").exists(), "the transfer did not run"
    assert _tokens(body) == _tokens(_plain(cluster, prompt))
    assert "injected failure of a read" in cluster["decode"].log_tail(200_000)


def test_the_fail_policy_fails_only_that_request(cluster):
    strict = cluster["strict"]
    prompt, other = _prompt(3 * BLOCK, salt=404), _prompt(2 * BLOCK + 1, salt=405)
    (cluster["faults"] / "fail").touch()
    params = remote_prefill(cluster["prefill"], prompt)
    with ThreadPoolExecutor(2) as pool:
        failed = pool.submit(
            post,
            f"{strict.base}/v1/completions",
            {
                "model": "tiny",
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "kv_transfer_params": params,
            },
        )
        served = pool.submit(completion, strict.base, other, MAX_TOKENS)
        status, body = failed.result()
        assert _tokens(served.result()) == _tokens(_plain(cluster, other))
    assert not (cluster["faults"] / "fail").exists()
    failed_choice = (body.get("choices") or [{}])[0]
    assert status >= 500 or failed_choice.get("finish_reason") == "error", (status, body)
    # the instance keeps serving transfers
    params = remote_prefill(cluster["prefill"], other)
    again = completion(strict.base, other, MAX_TOKENS, kv_transfer_params=params)
    assert _tokens(again) == _tokens(_plain(cluster, other))


def _kv_usage(base: str) -> float:
    return metric(base, "vllm:kv_cache_usage_perc")


def _wait_for_no_blocks(base: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    usage = _kv_usage(base)
    while usage > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        usage = _kv_usage(base)
    return usage


def test_prefill_frees_blocks_decode_never_pulls(cluster):
    prefill = cluster["prefill"]
    assert _wait_for_no_blocks(prefill.base, 30) == 0
    remote_prefill(prefill, _prompt(6 * BLOCK, salt=505))
    assert _kv_usage(prefill.base) > 0  # held for decode
    started = time.monotonic()
    assert _wait_for_no_blocks(prefill.base, ABORT_TIMEOUT_S + 20) == 0
    assert time.monotonic() - started >= ABORT_TIMEOUT_S - 2
    assert "did not read its KV blocks" in prefill.log_tail(200_000)


def test_no_block_leak_after_200_requests(cluster):
    prompts = [_prompt(1 + (i * 7) % (4 * BLOCK), salt=1000 + i) for i in range(200)]

    def one(prompt: list[int]) -> int:
        status, body = post(
            f"{cluster['proxy'].base}/v1/completions",
            {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0.0},
        )
        assert status == 200, body
        return body["usage"]["completion_tokens"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, prompts)) == [2] * 200
    for name in ("prefill", "decode"):
        assert _wait_for_no_blocks(cluster[name].base, 30) == 0, name
        assert metric(cluster[name].base, "vllm:num_requests_running") == 0


def test_prefill_killed_before_decode_pulls_is_recomputed(cluster):
    """Last in the module: prefill stops for good."""
    prefill, decode = cluster["prefill"], cluster["decode"]
    prompt = _prompt(5 * BLOCK, salt=606)
    plain = _tokens(_plain(cluster, prompt))
    params = remote_prefill(prefill, prompt)
    prefill.stop()
    body = completion(decode.base, prompt, MAX_TOKENS, kv_transfer_params=params)
    assert _tokens(body) == plain
    status, health = post(
        f"{cluster['proxy'].base}/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    )
    assert status == 503, health
    assert "unavailable" in json.dumps(health).lower() or prefill.base in json.dumps(health)
    assert _tokens(completion(decode.base, prompt, MAX_TOKENS)) == plain  # decode keeps serving
