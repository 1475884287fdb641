"""The platform's connector check with this sibling installed: vLLM's OffloadingConnector gets the Ascend spec
(default and vLLM's CPU name alike), MultiConnector children are checked one by one, AscendStoreConnector's
config is checked at config time, and what is not served is refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.config import KVTransferConfig

from vllm_ascend.core.platform import NPUPlatform
from vllm_ascend.core.sdk import ConfigError


def _vllm(connector: str, extra: dict | None = None, **kw) -> SimpleNamespace:
    transfer = KVTransferConfig(
        kv_connector=connector, kv_role="kv_both", engine_id="e", kv_connector_extra_config=extra or {}, **kw
    )
    return SimpleNamespace(kv_transfer_config=transfer, speculative_config=None)


@pytest.mark.parametrize("spec_name", [None, "CPUOffloadingSpec", "NPUOffloadingSpec"])
def test_offloading_connector_gets_the_ascend_spec(spec_name):
    extra = {"cpu_bytes_to_use": 1 << 20}
    if spec_name is not None:
        extra["spec_name"] = spec_name
    if spec_name == "NPUOffloadingSpec":
        extra["spec_module_path"] = "vllm_ascend.kv_offload.npu"  # upstream's module path: not needed here
    config = _vllm("OffloadingConnector", extra)
    NPUPlatform._check_kv_connector(config)
    assert config.kv_transfer_config.kv_connector_extra_config == {
        "cpu_bytes_to_use": 1 << 20,
        "spec_name": "NPUOffloadingSpec",
    }


def test_offloading_connector_without_host_bytes_is_refused():
    with pytest.raises(
        ConfigError, match=r"kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use must be"
    ):
        NPUPlatform._check_kv_connector(_vllm("OffloadingConnector", {}))


def test_an_unknown_offloading_spec_is_refused_by_name():
    with pytest.raises(
        ConfigError,
        match=r"spec_name = 'TieringOffloadingSpec' is not supported by vllm-ascend .*supported: NPUOffloadingSpec",
    ):
        NPUPlatform._check_kv_connector(_vllm("OffloadingConnector", {"spec_name": "TieringOffloadingSpec"}))


def test_multi_connector_children_are_checked_and_rewritten():
    children = [
        {
            "kv_connector": "MooncakeConnectorV1",
            "kv_role": "kv_producer",
            "kv_port": 20001,
            "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector",
        },
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20},
        },
    ]
    config = _vllm("MultiConnector", {"connectors": children})
    NPUPlatform._check_kv_connector(config)
    assert "kv_connector_module_path" not in children[0]
    assert children[1]["kv_connector_extra_config"]["spec_name"] == "NPUOffloadingSpec"


@pytest.mark.parametrize(
    ("connectors", "message"),
    [
        (None, r"kv_transfer_config.kv_connector_extra_config.connectors must be a non-empty list"),
        ([], r"connectors must be a non-empty list"),
        (
            [{"kv_connector": "NixlConnector", "kv_role": "kv_both"}],
            r"kv_transfer_config.kv_connector_extra_config.connectors\[0\].kv_connector = 'NixlConnector' is not "
            r"supported by vllm-ascend; supported: MultiConnector, OffloadingConnector, .*AscendStoreConnector",
        ),
        (
            [{"kv_connector": "AscendStoreConnector", "kv_role": "kv_both", "kv_connector_extra_config": {}}],
            r"connectors\[0\]|master",
        ),
    ],
)
def test_bad_multi_connector_children_are_refused_by_path(connectors, message):
    extra = {} if connectors is None else {"connectors": connectors}
    with pytest.raises(ConfigError, match=message):
        NPUPlatform._check_kv_connector(_vllm("MultiConnector", extra))


def test_unserved_connector_lists_what_is_served():
    with pytest.raises(
        ConfigError, match=r"kv_connector = 'LMCacheConnectorV1' is not supported by vllm-ascend"
    ):
        NPUPlatform._check_kv_connector(_vllm("LMCacheConnectorV1"))
