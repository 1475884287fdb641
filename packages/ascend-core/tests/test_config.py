"""AscendConfig defaults, dict/JSON round trip, dump, and the process-wide lifecycle."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import vllm_ascend.core as core
from vllm_ascend.core.config import (
    AscendConfig,
    ConfigError,
    RejectionSamplerConfig,
    clear_ascend_config,
    get_ascend_config,
    get_section,
    init_ascend_config,
)


@pytest.fixture(autouse=True)
def _fresh(no_sibling_sections):
    clear_ascend_config()
    yield
    clear_ascend_config()


def test_defaults_match_the_intended_behaviour():
    c = AscendConfig()
    assert c.rejection_sampler_config == RejectionSamplerConfig(verify_method="strict")
    assert c.enable_cpu_binding is False and c.dump_config_path is None
    assert c.to_dict() == {
        "rejection_sampler_config": {
            "verify_method": "strict",
            "posterior_threshold": 0.09,
            "posterior_alpha": 0.3,
        },
        "rl_config": {
            "enabled": False,
            "sleep_mode_extra_cleanup": False,
            "enable_training_consistency": False,
            "enable_batch_invariant": False,
        },
        "enable_cpu_binding": False,
        "dump_config_path": None,
    }
    assert AscendConfig.from_dict({}) == AscendConfig.from_dict(None) == c


NON_DEFAULT = {
    "rejection_sampler_config": {
        "verify_method": "block",
        "posterior_threshold": 0.2,
        "posterior_alpha": 0.5,
    },
    "rl_config": {
        "enabled": True,
        "sleep_mode_extra_cleanup": True,
        "enable_training_consistency": False,
        "enable_batch_invariant": True,
    },
    "enable_cpu_binding": True,
    "dump_config_path": "/tmp/vllm-ascend-config.json",
}


def test_dict_round_trip():
    c = AscendConfig.from_dict(NON_DEFAULT)
    d = c.to_dict()
    assert d == NON_DEFAULT
    assert AscendConfig.from_dict(d) == c
    assert c != AscendConfig()
    assert AscendConfig.from_dict(AscendConfig().to_dict()) == AscendConfig()


def test_json_round_trip_and_dump(tmp_path):
    c = AscendConfig.from_dict(NON_DEFAULT)
    text = c.to_json()
    assert json.loads(text) == c.to_dict()
    assert AscendConfig.from_json(text) == c
    written = c.dump(tmp_path / "sub" / "ascend.json")
    assert written == tmp_path / "sub" / "ascend.json"
    assert AscendConfig.from_json(written.read_text()) == c


def test_dump_to_unwritable_path_names_the_key(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(
        ConfigError, match=r"^additional_config.dump_config_path = '.*/file/c.json' cannot be written"
    ):
        AscendConfig().dump(blocker / "c.json")


def test_lifecycle_init_get_clear():
    with pytest.raises(RuntimeError, match="Ascend config is not initialised in this process"):
        get_ascend_config()
    c = init_ascend_config({"enable_cpu_binding": True})
    assert get_ascend_config() is c and c.enable_cpu_binding is True
    c2 = init_ascend_config('{"rejection_sampler_config": {"verify_method": "strict"}}')
    assert get_ascend_config() is c2 and c2.enable_cpu_binding is False
    clear_ascend_config()
    with pytest.raises(RuntimeError):
        get_ascend_config()


def test_init_takes_no_family():
    with pytest.raises(TypeError, match="family"):
        init_ascend_config({}, family="A3")  # type: ignore[call-arg]


def test_failed_init_leaves_the_previous_config_in_place():
    c = init_ascend_config(SimpleNamespace(additional_config={"enable_cpu_binding": True}))
    with pytest.raises(ConfigError, match=r"additional_config.enable_cpu_binding must be a boolean"):
        init_ascend_config({"enable_cpu_binding": "yes"})
    with pytest.raises(ConfigError, match=r"`additional_config.xlite_graph_config` is not supported yet"):
        init_ascend_config({"xlite_graph_config": {"enabled": True}})
    assert get_ascend_config() is c


def test_init_rejects_non_dict_additional_config_and_unknown_sources():
    with pytest.raises(ConfigError) as info:
        init_ascend_config(SimpleNamespace(additional_config=[1, 2]))
    assert str(info.value) == "additional_config must be a JSON object (dict), got list [1, 2]"
    with pytest.raises(ConfigError) as info:
        init_ascend_config(42)
    assert str(info.value) == "init_ascend_config expects a vLLM VllmConfig, a dict or a JSON string, got int"
    with pytest.raises(ConfigError) as info:
        init_ascend_config("[1]")
    assert str(info.value) == "additional_config must be a JSON object, got list"


def test_init_dumps_when_asked(tmp_path):
    target = tmp_path / "dump" / "cfg.json"
    c = init_ascend_config({"dump_config_path": str(target), "enable_cpu_binding": True})
    assert json.loads(target.read_text()) == c.to_dict()
    assert json.loads(target.read_text())["enable_cpu_binding"] is True


def test_describe_lists_every_leaf_option_with_help():
    rows = AscendConfig.describe()
    paths = [r[0] for r in rows]
    assert paths == [
        "additional_config.rejection_sampler_config.verify_method",
        "additional_config.rejection_sampler_config.posterior_threshold",
        "additional_config.rejection_sampler_config.posterior_alpha",
        "additional_config.rl_config.enabled",
        "additional_config.rl_config.sleep_mode_extra_cleanup",
        "additional_config.rl_config.enable_training_consistency",
        "additional_config.rl_config.enable_batch_invariant",
        "additional_config.enable_cpu_binding",
        "additional_config.dump_config_path",
    ]
    assert all(r[3] for r in rows)


def test_get_section_names_the_validated_sections():
    init_ascend_config({})
    with pytest.raises(
        ConfigError, match=r"^no validated additional_config section 'nope'; validated sections: "
    ):
        get_section("nope")


def test_lazy_exports_from_core():
    assert core.AscendConfig is AscendConfig
    assert core.init_ascend_config is init_ascend_config
    assert core.get_ascend_config is get_ascend_config
    assert core.clear_ascend_config is clear_ascend_config
    assert core.get_section is get_section


def test_worker_process_builds_the_config_from_vllms_current_config():
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config

    vllm_config = VllmConfig(additional_config={"enable_cpu_binding": True})
    clear_ascend_config()  # as in a worker process: the platform hook ran elsewhere
    with set_current_vllm_config(vllm_config):
        config = get_ascend_config()
    assert config.enable_cpu_binding is True
    assert get_ascend_config() is config
