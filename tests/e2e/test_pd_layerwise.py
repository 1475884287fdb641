"""Layer-wise prefill/decode disaggregation (``MooncakeLayerwiseConnector``): decode goes first and posts its
new block ids to the proxy's metaserver (``vllm-ascend pd-proxy --layerwise``); prefill then writes each
layer's blocks into decode's as soon as the layer ran, chunk by chunk, and tells decode when the prompt is
written. Oracle: the prefill instance answering the same request on its own. Prefill runs vLLM's Model Runner
V2 (the default), decode the V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``, what vLLM falls back to): the connector
serves both, and each side's layout comes from its own runner's caches.
"""

from __future__ import annotations

import pytest

from .pd import completion, free_port_block, metric, running, start_proxy, start_serve

BLOCK = 16
LENGTHS = (1, BLOCK, BLOCK + 1, 5 * BLOCK + 3)
MAX_TOKENS = 8


def _prompt(length: int, salt: int) -> list[int]:
    return [(11 * i + 17 * salt) % 500 + 3 for i in range(length)]


@pytest.fixture(scope="module")
def layerwise(tiny_qwen3, tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd-layerwise")

    def connector(role: str) -> dict:
        return {"kv_connector": "MooncakeLayerwiseConnector", "kv_role": role, "kv_port": free_port_block(4)}

    prefill = start_serve(tiny_qwen3, logs / "prefill.log", kv_transfer=connector("kv_producer"))
    decode = start_serve(
        tiny_qwen3,
        logs / "decode.log",
        kv_transfer=connector("kv_consumer"),
        env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
    )
    with running(prefill, decode):
        proxy = start_proxy([prefill], [decode], logs / "proxy.log", "--layerwise")
        with running(proxy):
            yield prefill, decode, proxy


def test_prefill_runs_v2_and_decode_v1(layerwise):
    prefill, decode, _ = layerwise
    assert "Using Model Runner V2" in prefill.log_tail(1_000_000)
    assert "Using Model Runner V2" not in decode.log_tail(1_000_000)


@pytest.mark.parametrize("length", LENGTHS)
def test_pushed_layers_give_the_plain_instance_tokens(layerwise, length):
    prefill, decode, proxy = layerwise
    prompt = _prompt(length, salt=length)
    before = metric(decode.base, "vllm:external_prefix_cache_hits_total")
    # first through the proxy (prefill has not seen the prompt: every block is computed and pushed), then
    # the oracle; a second proxy run pushes the blocks prefill now has cached
    first = completion(proxy.base, prompt, MAX_TOKENS)["choices"][0]["text"]
    plain = completion(prefill.base, prompt, MAX_TOKENS)["choices"][0]["text"]
    assert first == plain
    assert metric(decode.base, "vllm:external_prefix_cache_hits_total") - before == length
    # seeded draws come from the sampler of decode's runner (V1 here): its own plain run is the oracle
    seeded = {"temperature": 0.8, "seed": 77}
    assert (
        completion(proxy.base, prompt, MAX_TOKENS, **seeded)["choices"][0]["text"]
        == completion(decode.base, prompt, MAX_TOKENS, **seeded)["choices"][0]["text"]
    )


def test_streaming_through_the_layerwise_proxy(layerwise):
    import json
    import urllib.request

    prefill, _, proxy = layerwise
    prompt = _prompt(3 * BLOCK + 2, salt=9)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stream": True}
    req = urllib.request.Request(
        f"{proxy.base}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    pieces = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    assert len(pieces) >= 2
    assert "".join(pieces) == completion(prefill.base, prompt, MAX_TOKENS)["choices"][0]["text"]
