"""Sleep mode's config: the platform names the runner's sleep-mode backend and refuses what it does not serve."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_ascend.core.config import ConfigError
from vllm_ascend.core.platform import SLEEP_MODE_BACKEND, ReferencePlatform


def _vllm_config(**model: object) -> SimpleNamespace:
    fields = {
        "enable_sleep_mode": True,
        "sleep_mode_backend": "cumem",
        "enable_nccl_comm_suspend": False,
        **model,
    }
    return SimpleNamespace(model_config=SimpleNamespace(**fields))


def test_vllms_default_backend_is_replaced_by_the_ascend_one():
    config = _vllm_config()
    ReferencePlatform._check_sleep_mode(config)  # type: ignore[arg-type]
    assert config.model_config.sleep_mode_backend == SLEEP_MODE_BACKEND == "ascend"


def test_without_sleep_mode_nothing_changes():
    config = _vllm_config(enable_sleep_mode=False, sleep_mode_backend="criu")
    ReferencePlatform._check_sleep_mode(config)  # type: ignore[arg-type]
    assert config.model_config.sleep_mode_backend == "criu"


def test_other_backends_and_comm_suspension_are_refused_by_name():
    with pytest.raises(
        ConfigError, match=r"model_config.sleep_mode_backend='criu' is not supported yet .*allowed: 'ascend'"
    ):
        ReferencePlatform._check_sleep_mode(_vllm_config(sleep_mode_backend="criu"))  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"model_config.enable_nccl_comm_suspend=True is not supported yet .*allowed: False"
    ):
        ReferencePlatform._check_sleep_mode(_vllm_config(enable_nccl_comm_suspend=True))  # type: ignore[arg-type]
