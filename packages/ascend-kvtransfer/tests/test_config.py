"""MooncakeTransferConfig: defaults, upstream keys honoured, and refusals that name the field."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from vllm.config import KVTransferConfig

from vllm_ascend.core.sdk import ConfigError
from vllm_ascend.kvtransfer.config import EXTRA_KEYS, MooncakeTransferConfig, ParallelShape

EXTRA = "kv_transfer_config.kv_connector_extra_config"
ALLOWED = (
    "allowed: prefill, decode, use_ascend_direct, side_channel_host, abort_request_timeout, "
    "transfer_timeout, num_transfer_threads"
)


def _vllm(role="kv_consumer", port=20001, extra=None, connector="MooncakeConnectorV1", **kw):
    transfer = KVTransferConfig(
        kv_connector=connector,
        kv_role=role,
        kv_port=port,
        engine_id="engine-a",
        kv_connector_extra_config=extra or {},
        **kw,
    )
    return SimpleNamespace(kv_transfer_config=transfer)


def _config(on_npu=False, **kw) -> MooncakeTransferConfig:
    return MooncakeTransferConfig.from_vllm_config(_vllm(**kw), on_npu=on_npu)


def test_defaults_off_npu(monkeypatch):
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    cfg = _config()
    assert cfg == MooncakeTransferConfig(
        engine_id="engine-a",
        role="kv_consumer",
        kv_port=20001,
        side_channel_host="127.0.0.1",
        use_ascend_direct=False,
        abort_request_timeout=480.0,
        transfer_timeout=30.0,
        num_transfer_threads=4,
        load_failure_policy="fail",
        prefill=ParallelShape(None, None),
        decode=ParallelShape(None, None),
    )
    assert cfg.protocol == "tcp"
    assert (cfg.is_consumer, cfg.is_producer) == (True, False)


def test_defaults_on_npu_use_the_ascend_transport(monkeypatch):
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    cfg = _config(on_npu=True, role="kv_producer")
    assert (cfg.use_ascend_direct, cfg.protocol) == (True, "ascend")
    assert (cfg.is_consumer, cfg.is_producer) == (False, True)


def test_kv_both_is_producer_and_consumer():
    cfg = _config(role="kv_both")
    assert (cfg.is_consumer, cfg.is_producer) == (True, True)


def test_side_channel_host_from_vllm_host_ip(monkeypatch):
    monkeypatch.setenv("VLLM_HOST_IP", "10.1.2.3")
    assert _config().side_channel_host == "10.1.2.3"
    # an explicit key wins over the environment
    assert _config(extra={"side_channel_host": "10.9.9.9"}).side_channel_host == "10.9.9.9"
    monkeypatch.setenv("VLLM_HOST_IP", "")
    assert _config().side_channel_host == "127.0.0.1"


def test_upstream_keys_are_honoured():
    cfg = _config(
        on_npu=True,
        extra={
            "prefill": {"tp_size": 2, "dp_size": 1},
            "decode": {"tp_size": 1},
            "use_ascend_direct": False,
            "abort_request_timeout": 12,
            "transfer_timeout": 2.5,
            "num_transfer_threads": 64,
        },
        kv_load_failure_policy="recompute",
    )
    assert cfg.prefill == ParallelShape(tp_size=2, dp_size=1)
    assert cfg.decode == ParallelShape(tp_size=1, dp_size=None)
    assert (cfg.use_ascend_direct, cfg.protocol) == (False, "tcp")
    assert (cfg.abort_request_timeout, cfg.transfer_timeout) == (12.0, 2.5)
    assert isinstance(cfg.abort_request_timeout, float)
    assert cfg.num_transfer_threads == 64
    assert cfg.load_failure_policy == "recompute"
    assert _config(extra={"use_ascend_direct": True}).protocol == "ascend"


def test_every_documented_key_is_accepted():
    assert set(EXTRA_KEYS) == {
        "prefill",
        "decode",
        "use_ascend_direct",
        "side_channel_host",
        "abort_request_timeout",
        "transfer_timeout",
        "num_transfer_threads",
    }


def test_kv_port_given_as_digits_is_taken():
    vllm = _vllm()
    vllm.kv_transfer_config.kv_port = "20002"
    assert MooncakeTransferConfig.from_vllm_config(vllm, on_npu=False).kv_port == 20002


@pytest.mark.parametrize(
    "dp_rank,tp_rank,tp_size,port",
    [(0, 0, 1, 20001), (0, 3, 4, 20004), (1, 0, 4, 20005), (2, 1, 2, 20006), (3, 7, 8, 20032)],
)
def test_side_channel_port_is_dp_major(dp_rank, tp_rank, tp_size, port):
    assert _config().side_channel_port(dp_rank, tp_rank, tp_size) == port


def test_side_channel_ports_of_an_instance_are_distinct():
    cfg = _config()
    ports = [cfg.side_channel_port(dp, tp, 4) for dp in range(3) for tp in range(4)]
    assert ports == list(range(20001, 20013))


def test_unknown_extra_key_names_the_key_and_the_allowed_ones():
    with pytest.raises(ConfigError) as info:
        _config(extra={"prefill": {"tp_size": 1}, "kv_buffer_size": 1, "mooncake_protocol": "rdma"})
    message = str(info.value)
    assert message == (
        f"{EXTRA} key(s) 'kv_buffer_size', 'mooncake_protocol' not supported by vllm-ascend's "
        f"MooncakeConnectorV1; {ALLOWED}"
    )


def test_unknown_key_names_the_connector_in_use():
    with pytest.raises(ConfigError, match=re.escape("vllm-ascend's MooncakeLayerwiseConnector; allowed:")):
        _config(connector="MooncakeLayerwiseConnector", extra={"x": 1})


def test_missing_kv_transfer_config():
    with pytest.raises(ConfigError, match="kv_transfer_config must be set for the Mooncake connectors"):
        MooncakeTransferConfig.from_vllm_config(SimpleNamespace(kv_transfer_config=None), on_npu=False)


@pytest.mark.parametrize("role", [None, "kv_sender", "producer"])
def test_bad_kv_role(role):
    # vLLM's own dataclass refuses these at construction; a config changed afterwards is refused here
    vllm = _vllm()
    vllm.kv_transfer_config.kv_role = role
    with pytest.raises(ConfigError) as info:
        MooncakeTransferConfig.from_vllm_config(vllm, on_npu=False)
    assert str(info.value) == (
        f"kv_transfer_config.kv_role = {role!r} is not supported; allowed: kv_producer, kv_consumer, kv_both"
    )


@pytest.mark.parametrize("port", [80, 1023, 65536, 0, -1, "abc", None, True, 2.5])
def test_bad_kv_port(port):
    vllm = _vllm()
    vllm.kv_transfer_config.kv_port = port
    with pytest.raises(ConfigError) as info:
        MooncakeTransferConfig.from_vllm_config(vllm, on_npu=False)
    assert (
        str(info.value) == f"kv_transfer_config.kv_port must be an integer from 1024 to 65535, got {port!r}"
    )


@pytest.mark.parametrize("port", [1024, 65535])
def test_kv_port_bounds(port):
    assert _config(port=port).kv_port == port


@pytest.mark.parametrize("key", ["abort_request_timeout", "transfer_timeout"])
@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "30", True, None])
def test_bad_timeouts(key, value):
    with pytest.raises(ConfigError) as info:
        _config(extra={key: value})
    assert str(info.value) == f"{EXTRA}.{key} must be a number of seconds above 0, got {value!r}"


@pytest.mark.parametrize("value", [0, 65, 2.0, "4", False])
def test_bad_num_transfer_threads(value):
    with pytest.raises(ConfigError) as info:
        _config(extra={"num_transfer_threads": value})
    assert str(info.value) == f"{EXTRA}.num_transfer_threads must be an integer from 1 to 64, got {value!r}"


@pytest.mark.parametrize("value", ["true", 1, 0, None, "ascend"])
def test_use_ascend_direct_must_be_a_bool(value):
    with pytest.raises(ConfigError) as info:
        _config(extra={"use_ascend_direct": value})
    assert str(info.value) == f"{EXTRA}.use_ascend_direct must be true or false, got {value!r}"


@pytest.mark.parametrize("value", ["", 5, None])
def test_bad_side_channel_host(value):
    with pytest.raises(ConfigError) as info:
        _config(extra={"side_channel_host": value})
    assert str(info.value) == f"{EXTRA}.side_channel_host must be a host name, got {value!r}"


@pytest.mark.parametrize("group", ["prefill", "decode"])
def test_parallel_group_with_an_unknown_sub_key(group):
    with pytest.raises(ConfigError) as info:
        _config(extra={group: {"tp_size": 2, "pp_size": 1, "ep": 2}})
    assert str(info.value) == (
        f"{EXTRA}.{group} key(s) 'ep', 'pp_size' not supported; allowed: tp_size, dp_size"
    )


@pytest.mark.parametrize("group", ["prefill", "decode"])
@pytest.mark.parametrize("value", [2, [1, 2], "tp_size=2"])
def test_parallel_group_must_be_a_mapping(group, value):
    with pytest.raises(ConfigError) as info:
        _config(extra={group: value})
    assert str(info.value) == f"{EXTRA}.{group} must be a mapping with keys tp_size, dp_size, got {value!r}"


@pytest.mark.parametrize("sub", ["tp_size", "dp_size"])
@pytest.mark.parametrize("value", [0, -2, "2", 1.0, True, 65537])
def test_parallel_sizes_are_positive_integers(sub, value):
    with pytest.raises(ConfigError) as info:
        _config(extra={"prefill": {sub: value}})
    assert str(info.value) == f"{EXTRA}.prefill.{sub} must be an integer from 1 to 65536, got {value!r}"


def test_null_parallel_group_is_undeclared():
    assert _config(extra={"prefill": None}).prefill == ParallelShape()
