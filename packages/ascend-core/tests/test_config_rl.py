"""``additional_config.rl_config``: each field served or refused by name, and the switches ``enabled`` sets."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_ascend.core import envs
from vllm_ascend.core._version import __version__
from vllm_ascend.core.config import (
    AscendConfig,
    ConfigError,
    RlConfig,
    clear_ascend_config,
    get_ascend_config,
    init_ascend_config,
)
from vllm_ascend.core.platform import ReferencePlatform

RL = "additional_config.rl_config"
SWITCHES = ("VLLM_SERVER_DEV_MODE", "VLLM_ASCEND_BATCH_INVARIANT")


@pytest.fixture(autouse=True)
def _fresh(no_sibling_sections):
    clear_ascend_config()
    yield
    clear_ascend_config()


@pytest.fixture
def clean_env(monkeypatch):
    """Neither switch set; whatever the code under test sets is undone after the test."""
    for name in SWITCHES:
        monkeypatch.setenv(name, "")  # recorded first, so teardown restores the original (or removes it)
        monkeypatch.delenv(name)
    return monkeypatch


def _vllm_config(sleep_mode: bool = True) -> SimpleNamespace:
    return SimpleNamespace(model_config=SimpleNamespace(enable_sleep_mode=sleep_mode))


def _apply(rl: dict, sleep_mode: bool = True) -> RlConfig:
    config = init_ascend_config({"rl_config": rl})
    ReferencePlatform._check_rl_config(config.rl_config, _vllm_config(sleep_mode))  # type: ignore[arg-type]
    return config.rl_config


# -- the section ------------------------------------------------------------------------------------


def test_defaults_are_off_and_the_runner_reads_the_section_from_the_config():
    assert RlConfig() == RlConfig.from_dict({}) == AscendConfig().rl_config
    assert RlConfig().to_dict() == {
        "enabled": False,
        "sleep_mode_extra_cleanup": False,
        "enable_training_consistency": False,
        "enable_batch_invariant": False,
    }
    init_ascend_config({"rl_config": {"enabled": True, "sleep_mode_extra_cleanup": True}})
    rl = get_ascend_config().rl_config
    assert (rl.enabled, rl.sleep_mode_extra_cleanup, rl.enable_batch_invariant) == (True, True, False)


def test_unknown_keys_are_refused_with_the_allowed_names():
    with pytest.raises(ConfigError) as err:
        init_ascend_config({"rl_config": {"enable": True}})
    assert str(err.value) == (
        f"unknown option {RL}.enable; did you mean 'enabled'? Allowed keys: enable_batch_invariant, "
        "enable_training_consistency, enabled, sleep_mode_extra_cleanup"
    )
    with pytest.raises(
        ConfigError, match=r"additional_config.rl_config must be a JSON object \(allowed keys: "
    ):
        init_ascend_config({"rl_config": True})


@pytest.mark.parametrize("field", ["enabled", "sleep_mode_extra_cleanup", "enable_training_consistency"])
def test_non_booleans_are_refused_naming_the_field(field):
    with pytest.raises(ConfigError) as err:
        init_ascend_config({"rl_config": {"enabled": True, field: 1}})
    assert str(err.value) == f"{RL}.{field} must be a boolean (true or false), got int 1"


def test_training_consistency_is_refused_by_name():
    for rl in ({"enabled": True, "enable_training_consistency": True}, {"enable_training_consistency": True}):
        with pytest.raises(ConfigError) as err:
            init_ascend_config({"rl_config": rl})
        assert str(err.value) == (
            f"{RL}.enable_training_consistency=true is not supported yet by vllm-ascend {__version__} "
            "(FA3 attention from flash_attn_npu_v3); allowed: false"
        )
    assert RlConfig(enabled=True, enable_training_consistency=False).enable_training_consistency is False


@pytest.mark.parametrize("field", ["sleep_mode_extra_cleanup", "enable_batch_invariant"])
def test_sub_fields_without_the_master_switch_are_refused(field):
    with pytest.raises(ConfigError) as err:
        RlConfig.from_dict({field: True})
    assert str(err.value) == (
        f"{RL}.{field}=true needs {RL}.enabled=true (rl_config.enabled is the master switch; without it "
        f"{field} would do nothing); set enabled to true or {field} to false"
    )


# -- the platform's check and switches --------------------------------------------------------------


def test_disabled_sets_nothing(clean_env):
    _apply({})
    _apply({"enabled": False}, sleep_mode=False)
    assert all(name not in os.environ for name in SWITCHES)
    assert envs.VLLM_ASCEND_BATCH_INVARIANT is False


def test_enabled_turns_on_vllms_dev_and_rl_routes(clean_env):
    import vllm.envs as vllm_envs

    _apply({"enabled": True}, sleep_mode=False)  # sleep mode is the trainer's choice, not required
    assert os.environ["VLLM_SERVER_DEV_MODE"] == "1"
    if not vllm_envs._is_envs_cache_enabled():
        assert vllm_envs.VLLM_SERVER_DEV_MODE is True
    assert "VLLM_ASCEND_BATCH_INVARIANT" not in os.environ  # only with enable_batch_invariant


def test_batch_invariant_sets_the_same_switch_as_the_variable(clean_env):
    _apply({"enabled": True, "enable_batch_invariant": True})
    assert os.environ["VLLM_ASCEND_BATCH_INVARIANT"] == "1"
    assert envs.VLLM_ASCEND_BATCH_INVARIANT is True  # what the kernels read, at each call
    # processes started afterwards (engine core, workers) inherit both switches
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from vllm_ascend.core import envs; "
            "print(envs.VLLM_ASCEND_BATCH_INVARIANT, os.environ['VLLM_SERVER_DEV_MODE'])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.stdout.split() == ["True", "1"], child.stderr


def test_an_explicit_variable_is_never_turned_off_or_overridden(clean_env):
    clean_env.setenv("VLLM_ASCEND_BATCH_INVARIANT", "true")
    _apply({"enabled": True})  # rl_config without batch invariance leaves the variable alone
    assert os.environ["VLLM_ASCEND_BATCH_INVARIANT"] == "true" and envs.VLLM_ASCEND_BATCH_INVARIANT is True
    _apply({"enabled": True, "enable_batch_invariant": True})
    assert envs.VLLM_ASCEND_BATCH_INVARIANT is True
    clean_env.setenv("VLLM_ASCEND_BATCH_INVARIANT", "0")
    with pytest.raises(ConfigError) as err:
        _apply({"enabled": True, "enable_batch_invariant": True})
    assert str(err.value) == (
        f"{RL}.enable_batch_invariant=true turns VLLM_ASCEND_BATCH_INVARIANT on, but the environment sets "
        f"VLLM_ASCEND_BATCH_INVARIANT='0'; unset VLLM_ASCEND_BATCH_INVARIANT (or set it to 1), or set "
        f"{RL}.enable_batch_invariant to false"
    )
    assert os.environ["VLLM_ASCEND_BATCH_INVARIANT"] == "0"
    clean_env.setenv("VLLM_SERVER_DEV_MODE", "0")
    with pytest.raises(
        ConfigError, match=r"^additional_config.rl_config.enabled=true turns VLLM_SERVER_DEV_MODE "
    ):
        _apply({"enabled": True})
    assert os.environ["VLLM_SERVER_DEV_MODE"] == "0"


def test_extra_cleanup_needs_sleep_mode(clean_env):
    rl = {"enabled": True, "sleep_mode_extra_cleanup": True}
    assert _apply(rl, sleep_mode=True).sleep_mode_extra_cleanup is True
    clean_env.delenv("VLLM_SERVER_DEV_MODE")
    with pytest.raises(ConfigError) as err:
        _apply(rl, sleep_mode=False)
    assert str(err.value) == (
        f"{RL}.sleep_mode_extra_cleanup=true needs model_config.enable_sleep_mode=True (vllm serve "
        "--enable-sleep-mode): it changes what sleep frees; set one or unset the other"
    )
    assert "VLLM_SERVER_DEV_MODE" not in os.environ  # a refused config switches nothing on
    config = init_ascend_config({"rl_config": rl})
    with pytest.raises(ConfigError, match=r"needs model_config.enable_sleep_mode=True"):
        ReferencePlatform._check_rl_config(config.rl_config, SimpleNamespace(model_config=None))  # type: ignore[arg-type]
