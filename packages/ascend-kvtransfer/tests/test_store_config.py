"""AscendStoreConnector's config (upstream keys honoured or refused by name, MOONCAKE_CONFIG_PATH) and its
pool keys (the same in every process, different for different models, adapters and slices)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from vllm.config import KVTransferConfig

from vllm_ascend.core.sdk import ConfigError
from vllm_ascend.kvtransfer.block_keys import RequestKeys, block_key, chain_hashes
from vllm_ascend.kvtransfer.store_config import StoreConnectorConfig


def _vllm(extra: dict, role: str = "kv_both") -> SimpleNamespace:
    return SimpleNamespace(
        kv_transfer_config=KVTransferConfig(
            kv_connector="AscendStoreConnector", kv_role=role, engine_id="e", kv_connector_extra_config=extra
        )
    )


def test_defaults_and_roles():
    both = StoreConnectorConfig.from_vllm_config(_vllm({"master": "127.0.0.1:5000"}))
    assert (both.load_async, both.saves, both.loads, both.pool.master) == (True, True, True, "127.0.0.1:5000")
    consumer = StoreConnectorConfig.from_vllm_config(_vllm({"master": "127.0.0.1:5000"}, role="kv_consumer"))
    assert (consumer.saves, consumer.loads) == (False, True)
    putting = StoreConnectorConfig.from_vllm_config(
        _vllm({"master_server_address": "127.0.0.1:5000", "consumer_is_to_put": True, "load_async": False,
               "backend": "mooncake"}, role="kv_consumer")
    )  # fmt: skip
    assert (putting.saves, putting.load_async, putting.pool.master) == (True, False, "127.0.0.1:5000")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "kv pool master .* is required"),
        ({"master": "127.0.0.1:5000", "backend": "memcache"}, "backend = 'memcache' is not supported by vllm-ascend; supported: mooncake"),
        ({"master": "127.0.0.1:5000", "load_async": "yes"}, "load_async must be true or false"),
        ({"master": "127.0.0.1:5000", "prefill_pp_size": 2}, "pipeline-parallel prefill is not supported"),
        ({"master": "127.0.0.1:5000", "pool_namespace": "a/b"}, "pool_namespace must be a non-empty string without '/'"),
        ({"master": "127.0.0.1:5000", "lookup_rpc_port": 1}, "lookup_rpc_port is not used .*: remove it"),
        ({"master": "127.0.0.1:5000", "bogus": 1}, r"'bogus'.* not supported; allowed: .*AscendStoreConnector's own keys: backend"),
    ],
)  # fmt: skip
def test_bad_config_is_refused_by_field(extra, message):
    with pytest.raises(ConfigError, match=message):
        StoreConnectorConfig.from_vllm_config(_vllm(extra))


def test_mooncake_config_file_fills_pool_fields(tmp_path, monkeypatch):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({"master_server_address": "127.0.0.1:6001", "protocol": "tcp", "device_name": "",
                                "global_segment_size": "1GB", "local_hostname": "127.0.0.1"}))  # fmt: skip
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    config = StoreConnectorConfig.from_vllm_config(_vllm({}))
    assert (config.pool.master, config.pool.global_segment_size) == ("127.0.0.1:6001", 1 << 30)
    path.write_text("[1]")
    with pytest.raises(ConfigError, match=r"MOONCAKE_CONFIG_PATH=.*expected a JSON object, got list"):
        StoreConnectorConfig.from_vllm_config(_vllm({}))


def test_keys_chain_the_whole_prefix_and_ignore_partial_blocks():
    tokens = list(range(40))
    hashes = chain_hashes("ns", b"", tokens, 16)
    assert len(hashes) == 2
    changed = chain_hashes("ns", b"", [99, *tokens[1:]], 16)
    assert changed[0] != hashes[0] and changed[1] != hashes[1]  # block 1's key covers block 0's tokens
    assert chain_hashes("other-model", b"", tokens, 16)[0] != hashes[0]
    assert chain_hashes("ns", b"lora:a", tokens, 16)[0] != hashes[0]
    assert chain_hashes("ns", b"", tokens, 16, 1, hashes[0]) == hashes[1:]
    assert block_key("ns", hashes[0], "tp0of2.pp0of1") != block_key("ns", hashes[0], "tp1of2.pp0of1")


def test_keys_grow_with_the_request_and_match_another_process():
    request = SimpleNamespace(lora_request=None, cache_salt=None, mm_features=None)
    keys = RequestKeys("ns", request, 4)
    assert len(keys.extend([1, 2, 3])) == 0
    grown = keys.extend([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(grown) == 2 and grown == chain_hashes("ns", b"", list(range(1, 10)), 4)
    code = "from vllm_ascend.kvtransfer.block_keys import chain_hashes; print(chain_hashes('ns', b'', list(range(1, 10)), 4)[1].hex())"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == grown[1].hex()  # no per-process seed: every instance agrees
