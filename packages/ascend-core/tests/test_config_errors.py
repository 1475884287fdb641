"""Bad additional_config input: every error names the full key path and what is allowed."""

from __future__ import annotations

import pytest

from vllm_ascend.core.config import AscendConfig, ConfigError, RejectionSamplerConfig

TOP_KEYS = "dump_config_path, enable_cpu_binding, rejection_sampler_config"
P = "additional_config"
R = f"{P}.rejection_sampler_config"

CASES = [
    # unknown keys, with and without a suggestion
    (
        {"enable_cpu_bindng": True},
        f"unknown option {P}.enable_cpu_bindng; did you mean 'enable_cpu_binding'? Allowed keys: {TOP_KEYS}",
    ),
    ({"zzz": 1}, f"unknown option {P}.zzz. Allowed keys: {TOP_KEYS}"),
    (
        {"rejection_sampler_config": {"verify_methd": "strict"}},
        f"unknown option {R}.verify_methd; did you mean 'verify_method'? Allowed keys: verify_method",
    ),
    # wrong types
    (
        {"enable_cpu_binding": "yes"},
        f"{P}.enable_cpu_binding must be a boolean (true or false), got str 'yes'",
    ),
    ({"enable_cpu_binding": 1}, f"{P}.enable_cpu_binding must be a boolean (true or false), got int 1"),
    ({"enable_cpu_binding": None}, f"{P}.enable_cpu_binding must not be null"),
    ({"dump_config_path": 5}, f"{P}.dump_config_path must be a string, got int 5"),
    (
        {"rejection_sampler_config": 5},
        f"{R} must be a JSON object (allowed keys: verify_method), got int 5",
    ),
    ({"rejection_sampler_config": {"verify_method": 3}}, f"{R}.verify_method must be a string, got int 3"),
    # not an allowed value
    (
        {"rejection_sampler_config": {"verify_method": "greedy"}},
        f"{R}.verify_method = 'greedy' is invalid; allowed values: 'strict', 'block', 'entropy'",
    ),
    # upstream values this version does not serve
    (
        {"rejection_sampler_config": {"verify_method": "block"}},
        f"`{R}.verify_method` = 'block' is not supported yet by vllm-ascend 0.1.0; supported: 'strict'",
    ),
    (
        {"rejection_sampler_config": {"verify_method": "entropy"}},
        f"`{R}.verify_method` = 'entropy' is not supported yet by vllm-ascend 0.1.0; supported: 'strict'",
    ),
]


@pytest.mark.parametrize(("data", "message"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_additional_config_is_rejected_with_exact_message(data, message):
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_dict(data)
    assert str(info.value) == message


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_additional_config_must_be_an_object():
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_dict([1])  # type: ignore[arg-type]
    assert str(info.value) == "additional_config must be a JSON object, got list [1]"


def test_invalid_json_is_reported():
    with pytest.raises(ConfigError, match=r"^additional_config is not valid JSON: Expecting ',' delimiter"):
        AscendConfig.from_json('{"enable_cpu_binding": true "x": 1}')


def test_direct_construction_is_validated_too():
    with pytest.raises(ConfigError) as info:
        RejectionSamplerConfig(verify_method="block")
    assert str(info.value) == (
        f"`{R}.verify_method` = 'block' is not supported yet by vllm-ascend 0.1.0; supported: 'strict'"
    )
    with pytest.raises(ConfigError) as info:
        AscendConfig(rejection_sampler_config={"verify_method": "x"})  # type: ignore[arg-type]
    assert (
        str(info.value) == f"{R}.verify_method = 'x' is invalid; allowed values: 'strict', 'block', 'entropy'"
    )
    built = AscendConfig(rejection_sampler_config={"verify_method": "strict"})  # type: ignore[arg-type]
    assert built.rejection_sampler_config == RejectionSamplerConfig()


def test_replace_revalidates():
    config = AscendConfig()
    with pytest.raises(ConfigError, match=r"additional_config.enable_cpu_binding must be a boolean"):
        config.replace(enable_cpu_binding="x")
    assert config.replace(enable_cpu_binding=True).enable_cpu_binding is True
