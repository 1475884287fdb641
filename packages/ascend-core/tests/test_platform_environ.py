"""The platform's environment check: our variables are validated by core's table, vLLM's by vLLM."""

import pytest

from vllm_ascend.core.envs import EnvError, check_environment
from vllm_ascend.core.platform import NPUPlatform


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("VLLM_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_declared_ascend_variables_are_accepted(clean_env):
    clean_env.setenv("VLLM_ASCEND_DEVICE", "reference")
    clean_env.setenv("VLLM_ASCEND_DISABLED_EXTENSIONS", "eplb")
    clean_env.setenv("VLLM_ASCEND_KERNEL_BACKEND", "torch")
    assert check_environment() == []
    NPUPlatform.validate_environ(hard_fail=True)  # vLLM's own check would reject all three


def test_misspelt_ascend_variable_is_named_with_a_suggestion(clean_env):
    clean_env.setenv("VLLM_ASCEND_DEVCE", "reference")
    with pytest.raises(ValueError) as err:
        NPUPlatform.validate_environ(hard_fail=True)
    assert (
        str(err.value)
        == "unknown environment variable VLLM_ASCEND_DEVCE is ignored; did you mean VLLM_ASCEND_DEVICE?"
    )


def test_bad_value_of_an_ascend_variable(clean_env):
    clean_env.setenv("VLLM_ASCEND_DEVICE", "gpu")
    with pytest.raises(
        EnvError, match=r"^VLLM_ASCEND_DEVICE='gpu' is invalid; allowed values: auto, npu, reference, off$"
    ):
        NPUPlatform.validate_environ(hard_fail=False)


def test_unknown_vllm_variable_still_reported(clean_env):
    clean_env.setenv("VLLM_NOT_A_THING", "1")
    with pytest.raises(ValueError, match=r"^Unknown vLLM environment variable detected: VLLM_NOT_A_THING$"):
        NPUPlatform.validate_environ(hard_fail=True)
